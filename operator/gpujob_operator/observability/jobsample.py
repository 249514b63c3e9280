"""One job's status read into the numbers that become its series on the operator's /metrics.

The job loop hands each job's freshly computed status (wire format, camelCase) to
:meth:`JobMetrics.update <gpujob_operator.observability.opmetrics.JobMetrics.update>`, which
keeps it as a :class:`JobSample` until the next scrape renders it. Reading is lenient: a
missing or odd value makes its series absent, never an error.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from gpujob_operator.api.statusupgrade import is_legacy, upgrade
from gpujob_operator.observability.opfamilies import (
    CONFIDENCES,
    LOST_CAUSES,
    PHASE_RUNNING,
    PHASES,
    REPLICA_STATES,
    VERDICT_OTHER,
    VERDICTS,
)


def _num(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    f = float(value)
    return f if math.isfinite(f) else None


def _timestamp(value: Any) -> float | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _condition(status: Mapping[str, Any], type_: str) -> str | None:
    for c in status.get("conditions") or ():
        if isinstance(c, Mapping) and c.get("type") == type_:
            return str(c.get("status"))
    return None


@dataclass(frozen=True)
class JobSample:
    """The numbers of one job's status that become series (None: the series is absent)."""

    progress_ratio: float | None = None
    step: float | None = None
    target_steps: float | None = None
    eta_seconds: float | None = None
    samples_per_second: float | None = None
    tokens_per_second: float | None = None
    loss: float | None = None
    mfu: float | None = None
    step_p50_seconds: float | None = None
    step_p95_seconds: float | None = None
    last_step_timestamp: float | None = None
    start_timestamp: float | None = None
    phase: str | None = None
    verdict: str | None = None
    restarts: float = 0.0
    metrics_available: float | None = None
    stalled: float = 0.0
    gpus: float | None = None
    gpu_utilization: float | None = None
    replicas: Mapping[str, float] = field(default_factory=dict)
    start_forecast: float | None = None
    start_forecast_confidence: str | None = None
    start_forecast_error: float | None = None
    goodput_ratio: float | None = None
    lost_gpu_seconds: Mapping[str, float] = field(default_factory=dict)
    """GPU-seconds by lost cause (status.goodput.seconds x status.gang.gpus.requested)."""
    productive_gpu_seconds: float | None = None
    unobserved_gpu_seconds: float | None = None
    """GPU-seconds whose steps the operator could not see; with any, the job exports no
    ratio, lost or productive GPU-seconds (the fleet's goodput leaves it out)."""

    @classmethod
    def from_status(cls, status: Mapping[str, Any]) -> JobSample:
        """Read a wire-format (camelCase) status leniently: missing or odd values are absent."""
        if is_legacy(status):  # written by the previous version, not moved yet
            status = upgrade(status)
        progress = status.get("progress") or {}
        bottleneck = status.get("bottleneck") or {}
        gang = status.get("gang") or {}
        gpus = gang.get("gpus") or {}
        replicas = gang.get("replicas") or {}
        ratio = None
        percent = _num(progress.get("percent"))
        if percent is not None:
            ratio = min(max(percent / 100.0, 0.0), 1.0)
        else:
            step, total = _num(progress.get("step")), _num(progress.get("totalSteps"))
            if step is not None and total:
                ratio = min(max(step / total, 0.0), 1.0)
        phase = status.get("phase")
        # A verdict is about the attempt that runs now: a restarting, suspended or finished
        # job has none, whatever an older status still carries (no page for a dead gang).
        running = phase == PHASE_RUNNING
        verdict = bottleneck.get("verdict") if isinstance(bottleneck, Mapping) and running else None
        if isinstance(verdict, str) and verdict and verdict not in VERDICTS:
            verdict = VERDICT_OTHER
        queue = gang.get("startForecast") or {}
        error = _num(queue.get("forecastErrorSeconds"))
        confidence = queue.get("confidence")
        forecast = (
            _timestamp(queue.get("estimatedStartTime"))
            if error is None and confidence in CONFIDENCES
            else None
        )
        gpu_count = _num(gpus.get("requested"))
        raw = status.get("goodput")
        ledger: Mapping[str, Any] = raw if isinstance(raw, Mapping) else {}
        raw = ledger.get("seconds")
        seconds: Mapping[str, Any] = raw if isinstance(raw, Mapping) else {}
        lost: dict[str, float] = {}
        productive = None
        unobserved = _num(seconds.get("unobserved")) or 0.0
        if gpu_count is not None and seconds and unobserved <= 0:
            lost = {
                k: v * gpu_count for k in LOST_CAUSES if (v := _num(seconds.get(k))) is not None
            }
            p = _num(seconds.get("productive"))
            productive = None if p is None else p * gpu_count
        available = _condition(status, "MetricsAvailable")
        stalled = running and (_condition(status, "Stalled") == "True" or verdict == "Stalled")
        return cls(
            progress_ratio=ratio,
            step=_num(progress.get("step")),
            target_steps=_num(progress.get("totalSteps")),
            eta_seconds=_num(progress.get("etaSeconds")),
            samples_per_second=_num(progress.get("samplesPerSecond")),
            tokens_per_second=_num(progress.get("tokensPerSecond")),
            loss=_num(progress.get("loss")),
            mfu=_num(progress.get("mfu")),
            step_p50_seconds=_num(progress.get("stepSecondsP50")),
            step_p95_seconds=_num(progress.get("stepSecondsP95")),
            last_step_timestamp=_timestamp(progress.get("lastStepTime")),
            start_timestamp=_timestamp(status.get("startTime")),
            phase=phase if phase in PHASES else None,
            verdict=verdict if isinstance(verdict, str) and verdict else None,
            restarts=_num(gang.get("restarts")) or 0.0,
            metrics_available=None if available is None else float(available == "True"),
            stalled=float(stalled),
            gpus=gpu_count,
            gpu_utilization=_num(gpus.get("meanUtilizationRatio")),
            replicas={k: v for k in REPLICA_STATES if (v := _num(replicas.get(k))) is not None},
            start_forecast=forecast,
            start_forecast_confidence=str(confidence) if forecast is not None else None,
            start_forecast_error=error,
            goodput_ratio=_num(ledger.get("ratio")) if unobserved <= 0 else None,
            lost_gpu_seconds=lost,
            productive_gpu_seconds=productive,
            unobserved_gpu_seconds=(
                unobserved * gpu_count if gpu_count is not None and unobserved > 0 else None
            ),
        )
