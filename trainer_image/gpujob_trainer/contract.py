"""The trainer metrics contract: names, types, units, labels and env vars.

This one module is imported by both sides: the trainer's exporter renders these series and
the operator's scraper reads them. It holds plain data only, so importing it never pulls in
torch, NVML or prometheus_client. Change a name here and both sides move together.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final, Literal

MetricType = Literal["counter", "gauge", "histogram"]

# --- environment the operator injects (torchrun adds RANK, LOCAL_RANK, WORLD_SIZE, GROUP_RANK)
ENV_METRICS_PORT: Final = "GPUJOB_METRICS_PORT"
"""Base port of the per-rank exporters; each rank serves on base + LOCAL_RANK."""
ENV_METRICS_ADDR: Final = "GPUJOB_METRICS_ADDR"
"""Address the exporter binds (default all interfaces, so the operator can scrape the pod)."""
ENV_TOTAL_STEPS: Final = "GPUJOB_TOTAL_STEPS"
"""Target training steps (loop iterations) of the whole job (optional), exported as the target
gauge."""
ENV_RANK: Final = "RANK"
ENV_LOCAL_RANK: Final = "LOCAL_RANK"
ENV_WORLD_SIZE: Final = "WORLD_SIZE"
ENV_GROUP_RANK: Final = "GROUP_RANK"
"""torchrun's node rank; PET_NODE_RANK then NODE_RANK are the fallbacks, in that order."""
ENV_NODE_RANK_FALLBACKS: Final = ("PET_NODE_RANK", "NODE_RANK")
ENV_TRAINER: Final = (
    ENV_METRICS_PORT,
    ENV_METRICS_ADDR,
    ENV_TOTAL_STEPS,
    ENV_RANK,
    ENV_LOCAL_RANK,
    ENV_WORLD_SIZE,
    ENV_GROUP_RANK,
    *ENV_NODE_RANK_FALLBACKS,
)

ENV_NODE_NAME: Final = "GPUJOB_NODE_NAME"
"""The pod's node (the downward API's spec.nodeName): what the pre-flight check names."""
PREFLIGHT_EXIT_CODE: Final = 86
"""The exit code of a pod whose pre-flight check failed (``python -m gpujob_trainer.preflight``);
its last log line starts with :data:`PREFLIGHT_MARK` and names the node and the numbers."""
PREFLIGHT_MARK: Final = "gpujob preflight"

SUPERVISOR_MODULE: Final = "gpujob_trainer.supervisor"
"""The in-place restart supervisor (``runPolicy.restartStrategy: InPlace``): the operator
starts the trainer's command as ``python -m gpujob_trainer.supervisor --podinfo=DIR
--state=DIR -- COMMAND...``."""
RESTART_EXIT_CODE: Final = 87
"""The supervisor's exit code when the operator moved its pod to a later attempt while the
run was going (the run is stopped): the container's restart rule restarts the pod in place."""
LABEL_ATTEMPT: Final = "gpujob.dev/attempt"
"""The pod label naming the gang attempt the pod belongs to (the operator moves it)."""
ANNOTATION_RELEASED: Final = "gpujob.dev/released-attempt"
"""The pod annotation the operator sets to the attempt every pod of the gang has restarted
for: a supervisor restarted in place waits for it before it runs COMMAND again (a barrier,
so no restarted rank meets a rank of the old attempt)."""
ANNOTATION_RESTARTS_BASE: Final = "gpujob.dev/restarts-base"
"""The pod annotation with the trainer's restart count the pod's run for its attempt begins
at: a supervisor that has started fewer times than that stops (exit
:data:`RESTART_EXIT_CODE`), so the pod restarts in place into its new attempt."""
ANNOTATION_HOLD: Final = "gpujob.dev/hold"
"""On a pod created while an in-place restart is under way: its first run too waits for
:data:`ANNOTATION_RELEASED`."""
PODINFO_DIR: Final = "/var/run/gpujob/podinfo"
"""The downward API volume with the pod's ``labels`` and ``annotations`` files."""
INPLACE_STATE_DIR: Final = "/var/run/gpujob/inplace"
"""The emptyDir (kept across in-place restarts) where the supervisor counts its starts."""
ENV_ATTEMPT: Final = "GPUJOB_ATTEMPT"
"""The gang attempt the supervisor runs COMMAND for, in COMMAND's environment."""

DEFAULT_METRICS_PORT: Final = 9400
METRICS_PATH: Final = "/metrics"
EVIDENCE_PATH: Final = "/debug/evidence"
"""Where the same server answers with the rank's hang evidence (JSON, see evidence.py)."""
DEBUG_PREFIX: Final = "/debug/"
"""Every path under it answers only a request that carries the job's endpoint token, when the
pod has one (``ENV_ENDPOINT_TOKEN``)."""
ENV_ENDPOINT_TOKEN: Final = "GPUJOB_ENDPOINT_TOKEN"
"""The job's endpoint token, from a Secret the operator creates (only where the operator is
configured to: clusters that do not enforce NetworkPolicy). Set: ``/debug/*`` answers 401
unless the request carries ``Authorization: Bearer <token>``; ``/metrics`` stays open."""
ENV_EVIDENCE: Final = "GPUJOB_EVIDENCE"
"""0/false/off turns the evidence endpoint off (it is on by default); the user's to set."""
PROFILE_PATH: Final = "/debug/profile"
"""Where the same server answers a profile request and the rank's profile state (JSON, see
profiling.py); under ``DEBUG_PREFIX``, so the endpoint token guards it."""
PROFILE_MAX_STEPS: Final = 50
"""The most training steps one capture may span."""
PROFILE_DEFAULT_STEPS: Final = 5
"""The steps a capture spans when the request names none."""
PROFILE_PARTS: Final = ("compute", "communication", "copy", "idle")
"""The exclusive parts a captured step splits into (their sum is the step time); a moment
counts for the first of compute, communication, copy that runs then, else it is idle."""
ENV_PROFILE_DIR: Final = "GPUJOB_PROFILE_DIR"
"""Where a rank writes its profile traces (operator-owned: a mounted volume in the pod);
unset: ``<tempdir>/gpujob-profiles``."""
ENV_PROFILE: Final = "GPUJOB_PROFILE"
"""0/false/off turns profile captures off (on by default where the evidence endpoint is on);
the user's to set."""
PROFILE_ID: Final = re.compile(r"[A-Za-z0-9._-]{1,64}")
"""A capture's id (in the request annotation, the rank's query and the trace's file name)."""


def profile_steps(text: str) -> int | None:
    """A request's step count as written (``"5"``), or None unless 1..PROFILE_MAX_STEPS."""
    text = text.strip()
    if not re.fullmatch(r"[0-9]{1,4}", text) or not 1 <= int(text) <= PROFILE_MAX_STEPS:
        return None
    return int(text)


ENV_FRAMEWORK_CALLBACK: Final = "GPUJOB_FRAMEWORK_CALLBACK"
"""1/true/on adds gpujob's callback to every Lightning Trainer through Lightning's
callbacks_factory entry point (off by default); the user's to set."""
FLIGHT_RECORDER_ENV: Final = (
    (("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE"), "2000"),
    (("TORCH_FR_DUMP_ON_TIMEOUT", "TORCH_NCCL_DUMP_ON_TIMEOUT"), "1"),
    (("TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE"), "/tmp/gpujob_fr_rank_"),
)
"""What the operator puts in each pod unless ``spec.env`` sets it: the Flight Recorder on,
bounded to the last 2,000 collectives, and the watchdog dumping it to a local file when a
collective times out; each under its current ``TORCH_FR_*`` name and the older
``TORCH_NCCL_*`` one that earlier torch releases read. A user value for either name of a
pair replaces both defaults (torch would otherwise pick one of the two)."""


def flight_recorder_env(user: set[str] | frozenset[str]) -> list[tuple[str, str]]:
    """The Flight Recorder defaults a pod gets, given the env names its user already set."""
    return [
        (name, value)
        for names, value in FLIGHT_RECORDER_ENV
        if not user & set(names)
        for name in names
    ]


# --- labels
LABEL_RANK: Final = "rank"
LABEL_LOCAL_RANK: Final = "local_rank"
LABEL_NODE_RANK: Final = "node_rank"
LABEL_PHASE: Final = "phase"
LABEL_GPU: Final = "gpu"
"""NVML index of the GPU on its node (what NVIDIA's DCGM exporter calls `gpu`)."""
LABEL_UUID: Final = "UUID"
"""GPU UUID as NVML spells it (`GPU-…`); the join key with DCGM and across ranks."""
LABEL_REASON: Final = "reason"
LABEL_DTYPE: Final = "dtype"
"""The training precision a peak is quoted for (`PEAK_DTYPES`)."""
LABEL_DEVICE: Final = "device"
"""The GPU product name as NVML and CUDA spell it (`NVIDIA H100 80GB HBM3`)."""
LABEL_PART: Final = "part"
"""Which part of a profiled step a `profile step seconds` series speaks for (`PROFILE_PARTS`)."""
LABEL_COUNTER: Final = "counter"
"""Which optional GPU counter group a `profiling available` series speaks for."""

RANK_LABELS: Final = (LABEL_RANK, LABEL_LOCAL_RANK, LABEL_NODE_RANK)
"""Carried by every series a rank exports about its own training."""
GPU_LABELS: Final = (LABEL_NODE_RANK, LABEL_GPU, LABEL_UUID)
"""Carried by every NVML series (one per GPU of the node, exported by local rank 0)."""
CUDA_LABELS: Final = (*RANK_LABELS, LABEL_UUID)
"""Carried by allocator series: the rank's own CUDA device, named by UUID."""

# --- step phases; they partition each step, so their sum is the step time
PHASE_DATA_WAIT: Final = "data_wait"
PHASE_H2D: Final = "h2d"
"""Host-to-device copies of the batch (`wrap_loader(device=...)`, `tracker.transfer()`)."""
PHASE_FORWARD: Final = "forward"
PHASE_BACKWARD: Final = "backward"
PHASE_OPTIMIZER: Final = "optimizer"
PHASE_COMM_WAIT: Final = "comm_wait"
PHASE_CHECKPOINT: Final = "checkpoint"
PHASE_EVAL: Final = "eval"
"""Evaluation between training steps (`tracker.phase("eval")`): busy, not hung, and not training."""
PHASE_OTHER: Final = "other"
PHASES: Final = (
    PHASE_DATA_WAIT,
    PHASE_H2D,
    PHASE_FORWARD,
    PHASE_BACKWARD,
    PHASE_OPTIMIZER,
    PHASE_COMM_WAIT,
    PHASE_CHECKPOINT,
    PHASE_EVAL,
    PHASE_OTHER,
)
BUSY_PHASES: Final = (PHASE_CHECKPOINT, PHASE_EVAL)
"""Work between steps: a rank in one is busy (not hung) though it finishes no step."""
COMPUTE_PHASES: Final = (PHASE_FORWARD, PHASE_BACKWARD, PHASE_OPTIMIZER)
"""A rank's own compute: what it spends working, excluding waits for data or peers."""

# --- NVML clock event ("throttle") reasons, label value -> NVML bit
CLOCK_EVENT_REASONS: Final = {
    "gpu_idle": 0x1,
    "applications_clocks_setting": 0x2,
    "sw_power_cap": 0x4,
    "hw_slowdown": 0x8,
    "sync_boost": 0x10,
    "sw_thermal_slowdown": 0x20,
    "hw_thermal_slowdown": 0x40,
    "hw_power_brake_slowdown": 0x80,
    "display_clock_setting": 0x100,
}
THROTTLE_REASONS: Final = (
    "sw_power_cap",
    "hw_slowdown",
    "sw_thermal_slowdown",
    "hw_thermal_slowdown",
    "hw_power_brake_slowdown",
)
"""The reasons that mean the GPU runs slower than it could (power, heat, hardware)."""

# --- reasons GPU telemetry can be unavailable (values of the `reason` label)
TELEMETRY_OK: Final = "ok"
TELEMETRY_NVML_MISSING: Final = "nvml_not_installed"
TELEMETRY_NVML_INIT_FAILED: Final = "nvml_init_failed"
TELEMETRY_NO_DEVICES: Final = "no_devices"
TELEMETRY_REASONS: Final = (
    TELEMETRY_OK,
    TELEMETRY_NVML_MISSING,
    TELEMETRY_NVML_INIT_FAILED,
    TELEMETRY_NO_DEVICES,
)

# --- model FLOPs utilisation: why a rank exports no peak (values of the `reason` label)
PEAK_OK: Final = "ok"
PEAK_NO_GPU: Final = "no_gpu"
PEAK_UNKNOWN_DEVICE: Final = "unknown_device"
PEAK_FP8: Final = "fp8"
PEAK_REASONS: Final = (PEAK_OK, PEAK_NO_GPU, PEAK_UNKNOWN_DEVICE, PEAK_FP8)
PEAK_DTYPES: Final = ("bf16", "fp16", "tf32", "fp32", "fp8")
"""Training precisions, in the order the operator encodes them (index in a row)."""

# --- optional GPU counter groups (values of the `counter` label) and why one is missing
COUNTER_PCIE: Final = "pcie"
COUNTER_GPM: Final = "gpm"
COUNTERS: Final = (COUNTER_PCIE, COUNTER_GPM)
COUNTER_OK: Final = "ok"
COUNTER_NOT_SUPPORTED: Final = "not_supported"
"""The GPU or its driver does not offer the counter (GPM needs Hopper or later)."""
COUNTER_NVML_TOO_OLD: Final = "nvml_too_old"
"""The installed pynvml lacks the call."""
COUNTER_REASONS: Final = (COUNTER_OK, COUNTER_NOT_SUPPORTED, COUNTER_NVML_TOO_OLD)

STEP_DURATION_BUCKETS: Final = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    120.0,
    300.0,
)
"""Upper bounds (seconds) of the step time histogram; +Inf is implied."""


@dataclass(frozen=True)
class MetricSpec:
    """One series family: its full exposition name, type, base unit, help and labels."""

    name: str
    type: MetricType
    help: str
    labels: tuple[str, ...]
    unit: str = ""

    @property
    def family(self) -> str:
        """The name a parser reports for the family (counters lose `_total`)."""
        if self.type == "counter" and self.name.endswith("_total"):
            return self.name[: -len("_total")]
        return self.name


def _m(
    name: str, type_: MetricType, help_: str, labels: tuple[str, ...], unit: str = ""
) -> MetricSpec:
    return MetricSpec(name=name, type=type_, help=help_, labels=labels, unit=unit)


STEPS = _m(
    "gpujob_train_steps_total",
    "counter",
    "Training steps this process completed (counted from 0 at each process start).",
    RANK_LABELS,
)
START_STEP = _m(
    "gpujob_train_start_step",
    "gauge",
    "The run's step this process started from: a resumed checkpoint's global step, 0 on a "
    "fresh start. The run's global step is this plus gpujob_train_steps_total.",
    RANK_LABELS,
)
TARGET_STEPS = _m(
    "gpujob_train_target_steps",
    "gauge",
    "Training steps (loop iterations) the job means to run.",
    RANK_LABELS,
)
SAMPLES = _m("gpujob_train_samples_total", "counter", "Samples consumed.", RANK_LABELS)
TOKENS = _m("gpujob_train_tokens_total", "counter", "Tokens consumed, when given.", RANK_LABELS)
EPOCH = _m("gpujob_train_epoch", "gauge", "Current epoch, counted from 0.", RANK_LABELS)
LOSS = _m("gpujob_train_loss", "gauge", "Last reported training loss.", RANK_LABELS)
STEP_DURATION = _m(
    "gpujob_train_step_duration_seconds",
    "histogram",
    "Step time: from the end of one training step (its iteration's last optimizer step) to the "
    "end of the next.",
    RANK_LABELS,
    "seconds",
)
PHASE_SECONDS = _m(
    "gpujob_train_phase_seconds_total",
    "counter",
    "Step time by phase; the phases partition each step.",
    (*RANK_LABELS, LABEL_PHASE),
    "seconds",
)
COMPUTE_SECONDS = _m(
    "gpujob_train_compute_seconds_total",
    "counter",
    "The rank's own compute (forward, backward, optimizer), excluding data and comm waits.",
    RANK_LABELS,
    "seconds",
)
LAST_STEP_TIMESTAMP = _m(
    "gpujob_train_last_step_timestamp_seconds",
    "gauge",
    "Unix time the last training step ended (its iteration's last optimizer step).",
    RANK_LABELS,
    "seconds",
)
HEARTBEAT_TIMESTAMP = _m(
    "gpujob_train_heartbeat_timestamp_seconds",
    "gauge",
    "Unix time the training thread last entered a phase: alive between steps too.",
    RANK_LABELS,
    "seconds",
)
CLOCK_TIMESTAMP = _m(
    "gpujob_train_clock_timestamp_seconds",
    "gauge",
    "Unix time on the rank's own clock when this scrape was answered: the last-step and "
    "heartbeat times are on the same clock, so their ages need no agreement between clocks.",
    RANK_LABELS,
    "seconds",
)
MODEL_FLOPS = _m(
    "gpujob_train_model_flops_total",
    "counter",
    "Model FLOPs (forward and backward) of the samples trained, measured once or given.",
    RANK_LABELS,
)
PEAK_FLOPS = _m(
    "gpujob_train_peak_flops_per_second",
    "gauge",
    "Dense peak FLOP/s of the rank's GPU at its training precision; 0 with the reason when "
    "unknown.",
    (*RANK_LABELS, LABEL_DEVICE, LABEL_DTYPE, LABEL_REASON),
)
RANK_DEVICE = _m(
    "gpujob_train_device_info",
    "gauge",
    "One series per GPU this rank drives (several under nn.DataParallel); the value is the "
    "device's position in the rank's list, 0 for the one that gathers.",
    (*RANK_LABELS, LABEL_UUID),
)
CURRENT_PHASE = _m(
    "gpujob_train_current_phase",
    "gauge",
    "1 for the phase the rank is in now (checkpoint, eval, ...), 0 for the others.",
    (*RANK_LABELS, LABEL_PHASE),
)

PROFILE_STEP_SECONDS = _m(
    "gpujob_profile_step_seconds",
    "gauge",
    "The latest finished profile capture of the rank: seconds per captured step in each part "
    "(compute, exposed communication, copies, idle; they add up to the step time). Absent "
    "until a capture finished.",
    (*RANK_LABELS, LABEL_PART),
    "seconds",
)

GPU_TELEMETRY_AVAILABLE = _m(
    "gpujob_gpu_telemetry_available",
    "gauge",
    "1 when NVML GPU telemetry is exported, else 0 with the reason.",
    (LABEL_NODE_RANK, LABEL_REASON),
)
GPU_UTILIZATION = _m(
    "gpujob_gpu_utilization_ratio",
    "gauge",
    "Fraction of the last sample period a kernel ran on the GPU.",
    GPU_LABELS,
    "ratio",
)
GPU_MEMORY_USED = _m(
    "gpujob_gpu_memory_used_bytes", "gauge", "GPU memory in use.", GPU_LABELS, "bytes"
)
GPU_MEMORY_TOTAL = _m(
    "gpujob_gpu_memory_total_bytes", "gauge", "GPU memory installed.", GPU_LABELS, "bytes"
)
GPU_POWER = _m("gpujob_gpu_power_watts", "gauge", "GPU power draw.", GPU_LABELS, "watts")
GPU_POWER_LIMIT = _m(
    "gpujob_gpu_power_limit_watts", "gauge", "Enforced GPU power limit.", GPU_LABELS, "watts"
)
GPU_TEMPERATURE = _m(
    "gpujob_gpu_temperature_celsius", "gauge", "GPU core temperature.", GPU_LABELS, "celsius"
)
GPU_SM_CLOCK = _m("gpujob_gpu_sm_clock_hertz", "gauge", "Current SM clock.", GPU_LABELS, "hertz")
GPU_CLOCK_EVENT = _m(
    "gpujob_gpu_clock_event_active",
    "gauge",
    "1 while NVML reports this clock event (throttle) reason.",
    (*GPU_LABELS, LABEL_REASON),
)
GPU_XID_ERRORS = _m(
    "gpujob_gpu_xid_errors_total",
    "counter",
    "Critical XID errors seen since the exporter started.",
    GPU_LABELS,
)
GPU_ECC_UNCORRECTED = _m(
    "gpujob_gpu_ecc_uncorrected_errors_total",
    "counter",
    "Uncorrected ECC errors since the driver loaded (volatile count).",
    GPU_LABELS,
)

GPU_PCIE_RX = _m(
    "gpujob_gpu_pcie_rx_bytes_per_second",
    "gauge",
    "PCIe traffic into the GPU (host to device), NVML's 20 ms sample.",
    GPU_LABELS,
    "bytes_per_second",
)
GPU_PCIE_TX = _m(
    "gpujob_gpu_pcie_tx_bytes_per_second",
    "gauge",
    "PCIe traffic out of the GPU (device to host), NVML's 20 ms sample.",
    GPU_LABELS,
    "bytes_per_second",
)
GPU_SM_ACTIVE = _m(
    "gpujob_gpu_sm_active_ratio",
    "gauge",
    "Share of SMs that were busy over the last sample period (NVML GPM SM_UTIL).",
    GPU_LABELS,
    "ratio",
)
GPU_TENSOR_ACTIVE = _m(
    "gpujob_gpu_tensor_active_ratio",
    "gauge",
    "Share of cycles any tensor pipe was busy (NVML GPM ANY_TENSOR_UTIL).",
    GPU_LABELS,
    "ratio",
)
GPU_PROFILING_AVAILABLE = _m(
    "gpujob_gpu_profiling_available",
    "gauge",
    "1 when an optional counter group (pcie, gpm) is exported for every GPU, else 0 with "
    "the reason.",
    (LABEL_NODE_RANK, LABEL_COUNTER, LABEL_REASON),
)

CUDA_MEMORY_RESERVED = _m(
    "gpujob_cuda_memory_reserved_bytes",
    "gauge",
    "Memory the rank's CUDA caching allocator holds.",
    CUDA_LABELS,
    "bytes",
)
CUDA_ALLOC_RETRIES = _m(
    "gpujob_cuda_alloc_retries_total",
    "counter",
    "Allocations that had to free cached blocks and retry.",
    CUDA_LABELS,
)
CUDA_OOMS = _m(
    "gpujob_cuda_ooms_total", "counter", "Out-of-memory errors the allocator raised.", CUDA_LABELS
)

TRAIN_METRICS: Final = (
    STEPS,
    START_STEP,
    TARGET_STEPS,
    SAMPLES,
    TOKENS,
    EPOCH,
    LOSS,
    STEP_DURATION,
    PHASE_SECONDS,
    COMPUTE_SECONDS,
    LAST_STEP_TIMESTAMP,
    HEARTBEAT_TIMESTAMP,
    CLOCK_TIMESTAMP,
    CURRENT_PHASE,
    MODEL_FLOPS,
    PEAK_FLOPS,
    RANK_DEVICE,
)
GPU_METRICS: Final = (
    GPU_UTILIZATION,
    GPU_MEMORY_USED,
    GPU_MEMORY_TOTAL,
    GPU_POWER,
    GPU_POWER_LIMIT,
    GPU_TEMPERATURE,
    GPU_SM_CLOCK,
    GPU_CLOCK_EVENT,
    GPU_XID_ERRORS,
    GPU_ECC_UNCORRECTED,
    GPU_PCIE_RX,
    GPU_PCIE_TX,
    GPU_SM_ACTIVE,
    GPU_TENSOR_ACTIVE,
)
CUDA_METRICS: Final = (CUDA_MEMORY_RESERVED, CUDA_ALLOC_RETRIES, CUDA_OOMS)
PROFILE_METRICS: Final = (PROFILE_STEP_SECONDS,)
ALL_METRICS: Final = (
    *TRAIN_METRICS,
    *PROFILE_METRICS,
    GPU_TELEMETRY_AVAILABLE,
    GPU_PROFILING_AVAILABLE,
    *GPU_METRICS,
    *CUDA_METRICS,
)
BY_NAME: Final = {m.name: m for m in ALL_METRICS}


def metrics_port(base: int, local_rank: int) -> int:
    """The port a rank serves on: the base port plus its local rank."""
    return base + local_rank
