"""The Stalled verdict: hung, not slow, and the reason the Stalled condition gives.

Stalled means hung, not slow: no step for the threshold *and* no rank busy. The threshold
is max(`STALL_STEP_FACTOR` x the run's median step time, stallTimeoutSeconds). Before the
first step the threshold is the start-up timeout; once every rank reached its own last step
(`targets`) there is no stall; a rank that changed phase within the threshold (its heartbeat
moved) or sits in a checkpoint or an evaluation (up to the busy timeout) is busy. The heartbeat and the last step are
timed by the operator's own clock (when it saw the value change); on first sight (an operator
restart, a handover, a spec edit) by their age on the rank's own clock, which it exports with
them, or from that sight when it does not. A node's clock is never compared with the
operator's, so clock skew between nodes does not matter.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Final

from gpujob_operator.api import conditions as c
from gpujob_operator.api.display import format_duration
from gpujob_operator.monitoring.rows import (
    N_BUCKETS,
    R_CURRENT_PHASE,
    R_STEPS,
    latest,
)
from gpujob_operator.monitoring.verdicts.analysis_settings import Settings
from gpujob_operator.monitoring.verdicts.formatting import round4
from gpujob_operator.monitoring.verdicts.latency import quantile
from gpujob_operator.monitoring.verdicts.targets import job_targets
from gpujob_operator.monitoring.verdicts.verdict import ADVICE, CRITICAL, STALLED, Evidence, Verdict
from gpujob_operator.monitoring.window import RankSeries, Window
from gpujob_trainer import contract

STALL_STEP_FACTOR: Final = 10.0
"""Stalled after max(this x the median step time, stallTimeoutSeconds) without a step."""


def median_step_seconds(series: Sequence[RankSeries]) -> float | None:
    """Median step time of the run so far, from the ranks' cumulative histograms."""
    merged = [0.0] * N_BUCKETS
    for s in series:
        if s.buckets is None:
            continue
        for i, v in enumerate(s.buckets):
            if not math.isnan(v):
                merged[i] += v
    return quantile(0.5, merged)


StallOutcome = tuple[Verdict | None, float | None, float | None, str, str]
"""(Stalled or None, seconds without a step, threshold, condition reason, message)."""


def stall_verdict(
    window: Window, series: Sequence[RankSeries], settings: Settings, now: float
) -> StallOutcome:
    """(Stalled or None, seconds without a step, threshold, condition reason, message)."""
    if math.isnan(window.progress_time):
        return None, None, None, c.PROGRESSING, ""
    steps = {s.rank: latest(s.rows, R_STEPS) for s in series}
    known = [v for v in steps.values() if not math.isnan(v)]
    median = median_step_seconds(series)
    threshold = settings.stall_timeout_seconds
    if median is not None:
        threshold = max(threshold, STALL_STEP_FACTOR * median)
    starting = not known or max(known) <= 0
    if starting:
        threshold = max(threshold, settings.startup_timeout_seconds)
    idle = max(0.0, now - window.progress_time)
    targets = job_targets(series, settings.total_steps)
    if targets.finished(series):
        ends = sorted({t for s in series if (t := targets.of(s))})
        last = f"{ends[0]:.0f}" if len(ends) == 1 else f"{ends[0]:.0f}-{ends[-1]:.0f}"
        note = f"every rank reached {'the' if len(ends) == 1 else 'its own'} last step {last}"
        return None, idle, threshold, c.RANKS_FINISHED, note
    if idle <= threshold:
        if starting:
            note = (
                f"no step yet after {format_duration(idle)} (start-up: compilation, init, data; "
                f"stalled after {format_duration(threshold)})"
            )
            return None, idle, threshold, c.STARTING_UP, note
        note = f"steps advance (stall after {threshold:.0f}s without one)"
        return None, idle, threshold, c.PROGRESSING, note
    busy = _busy_ranks(series, settings, now, threshold)
    if busy:
        note = f"no step for {format_duration(idle)}, but not hung: " + "; ".join(busy)
        return None, idle, threshold, c.RANKS_BUSY, note
    step = int(min(known)) if known else 0  # every step value may have been refused
    behind = min(series, key=lambda s: latest(s.rows, R_STEPS))
    if starting:
        how = f"startup timeout {settings.startup_timeout_seconds:.0f}s"
        what = f"no rank finished a first step in {format_duration(idle)}"
    else:
        how = f"stall timeout {settings.stall_timeout_seconds:.0f}s"
        if median is not None:
            how = f"max({STALL_STEP_FACTOR:.0f} x median step {median:.3g}s, {how})"
        what = f"no rank finished a step for {format_duration(idle)}"
    summary = (
        f"{what} (threshold {format_duration(threshold)} = {how}) and no rank is busy; "
        f"stuck at step {step}"
    )
    ev: Evidence = {
        "secondsSinceLastStep": round4(idle),
        "thresholdSeconds": round4(threshold),
        "step": step,
    }
    if median is not None:
        ev["medianStepSeconds"] = round4(median)
    phases = sorted({p for s in series if (p := _current_phase(s))})
    if phases:
        ev["currentPhases"] = ",".join(phases)
    lagging = len(set(steps.values())) > 1
    verdict = Verdict(
        STALLED,
        CRITICAL,
        summary,
        ev,
        ADVICE[STALLED],
        rank=behind.rank if lagging else None,
        pod=behind.pod if lagging else None,
        node=(behind.node or None) if lagging else None,
    )
    return verdict, idle, threshold, c.STALL_DETECTED, summary


def _current_phase(s: RankSeries) -> str:
    """The phase the rank last said it is in ("" when it does not export one)."""
    index = latest(s.rows, R_CURRENT_PHASE)
    if math.isnan(index) or not 0 <= index < len(contract.PHASES):
        return ""
    return contract.PHASES[int(index)]


def _busy_ranks(
    series: Sequence[RankSeries], settings: Settings, now: float, threshold: float
) -> list[str]:
    """What each busy rank is doing: in a checkpoint or an evaluation for at most the busy
    timeout, or changing phase within the threshold (its heartbeat moved)."""
    out = []
    for s in series:
        if math.isnan(s.beat_since):
            continue
        age = max(0.0, now - s.beat_since)
        phase = _current_phase(s)
        if phase in contract.BUSY_PHASES and age <= max(settings.busy_timeout_seconds, threshold):
            out.append(f"rank {s.rank} is in {phase} for {format_duration(age)}")
        elif age <= threshold:
            where = f" (now {phase})" if phase else ""
            out.append(f"rank {s.rank} changed phase {format_duration(age)} ago{where}")
    return out
