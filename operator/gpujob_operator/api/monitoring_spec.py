"""``spec.monitoring``: scraping, stall detection and the bottleneck analysis' settings.

The window of scrapes, the per-verdict thresholds and the timeouts, each cross-field rule
written twice: CEL in the CRD and the same check in a pydantic validator.
"""

from __future__ import annotations

from typing import ClassVar, Final

from pydantic import ConfigDict, Field, model_validator

from gpujob_operator.api import rules as R
from gpujob_operator.api.base import Model as _Model
from gpujob_operator.api.base import Ruled as _Ruled


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
        json_schema_extra=R.cel_rules(
            R.cel(
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
    transfer_bound_ratio: float = Field(
        default=0.20,
        ge=0,
        le=1,
        description="TransferBound when copying batches to the GPU (the h2d phase) exceeds "
        "this share of training time.",
    )
    compute_bound_ratio: float = Field(
        default=0.90,
        ge=0,
        le=1,
        description="ComputeBound (Info) when forward, backward and optimizer exceed this "
        "share of training time.",
    )
    data_parallel_balance_ratio: float = Field(
        default=0.67,
        ge=0,
        le=1,
        description="DataParallelImbalance when one process drives several GPUs and the "
        "others' median memory in use (or utilization) over its first GPU's falls below it.",
    )

    @model_validator(mode="after")
    def _warn_below_bound(self) -> Thresholds:
        if self.input_warn_ratio >= self.input_bound_ratio:
            raise ValueError(_WARN_BELOW_BOUND)
        return self


_PROFILE_PATH_ABSOLUTE: Final = (
    "spec.monitoring.profile.path must be an absolute path without '..' segments (a "
    "directory inside one of the trainer's spec.template.volumeMounts)"
)


def profile_path_is_absolute(path: str | None) -> bool:
    """An absolute path with no ``..`` segment (the CEL twin of the rule below)."""
    return path is None or (path.startswith("/") and ".." not in path.split("/"))


class Profile(_Ruled):
    """Where a profile's trace files go (``gpujob profile``, ``profileOnVerdict``)."""

    RULES: ClassVar = (
        R.Rule(
            "!has(self.path) || (self.path.startsWith('/') && "
            "!self.path.matches('(^|/)[.][.](/|$)'))",
            _PROFILE_PATH_ABSOLUTE,
            lambda m: profile_path_is_absolute(m.path),
            field_path=".path",
        ),
    )
    model_config = ConfigDict(json_schema_extra=R.validations(*RULES))

    path: str | None = Field(
        default=None,
        min_length=1,
        max_length=4096,
        description="Directory the ranks write their trace files to (GPUJOB_PROFILE_DIR): an "
        "absolute path inside one of the trainer's spec.template.volumeMounts, so the traces "
        "outlive the pod. Unset: an emptyDir mounted at /var/run/gpujob/profiles (gone with "
        "the pod).",
    )


class Monitoring(_Model):
    """Scraping of the ranks' /metrics, stall detection and bottleneck analysis."""

    model_config = ConfigDict(
        json_schema_extra=R.cel_rules(
            R.cel(
                "!has(self.stallTimeoutSeconds) || !has(self.scrapeIntervalSeconds) || "
                "self.stallTimeoutSeconds >= self.scrapeIntervalSeconds",
                "spec.monitoring.stallTimeoutSeconds must be >= scrapeIntervalSeconds",
            ),
            R.cel(
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
    peak_tflops_per_gpu: float | None = Field(
        default=None,
        alias="peakTFLOPSPerGPU",
        gt=0,
        le=1e6,
        description="Dense peak TFLOP/s of one GPU at the job's training precision, for MFU; "
        "overrides the trainer's table (a GPU it does not know, a clock-capped part).",
    )

    profile: Profile = Field(
        default_factory=Profile,
        description="Profiles on request (annotation gpujob.dev/profile, gpujob profile): "
        "where the traces go.",
        json_schema_extra={"default": {}},
    )
    profile_on_verdict: bool = Field(
        default=False,
        description="Profile the ranks once per attempt when a Warning bottleneck verdict has "
        "held for its hysteresis (status.profile.auto).",
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
