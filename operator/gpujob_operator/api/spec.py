"""The GPUTrainingJob's spec: the image and command, the gang's shape, and its policies.

Every field carries a ``description`` (the CRD's schema and ``kubectl explain`` come from
it), and every server-side rule (CEL ``x-kubernetes-validations``) has a pydantic twin here
so a manifest the API server refuses is refused by the model too; rules are written once
with both twins (:mod:`gpujob_operator.api.rules`). The pod-facing part of the spec (env,
resources, ``template``) lives in :mod:`gpujob_operator.api.pod`, ``spec.monitoring`` in
:mod:`gpujob_operator.api.monitoring_spec`.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections.abc import Mapping
from typing import Annotated, Any, ClassVar, Final, Literal

from pydantic import ConfigDict, Field, ValidationError, model_validator

from gpujob_operator.api import rules as R
from gpujob_operator.api.base import Model as _Model
from gpujob_operator.api.base import Ruled as _Ruled
from gpujob_operator.api.base import quantity_value as _q
from gpujob_operator.api.monitoring_spec import Monitoring
from gpujob_operator.api.names import RESERVED_ENV, GangMechanism
from gpujob_operator.api.pod.env import EnvVar
from gpujob_operator.api.pod.resources import ResourceRequirements
from gpujob_operator.api.pod.template import PodTemplate
from gpujob_trainer import contract

MAX_NODES: Final = 9999


class Training(_Model):
    """How the trainer is launched and where it reports metrics."""

    total_steps: int | None = Field(
        default=None,
        ge=1,
        description="Planned training steps; gives percent and ETA when the trainer does not "
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
    host_network_ports: Literal["Auto", "Spec"] = Field(
        default="Auto",
        description="With spec.template.hostNetwork, the ranks share their node's ports with "
        "other jobs. Auto: the operator gives the job its own block of ports from "
        "20000-29999, chosen from its UID, instead of metricsPort and masterPort. Spec: "
        "metricsPort and masterPort as written; the operator scrapes the metrics ports only "
        "within its allowed node port range (GPUJOB_HOST_PORT_RANGE, default 20000-29999), "
        "else MetricsAvailable=False (HostPortsNotAllowed) and the job runs unscraped. "
        "Either way the ports are declared as hostPorts, so the scheduler never puts two "
        "pods that would collide on one node.",
    )


CleanPodPolicy = Literal["None", "Running", "All"]
RestartStrategy = Literal["InPlace", "Recreate"]


class Preflight(_Model):
    """A health check of every node before training (``python -m gpujob_trainer.preflight``)."""

    enabled: bool = Field(
        default=False,
        description="Run the check: each pod times a GEMM on each GPU (on the CPU without "
        "GPUs) and the gang one all-reduce, then starts spec.command; a node that fails exits "
        f"{contract.PREFLIGHT_EXIT_CODE} naming itself, the attempt restarts and the node is "
        "avoided (runPolicy.avoidBlamedNodes). The image needs gpujob_trainer and torch, "
        "and spec.command must be set (the check runs it).",
    )
    min_relative_speed: float = Field(
        default=0.5,
        ge=0,
        le=1,
        description="A node whose GEMM rate is below this share of the gang's median fails.",
    )
    min_gemm_tflops: float | None = Field(
        default=None,
        gt=0,
        alias="minGemmTFLOPS",
        description="A node whose slowest device's GEMM rate (TFLOP/s) is below this fails.",
    )
    min_peak_ratio: float = Field(
        default=0.25,
        ge=0,
        le=1,
        description="A GPU the trainer's peak table knows fails below this share of its "
        "dense bf16 peak.",
    )
    min_bus_bandwidth_gbps: float | None = Field(
        default=None,
        gt=0,
        alias="minBusBandwidthGBps",
        description="The gang fails (naming no node) when one all-reduce's bus bandwidth "
        "(GB/s) is below this.",
    )
    timeout_seconds: int = Field(
        default=600,
        ge=10,
        le=3600,
        description="How long the nodes wait for each other before the check fails (as "
        "torchrun's rendezvous, 600 by default: the first pod may start long before the last "
        "one's image is pulled). They meet on training.masterPort + 1.",
    )


class RunPolicy(_Model):
    """Retries, deadlines, cleanup and suspension of the whole gang."""

    backoff_limit: int = Field(
        default=3,
        ge=0,
        description="Gang restarts allowed after rank failures before the job fails.",
    )
    max_restarts_without_progress: int = Field(
        default=3,
        ge=1,
        le=64,
        description="Fail the job (NoProgressAcrossRestarts) at this many consecutive failed "
        "attempts that never passed the furthest step any attempt reached before them, "
        "instead of spending the rest of backoffLimit on a crash loop. Preemptions and "
        "evictions do not count; an attempt that passes that step resets the count; only "
        "jobs whose ranks reported a step are judged.",
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
    admission_retry_seconds: int = Field(
        default=600,
        ge=0,
        le=604800,
        description="How long creates an admission webhook denies are retried (with the "
        "refusal backoff) before the job fails (AdmissionWebhookDenied): budget and capacity "
        'webhooks deny "for now". Counted from the first denial in a row (kept in '
        "status.operatorState.admissionDenial across operator restarts); 0 fails at the first "
        "denial.",
    )
    avoid_blamed_nodes: bool = Field(
        default=True,
        description="Keep the next attempts off a node that an ended attempt blamed: a "
        "HardwareFault on one of its GPUs (XID, uncorrected ECC, a GPU lost), the rank a "
        "stall's hang evidence names, a Straggler that held avoidAfterWindows windows, a node "
        "that went NotReady, a failed pre-flight check. The pods get required node affinity "
        "NotIn for avoidSeconds (status.gang.avoidedNodes); never so many nodes that the gang "
        "cannot fit on the nodes' allocatable resources (then condition NodesAvoided False, "
        "TooFewNodes, and the least severe exclusions are given back).",
    )
    avoid_after_windows: int = Field(
        default=3,
        ge=1,
        le=100,
        description="A Straggler verdict blames its node once it held this many analysis "
        "windows (spec.monitoring.window.durationSeconds each) when its attempt ended.",
    )
    preflight: Preflight = Field(
        default_factory=Preflight,
        description="An opt-in health check of every node before training starts; a node "
        "that fails is named and avoided.",
    )
    avoid_seconds: int = Field(
        default=3600,
        ge=60,
        le=604800,
        description="How long a blamed node is avoided, from the end of the attempt that "
        "blamed it.",
    )
    restart_strategy: RestartStrategy | None = Field(
        default=None,
        description="How a gang restart restarts the pods. InPlace: every container of every "
        "pod restarts in place (the trainer container's restartPolicyRules with the action "
        "RestartAllContainers): the pods keep their UIDs, IPs, volumes, devices and nodes, "
        "and a supervisor (python -m gpujob_trainer.supervisor, so the image needs "
        "gpujob_trainer) holds every restarted rank until the whole gang has restarted. A pod "
        "on a blamed node, gone, evicted, or not restarted within inPlaceTimeoutSeconds is "
        "recreated instead. Recreate: every pod is deleted and created again. Unset: InPlace "
        "where enough nodes declare the RestartAllContainersOnContainerExits feature and the "
        "job has a command, else Recreate. The strategy in effect, and why, is in "
        "status.gang.restartStrategy.",
    )
    in_place_timeout_seconds: int = Field(
        default=60,
        ge=5,
        le=3600,
        description="How long an in-place restart may take to bring every pod to the new "
        "attempt (the old run stopped, the pod restarted), counted from the last pods' move to "
        "it; a pod that has not by then is deleted and created again (Recreate for that pod).",
    )


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
        json_schema_extra=R.immutable("spec.scheduling.gang"),
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
        server_only=tuple(R.immutable("spec.image")["x-kubernetes-validations"]),
    ),
]

_PROCS_EXPR = (
    "(has(self.training) && has(self.training.procsPerNode) ? self.training.procsPerNode : "
    "(has(self.gpusPerNode) && self.gpusPerNode > 0 ? self.gpusPerNode : 1))"
)


_LIMIT_MEMORY: Final = "self.resources.limits['memory']"
_HOLDS = (
    "(self.monitoring.profile.path == m.mountPath || self.monitoring.profile.path.startsWith("
    "m.mountPath.endsWith('/') ? m.mountPath : m.mountPath + '/'))"
)


def _holds(path: str, mount_path: str) -> bool:
    return path == mount_path or path.startswith(
        mount_path if mount_path.endswith("/") else mount_path + "/"
    )


def _profile_path_mounted(s: GPUTrainingJobSpec) -> bool:
    """``spec.monitoring.profile.path`` lies in a trainer volumeMount and in no read-only one."""
    path = s.monitoring.profile.path
    if path is None:
        return True
    holding = [
        m
        for m in (s.template.volume_mounts if s.template else None) or ()
        if _holds(path, m.mount_path)
    ]
    return bool(holding) and not any(m.read_only for m in holding)


def _shm_fits(s: GPUTrainingJobSpec) -> bool:
    shm = _q(s.template.shm_size) if s.template else None
    limit = _q((s.resources.limits or {}).get("memory")) if s.resources else None
    return shm is None or limit is None or shm <= limit


_SPEC_RULES: Final = (
    # The traces must outlive the container and be writable: a path outside every mount
    # would fill the container's own filesystem and vanish with it.
    R.Rule(
        "!has(self.monitoring) || !has(self.monitoring.profile) || "
        "!has(self.monitoring.profile.path) || (has(self.template) && "
        f"has(self.template.volumeMounts) && self.template.volumeMounts.exists(m, {_HOLDS}) && "
        f"!self.template.volumeMounts.exists(m, {_HOLDS} && has(m.readOnly) && m.readOnly))",
        "spec.monitoring.profile.path must lie inside one of the trainer's "
        "spec.template.volumeMounts, and inside no read-only one: the ranks write their "
        "traces there (unset: an emptyDir at /var/run/gpujob/profiles)",
        _profile_path_mounted,
        field_path=".monitoring.profile.path",
    ),
    # core/v1 accepts an empty program name, but no runtime can start it: the job would
    # only fail at run time, on every node, after the gang was scheduled.
    R.Rule(
        "!has(self.command) || size(self.command) == 0 || self.command[0] != ''",
        "spec.command[0] must not be empty: it is the program every rank runs",
        lambda s: not s.command or s.command[0] != "",
        field_path=".command",
    ),
    # The check runs before the command and then becomes it: an image's own entrypoint
    # cannot be wrapped.
    R.Rule(
        "!has(self.runPolicy) || !has(self.runPolicy.preflight) || "
        "!has(self.runPolicy.preflight.enabled) || !self.runPolicy.preflight.enabled || "
        "(has(self.command) && size(self.command) > 0)",
        "spec.runPolicy.preflight.enabled needs spec.command: the check runs before it and "
        "then starts it (the image's own entrypoint cannot be wrapped)",
        lambda s: not s.run_policy.preflight.enabled or bool(s.command),
        field_path=".runPolicy.preflight.enabled",
    ),
    # The supervisor wraps the command: an image's own entrypoint cannot be wrapped.
    R.Rule(
        "!has(self.runPolicy) || !has(self.runPolicy.restartStrategy) || "
        "self.runPolicy.restartStrategy != 'InPlace' || "
        "(has(self.command) && size(self.command) > 0)",
        "spec.runPolicy.restartStrategy InPlace needs spec.command: the restart supervisor "
        "runs it (the image's own entrypoint cannot be wrapped)",
        lambda s: s.run_policy.restart_strategy != "InPlace" or bool(s.command),
        field_path=".runPolicy.restartStrategy",
    ),
    # A memory-backed /dev/shm counts against the container's memory limit.
    R.Rule(
        "!has(self.template) || !has(self.template.shmSize) || !has(self.resources) || "
        "!has(self.resources.limits) || !('memory' in self.resources.limits) || "
        f"!{R.CEL_QUANTITY.format(x='self.template.shmSize')} || "
        f"!{R.CEL_QUANTITY.format(x=_LIMIT_MEMORY)} || "
        f"{R.CEL_QUANTITY_OF.format(x='self.template.shmSize')}.compareTo("
        f"{R.CEL_QUANTITY_OF.format(x=_LIMIT_MEMORY)}) <= 0",
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
    R.Rule(
        "!has(self.gpusFrom) || self.gpusFrom != 'ResourceClaims' || (has(self.resources) && "
        "has(self.resources.claims) && size(self.resources.claims) > 0)",
        "spec.gpusFrom ResourceClaims needs spec.resources.claims: the claims that bring the "
        "trainer its GPUs",
        lambda s: s.gpus_from != "ResourceClaims" or bool(s.resources and s.resources.claims),
    ),
)


class GPUTrainingJobSpec(_Ruled):
    """Desired state: the image and command, the gang's shape, and its policies."""

    RULES: ClassVar = _SPEC_RULES
    model_config = ConfigDict(
        json_schema_extra=R.cel_rules(
            *(r.schema() for r in _SPEC_RULES),
            R.cel(
                "!has(self.training) || !has(self.training.procsPerNode) || "
                "!has(self.gpusPerNode) || self.gpusPerNode == 0 || "
                "self.training.procsPerNode <= self.gpusPerNode",
                "spec.training.procsPerNode must be <= spec.gpusPerNode when GPUs are requested",
            ),
            R.cel(
                "!has(self.training) || self.training.launcher != 'torchrun' || "
                "(has(self.command) && size(self.command) > 0)",
                "spec.command is required when spec.training.launcher is torchrun",
            ),
            R.cel(
                "!has(self.training) || !has(self.training.metricsPort) || "
                "!has(self.training.masterPort) || "
                "self.training.masterPort < self.training.metricsPort || "
                f"self.training.masterPort >= self.training.metricsPort + {_PROCS_EXPR}",
                "spec.training.masterPort must not fall in the metrics port range "
                "metricsPort..metricsPort+procsPerNode-1",
            ),
            R.cel(
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
            **R.cel_rules(
                R.cel(
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
        json_schema_extra=R.immutable("spec.nodes"),
    )
    gpus_per_node: int = Field(
        default=0,
        ge=0,
        le=64,
        description="nvidia.com/gpu requested and limited per pod; 0 runs on CPU.",
    )
    gpus_from: Literal["DevicePlugin", "ResourceClaims"] = Field(
        default="DevicePlugin",
        description="Where the trainer's GPUs come from. DevicePlugin: gpusPerNode x "
        "nvidia.com/gpu requested and limited. ResourceClaims: the claims in "
        "spec.resources.claims (Dynamic Resource Allocation) bring them and no nvidia.com/gpu "
        "is requested; gpusPerNode still counts them (MFU, goodput, status.gang.gpus.requested).",
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


PARSE_KEEP_SECONDS: Final = 0.005
"""A spec whose validation took longer than this is remembered, by its content."""
PARSED_KEPT: Final = 16
_PARSED: dict[bytes, GPUTrainingJobSpec] = {}
_PARSED_LOCK = threading.Lock()


def parse_spec(spec: Mapping[str, Any] | GPUTrainingJobSpec) -> GPUTrainingJobSpec:
    """Validate a raw (camelCase) spec mapping, filling defaults; models pass through.

    The operator parses each job's spec on every pass, scrape round and forecast; a 400 KB
    template took 0.7 s each time, on the event loop. So a spec that was slow to validate is
    remembered by a digest of its JSON (a few ms to take for 400 KB): a body the watch
    delivers again with the same spec finds it. At most :data:`PARSED_KEPT` are kept, and
    none of a spec that validates quickly. Readers never change what they are given.
    """
    if isinstance(spec, GPUTrainingJobSpec):
        return spec
    try:
        text = json.dumps(dict(spec), sort_keys=True, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError):  # not JSON (a hand-written YAML's odd keys): no memory
        return GPUTrainingJobSpec.model_validate(dict(spec))
    key = hashlib.blake2b(text.encode(), digest_size=16).digest()
    kept = _PARSED.get(key)
    if kept is not None:
        return kept
    started = time.perf_counter()
    parsed = GPUTrainingJobSpec.model_validate(dict(spec))
    if time.perf_counter() - started > PARSE_KEEP_SECONDS:
        with _PARSED_LOCK:
            while len(_PARSED) >= PARSED_KEPT:
                del _PARSED[next(iter(_PARSED))]
            _PARSED[key] = parsed
    return parsed


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
