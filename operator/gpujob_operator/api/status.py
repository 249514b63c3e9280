"""The GPUTrainingJob's status: what the operator observed, through the status subresource.

Conditions, pod counts, progress, the bottleneck verdict with its evidence, the GPUs, the
root cause of a failure, the gang's admission and the strings of ``kubectl get``. Read
leniently: unknown fields are ignored, so an older operator can read a newer one's status.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, PlainSerializer, WithJsonSchema

from gpujob_operator.api.base import Model as _Model
from gpujob_operator.api.conditions import MESSAGE_MAX_LENGTH, STALLED, TRUE, find, format_time
from gpujob_operator.api.names import GangMechanism

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
    message: str = Field(
        default="", max_length=MESSAGE_MAX_LENGTH, description="Human-readable details."
    )
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


class RateSince(_StatusModel):
    """Where the ETA's step rate is measured from (kept so an operator restart keeps it)."""

    time: Time = Field(description="The scrape the rate is measured from.")
    step: int = Field(ge=0, description="The job's step at that scrape.")
    attempt: int = Field(ge=0, description="The gang attempt the basis belongs to.")


class Progress(_StatusModel):
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
        "since rateSince (an EWMA of the recent rate while that basis is young).",
    )
    eta_unavailable: str | None = Field(
        default=None,
        max_length=1024,
        description="Why there is no ETA, starting with a word: restarting, resuming, "
        "measuring (warm-up), no target, suspended, failed.",
    )
    rate_since: RateSince | None = Field(
        default=None,
        description="The ETA's basis: the first scrape after warm-up since the attempt's "
        "latest start or resume.",
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
    seconds_per_sample: float | None = Field(
        default=None,
        description="Wall time per sample of the job (1 / samplesPerSecond): what one more "
        "sample costs the whole gang.",
    )
    seconds_per_token: float | None = Field(
        default=None, description="Wall time per token of the job (1 / tokensPerSecond)."
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


class Bottleneck(_StatusModel):
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


class AdmissionDenial(_StatusModel):
    """The run of admission webhook denials being retried (spec.runPolicy.admissionRetrySeconds)."""

    since: Time | None = Field(
        default=None, description="The first denial of this run: the retries count from it."
    )
    target: str | None = Field(default=None, description="What was denied, e.g. pod j-node-0.")


class CreateBackoff(_StatusModel):
    """A refused create being retried with backoff: kept in the status so that an operator
    restart resumes the backoff (and the gang's grace) instead of retrying every job at once."""

    tries: int | None = Field(
        default=None, ge=1, description="Refused creates in a row: the backoff's exponent."
    )
    since: Time | None = Field(
        default=None,
        description="The first refusal of this run: an incomplete gang's grace counts from it.",
    )
    retry_at: Time | None = Field(default=None, description="When the next create may be tried.")
    reason: str | None = Field(
        default=None, max_length=128, description="The refusal's reason, e.g. QuotaExceeded."
    )
    code: int | None = Field(default=None, description="The refusal's HTTP status code.")
    message: str | None = Field(
        default=None, max_length=1024, description="The API server's message, truncated."
    )
    target: str | None = Field(
        default=None, max_length=512, description="What was refused, e.g. pod j-node-0."
    )


class QueueForecast(_StatusModel):
    """When a waiting job is forecast to start, and, once it started, how far off that was."""

    estimated_start_time: Time | None = Field(
        default=None,
        description="Earliest time at which enough GPUs are free for the whole gang, "
        "assuming the jobs ahead of it start first.",
    )
    latest_start_time: Time | None = Field(
        default=None,
        description="With confidence LowerBound: the latest start, where holders without "
        "an ETA never finishing still leaves a finite one.",
    )
    confidence: Literal["Exact", "LowerBound", "Unknown"] | None = Field(
        default=None,
        description="Exact (as exact as the holders' ETAs), LowerBound (holders without an "
        "ETA, named in reason, could delay it) or Unknown (cannot start as asked; see reason).",
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


class HangEvidence(_StatusModel):
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


class GoodputSeconds(_StatusModel):
    """Seconds of the job's life since ``goodput.since``, by what they were spent on."""

    queued: float = Field(
        default=0.0, description="Suspended, or waiting for the gang to be placed the first time."
    )
    startup: float = Field(default=0.0, description="From the gang placed to the job's first step.")
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


class Goodput(_StatusModel):
    """What share of the job's GPU time made steps it kept, and where the rest went.

    Written by the planner from one pass to the next; everything it needs is here, so an
    operator restart continues it (a gap longer than 10 minutes is charged to the state
    found after it).
    """

    since: Time | None = Field(
        default=None,
        description="Start of the accounting: the job's creation (or when an operator first "
        "accounted a job that had already started).",
    )
    accounted_until: Time | None = Field(
        default=None, description="The time up to which seconds are charged."
    )
    cause: str | None = Field(
        default=None,
        description="What the time from accountedUntil counts as: queued, startup, restart, "
        "stall or productive (split with checkpoint and eval); absent once finished.",
    )
    seconds: GoodputSeconds | None = Field(default=None, description="Seconds by cause.")
    ratio: float | None = Field(
        default=None, description="Productive seconds over all seconds (0..1)."
    )
    lost_gpu_hours: float | None = Field(
        default=None,
        alias="lostGPUHours",
        description="GPU-hours not productive: seconds of the other causes x totalGPUs / 3600.",
    )
    stage: Literal["Queued", "Starting", "Stepped"] | None = Field(
        default=None,
        description="How far the job ever got: never placed, placed without a step, stepped.",
    )
    attempt: int | None = Field(default=None, description="The attempt the accounting follows.")
    attempt_since: Time | None = Field(
        default=None, description="When the accounting first saw that attempt."
    )
    attempt_stepped: bool | None = Field(
        default=None, description="Whether that attempt has finished a step."
    )
    furthest_step: int | None = Field(
        default=None, description="The furthest step seen: a lower step is recomputation."
    )
    verdict: str | None = Field(
        default=None, description="The published verdict when last accounted."
    )
    rank: int | None = Field(default=None, description="The rank that verdict named, if one.")
    verdict_seconds: dict[str, float] | None = Field(
        default=None,
        max_length=16,
        description="Seconds each bottleneck verdict was published (at most 16 verdicts).",
    )
    rank_seconds: dict[str, float] | None = Field(
        default=None,
        max_length=8,
        description="Seconds each rank was named by the verdict (the 8 named longest).",
    )
    samples: float | None = Field(
        default=None, description="Samples of kept steps: samplesPerSecond over stepping time."
    )
    tokens: float | None = Field(default=None, description="Tokens of kept steps, likewise.")
    checkpoint_ratio: float | None = Field(
        default=None,
        description="The checkpoint share last seen while the job stepped (progress."
        "checkpointRatio): how stepping time is split until a newer one is seen.",
    )
    eval_ratio: float | None = Field(default=None, description="The eval share, likewise.")
    samples_per_second: float | None = Field(
        default=None, description="The throughput last seen while the job stepped."
    )
    tokens_per_second: float | None = Field(
        default=None, description="The token throughput last seen while the job stepped."
    )


class VerdictShare(_StatusModel):
    """One verdict of a finished job: how long it was published."""

    verdict: str = Field(description="The bottleneck verdict.")
    seconds: float | None = Field(default=None, description="Seconds it was published.")
    share: float | None = Field(
        default=None, description="Its share of the time any verdict was published (0..1)."
    )


class JobSummary(_StatusModel):
    """A finished job's run in a few numbers, kept once its live parts are gone."""

    wall_seconds: float | None = Field(
        default=None, description="From goodput.since to completionTime."
    )
    goodput_ratio: float | None = Field(default=None, description="goodput.ratio at the end.")
    gpu_hours: float | None = Field(
        default=None, alias="gpuHours", description="GPU-hours accounted (seconds x totalGPUs)."
    )
    lost_gpu_hours: float | None = Field(
        default=None, alias="lostGPUHours", description="GPU-hours that were not productive."
    )
    restarts: int | None = Field(default=None, description="Gang restarts.")
    steps: int | None = Field(default=None, description="The last step reported.")
    mean_samples_per_second: float | None = Field(
        default=None,
        description="Kept samples over the time the job stepped (productive, checkpoint and "
        "eval seconds): its throughput while it ran.",
    )
    mean_tokens_per_second: float | None = Field(
        default=None, description="Kept tokens over the time the job stepped."
    )
    last_mfu: float | None = Field(
        default=None, alias="lastMFU", description="The last model FLOPs utilisation published."
    )
    verdicts: list[VerdictShare] | None = Field(
        default=None, max_length=16, description="The verdicts it had, longest first."
    )
    worst_rank: int | None = Field(default=None, description="The rank the verdicts named longest.")
    worst_rank_seconds: float | None = Field(
        default=None, description="Seconds that rank was named."
    )


class Display(_StatusModel):
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
    restarts_without_progress: int | None = Field(
        default=None,
        description="Consecutive failed attempts that ended without passing the furthest step "
        "reached before them (spec.runPolicy.maxRestartsWithoutProgress).",
    )
    attempts_without_progress: list[int] | None = Field(
        default=None,
        max_length=64,
        description="Those attempts, oldest first.",
        json_schema_extra={"x-kubernetes-list-type": "atomic"},
    )
    furthest_step_at_attempt_start: int | None = Field(
        default=None,
        description="The furthest step any attempt had reached when the current attempt "
        "began: the current attempt makes progress once it passes it.",
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
    admission_denial: AdmissionDenial | None = Field(
        default=None,
        description="Set while an admission webhook denies the job's creates: since when, so "
        "that the bounded retry (spec.runPolicy.admissionRetrySeconds) survives an operator "
        "restart.",
    )
    create_backoff: CreateBackoff | None = Field(
        default=None,
        description="Set while a refused create of the gang or its Service is retried with "
        "backoff: tries, the first refusal and the next try, so that an operator restart "
        "neither resets the backoff nor retries every refused job at once.",
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
    queue: QueueForecast | None = Field(
        default=None, description="Start-time forecast while the job waits for GPUs."
    )
    hang_evidence: HangEvidence | None = Field(
        default=None,
        description="Every rank's place when the job last stalled, taken before any restart.",
    )
    goodput: Goodput | None = Field(
        default=None,
        description="The share of the job's GPU time that made kept steps, and the rest by "
        "cause (queued, startup, restart, stall, checkpoint, eval).",
    )
    summary: JobSummary | None = Field(
        default=None, description="A finished job's run: wall time, goodput, throughput, verdicts."
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
