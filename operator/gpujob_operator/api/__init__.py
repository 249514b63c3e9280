"""The GPUTrainingJob API and everything that names or describes it (pure).

What belongs here: the pydantic models of spec and status (the single source of truth),
the pod-template model, the CEL rules with their Python twins, Kubernetes value formats,
condition types and reasons, the display strings of ``kubectl get``, the names, labels and
ownership of the job's children, and the generators of the CRD and the API reference.

May import: the standard library, pydantic, PyYAML and :mod:`gpujob_trainer.contract`.
Never kopf, a Kubernetes client, an HTTP library, torch, or another layer of the operator.

This module is the public face of the models: ``from gpujob_operator import api`` and
``api.GPUTrainingJobSpec``. The submodules are imported by name for everything else
(``from gpujob_operator.api import conditions``).
"""

from gpujob_operator.api.job import (
    API_VERSION,
    CRD_NAME,
    GROUP,
    KIND,
    MAX_JOB_NAME_LENGTH,
    NAME_RULE,
    PLURAL,
    SHORT_NAMES,
    SINGULAR,
    VERSION,
    GPUTrainingJob,
    dump,
)
from gpujob_operator.api.monitoring_spec import Monitoring, Thresholds, Window
from gpujob_operator.api.names import (
    ENV_JOB_NAME,
    ENV_METRICS_PORT,
    ENV_NAMESPACE,
    ENV_TOTAL_STEPS,
    GANG_KUEUE,
    GANG_NATIVE,
    GANG_NONE,
    GANGS,
    KUEUE_PRIORITY_LABEL,
    KUEUE_QUEUE_LABEL,
    RESERVED_ENV,
)
from gpujob_operator.api.pod.env import EnvVar
from gpujob_operator.api.pod.placement import Toleration
from gpujob_operator.api.pod.resources import GPU_RESOURCE, ResourceRequirements
from gpujob_operator.api.pod.template import PodTemplate
from gpujob_operator.api.pod.volumes import VOLUME_SOURCES
from gpujob_operator.api.spec import (
    MAX_NODES,
    GPUTrainingJobSpec,
    RunPolicy,
    Scheduling,
    Training,
    parse_spec,
    spec_problems,
)
from gpujob_operator.api.status import (
    Bottleneck,
    Condition,
    Failure,
    GangStatus,
    Goodput,
    GPUSummary,
    GPUTrainingJobStatus,
    HangEvidence,
    Progress,
    QueueForecast,
    RankBreakdown,
    Replicas,
    parse_status,
)

__all__ = [
    "API_VERSION",
    "CRD_NAME",
    "ENV_JOB_NAME",
    "ENV_METRICS_PORT",
    "ENV_NAMESPACE",
    "ENV_TOTAL_STEPS",
    "GANGS",
    "GANG_KUEUE",
    "GANG_NATIVE",
    "GANG_NONE",
    "GPU_RESOURCE",
    "GROUP",
    "KIND",
    "KUEUE_PRIORITY_LABEL",
    "KUEUE_QUEUE_LABEL",
    "MAX_JOB_NAME_LENGTH",
    "MAX_NODES",
    "NAME_RULE",
    "PLURAL",
    "RESERVED_ENV",
    "SHORT_NAMES",
    "SINGULAR",
    "VERSION",
    "VOLUME_SOURCES",
    "Bottleneck",
    "Condition",
    "EnvVar",
    "Failure",
    "GPUSummary",
    "GPUTrainingJob",
    "GPUTrainingJobSpec",
    "GPUTrainingJobStatus",
    "GangStatus",
    "Goodput",
    "HangEvidence",
    "Monitoring",
    "PodTemplate",
    "Progress",
    "QueueForecast",
    "RankBreakdown",
    "Replicas",
    "ResourceRequirements",
    "RunPolicy",
    "Scheduling",
    "Thresholds",
    "Toleration",
    "Training",
    "Window",
    "dump",
    "parse_spec",
    "parse_status",
    "spec_problems",
]
