"""The GPUTrainingJob API: pydantic v2 models of spec and status.

This module is the single source of truth. :mod:`gpujob_operator.api.crd` turns it into the
CRD's OpenAPI schema (descriptions feed ``kubectl explain``), so every field carries a
``description``, and every server-side rule (CEL ``x-kubernetes-validations``) has a
pydantic twin here so a manifest the API server refuses is refused by the model too. The
pod-facing part of the spec (env, resources, ``template``) lives in
:mod:`gpujob_operator.api.podtemplate` and is re-exported here; rules are written once with both
twins (:mod:`gpujob_operator.api.rules`).

Wire format is camelCase; Python attributes are snake_case. Dump with
``model_dump(mode="json", exclude_none=True)`` (aliases are the default).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import datetime
from typing import Annotated, Any, ClassVar, Final, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PlainSerializer,
    ValidationError,
    WithJsonSchema,
    model_validator,
)

from gpujob_operator.api import rules as R
from gpujob_operator.api.base import Model as _Model
from gpujob_operator.api.base import Ruled as _Ruled
from gpujob_operator.api.base import quantity_value as _q
from gpujob_operator.api.conditions import format_time
from gpujob_operator.api.podtemplate import GPU_RESOURCE as GPU_RESOURCE
from gpujob_operator.api.podtemplate import VOLUME_SOURCES as VOLUME_SOURCES
from gpujob_operator.api.podtemplate import EnvVar as EnvVar
from gpujob_operator.api.podtemplate import PodTemplate as PodTemplate
from gpujob_operator.api.podtemplate import ResourceRequirements as ResourceRequirements
from gpujob_operator.api.podtemplate import Toleration as Toleration
from gpujob_trainer import contract

GROUP: Final = "gpujob.dev"
VERSION: Final = "v1alpha1"
API_VERSION: Final = f"{GROUP}/{VERSION}"
KIND: Final = "GPUTrainingJob"
PLURAL: Final = "gputrainingjobs"
SINGULAR: Final = "gputrainingjob"
SHORT_NAMES: Final = ("gtj", "gpujob")
CRD_NAME: Final = f"{PLURAL}.{GROUP}"

MAX_NODES: Final = 9999
# `<job>-node-<rank>` is a pod hostname (a DNS label, <= 63 chars): 53 + len("-node-9998").
MAX_JOB_NAME_LENGTH: Final = 53
JOB_NAME_PATTERN: Final = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"

# Env the operator owns (torchrun/PyTorchJob contract + gpujob's own). A user value for one
# of these would break the gang's rendezvous or the metrics contract, so the API refuses it.
# The metrics ones come from the shared, torch-free contract module; the contract does not
# define the job identity variables (yet), so those two are local.
ENV_METRICS_PORT: Final = contract.ENV_METRICS_PORT
ENV_TOTAL_STEPS: Final = contract.ENV_TOTAL_STEPS
ENV_JOB_NAME: Final = "GPUJOB_JOB_NAME"
ENV_NAMESPACE: Final = "GPUJOB_NAMESPACE"
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
)


def _cel(rule: str, message: str, field_path: str | None = None) -> dict[str, str]:
    out = {"rule": rule, "message": message}
    if field_path:
        out["fieldPath"] = field_path
    return out


def _rules(*rules: dict[str, str]) -> dict[str, Any]:
    return {"x-kubernetes-validations": list(rules)}


def _immutable(path: str) -> dict[str, Any]:
    return _rules(
        _cel(
            "self == oldSelf",
            f"{path} is immutable: delete the job and create a new one to change it",
        )
    )


# ---- reusable annotated types ---------------------------------------------------------

Time = Annotated[
    datetime,
    PlainSerializer(format_time, return_type=str, when_used="json"),
    WithJsonSchema({"type": "string", "format": "date-time"}),
]
"""A timestamp, written as RFC 3339 UTC with a Z, like Kubernetes' metav1.Time."""

Evidence = Annotated[
    dict[str, float | int | str],
    WithJsonSchema(
        {"type": "object", "additionalProperties": {"x-kubernetes-preserve-unknown-fields": True}}
    ),
]


class _StatusModel(_Model):
    """Base for status models: unknown fields ignored so an older operator can read."""

    model_config = ConfigDict(extra="ignore")


# ---- spec ------------------------------------------------------------------------------


class Training(_Model):
    """How the trainer is launched and where it reports metrics."""

    total_steps: int | None = Field(
        default=None,
        ge=1,
        description="Planned optimizer steps; gives percent and ETA when the trainer does not "
        "export its own target. Passed as GPUJOB_TOTAL_STEPS.",
    )
    metrics_port: int = Field(
        default=contract.DEFAULT_METRICS_PORT,
        ge=1024,
        le=65535,
        description="First metrics port: local rank i serves /metrics on metricsPort+i.",
    )
    procs_per_node: int | None = Field(
        default=None,
        ge=1,
        le=256,
        description="Processes (ranks) per node; default gpusPerNode, or 1 without GPUs.",
    )
    launcher: Literal["torchrun", "none"] = Field(
        default="torchrun",
        description="torchrun: the operator wraps command in torchrun with static rendezvous. "
        "none: command starts torchrun (or its own launcher) itself, reading PET_* env.",
    )
    master_port: int = Field(
        default=29500,
        ge=1,
        le=65535,
        description="Rendezvous port on rank 0 (MASTER_PORT).",
    )
    rdzv_timeout_seconds: int = Field(
        default=600,
        ge=1,
        description="How long ranks wait for each other at rendezvous before failing.",
    )


class Window(_Model):
    """The sliding window of scrapes the bottleneck analysis is computed over."""

    duration_seconds: int = Field(
        default=120, ge=10, le=3600, description="Length of the window in seconds."
    )
    min_scrapes: int = Field(
        default=3, ge=2, le=1000, description="Scrapes needed in the window before any verdict."
    )


# InputBound wins above the bound, so a warning level at or above it could never show.
_WARN_BELOW_BOUND: Final = (
    "spec.monitoring.thresholds.inputWarnRatio must be < inputBoundRatio: the warning level "
    "could never show"
)
# The window keeps scrapes no older than durationSeconds (window.py), so a window shorter
# than minScrapes-1 scrape intervals never holds enough scrapes for a verdict.
_WINDOW_HOLDS_MIN_SCRAPES: Final = (
    "spec.monitoring.window.durationSeconds must be >= scrapeIntervalSeconds x "
    "(window.minScrapes - 1): a shorter window never holds minScrapes scrapes, so no verdict "
    "could ever be made"
)


class Thresholds(_Model):
    """Per-verdict trigger levels (ratios 0..1); override the defaults per job."""

    model_config = ConfigDict(
        json_schema_extra=_rules(
            _cel(
                "!has(self.inputWarnRatio) || !has(self.inputBoundRatio) || "
                "self.inputWarnRatio < self.inputBoundRatio",
                _WARN_BELOW_BOUND,
            )
        )
    )

    input_bound_ratio: float = Field(
        default=0.20, ge=0, le=1, description="InputBound when data_wait/step time exceeds it."
    )
    input_warn_ratio: float = Field(
        default=0.05, ge=0, le=1, description="InputBound warning level of data_wait/step time."
    )
    comm_bound_ratio: float = Field(
        default=0.15,
        ge=0,
        le=1,
        description="CommunicationBound when exposed comm_wait/step time exceeds it.",
    )
    straggler_score: float = Field(
        default=0.75,
        ge=0,
        le=1,
        description="Straggler when the other ranks' median own time per step (step time "
        "minus data, comm, checkpoint and eval waits) over the slowest rank's falls below it.",
    )
    checkpoint_bound_ratio: float = Field(
        default=0.10,
        ge=0,
        le=1,
        description="CheckpointBound when the checkpoint phase's share of the time between "
        "steps (on the rank that spends most in it) exceeds it.",
    )
    eval_bound_ratio: float = Field(
        default=0.15,
        ge=0,
        le=1,
        description="EvalBound when the eval phase's share of the time between steps (on the "
        "rank that spends most in it) exceeds it.",
    )
    memory_pressure_ratio: float = Field(
        default=0.90,
        ge=0,
        le=1,
        description="MemoryPressure when reserved/total GPU memory exceeds it.",
    )
    gpu_underutilized_ratio: float = Field(
        default=0.50,
        ge=0,
        le=1,
        description="GPUUnderutilized when median GPU utilization is below it.",
    )

    @model_validator(mode="after")
    def _warn_below_bound(self) -> Thresholds:
        if self.input_warn_ratio >= self.input_bound_ratio:
            raise ValueError(_WARN_BELOW_BOUND)
        return self


class Monitoring(_Model):
    """Scraping of the ranks' /metrics, stall detection and bottleneck analysis."""

    model_config = ConfigDict(
        json_schema_extra=_rules(
            _cel(
                "!has(self.stallTimeoutSeconds) || !has(self.scrapeIntervalSeconds) || "
                "self.stallTimeoutSeconds >= self.scrapeIntervalSeconds",
                "spec.monitoring.stallTimeoutSeconds must be >= scrapeIntervalSeconds",
            ),
            _cel(
                "!has(self.window) || !has(self.window.durationSeconds) || "
                "!has(self.window.minScrapes) || !has(self.scrapeIntervalSeconds) || "
                "self.window.durationSeconds >= "
                "self.scrapeIntervalSeconds * (self.window.minScrapes - 1)",
                _WINDOW_HOLDS_MIN_SCRAPES,
            ),
        )
    )

    enabled: bool = Field(
        default=True, description="Scrape the ranks and analyze; off = no status.progress."
    )
    scrape_interval_seconds: int = Field(
        default=15, ge=1, le=3600, description="Seconds between scrapes of every rank."
    )
    stall_timeout_seconds: int = Field(
        default=300,
        ge=1,
        description="Stalled when no rank finished a step for this long (or k x the median "
        "step time, whichever is longer) and no rank is busy: a rank that changed phase "
        "within this time, or is in a checkpoint or an evaluation, is not hung.",
    )
    startup_timeout_seconds: int = Field(
        default=1800,
        ge=1,
        description="Before the first step (compilation, model init, data download) the "
        "job is Stalled only after this long (or stallTimeoutSeconds, if longer) without one.",
    )
    busy_timeout_seconds: int = Field(
        default=1800,
        ge=1,
        description="Longest one checkpoint or evaluation (the trainer's checkpoint and eval "
        "phases) may take before a rank in it counts as hung (or stallTimeoutSeconds, if "
        "longer).",
    )
    window: Window = Field(
        default_factory=Window,
        description="Sliding window of scrapes for the analysis.",
        json_schema_extra={"default": {}},
    )
    warmup_steps: int = Field(
        default=20, ge=0, description="Steps ignored by the analysis (compilation, warm caches)."
    )
    hysteresis_windows: int = Field(
        default=3,
        ge=1,
        le=100,
        description="Consecutive windows a verdict must hold before it is published.",
    )
    thresholds: Thresholds = Field(
        default_factory=Thresholds,
        description="Per-verdict thresholds.",
        json_schema_extra={"default": {}},
    )

    @model_validator(mode="after")
    def _stall_after_scrape(self) -> Monitoring:
        if self.stall_timeout_seconds < self.scrape_interval_seconds:
            raise ValueError("spec.monitoring.stallTimeoutSeconds must be >= scrapeIntervalSeconds")
        if self.window.duration_seconds < self.scrape_interval_seconds * (
            self.window.min_scrapes - 1
        ):
            raise ValueError(_WINDOW_HOLDS_MIN_SCRAPES)
        return self


CleanPodPolicy = Literal["None", "Running", "All"]


class RunPolicy(_Model):
    """Retries, deadlines, cleanup and suspension of the whole gang."""

    backoff_limit: int = Field(
        default=3,
        ge=0,
        description="Gang restarts allowed after rank failures before the job fails.",
    )
    retryable_exit_codes: list[Annotated[int, Field(ge=1, le=255)]] | None = Field(
        default=None,
        max_length=255,
        description="Unset: every failure is retried (up to backoffLimit). Set: only a root-"
        "cause exit code in this list is retried; any other exit code fails the job at once "
        "(NonRetryableExitCode); [] retries no exit code. Failures without an exit code "
        "(eviction, lost node) are always retried.",
        json_schema_extra={"x-kubernetes-list-type": "set"},
    )
    active_deadline_seconds: int | None = Field(
        default=None,
        ge=1,
        description="Fail the job (DeadlineExceeded) this long after startTime; the clock "
        "restarts on resume from suspension, as for batch/v1 Job.",
    )
    ttl_seconds_after_finished: int | None = Field(
        default=None,
        ge=0,
        description="Delete the job (and its pods) this long after it succeeded or failed.",
    )
    clean_pod_policy: CleanPodPolicy = Field(
        default="Running",
        description="Pods deleted when the job finishes: None keeps all, Running deletes the "
        "ones still running, All deletes every pod.",
    )
    suspend: bool = Field(
        default=False,
        description="true deletes the pods and keeps the job; false creates them again.",
    )
    restart_on_stall: bool = Field(
        default=False,
        description="Restart the gang (counted against backoffLimit) when the job is Stalled.",
    )


GangMechanism = Literal["None", "Native", "Kueue"]
GANG_NONE: Final = "None"
GANG_NATIVE: Final = "Native"
GANG_KUEUE: Final = "Kueue"
KUEUE_QUEUE_LABEL: Final = "kueue.x-k8s.io/queue-name"
KUEUE_PRIORITY_LABEL: Final = "kueue.x-k8s.io/priority-class"


class Scheduling(_Model):
    """How the gang gets its nodes: all pods at once, or none of them."""

    gang: GangMechanism | None = Field(
        default=None,
        description="None: the default scheduler places each pod on its own (a busy cluster "
        "can bind part of the gang). Native: a Kubernetes Workload and PodGroup (minCount = "
        "nodes) make kube-scheduler bind all pods or none (needs the GenericWorkload feature "
        "gate). Kueue: the job waits in the Kueue LocalQueue named by its "
        "kueue.x-k8s.io/queue-name label and its pods are created only once Kueue admits it. "
        "Unset: Kueue when the job carries that label, else the operator's default "
        "(GPUJOB_DEFAULT_GANG, None unless the platform set it). Decided when the job is "
        "first reconciled and kept in status.gang.mechanism.",
        json_schema_extra=_immutable("spec.scheduling.gang"),
    )


Image = Annotated[
    str,
    R.Checked(
        R.str_rule(
            "self == self.trim()",
            lambda v: v == v.strip(),
            "spec.image must not have leading or trailing whitespace",
        ),
        max_length=4096,
        min_length=1,
        server_only=tuple(_immutable("spec.image")["x-kubernetes-validations"]),
    ),
]

_PROCS_EXPR = (
    "(has(self.training) && has(self.training.procsPerNode) ? self.training.procsPerNode : "
    "(has(self.gpusPerNode) && self.gpusPerNode > 0 ? self.gpusPerNode : 1))"
)


def _shm_fits(s: GPUTrainingJobSpec) -> bool:
    shm = _q(s.template.shm_size) if s.template else None
    limit = _q((s.resources.limits or {}).get("memory")) if s.resources else None
    return shm is None or limit is None or shm <= limit


_SPEC_RULES: Final = (
    # A memory-backed /dev/shm counts against the container's memory limit.
    R.Rule(
        "!has(self.template) || !has(self.template.shmSize) || !has(self.resources) || "
        "!has(self.resources.limits) || !('memory' in self.resources.limits) || "
        "!isQuantity(string(self.template.shmSize)) || "
        "!isQuantity(string(self.resources.limits['memory'])) || "
        "quantity(string(self.template.shmSize)).compareTo("
        "quantity(string(self.resources.limits['memory']))) <= 0",
        "spec.template.shmSize must be <= spec.resources.limits.memory: /dev/shm is "
        "memory-backed and counts against the limit",
        _shm_fits,
    ),
    R.Rule(
        "!has(self.runPolicy) || !has(self.runPolicy.restartOnStall) || "
        "!self.runPolicy.restartOnStall || !has(self.monitoring) || "
        "!has(self.monitoring.enabled) || self.monitoring.enabled",
        "spec.runPolicy.restartOnStall needs spec.monitoring.enabled: only monitoring "
        "detects a stall",
        lambda s: not s.run_policy.restart_on_stall or s.monitoring.enabled,
    ),
    R.Rule(
        "!has(self.training) || !has(self.training.totalSteps) || !has(self.monitoring) || "
        "(has(self.monitoring.enabled) && !self.monitoring.enabled) || "
        "!has(self.monitoring.warmupSteps) || "
        "self.monitoring.warmupSteps < self.training.totalSteps",
        "spec.monitoring.warmupSteps must be < spec.training.totalSteps: the analysis skips "
        "the first warmupSteps steps, so no verdict could ever be made",
        lambda s: (
            s.training.total_steps is None
            or not s.monitoring.enabled
            or s.monitoring.warmup_steps < s.training.total_steps
        ),
    ),
)


class GPUTrainingJobSpec(_Ruled):
    """Desired state: the image and command, the gang's shape, and its policies."""

    RULES: ClassVar = _SPEC_RULES
    model_config = ConfigDict(
        json_schema_extra=_rules(
            *(r.schema() for r in _SPEC_RULES),
            _cel(
                "!has(self.training) || !has(self.training.procsPerNode) || "
                "!has(self.gpusPerNode) || self.gpusPerNode == 0 || "
                "self.training.procsPerNode <= self.gpusPerNode",
                "spec.training.procsPerNode must be <= spec.gpusPerNode when GPUs are requested",
            ),
            _cel(
                "!has(self.training) || self.training.launcher != 'torchrun' || "
                "(has(self.command) && size(self.command) > 0)",
                "spec.command is required when spec.training.launcher is torchrun",
            ),
            _cel(
                "!has(self.training) || !has(self.training.metricsPort) || "
                "!has(self.training.masterPort) || "
                "self.training.masterPort < self.training.metricsPort || "
                f"self.training.masterPort >= self.training.metricsPort + {_PROCS_EXPR}",
                "spec.training.masterPort must not fall in the metrics port range "
                "metricsPort..metricsPort+procsPerNode-1",
            ),
            _cel(
                "!has(self.training) || !has(self.training.metricsPort) || "
                f"self.training.metricsPort + {_PROCS_EXPR} - 1 <= 65535",
                "spec.training.metricsPort+procsPerNode-1 must be <= 65535",
            ),
        )
    )

    image: Image = Field(
        description="Container image of every rank (e.g. the gpujob trainer image).",
    )
    command: list[str] | None = Field(
        default=None,
        description='Trainer command, e.g. ["python", "-m", "pkg.train"]. With launcher '
        "torchrun, python -m M / python S are run as torchrun -m M / torchrun S, anything "
        "else as torchrun --no-python CMD.",
    )
    args: list[str] | None = Field(default=None, description="Arguments appended to command.")
    env: list[EnvVar] | None = Field(
        default=None,
        max_length=256,
        description="Extra environment. The rendezvous variables (MASTER_ADDR, MASTER_PORT, "
        "WORLD_SIZE, RANK, PET_*) and GPUJOB_* contract variables are the operator's.",
        json_schema_extra={
            "x-kubernetes-list-type": "map",
            "x-kubernetes-list-map-keys": ["name"],
            **_rules(
                _cel(
                    "self.all(e, !(e.name in [" + ", ".join(f"'{n}'" for n in RESERVED_ENV) + "]))",
                    "spec.env must not set " + ", ".join(RESERVED_ENV) + ": the operator sets them",
                )
            ),
        },
    )
    nodes: int = Field(
        default=1,
        ge=1,
        le=MAX_NODES,
        description="Number of nodes (pods) in the gang; each runs procsPerNode ranks.",
        json_schema_extra=_immutable("spec.nodes"),
    )
    gpus_per_node: int = Field(
        default=0,
        ge=0,
        le=64,
        description="nvidia.com/gpu requested and limited per pod; 0 runs on CPU.",
    )
    resources: ResourceRequirements | None = Field(
        default=None, description="Per-pod resources besides GPUs (core/v1 requests/limits)."
    )
    template: PodTemplate | None = Field(
        default=None, description="Pod settings copied into every pod."
    )
    training: Training = Field(
        default_factory=Training,
        description="Launcher, rendezvous and metrics settings.",
        json_schema_extra={"default": {}},
    )
    monitoring: Monitoring = Field(
        default_factory=Monitoring,
        description="Scraping, stall detection and bottleneck thresholds.",
        json_schema_extra={"default": {}},
    )
    run_policy: RunPolicy = Field(
        default_factory=RunPolicy,
        description="Retries, deadlines, cleanup and suspension.",
        json_schema_extra={"default": {}},
    )
    scheduling: Scheduling | None = Field(
        default=None,
        description="Gang admission: Native (Workload/PodGroup), Kueue, or None.",
    )

    @model_validator(mode="after")
    def _cross_field(self) -> GPUTrainingJobSpec:
        t = self.training
        if t.procs_per_node is not None and 0 < self.gpus_per_node < t.procs_per_node:
            raise ValueError(
                "spec.training.procsPerNode must be <= spec.gpusPerNode when GPUs are requested"
            )
        if t.launcher == "torchrun" and not self.command:
            raise ValueError("spec.command is required when spec.training.launcher is torchrun")
        procs = self.procs_per_node
        if t.metrics_port <= t.master_port < t.metrics_port + procs:
            raise ValueError(
                "spec.training.masterPort must not fall in the metrics port range "
                "metricsPort..metricsPort+procsPerNode-1"
            )
        if t.metrics_port + procs - 1 > 65535:
            raise ValueError("spec.training.metricsPort+procsPerNode-1 must be <= 65535")
        reserved = sorted({e.name for e in self.env or ()} & set(RESERVED_ENV))
        if reserved:
            raise ValueError(
                "spec.env must not set " + ", ".join(RESERVED_ENV) + ": the operator sets them"
            )
        names = [e.name for e in self.env or ()]
        if len(names) != len(set(names)):
            raise ValueError("spec.env: duplicate variable names")
        return self

    @property
    def procs_per_node(self) -> int:
        """Effective ranks per node: explicit, else gpusPerNode, else 1 on CPU."""
        if self.training.procs_per_node is not None:
            return self.training.procs_per_node
        return self.gpus_per_node if self.gpus_per_node > 0 else 1

    @property
    def total_gpus(self) -> int:
        """GPUs of the whole gang (nodes x gpusPerNode)."""
        return self.nodes * self.gpus_per_node


# ---- status ----------------------------------------------------------------------------


class Condition(_StatusModel):
    """A metav1.Condition: one aspect of the job's state and when it last changed."""

    type: str = Field(
        max_length=316,
        description="Condition type: Created, Running, Restarting, Suspended, Succeeded, "
        "Failed, Stalled, MetricsAvailable or BottleneckDetected.",
    )
    status: Literal["True", "False", "Unknown"] = Field(description="True, False or Unknown.")
    reason: str = Field(
        default="",
        max_length=1024,
        description="CamelCase reason for the last transition, e.g. Unschedulable.",
    )
    message: str = Field(default="", max_length=32768, description="Human-readable details.")
    last_transition_time: Time | None = Field(default=None, description="When status last changed.")
    observed_generation: int | None = Field(
        default=None, ge=0, description="metadata.generation the condition was computed for."
    )


class Replicas(_StatusModel):
    """Pod counts of the current gang attempt."""

    desired: int = Field(default=0, description="Pods the gang needs (spec.nodes).")
    created: int = Field(default=0, description="Pods of the current attempt that exist.")
    pending: int = Field(default=0, description="Pods waiting to be scheduled or started.")
    running: int = Field(default=0, description="Pods running.")
    succeeded: int = Field(default=0, description="Pods whose trainer exited 0.")
    failed: int = Field(default=0, description="Pods whose trainer failed.")


class Progress(_StatusModel):
    """Training progress from the ranks' metrics (latest values, never time series)."""

    step: int | None = Field(
        default=None, description="Optimizer steps completed (min over ranks)."
    )
    total_steps: int | None = Field(default=None, description="Target steps.")
    percent: float | None = Field(default=None, description="step/totalSteps in percent.")
    epoch: float | None = Field(default=None, description="Current epoch.")
    samples_per_second: float | None = Field(
        default=None, description="Global training throughput over the window."
    )
    tokens_per_second: float | None = Field(
        default=None, description="Global token throughput over the window, when exported."
    )
    eta_seconds: float | None = Field(default=None, description="Estimated seconds to totalSteps.")
    estimated_completion_time: Time | None = Field(
        default=None, description="Now plus etaSeconds at the last analysis."
    )
    last_step_time: Time | None = Field(
        default=None, description="When a rank last finished a step."
    )
    loss: float | None = Field(default=None, description="Last reported training loss.")


class RankBreakdown(_StatusModel):
    """One rank's step split: own work vs waits (mean seconds per step over the window)."""

    rank: int = Field(description="Global rank.")
    role: str = Field(description="slowest, median or fastest, by own time per step.")
    pod: str | None = Field(default=None, description="Pod of the rank.")
    node: str | None = Field(default=None, description="Node of the rank.")
    step_seconds: float | None = Field(default=None, description="Whole step.")
    own_seconds: float | None = Field(
        default=None,
        description="The rank's own work: step minus data wait, comm wait, checkpoint, eval.",
    )
    compute_seconds: float | None = Field(
        default=None, description="Forward, backward and optimizer (part of own)."
    )
    other_seconds: float | None = Field(
        default=None,
        description="Own work outside forward/backward/optimizer: loss, preprocessing, metrics.",
    )
    data_wait_seconds: float | None = Field(default=None, description="Waiting for a batch.")
    comm_wait_seconds: float | None = Field(
        default=None, description="Exposed wait for gradient all-reduce (for slower peers too)."
    )
    checkpoint_seconds: float | None = Field(default=None, description="Checkpointing.")
    eval_seconds: float | None = Field(default=None, description="Evaluation.")


class Bottleneck(_StatusModel):
    """What limits the job's speed now, with the numbers that justify the verdict."""

    verdict: str = Field(
        description="InputBound, CheckpointBound, EvalBound, CommunicationBound, Straggler, "
        "MemoryPressure, GPUUnderutilized, Throttled, Stalled, HardwareFault or Healthy."
    )
    severity: str | None = Field(default=None, description="Info, Warning or Critical.")
    summary: str | None = Field(default=None, description="One-line explanation.")
    evidence: Evidence | None = Field(
        default=None, description="Numbers (and labels) behind the verdict, by name."
    )
    advice: str | None = Field(default=None, description="What to try.")
    rank: int | None = Field(default=None, description="Global rank concerned, if one.")
    pod: str | None = Field(default=None, description="Pod concerned, if one.")
    node: str | None = Field(default=None, description="Node concerned, if one.")
    gpu_uuid: str | None = Field(
        default=None, alias="gpuUUID", description="GPU concerned (NVML UUID), if one."
    )
    since: Time | None = Field(default=None, description="When this verdict was first published.")
    breakdown: list[RankBreakdown] | None = Field(
        default=None,
        max_length=8,
        description="Mean seconds per step of a few ranks over the window: the slowest "
        "three by own time, the median and the fastest (never one entry per rank).",
    )


class GPUSummary(_StatusModel):
    """The gang's GPUs as seen by NVML on the ranks."""

    requested: int | None = Field(default=None, description="GPUs requested (nodes x gpusPerNode).")
    observed: int | None = Field(default=None, description="GPUs reporting telemetry.")
    product: str | None = Field(default=None, description="GPU model name.")
    mean_utilization_ratio: float | None = Field(
        default=None, description="Mean GPU utilization 0..1 over the window."
    )
    max_memory_used_ratio: float | None = Field(
        default=None, description="Highest used/total GPU memory 0..1."
    )
    telemetry: str | None = Field(
        default=None, description="Available, or Unavailable (no GPU or no NVML) with why."
    )


class Failure(_StatusModel):
    """The root cause of the job's failure, or of its latest gang restart."""

    pod: str | None = Field(default=None, description="Pod whose failure came first.")
    container: str | None = Field(default=None, description="Container that failed.")
    node_rank: int | None = Field(default=None, description="Node rank of that pod.")
    attempt: int | None = Field(default=None, description="Gang attempt it belonged to.")
    exit_code: int | None = Field(default=None, description="Container exit code, if any.")
    reason: str | None = Field(
        default=None, description="OOMKilled, Error, Evicted, DeadlineExceeded, PodLost, ..."
    )
    message: str | None = Field(default=None, description="Kubernetes' or the trainer's message.")
    log_tail: str | None = Field(
        default=None, description="Last lines of the failed container's log."
    )
    time: Time | None = Field(default=None, description="When the container terminated.")


class GangStatus(_StatusModel):
    """Where the gang stands with its admission mechanism (spec.scheduling.gang)."""

    mechanism: GangMechanism | None = Field(
        default=None, description="The mechanism in effect: None, Native or Kueue."
    )
    workload: str | None = Field(
        default=None,
        description="Native: the scheduling.k8s.io Workload; Kueue: the kueue.x-k8s.io Workload.",
    )
    pod_group: str | None = Field(
        default=None, description="Native: the PodGroup of the current attempt."
    )
    queue: str | None = Field(default=None, description="Kueue: the LocalQueue.")
    cluster_queue: str | None = Field(
        default=None, description="Kueue: the ClusterQueue that admitted the job."
    )
    admitted: bool | None = Field(
        default=None, description="Kueue: whether the job holds its quota now."
    )
    flavors: dict[str, str] | None = Field(
        default=None, description="Kueue: the ResourceFlavor assigned to each resource."
    )
    preemptions: int | None = Field(
        default=None,
        description="Times the gang was preempted or evicted (by Kueue, by kube-scheduler "
        "for a higher-priority pod, by an eviction such as kubectl drain): restarts that are "
        "not failures and not counted against backoffLimit.",
    )


class Display(_StatusModel):
    """Pre-formatted strings for `kubectl get` columns (JSONPath cannot format)."""

    progress: str | None = Field(default=None, description='e.g. "41.3%".')
    eta: str | None = Field(default=None, description='e.g. "18m20s".')
    throughput: str | None = Field(default=None, description='e.g. "2840 samples/s".')
    bottleneck: str | None = Field(default=None, description='e.g. "Straggler(r13)".')


Phase = Literal["Pending", "Running", "Restarting", "Suspended", "Succeeded", "Failed"]


class GPUTrainingJobStatus(_StatusModel):
    """Observed state, written by the operator through the status subresource."""

    observed_generation: int | None = Field(
        default=None, description="metadata.generation the status was computed for."
    )
    conditions: list[Condition] | None = Field(
        default=None,
        description="Latest observations of the job's state, one per type.",
        json_schema_extra={
            "x-kubernetes-list-type": "map",
            "x-kubernetes-list-map-keys": ["type"],
        },
    )
    phase: Phase | None = Field(
        default=None,
        description="Display phase derived from conditions: Pending, Running, Restarting, "
        "Suspended, Succeeded or Failed.",
    )
    attempt: int | None = Field(
        default=None,
        description="Current gang attempt (pod label gpujob.dev/attempt); bumped on each gang "
        "restart and on suspension.",
    )
    restarts: int | None = Field(
        default=None, description="Gang restarts so far, counted against backoffLimit."
    )
    replicas: Replicas | None = Field(
        default=None, description="Pod counts of the current attempt."
    )
    total_gpus: int | None = Field(
        default=None, alias="totalGPUs", description="nodes x gpusPerNode (for kubectl get)."
    )
    start_time: Time | None = Field(
        default=None, description="When the pods were first created (reset on resume)."
    )
    completion_time: Time | None = Field(
        default=None, description="When the job succeeded or failed."
    )
    next_attempt_time: Time | None = Field(
        default=None,
        description="When the pods of the next gang attempt will be created: set while a gang "
        "restart backs off (10 s, 20 s, 40 s ... capped, like batch/v1 Job) or a refused pod "
        "create is retried.",
    )
    progress: Progress | None = Field(default=None, description="Training progress.")
    bottleneck: Bottleneck | None = Field(default=None, description="Current bottleneck verdict.")
    gpus: GPUSummary | None = Field(default=None, description="GPU summary.")
    failure: Failure | None = Field(
        default=None, description="Root cause of the failure or of the latest gang restart."
    )
    display: Display | None = Field(default=None, description="Strings for kubectl get columns.")
    gang: GangStatus | None = Field(
        default=None, description="Gang admission: mechanism, PodGroup or Kueue queue state."
    )


class GPUTrainingJob(BaseModel):
    """A multi-node, multi-GPU PyTorch training job run as a gang of torchrun pods."""

    model_config = ConfigDict(extra="forbid", validate_by_name=True, serialize_by_alias=True)

    api_version: Literal["gpujob.dev/v1alpha1"] = Field(
        default="gpujob.dev/v1alpha1", alias="apiVersion", description="gpujob.dev/v1alpha1"
    )
    kind: Literal["GPUTrainingJob"] = Field(default=KIND, description="GPUTrainingJob")
    metadata: dict[str, Any] = Field(default_factory=dict, description="Standard object metadata.")
    spec: GPUTrainingJobSpec = Field(description="Desired state.")
    status: GPUTrainingJobStatus | None = Field(default=None, description="Observed state.")

    @model_validator(mode="after")
    def _name(self) -> GPUTrainingJob:

        name = self.metadata.get("name")
        if isinstance(name, str) and not (
            len(name) <= MAX_JOB_NAME_LENGTH and re.match(JOB_NAME_PATTERN, name)
        ):
            raise ValueError(NAME_RULE_MESSAGE)
        return self


NAME_RULE_MESSAGE: Final = (
    f"metadata.name must be a DNS-1035 label of at most {MAX_JOB_NAME_LENGTH} characters "
    "(it names the headless Service and the pods' hostnames)"
)
NAME_RULE: Final = _cel(
    f"size(self.metadata.name) <= {MAX_JOB_NAME_LENGTH} && "
    f"self.metadata.name.matches('{JOB_NAME_PATTERN}')",
    NAME_RULE_MESSAGE,
)


def parse_spec(spec: Mapping[str, Any] | GPUTrainingJobSpec) -> GPUTrainingJobSpec:
    """Validate a raw (camelCase) spec mapping, filling defaults; models pass through."""
    if isinstance(spec, GPUTrainingJobSpec):
        return spec
    return GPUTrainingJobSpec.model_validate(dict(spec))


def spec_problems(error: ValidationError) -> str:
    """A refused spec's problems as the API server words them: ``spec.<path>: <message>``.

    For the operator's status when a stored job no longer passes the model (created before
    a rule existed, or under an older CRD): the same words ``kubectl apply`` would show.
    """
    out = []
    for e in error.errors():
        path = "spec" + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in e["loc"])
        message = str(e["msg"]).removeprefix("Value error, ")
        out.append(f"{path}: {message}")
    return "; ".join(out)


def parse_status(status: Mapping[str, Any] | None) -> GPUTrainingJobStatus:
    """Read a raw status mapping leniently (unknown keys ignored, absent = empty)."""
    return GPUTrainingJobStatus.model_validate(dict(status or {}))


def dump(model: BaseModel) -> dict[str, Any]:
    """Wire-format dict: camelCase, JSON types, unset optionals omitted."""
    return model.model_dump(mode="json", by_alias=True, exclude_none=True)
