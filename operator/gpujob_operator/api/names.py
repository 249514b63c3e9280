"""Names the operator owns that the spec, the builders and the planner share.

The environment variables it sets in every rank (which the API therefore refuses from a
user), the gang mechanisms of ``spec.scheduling.gang`` and ``status.gang.mechanism``, and
the Kueue labels it reads on a job. Re-exported by :mod:`gpujob_operator.api`.
"""

from __future__ import annotations

from typing import Final, Literal

from gpujob_trainer import contract

# Env the operator owns (torchrun/PyTorchJob contract + gpujob's own). A user value for one
# of these would break the gang's rendezvous or the metrics contract, so the API refuses it.
# The metrics ones come from the shared, torch-free contract module; the contract does not
# define the job identity variables (yet), so those two are local.
ENV_METRICS_PORT: Final = contract.ENV_METRICS_PORT
ENV_TOTAL_STEPS: Final = contract.ENV_TOTAL_STEPS
ENV_JOB_NAME: Final = "GPUJOB_JOB_NAME"
ENV_NAMESPACE: Final = "GPUJOB_NAMESPACE"
ENV_ENDPOINT_TOKEN: Final = contract.ENV_ENDPOINT_TOKEN
ENV_PROFILE_DIR: Final = contract.ENV_PROFILE_DIR
RESERVED_ENV: Final = (
    "MASTER_ADDR",
    "MASTER_PORT",
    "WORLD_SIZE",
    "RANK",
    "PET_NNODES",
    "PET_NPROC_PER_NODE",
    "PET_NODE_RANK",
    "PET_MASTER_ADDR",
    "PET_MASTER_PORT",
    ENV_METRICS_PORT,
    ENV_TOTAL_STEPS,
    ENV_JOB_NAME,
    ENV_NAMESPACE,
    ENV_ENDPOINT_TOKEN,
    ENV_PROFILE_DIR,
)

PROFILE_ANNOTATION: Final = "gpujob.dev/profile"
"""The request for a profile on a GPUTrainingJob: ``steps=5;ranks=all;id=<token>``
(:mod:`gpujob_operator.api.profile`)."""
PROFILE_VOLUME: Final = "gpujob-profiles"
"""The emptyDir the operator mounts in the trainer for traces when
``spec.monitoring.profile.path`` is unset (a user volume of this name is refused)."""
PROFILE_DEFAULT_DIR: Final = "/var/run/gpujob/profiles"
"""Where that emptyDir is mounted (``GPUJOB_PROFILE_DIR``)."""

GangMechanism = Literal["None", "Native", "Kueue"]
GANG_NONE: Final = "None"
GANG_NATIVE: Final = "Native"
GANG_KUEUE: Final = "Kueue"
GANGS: Final = (GANG_NONE, GANG_NATIVE, GANG_KUEUE)
"""Every gang mechanism, in the order the docs list them."""
KUEUE_QUEUE_LABEL: Final = "kueue.x-k8s.io/queue-name"
KUEUE_PRIORITY_LABEL: Final = "kueue.x-k8s.io/priority-class"
