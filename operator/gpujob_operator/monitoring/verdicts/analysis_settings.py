"""What the analysis needs from a job's spec: its `Settings` (defaults are the API's).

The monitor sizes the job's window from them (`max_points`), the analysis reads the
warm-up, the thresholds and the stall timeouts, the hysteresis how many evaluations confirm
a verdict; `gpujob diagnose` builds them from a manifest or its flags.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gpujob_operator import api


@dataclass(frozen=True)
class Settings:
    """What the analysis needs from the job's spec (defaults are the API's)."""

    total_steps: int | None = None
    warmup_steps: int = 20
    min_scrapes: int = 3
    window_seconds: float = 120.0
    scrape_interval_seconds: float = 15.0
    stall_timeout_seconds: float = 300.0
    startup_timeout_seconds: float = 1800.0
    busy_timeout_seconds: float = 1800.0
    hysteresis_windows: int = 3
    gpus_requested: int | None = None
    thresholds: api.Thresholds = field(default_factory=api.Thresholds)
    peak_tflops: float | None = None
    """The job's dense peak TFLOP/s per GPU for MFU (None: the trainer's table)."""

    @classmethod
    def from_spec(cls, spec: api.GPUTrainingJobSpec | Mapping[str, Any]) -> Settings:
        """Settings of a job spec (a model or its camelCase dict)."""
        s = api.parse_spec(spec)
        return cls.from_monitoring(s.monitoring, s.training.total_steps, s.total_gpus or None)

    @classmethod
    def from_monitoring(
        cls, m: api.Monitoring, total_steps: int | None = None, gpus: int | None = None
    ) -> Settings:
        """Settings of a spec's `monitoring` section (`gpujob diagnose` starts from one)."""
        return cls(
            total_steps=total_steps,
            warmup_steps=m.warmup_steps,
            min_scrapes=m.window.min_scrapes,
            window_seconds=float(m.window.duration_seconds),
            scrape_interval_seconds=float(m.scrape_interval_seconds),
            stall_timeout_seconds=float(m.stall_timeout_seconds),
            startup_timeout_seconds=float(m.startup_timeout_seconds),
            busy_timeout_seconds=float(m.busy_timeout_seconds),
            hysteresis_windows=m.hysteresis_windows,
            gpus_requested=gpus,
            thresholds=m.thresholds,
            peak_tflops=m.peak_tflops_per_gpu,
        )

    def max_points(self) -> int:
        """Rows a window keeps per series: the window's scrapes plus one for the deltas."""
        return (
            max(self.min_scrapes, math.ceil(self.window_seconds / self.scrape_interval_seconds)) + 1
        )
