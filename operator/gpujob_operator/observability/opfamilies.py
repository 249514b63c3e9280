"""Every series the operator's own /metrics exports: name, help, unit and label vocabulary.

The single spelling of each family: the collectors of
:mod:`~gpujob_operator.observability.opmetrics` render them, and the dashboards and alert rules
name them, so tests check every query against what is actually exported. Labels are only
``namespace`` and ``job_name`` (plus small fixed sets such as ``phase`` and ``verdict``), so
cardinality grows with the number of jobs and nothing else.

``job_name`` rather than ``job``: Prometheus owns the ``job`` label (the scrape job;
:data:`OPERATOR_JOB` for the operator's own target). The ServiceMonitor scrapes with
``honorLabels`` so our ``namespace`` (the job's) wins over the target's (the operator's).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

OPERATOR_JOB: Final = "gpujob-operator"
"""The Prometheus ``job`` label of the operator's target (the ServiceMonitor sets it)."""

LABEL_NAMESPACE: Final = "namespace"
LABEL_JOB: Final = "job_name"
JOB_LABELS: Final = (LABEL_NAMESPACE, LABEL_JOB)

PHASES: Final = ("Pending", "Running", "Restarting", "Suspended", "Succeeded", "Failed")
"""Display phases (``status.phase``); one 0/1 series each, so a phase change is one flip."""
PHASE_RUNNING: Final = "Running"
"""The only phase whose verdicts (stalled, bottleneck) are about a live attempt."""
VERDICTS: Final = (
    "Healthy",
    "InputBound",
    "CheckpointBound",
    "EvalBound",
    "CommunicationBound",
    "Straggler",
    "MemoryPressure",
    "GPUUnderutilized",
    "Throttled",
    "Stalled",
    "HardwareFault",
    "TransferBound",
    "ComputeBound",
    "DataParallelImbalance",
)
"""Bottleneck verdicts (design section 5). An unknown verdict is rendered as ``Other``."""
VERDICT_OTHER: Final = "Other"
REPLICA_STATES: Final = ("desired", "pending", "running", "succeeded", "failed")


@dataclass(frozen=True)
class Family:
    """Name, help and unit of one exported family: the single spelling dashboards use."""

    name: str
    help: str
    unit: str = ""


# ---- job-level families --------------------------------------------------------------
JOB_PROGRESS = Family(
    "gpujob_job_progress_ratio", "Steps completed / target steps, 0..1 (status.progress).", "ratio"
)
JOB_STEP = Family("gpujob_job_step", "Training steps completed (min over ranks).")
JOB_TARGET_STEPS = Family("gpujob_job_target_steps", "Training steps the job means to run.")
JOB_ETA = Family("gpujob_job_eta_seconds", "Estimated seconds until the target step.", "seconds")
JOB_SAMPLES_RATE = Family(
    "gpujob_job_samples_per_second", "Global training throughput over the analysis window."
)
JOB_TOKENS_RATE = Family(
    "gpujob_job_tokens_per_second", "Global token throughput over the window, when exported."
)
JOB_LOSS = Family("gpujob_job_loss", "Last reported training loss.")
JOB_MFU = Family(
    "gpujob_job_mfu_ratio",
    "Model FLOPs utilisation, 0..1: model FLOP/s over the GPUs' dense peak (status.progress).",
    "ratio",
)
JOB_STEP_P50 = Family(
    "gpujob_job_step_p50_seconds", "Median step time over the analysis window.", "seconds"
)
JOB_STEP_P95 = Family(
    "gpujob_job_step_p95_seconds", "95th percentile step time over the window.", "seconds"
)
JOB_LAST_STEP = Family(
    "gpujob_job_last_step_timestamp_seconds", "Unix time a rank last finished a step.", "seconds"
)
JOB_START = Family("gpujob_job_start_time_seconds", "Unix time the pods were created.", "seconds")
JOB_VERDICT = Family(
    "gpujob_job_bottleneck_verdict",
    "1 for the running attempt's bottleneck verdict, else 0; absent unless the job runs.",
)
JOB_PHASE = Family("gpujob_job_phase", "1 for the job's current display phase, else 0.")
JOB_RESTARTS = Family("gpujob_job_restarts_total", "Gang restarts so far (status.gang.restarts).")
JOB_METRICS_AVAILABLE = Family(
    "gpujob_job_metrics_available",
    "1 while the operator can scrape the job's ranks (MetricsAvailable condition), else 0.",
)
JOB_STALLED = Family(
    "gpujob_job_stalled",
    "1 while the job runs and its present attempt is Stalled (no step for too long), else 0.",
)
JOB_GPUS = Family("gpujob_job_gpus", "GPUs requested by the gang (nodes x gpusPerNode).")
JOB_GPU_UTILIZATION = Family(
    "gpujob_job_gpu_utilization_ratio", "Mean GPU utilization of the gang over the window.", "ratio"
)
JOB_REPLICAS = Family("gpujob_job_replicas", "Pods of the current gang attempt by state.")
JOB_START_FORECAST = Family(
    "gpujob_job_start_forecast_timestamp_seconds",
    "Unix time a waiting job is forecast to start (status.gang.startForecast."
    "estimatedStartTime), by confidence: Exact, or LowerBound when holders without an ETA "
    "could delay it.",
    "seconds",
)
JOB_START_FORECAST_ERROR = Family(
    "gpujob_job_start_forecast_error_seconds",
    "Once a job started: its actual start minus its last forecast start (positive: late).",
    "seconds",
)
JOB_GOODPUT = Family(
    "gpujob_job_goodput_ratio",
    "Share of the job's GPU time since creation that made steps it kept, 0..1 "
    "(status.goodput.ratio).",
    "ratio",
)
JOB_LOST_GPU_SECONDS = Family(
    "gpujob_job_lost_gpu_seconds",
    "GPU-seconds of the job that made no kept step, by cause (queued, startup, restart, stall, "
    "checkpoint, eval): status.goodput.seconds x GPUs.",
    "seconds",
)
JOB_PRODUCTIVE_GPU_SECONDS = Family(
    "gpujob_job_productive_gpu_seconds",
    "GPU-seconds of the job that made steps it kept (status.goodput.seconds x GPUs).",
    "seconds",
)
JOB_UNOBSERVED_GPU_SECONDS = Family(
    "gpujob_job_unobserved_gpu_seconds",
    "GPU-seconds of a job whose steps the operator cannot see (monitoring off, no step past "
    "the start-up timeout): status.goodput.seconds.unobserved x GPUs. Such a job exports no "
    "goodput ratio, lost or productive GPU-seconds.",
    "seconds",
)
CONFIDENCES: Final = ("Exact", "LowerBound")
LOST_CAUSES: Final = ("queued", "startup", "restart", "stall", "checkpoint", "eval")
"""The causes of ``gpujob_job_lost_gpu_seconds`` (the goodput ledger's, less productive and
unobserved: time not known to be lost is not counted as lost)."""

# ---- operator health -------------------------------------------------------------------
RECONCILES = Family("gpujob_operator_reconciles_total", "Reconcile passes, by result.")
RECONCILE_DURATION = Family(
    "gpujob_operator_reconcile_duration_seconds", "Time one reconcile pass took.", "seconds"
)
SCRAPES = Family("gpujob_operator_scrapes_total", "Scrapes of rank endpoints, by result.")
SCRAPE_DURATION = Family(
    "gpujob_operator_scrape_duration_seconds", "Time one scrape of a rank took.", "seconds"
)
ERRORS = Family("gpujob_operator_errors_total", "Failed reconciles and scrapes, by source/reason.")
DROPPED_SERIES = Family(
    "gpujob_operator_scrape_dropped_series_total",
    "Series refused from rank payloads: a rank label not the target's rank, over a cap.",
)
DROPPED_VALUES = Family(
    "gpujob_operator_scrape_dropped_values_total",
    "Values refused from rank payloads: NaN, infinities, implausible numbers.",
)
DROPPED_BYTES = Family(
    "gpujob_operator_scrape_dropped_bytes_total",
    "Bytes of rank responses thrown away for exceeding a size, line or sample cap.",
    "bytes",
)
API_ERRORS = Family(
    "gpujob_operator_api_errors_total",
    "API calls the server refused or that failed, by call and classified reason "
    "(QuotaExceeded, APIThrottled, ...; see the README's Troubleshooting).",
)
FORECAST_ERROR = Family(
    "gpujob_operator_start_forecast_abs_error_seconds",
    "How far each started job's start was from its last forecast, in absolute seconds.",
    "seconds",
)
FORECAST_DURATION = Family(
    "gpujob_operator_forecast_duration_seconds",
    "Time one start-time forecast pass over the whole fleet took (reads and arithmetic).",
    "seconds",
)
LOOP_LAG = Family(
    "gpujob_operator_event_loop_lag_seconds",
    "How late the event loop woke a 100 ms timer: the longest stretch something held the "
    "loop (parsing, building, decoding) that every job's handling waited behind.",
    "seconds",
)
LOOP_LAGS = Family(
    "gpujob_operator_event_loop_lags_total",
    "Times the event loop woke its 100 ms timer over 100 ms late, by what took most of the "
    "stretch: loop (its own work, the operator's to move off the loop), gil (the operator's "
    "other threads ran while it waited), cpu (it waited on a run queue: a busy machine or a "
    "CPU limit), blocked (none of these: a system call, a lock, paging).",
)
GC_PAUSE = Family(
    "gpujob_operator_gc_pause_seconds",
    "How long each garbage collection held the operator, by generation: a full (2) one walks "
    "every object the operator keeps, and the event loop waits it out.",
    "seconds",
)
HANG_CAPTURES = Family(
    "gpujob_operator_hang_captures_total",
    "Stalls whose hang evidence was taken, by result: complete (every rank answered, "
    "ConfigMap written), partial (some rank silent or unusable), unrecorded (no ConfigMap).",
)
HANG_CAPTURE_RESULTS: Final = ("complete", "partial", "unrecorded")
GHOST_PODS = Family(
    "gpujob_operator_ghost_pods_total",
    "Pods the operator's index still held after the API server proved them gone (a 404 on "
    "their delete, or absent from a fresh listing: a DELETED lost in a watch re-list), by how "
    "it was found; the job's planning goes on without them.",
)
GHOST_POD_PROOFS: Final = ("delete_404", "listing")
WORKLOAD_READS = Family(
    "gpujob_operator_workload_reads_total",
    "Kueue Workloads read by job passes, by source: watch (from the operator's cache of its "
    "Workload watch) or api (a GET: not cached yet, not confirmed for a minute, or just "
    "written by the operator).",
)
WORKLOAD_READ_SOURCES: Final = ("watch", "api")
JOBS = Family("gpujob_operator_jobs", "Jobs the operator currently exports series for.")
BUILD_INFO = Family("gpujob_operator_build_info", "Always 1; the version label says which build.")

JOB_FAMILIES: Final = (
    JOB_PROGRESS,
    JOB_STEP,
    JOB_TARGET_STEPS,
    JOB_ETA,
    JOB_SAMPLES_RATE,
    JOB_TOKENS_RATE,
    JOB_LOSS,
    JOB_MFU,
    JOB_STEP_P50,
    JOB_STEP_P95,
    JOB_LAST_STEP,
    JOB_START,
    JOB_VERDICT,
    JOB_PHASE,
    JOB_RESTARTS,
    JOB_METRICS_AVAILABLE,
    JOB_STALLED,
    JOB_GPUS,
    JOB_GPU_UTILIZATION,
    JOB_REPLICAS,
    JOB_START_FORECAST,
    JOB_START_FORECAST_ERROR,
    JOB_GOODPUT,
    JOB_LOST_GPU_SECONDS,
    JOB_PRODUCTIVE_GPU_SECONDS,
    JOB_UNOBSERVED_GPU_SECONDS,
)
HEALTH_FAMILIES: Final = (
    RECONCILES,
    RECONCILE_DURATION,
    SCRAPES,
    SCRAPE_DURATION,
    ERRORS,
    DROPPED_SERIES,
    DROPPED_VALUES,
    DROPPED_BYTES,
    API_ERRORS,
    FORECAST_ERROR,
    FORECAST_DURATION,
    LOOP_LAG,
    LOOP_LAGS,
    GC_PAUSE,
    HANG_CAPTURES,
    GHOST_PODS,
    WORKLOAD_READS,
    JOBS,
    BUILD_INFO,
)
HISTOGRAMS: Final = (
    RECONCILE_DURATION,
    SCRAPE_DURATION,
    FORECAST_ERROR,
    FORECAST_DURATION,
    LOOP_LAG,
    GC_PAUSE,
)


def exported_names() -> set[str]:
    """Every series name the operator can export (histograms expanded), for dashboard checks."""
    out: set[str] = set()
    for m in (*JOB_FAMILIES, *HEALTH_FAMILIES):
        if m in HISTOGRAMS:
            out |= {f"{m.name}_bucket", f"{m.name}_sum", f"{m.name}_count"}
        else:
            out.add(m.name)
    return out
