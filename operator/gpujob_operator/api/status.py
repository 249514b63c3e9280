"""The GPUTrainingJob's status: the user's contract, what the operator observed.

Thirteen top-level fields a user can hold in mind (the README's status table lists each,
and a unit test pins them): phase and conditions, progress, the bottleneck verdict with its
evidence, the gang (attempt, restarts, pods, GPUs, admission, start forecast), the root
cause of a failure, the hang evidence, the latest profile, goodput and the strings of
``kubectl get``. The
operator's own bookkeeping lives apart, in ``operatorState`` (:mod:`.operatorstate`). Read
leniently: unknown fields are ignored, so an older operator can read a newer one's status.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import Field, WithJsonSchema

from gpujob_operator.api.conditions import MESSAGE_MAX_LENGTH, STALLED, TRUE, find
from gpujob_operator.api.names import GangMechanism
from gpujob_operator.api.operatorstate import OperatorState
from gpujob_operator.api.statusbase import StatusModel, Time

Evidence = Annotated[
    dict[str, float | int | str],
    WithJsonSchema(
        {"type": "object", "additionalProperties": {"x-kubernetes-preserve-unknown-fields": True}}
    ),
]


class Condition(StatusModel):
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
    message: str = Field(
        default="", max_length=MESSAGE_MAX_LENGTH, description="Human-readable details."
    )
    last_transition_time: Time | None = Field(default=None, description="When status last changed.")
    observed_generation: int | None = Field(
        default=None, ge=0, description="metadata.generation the condition was computed for."
    )


class Replicas(StatusModel):
    """Pod counts of the current gang attempt."""

    desired: int = Field(default=0, description="Pods the gang needs (spec.nodes).")
    created: int = Field(default=0, description="Pods of the current attempt that exist.")
    pending: int = Field(default=0, description="Pods waiting to be scheduled or started.")
    running: int = Field(default=0, description="Pods running.")
    succeeded: int = Field(default=0, description="Pods whose trainer exited 0.")
    failed: int = Field(default=0, description="Pods whose trainer failed.")


class Progress(StatusModel):
    """Training progress from the ranks' metrics (latest values, never time series)."""

    step: int | None = Field(
        default=None,
        description="The run's training steps completed (min over ranks of the step each "
        "rank's process started or resumed from plus its own steps). Between a gang restart "
        "and the new attempt's first step, the last known step.",
    )
    furthest_step: int | None = Field(
        default=None,
        description="The furthest step any attempt reached: never goes down, across "
        "resumes, gang restarts and operator restarts.",
    )
    resumed_from_step: int | None = Field(
        default=None,
        description="The step the current attempt resumed from (a checkpoint's, min over "
        "its ranks); absent on a fresh start.",
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
    eta_seconds: float | None = Field(
        default=None,
        description="Estimated seconds to totalSteps: the remaining steps over the step rate "
        "since the first scrape after warm-up of the attempt's latest start or resume (an "
        "EWMA of the recent rate while that basis is young).",
    )
    eta_unavailable: str | None = Field(
        default=None,
        max_length=1024,
        description="Why there is no ETA, starting with a word: restarting, resuming, "
        "measuring (warm-up), no target, suspended, failed.",
    )
    estimated_completion_time: Time | None = Field(
        default=None, description="Now plus etaSeconds at the last analysis."
    )
    last_step_time: Time | None = Field(
        default=None, description="When a rank last finished a step."
    )
    loss: float | None = Field(default=None, description="Last reported training loss.")
    step_seconds_p50: float | None = Field(
        default=None,
        description="Median step time over the window, every rank's steps pooled (from the "
        "step time histogram, interpolated within its buckets).",
    )
    step_seconds_p95: float | None = Field(
        default=None, description="95th percentile step time over the window, likewise."
    )
    checkpoint_ratio: float | None = Field(
        default=None,
        description="Share of step time in the checkpoint phase since the ranks started "
        "(the rank that spends most; the others wait for it).",
    )
    eval_ratio: float | None = Field(
        default=None, description="Share of step time in the eval phase, likewise."
    )
    mfu: float | None = Field(
        default=None,
        description="Model FLOPs utilisation (0..1): the ranks' model FLOP/s over their GPUs' "
        "dense peak at the training precision, median over ranks.",
    )
    achieved_tflops_per_gpu: float | None = Field(
        default=None,
        alias="achievedTFLOPSPerGPU",
        description="Model TFLOP/s per GPU (median over ranks).",
    )
    peak_tflops_per_gpu: float | None = Field(
        default=None,
        alias="peakTFLOPSPerGPU",
        description="The dense peak MFU is taken against: spec.monitoring.peakTFLOPSPerGPU, "
        "else the trainer's table for its GPU and precision.",
    )
    mfu_unavailable: str | None = Field(
        default=None, description="Why there is no MFU (no FLOP count, unknown GPU, FP8 ...)."
    )


class RankBreakdown(StatusModel):
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
    h2d_seconds: float | None = Field(
        default=None,
        alias="h2dSeconds",
        description="Copying batches to the GPU (the h2d phase, part of own).",
    )
    comm_wait_seconds: float | None = Field(
        default=None, description="Exposed wait for gradient all-reduce (for slower peers too)."
    )
    checkpoint_seconds: float | None = Field(default=None, description="Checkpointing.")
    eval_seconds: float | None = Field(default=None, description="Evaluation.")
    mfu: float | None = Field(default=None, description="The rank's model FLOPs utilisation.")


class Bottleneck(StatusModel):
    """What limits the job's speed now, with the numbers that justify the verdict."""

    verdict: str = Field(
        description="InputBound, TransferBound, CheckpointBound, EvalBound, "
        "CommunicationBound, Straggler, DataParallelImbalance, MemoryPressure, "
        "GPUUnderutilized, Throttled, ComputeBound, Stalled, HardwareFault or Healthy."
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


class GPUSummary(StatusModel):
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


class Failure(StatusModel):
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


BlameReason = Literal["HardwareFault", "Preflight", "Stalled", "Straggler", "NodeNotReady"]


class AvoidedNode(StatusModel):
    """A node an ended attempt blamed, which the next attempts' pods are kept off."""

    node: str = Field(max_length=253, description="The node's name.")
    reason: BlameReason = Field(
        description="HardwareFault, Preflight (its pre-flight check failed), Stalled (the "
        "rank the hang evidence named), Straggler (held spec.runPolicy.avoidAfterWindows "
        "windows) or NodeNotReady."
    )
    message: str | None = Field(
        default=None, max_length=1024, description="The verdict or event that blamed it."
    )
    attempt: int | None = Field(default=None, description="The attempt that blamed it.")
    since: Time | None = Field(default=None, description="When that attempt ended.")
    expires: Time | None = Field(
        default=None, description="When it is no longer avoided (spec.runPolicy.avoidSeconds)."
    )


class RestartStrategyStatus(StatusModel):
    """How the current attempt's pods restart (spec.runPolicy.restartStrategy), and why."""

    strategy: Literal["InPlace", "Recreate"] = Field(
        description="InPlace: the pods restart in place; Recreate: they are deleted and "
        "created again."
    )
    reason: str = Field(
        max_length=128,
        description="Why: Requested, NodesDeclareIt, FeatureNotDeclared, NodesUnknown, "
        "NoCommand, SupervisorMissing.",
    )
    message: str | None = Field(default=None, max_length=1024, description="In words.")


class QueueForecast(StatusModel):
    """When a waiting job is forecast to start, and, once it started, how far off that was."""

    estimated_start_time: Time | None = Field(
        default=None,
        description="Earliest time at which enough GPUs are free for the whole gang, the jobs "
        "ahead of it that fit starting first (in a StrictFIFO ClusterQueue, every job ahead).",
    )
    latest_start_time: Time | None = Field(
        default=None,
        description="With confidence LowerBound: the latest start, where holders without "
        "an ETA never finishing still leaves a finite one.",
    )
    confidence: Literal["Exact", "LowerBound", "Unknown"] | None = Field(
        default=None,
        description="Exact (as exact as the holders' ETAs), LowerBound (holders without an "
        "ETA, named in reason, could delay it, or it starts past a job ahead that does not fit "
        "yet) or Unknown (cannot start as asked; see reason).",
    )
    basis: str | None = Field(
        default=None,
        max_length=1024,
        description='What it waits for, e.g. "after job team/a end; 1 ahead in queue".',
    )
    reason: str | None = Field(
        default=None, max_length=1024, description="Why the confidence is not Exact."
    )
    ahead: int | None = Field(default=None, description="Waiting jobs ahead of it in its queue.")
    waits_for: list[str] | None = Field(
        default=None,
        max_length=8,
        description="The holders whose end lets it start (jobs, pods or Workloads).",
    )
    computed_at: Time | None = Field(default=None, description="When the forecast was made.")
    forecast_error_seconds: float | None = Field(
        default=None,
        description="Set once the job started: actual start minus the last estimatedStartTime "
        "(positive: it started later than forecast).",
    )


class HangEvidence(StatusModel):
    """What every rank was doing when the job was last found stalled, compared."""

    attempt: int | None = Field(default=None, description="Gang attempt that stalled.")
    stalled_since: Time | None = Field(
        default=None,
        description="The Stalled condition's lastTransitionTime: which stall this is about "
        "(evidence is taken once per stall).",
    )
    captured_at: Time | None = Field(default=None, description="When the ranks were asked.")
    summary: str | None = Field(
        default=None,
        max_length=4096,
        description="The answer in one line: which rank is not where the others are, and "
        "where it is instead.",
    )
    culprits: list[int] | None = Field(
        default=None,
        max_length=64,
        description="Ranks named as not where the others are (or silent).",
    )
    silent: list[int] | None = Field(
        default=None, max_length=64, description="Ranks that did not answer at all."
    )
    pod: str | None = Field(default=None, description="Pod of the first rank named.")
    node: str | None = Field(default=None, description="Node of the first rank named.")
    gpu: str | None = Field(
        default=None, description="CUDA device UUID of the first rank named, when known."
    )
    config_map: str | None = Field(
        default=None,
        description="ConfigMap (owned by the job, one per attempt) with every rank's stacks "
        "and recent collectives: kubectl get configmap NAME -o jsonpath='{.data}'.",
    )
    note: str | None = Field(
        default=None,
        max_length=1024,
        description="Why the ConfigMap is missing or cut short, when it is.",
    )


ProfileState = Literal["Requested", "Capturing", "Captured", "Failed", "Refused"]


class ProfileRankFailure(StatusModel):
    """A rank that gave no usable profile, and why."""

    rank: int = Field(description="Global rank.")
    why: str = Field(default="", max_length=512, description="Why its profile is missing.")


class ProfileRefusal(StatusModel):
    """A request refused while a capture was under way (that capture's record stays)."""

    request: str | None = Field(default=None, max_length=256, description="Its value.")
    id: str | None = Field(default=None, max_length=64, description="Its id.")
    reason: str | None = Field(default=None, max_length=1024, description="Why refused.")
    at: Time | None = Field(default=None, description="When it was refused.")


class ProfileRecord(StatusModel):
    """The latest profile asked of the ranks (annotation gpujob.dev/profile, gpujob profile,
    or spec.monitoring.profileOnVerdict) and its answer."""

    request: str | None = Field(
        default=None,
        max_length=256,
        description="The annotation value as the operator saw it (a new value is a new "
        "request); empty for an automatic capture.",
    )
    id: str | None = Field(
        default=None, max_length=64, description="The capture's id (the trace files carry it)."
    )
    state: ProfileState | None = Field(
        default=None, description="Requested, Capturing, Captured, Failed or Refused."
    )
    reason: str | None = Field(
        default=None, max_length=1024, description="Why it was refused or failed."
    )
    requested_at: Time | None = Field(default=None, description="When the operator took it.")
    captured_at: Time | None = Field(
        default=None, description="When the last rank's answer came in."
    )
    steps: int | None = Field(default=None, description="Training steps profiled.")
    ranks: list[int] | None = Field(default=None, max_length=256, description="The ranks asked.")
    auto: bool | None = Field(
        default=None, description="Taken by spec.monitoring.profileOnVerdict, not on request."
    )
    attempt: int | None = Field(default=None, description="Gang attempt profiled.")
    path: str | None = Field(
        default=None,
        max_length=4096,
        description="Directory of the trace files in the pods (GPUJOB_PROFILE_DIR).",
    )
    answer: str | None = Field(
        default=None,
        max_length=1024,
        description='The comparison in one line, e.g. "rank 13: aten::mm 41% vs 22% on the '
        'median rank (rank 4)".',
    )
    slowest_rank: int | None = Field(
        default=None, description="The rank with the most busy time per step."
    )
    median_rank: int | None = Field(
        default=None, description="The rank at the lower median of busy time per step."
    )
    operation: str | None = Field(
        default=None,
        max_length=256,
        description="The operation whose time per step differs most between those two.",
    )
    config_map: str | None = Field(
        default=None,
        description="ConfigMap (owned by the job) with the comparison and every rank's "
        "summary: kubectl get configmap NAME -o jsonpath='{.data.summary}'.",
    )
    failed_ranks: list[ProfileRankFailure] | None = Field(
        default=None, max_length=64, description="Ranks that gave no usable profile, and why."
    )
    refused: ProfileRefusal | None = Field(
        default=None,
        description="The latest request refused while this capture was under way (one at a "
        "time): acknowledged, never started.",
    )


class GangStatus(StatusModel):
    """The gang: its attempt and restarts, its pods and GPUs, and where it stands with its
    admission mechanism (spec.scheduling.gang) and the start forecast."""

    attempt: int | None = Field(
        default=None,
        description="Current gang attempt (pod label gpujob.dev/attempt), from 0; bumped on "
        "each gang restart and on suspension.",
    )
    restarts: int | None = Field(
        default=None, description="Gang restarts so far, counted against backoffLimit."
    )
    next_attempt_time: Time | None = Field(
        default=None,
        description="When the pods of the next gang attempt will be created: set while a gang "
        "restart backs off (10 s, 20 s, 40 s ... capped, like batch/v1 Job) or a refused pod "
        "create is retried.",
    )
    replicas: Replicas | None = Field(
        default=None, description="Pod counts of the current attempt."
    )
    gpus: GPUSummary | None = Field(
        default=None,
        description="The gang's GPUs: requested (nodes x gpusPerNode, the GPUs column of "
        "kubectl get) and what NVML on the ranks reports.",
    )
    start_forecast: QueueForecast | None = Field(
        default=None,
        description="When the waiting gang is forecast to start, and once it started how far "
        "off that was.",
    )
    avoided_nodes: list[AvoidedNode] | None = Field(
        default=None,
        max_length=32,
        description="Nodes ended attempts blamed, kept off the next attempts' pods until they "
        "expire (spec.runPolicy.avoidBlamedNodes); condition NodesAvoided says whether the "
        "current attempt could avoid them.",
        json_schema_extra={"x-kubernetes-list-type": "atomic"},
    )

    restart_strategy: RestartStrategyStatus | None = Field(
        default=None,
        description="How the current attempt's pods restart when the gang restarts "
        "(spec.runPolicy.restartStrategy), and why that way.",
    )
    in_place_restarts: int | None = Field(
        default=None,
        description="Gang restarts done in place (of restarts and preemptions): the pods "
        "kept their UIDs and nodes.",
    )

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
        "for a higher-priority pod, by an eviction such as kubectl drain, or its Kueue "
        "Workload deleted while it ran): restarts that are not failures and not counted "
        "against backoffLimit.",
    )
    read_error: str | None = Field(
        default=None,
        max_length=1024,
        description="Why the gang's admission objects could not be read at the last pass; "
        "while it lasts the gang's pods are kept with the last known admission and nothing "
        "is created.",
    )


class GoodputSeconds(StatusModel):
    """Seconds of the job's life since ``goodput.since``, by what they were spent on."""

    queued: float = Field(
        default=0.0, description="Suspended, or waiting for the gang to be placed the first time."
    )
    startup: float = Field(
        default=0.0,
        description="From the gang placed to the job's first step, at most "
        "spec.monitoring.startupTimeoutSeconds.",
    )
    unobserved: float = Field(
        default=0.0,
        description="Running past the start-up timeout without a step the operator saw, or "
        "with spec.monitoring.enabled false: not known to be productive or lost, so while "
        "there is any, ratio and lostGPUHours are absent.",
    )
    restart: float = Field(
        default=0.0,
        description="From a failure or eviction to the new attempt's first step, plus the "
        "steps recomputed while the step was below the furthest one reached.",
    )
    stall: float = Field(default=0.0, description="Running while the Stalled condition was True.")
    checkpoint: float = Field(
        default=0.0, description="The ranks' share of step time in the checkpoint phase."
    )
    eval: float = Field(default=0.0, description="The ranks' share of step time in the eval phase.")
    productive: float = Field(default=0.0, description="Steps that were kept.")


class VerdictShare(StatusModel):
    """One bottleneck verdict: how long it was published."""

    verdict: str = Field(description="The bottleneck verdict.")
    seconds: float | None = Field(default=None, description="Seconds it was published.")
    share: float | None = Field(
        default=None, description="Its share of the time any verdict was published (0..1)."
    )


class Goodput(StatusModel):
    """What share of the job's GPU time made steps it kept, where the rest went, and what
    the run was like: kept up to date while the job lives, and kept once it finished."""

    since: Time | None = Field(
        default=None,
        description="Start of the accounting: the job's creation (or when an operator first "
        "accounted a job that had already started).",
    )
    seconds: GoodputSeconds | None = Field(default=None, description="Seconds by cause.")
    ratio: float | None = Field(
        default=None,
        description="Productive seconds over all seconds (0..1); absent while any second is "
        "unobserved.",
    )
    gpu_hours: float | None = Field(
        default=None, alias="gpuHours", description="GPU-hours accounted (seconds x GPUs)."
    )
    lost_gpu_hours: float | None = Field(
        default=None,
        alias="lostGPUHours",
        description="GPU-hours not productive: seconds of the other causes x GPUs / 3600; "
        "absent while any second is unobserved.",
    )
    mean_samples_per_second: float | None = Field(
        default=None,
        description="Kept samples over the time the job stepped (productive, checkpoint and "
        "eval seconds): its throughput while it ran, not diluted by its waits.",
    )
    mean_tokens_per_second: float | None = Field(
        default=None, description="Kept tokens over the time the job stepped."
    )
    verdicts: list[VerdictShare] | None = Field(
        default=None,
        max_length=16,
        description="The bottleneck verdicts the job had, longest first (at most 16).",
    )
    worst_rank: int | None = Field(
        default=None, description="The rank the verdicts named longest, if any."
    )
    worst_rank_seconds: float | None = Field(
        default=None, description="Seconds that rank was named."
    )


class Display(StatusModel):
    """Pre-formatted strings for `kubectl get` columns (JSONPath cannot format)."""

    progress: str | None = Field(default=None, description='e.g. "41.3%".')
    eta: str | None = Field(
        default=None, description='e.g. "18m20s"; for a waiting job its start, "starts ~14:20".'
    )
    throughput: str | None = Field(default=None, description='e.g. "2840 samples/s".')
    bottleneck: str | None = Field(default=None, description='e.g. "Straggler(r13)".')
    mfu: str | None = Field(default=None, description='Model FLOPs utilisation, e.g. "38.2%".')
    step_time: str | None = Field(
        default=None, description='Median and p95 step time, e.g. "410ms/520ms".'
    )
    goodput: str | None = Field(
        default=None, description='Share of GPU time that made kept steps, e.g. "87.3%".'
    )


Phase = Literal["Pending", "Running", "Restarting", "Suspended", "Succeeded", "Failed"]


class GPUTrainingJobStatus(StatusModel):
    """Observed state, written by the operator through the status subresource.

    Every top-level field but ``operatorState`` is the user's contract, listed in the
    README's status table and pinned by a unit test; ``operatorState`` is the operator's own
    bookkeeping, free to change between versions.
    """

    observed_generation: int | None = Field(
        default=None, description="metadata.generation the status was computed for."
    )
    phase: Phase | None = Field(
        default=None,
        description="Display phase derived from conditions: Pending, Running, Restarting, "
        "Suspended, Succeeded or Failed.",
    )
    conditions: list[Condition] | None = Field(
        default=None,
        description="Latest observations of the job's state, one per type.",
        json_schema_extra={
            "x-kubernetes-list-type": "map",
            "x-kubernetes-list-map-keys": ["type"],
        },
    )
    start_time: Time | None = Field(
        default=None, description="When the pods were first created (reset on resume)."
    )
    completion_time: Time | None = Field(
        default=None, description="When the job succeeded or failed."
    )
    progress: Progress | None = Field(default=None, description="Training progress.")
    bottleneck: Bottleneck | None = Field(default=None, description="Current bottleneck verdict.")
    gang: GangStatus | None = Field(
        default=None,
        description="The gang: attempt, restarts, pods, GPUs, admission and start forecast.",
    )
    failure: Failure | None = Field(
        default=None, description="Root cause of the failure or of the latest gang restart."
    )
    hang_evidence: HangEvidence | None = Field(
        default=None,
        description="Every rank's place when the job last stalled, taken before any restart.",
    )
    profile: ProfileRecord | None = Field(
        default=None,
        description="The latest profile asked of the ranks (gpujob profile) and its answer.",
    )
    goodput: Goodput | None = Field(
        default=None,
        description="The share of the job's GPU time that made kept steps, the rest by cause "
        "(queued, startup, unobserved, restart, stall, checkpoint, eval), and the run's mean "
        "throughput and verdicts.",
    )
    display: Display | None = Field(default=None, description="Strings for kubectl get columns.")
    operator_state: OperatorState | None = Field(
        default=None,
        description="The operator's own bookkeeping, kept so that a restarted operator resumes "
        "its work (backoff, the ETA's basis, the goodput ledger's cursor): internal, not part "
        "of the API, free to change between versions.",
    )


def parse_status(status: Mapping[str, Any] | None) -> GPUTrainingJobStatus:
    """Read a raw status mapping leniently (unknown keys ignored, absent = empty)."""
    return GPUTrainingJobStatus.model_validate(dict(status or {}))


def stalled_since(status: Mapping[str, Any]) -> str | None:
    """The current stall's identity: the Stalled condition's transition time, while True."""
    cond = find(status.get("conditions"), STALLED) or {}
    since = cond.get("lastTransitionTime") if cond.get("status") == TRUE else None
    return str(since) if since else None


def stall_evidence(status: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """``status.hangEvidence`` when it is about the current stall (else None)."""
    since = stalled_since(status)
    ev = status.get("hangEvidence") or {}
    return ev if since is not None and ev.get("stalledSince") == since else None


def furthest_step(status: Mapping[str, Any]) -> int | None:
    """The furthest step any attempt reached (status.progress.furthestStep, or its step when
    an older operator wrote it); None while no rank ever reported a step."""
    progress = status.get("progress") or {}
    steps = [
        int(v)
        for v in (progress.get("furthestStep"), progress.get("step"))
        if isinstance(v, int | float) and not isinstance(v, bool)
    ]
    return max(steps) if steps else None


def attempt_of(status: Mapping[str, Any]) -> int:
    """The gang's current attempt: ``status.gang.attempt`` (``status.attempt`` in a status the
    previous version wrote and no pass has moved yet); 0 before the first."""
    value = (status.get("gang") or {}).get("attempt", status.get("attempt"))
    return int(value) if isinstance(value, int) and not isinstance(value, bool) else 0


def start_forecast(status: Mapping[str, Any]) -> Mapping[str, Any]:
    """The gang's start forecast: ``status.gang.startForecast`` (``status.queue`` in a status
    the previous version wrote and no pass has moved yet); empty when none."""
    gang = status.get("gang") or {}
    found = gang.get("startForecast") if "startForecast" in gang else status.get("queue")
    return found if isinstance(found, Mapping) else {}
