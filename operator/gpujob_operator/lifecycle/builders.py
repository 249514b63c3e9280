"""Pure builders of the job's children: the headless Service and one pod per node.

Plain dicts in the API's camelCase JSON, ready for any client (kopf, kubernetes, kubectl).

Contract: pod ``<job>-node-<i>`` with ``hostname`` and ``subdomain``
so ``<job>-node-0.<job>`` resolves through the headless Service ``<job>``; the torchrun /
Kubeflow PyTorchJob env (``MASTER_ADDR``, ``WORLD_SIZE`` = nodes, ``RANK`` = node rank,
``PET_*``); one pod per node, ``restartPolicy: Never`` (the operator restarts the gang).

Decisions:

* Env: the operator's rendezvous and ``GPUJOB_*`` variables come first and always win (the
  API refuses user values for them, see ``api.RESERVED_ENV``); any other operator default
  (``PYTHONUNBUFFERED``, the Flight Recorder's ``contract.FLIGHT_RECORDER_ENV``) is replaced
  by a user entry of the same name. User entries follow, so their ``$(VAR)`` references can
  use the operator's variables.
* Command with ``launcher: torchrun``: ``python -m M args`` -> ``torchrun <flags> -m M args``;
  ``python S args`` -> ``torchrun <flags> S args`` (torchrun runs S with its own interpreter);
  anything else (including ``python -u ...``) -> ``torchrun <flags> --no-python CMD``.
  Flags: static rendezvous on rank 0 with an explicit timeout
  (``--rdzv-backend=static --rdzv-conf=timeout=T``) and ``--max-restarts=0``: a local
  restart cannot rejoin a static gang, so failures surface to the operator.
  ``spec.args`` become the container's ``args`` (appended by the kubelet).
* The attempt is a label, not part of the name: names stay stable DNS names and a new
  attempt's pod can only be created once its old namesake is gone (no duplicates).
* ``terminationMessagePolicy: FallbackToLogsOnError``: a failed container's last log lines
  reach ``state.terminated.message`` even when the log cannot be fetched any more.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any, Final

from gpujob_operator import api
from gpujob_operator.api.children import (
    LABEL_ATTEMPT,
    LABEL_JOB_NAME,
    LABEL_MANAGED_BY,
    LABEL_NODE_RANK,
    LABEL_PREFIX,
    MANAGED_BY,
    job_meta,
    master_addr,
    owner_reference,
    pod_name,
    selector_labels,
)
from gpujob_trainer import contract
from gpujob_trainer.contract import ENV_METRICS_ADDR

CONTAINER_NAME: Final = "trainer"
SHM_VOLUME: Final = "gpujob-shm"
RENDEZVOUS_PORT_NAME: Final = "rendezvous"

_PYTHON = re.compile(r"python(3(\.\d+)?)?")


def _spec(job: Mapping[str, Any], spec: api.GPUTrainingJobSpec | None) -> api.GPUTrainingJobSpec:
    return spec if spec is not None else api.parse_spec(job["spec"])


def build_service(
    job: Mapping[str, Any], spec: api.GPUTrainingJobSpec | None = None
) -> dict[str, Any]:
    """Headless Service ``<job>``: gives each pod a DNS name, ready or not.

    ``publishNotReadyAddresses`` because ranks must resolve rank 0 before anything is
    ready (there are no readiness probes; rendezvous is the readiness).
    """
    spec = _spec(job, spec)
    name, namespace, _ = job_meta(job)
    port = spec.training.master_port
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {**selector_labels(name), LABEL_MANAGED_BY: MANAGED_BY},
            "ownerReferences": [owner_reference(job)],
        },
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": selector_labels(name),
            "ports": [
                {
                    "name": RENDEZVOUS_PORT_NAME,
                    "port": port,
                    "targetPort": port,
                    "protocol": "TCP",
                }
            ],
        },
    }


def build_env(
    job_name: str, namespace: str, spec: api.GPUTrainingJobSpec, node_rank: int
) -> list[dict[str, Any]]:
    """The container env: operator contract first, then the user's (see module doc)."""
    t = spec.training
    addr = master_addr(job_name)
    owned: list[tuple[str, str]] = [
        ("MASTER_ADDR", addr),
        ("MASTER_PORT", str(t.master_port)),
        ("WORLD_SIZE", str(spec.nodes)),
        ("RANK", str(node_rank)),
        ("PET_NNODES", str(spec.nodes)),
        ("PET_NPROC_PER_NODE", str(spec.procs_per_node)),
        ("PET_NODE_RANK", str(node_rank)),
        ("PET_MASTER_ADDR", addr),
        ("PET_MASTER_PORT", str(t.master_port)),
        (api.ENV_METRICS_PORT, str(t.metrics_port)),
        (api.ENV_JOB_NAME, job_name),
        (api.ENV_NAMESPACE, namespace),
    ]
    if t.total_steps is not None:
        owned.append((api.ENV_TOTAL_STEPS, str(t.total_steps)))
    user = [e for e in spec.env or () if e.name not in api.RESERVED_ENV]
    user_names = {e.name for e in user}
    # The Flight Recorder on (bounded), so a hang leaves a collective trace to compare.
    defaults = [("PYTHONUNBUFFERED", "1"), *contract.flight_recorder_env(user_names)]
    env: list[dict[str, Any]] = [{"name": k, "value": v} for k, v in owned]
    if ENV_METRICS_ADDR not in user_names:
        # Bind the exporter to the pod's own address: correct on a real cluster, and it keeps
        # ranks of two pods apart where pods share a network namespace (the local node agent).
        env.append(
            {"name": ENV_METRICS_ADDR, "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}
        )
    env += [{"name": k, "value": v} for k, v in defaults if k not in user_names]
    env += [e.model_dump(mode="json", by_alias=True, exclude_none=True) for e in user]
    return env


def _python_form(command: list[str]) -> list[str] | None:
    """torchrun's own form of a ``python -m M ...`` / ``python S ...`` command, else None."""
    if not command or not _PYTHON.fullmatch(os.path.basename(command[0])):
        return None
    if len(command) >= 3 and command[1] == "-m":
        return ["-m", *command[2:]]
    if len(command) >= 2 and not command[1].startswith("-"):
        return command[1:]
    return None


def torchrun_command(job_name: str, spec: api.GPUTrainingJobSpec, node_rank: int) -> list[str]:
    """``torchrun`` with static rendezvous on rank 0, wrapping the user's command."""
    t = spec.training
    flags = [
        "torchrun",
        f"--nnodes={spec.nodes}",
        f"--nproc-per-node={spec.procs_per_node}",
        f"--node-rank={node_rank}",
        f"--master-addr={master_addr(job_name)}",
        f"--master-port={t.master_port}",
        "--rdzv-backend=static",
        f"--rdzv-conf=timeout={t.rdzv_timeout_seconds}",
        "--max-restarts=0",
    ]
    command = list(spec.command or [])
    python_form = _python_form(command)
    if python_form is not None:
        return flags + python_form
    return [*flags, "--no-python", *command]


def container_command(
    job_name: str, spec: api.GPUTrainingJobSpec, node_rank: int
) -> list[str] | None:
    """The container's ``command``: wrapped by torchrun, or the user's as is (None = image's)."""
    if spec.training.launcher == "torchrun":
        return torchrun_command(job_name, spec, node_rank)
    return list(spec.command) if spec.command else None


def _resources(spec: api.GPUTrainingJobSpec) -> dict[str, Any]:
    requests = dict(spec.resources.requests or {}) if spec.resources else {}
    limits = dict(spec.resources.limits or {}) if spec.resources else {}
    if spec.gpus_per_node > 0:
        # Extended resources must have requests == limits.
        requests[api.GPU_RESOURCE] = str(spec.gpus_per_node)
        limits[api.GPU_RESOURCE] = str(spec.gpus_per_node)
    out: dict[str, Any] = {}
    if requests:
        out["requests"] = requests
    if limits:
        out["limits"] = limits
    return out


def build_pod(
    job: Mapping[str, Any],
    node_rank: int,
    attempt: int,
    spec: api.GPUTrainingJobSpec | None = None,
) -> dict[str, Any]:
    """Pod ``<job>-node-<rank>`` of gang attempt ``attempt``."""
    spec = _spec(job, spec)
    name, namespace, _ = job_meta(job)
    tpl = spec.template or api.PodTemplate()
    t = spec.training
    pname = pod_name(name, node_rank)

    labels = {k: v for k, v in (tpl.labels or {}).items() if not k.startswith(LABEL_PREFIX)}
    labels.update(
        {
            LABEL_JOB_NAME: name,
            LABEL_NODE_RANK: str(node_rank),
            LABEL_ATTEMPT: str(attempt),
            LABEL_MANAGED_BY: MANAGED_BY,
        }
    )
    ports = [
        {"name": f"metrics-{i}", "containerPort": t.metrics_port + i, "protocol": "TCP"}
        for i in range(spec.procs_per_node)
    ]
    ports.append({"name": RENDEZVOUS_PORT_NAME, "containerPort": t.master_port, "protocol": "TCP"})
    container: dict[str, Any] = {
        "name": CONTAINER_NAME,
        "image": spec.image,
    }
    command = container_command(name, spec, node_rank)
    if command is not None:
        container["command"] = command
    if spec.args:
        container["args"] = list(spec.args)
    container["env"] = build_env(name, namespace, spec, node_rank)
    container["ports"] = ports
    resources = _resources(spec)
    if resources:
        container["resources"] = resources
    if tpl.image_pull_policy:
        container["imagePullPolicy"] = tpl.image_pull_policy
    mounts = [api.dump(m) for m in tpl.volume_mounts or ()]
    volumes = [api.dump(v) for v in tpl.volumes or ()]
    if tpl.shm_size is not None:
        volumes.append(
            {"name": SHM_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": tpl.shm_size}}
        )
        mounts.append({"name": SHM_VOLUME, "mountPath": "/dev/shm"})
    if mounts:
        container["volumeMounts"] = mounts
    if tpl.container_security_context:
        container["securityContext"] = api.dump(tpl.container_security_context)
    container["terminationMessagePolicy"] = "FallbackToLogsOnError"

    pod_spec: dict[str, Any] = {
        "hostname": pname,
        "subdomain": name,
        "restartPolicy": "Never",
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": tpl.termination_grace_period_seconds,
        "containers": [container],
    }
    optional: dict[str, Any] = {
        "nodeSelector": dict(tpl.node_selector) if tpl.node_selector else None,
        "tolerations": [
            x.model_dump(mode="json", by_alias=True, exclude_none=True) for x in tpl.tolerations
        ]
        if tpl.tolerations
        else None,
        "affinity": api.dump(tpl.affinity) if tpl.affinity else None,
        "volumes": volumes or None,
        "securityContext": api.dump(tpl.security_context) if tpl.security_context else None,
        "serviceAccountName": tpl.service_account_name,
        "priorityClassName": tpl.priority_class_name,
        "schedulerName": tpl.scheduler_name,
        "imagePullSecrets": [{"name": s.name} for s in tpl.image_pull_secrets]
        if tpl.image_pull_secrets
        else None,
    }
    pod_spec.update({k: v for k, v in optional.items() if v is not None})

    metadata: dict[str, Any] = {
        "name": pname,
        "namespace": namespace,
        "labels": labels,
        "ownerReferences": [owner_reference(job)],
    }
    if tpl.annotations:
        metadata["annotations"] = dict(tpl.annotations)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": pod_spec}
