"""Progress, throughput and ETA of a job's window (status.progress).

- `step` is the minimum over ranks: the step every rank has completed (in DDP the ranks
  move in lockstep, so it differs from rank 0 by at most one);
- throughput sums the ranks' rates: in DDP each rank counts only its own samples;
- the ETA divides the remaining steps by an EWMA of the recent step rate, so one slow
  scrape interval does not swing it.
"""

from __future__ import annotations

import math
import statistics
from array import array
from collections.abc import Sequence
from typing import Any, Final

from gpujob_operator.monitoring.analysis_settings import Settings
from gpujob_operator.monitoring.formatting import iso
from gpujob_operator.monitoring.rows import (
    NAN,
    R_EPOCH,
    R_LAST_STEP,
    R_LOSS,
    R_SAMPLES,
    R_STEPS,
    R_T,
    R_TOKENS,
    latest,
    own_clock_age,
    rate,
)
from gpujob_operator.monitoring.targets import Targets, job_targets
from gpujob_operator.monitoring.window import RankSeries

EWMA_ALPHA: Final = 0.3
"""Weight of the newest scrape interval in the smoothed step rate."""
MAX_ETA_SECONDS: Final = 100 * 365 * 86400.0
"""No estimated completion date beyond a century (a datetime ends at year 9999)."""


def _ewma_rate(rows: Sequence[array[float]]) -> float:
    """EWMA of the step rate over successive scrape intervals (resets count from 0)."""
    est = math.nan
    prev: array[float] | None = None
    for row in rows:
        if math.isnan(row[R_STEPS]):
            continue
        if prev is not None and row[R_T] > prev[R_T]:
            d = row[R_STEPS] - prev[R_STEPS]
            d = d if d >= 0 else row[R_STEPS]
            r = d / (row[R_T] - prev[R_T])
            est = r if math.isnan(est) else EWMA_ALPHA * r + (1 - EWMA_ALPHA) * est
        prev = row
    return est


def _last_step_time(s: RankSeries) -> float:
    """When the rank's last step ended, on the operator's clock when the rank exports its own
    clock (its scrape time less the step's age), else as the rank exported it."""
    at, age = own_clock_age(s.rows, R_LAST_STEP)
    if math.isnan(at):
        return NAN
    return at - age if not math.isnan(age) else latest(s.rows, R_LAST_STEP)


def smoothed_step_rate(
    series: Sequence[RankSeries], ready_rows: dict[Any, list[array[float]]]
) -> float | None:
    """The job's smoothed steps per second: the median over ranks of their EWMA step rates."""
    rates = []
    for s in series:
        rows = ready_rows.get((s.pod, s.rank)) or []
        r = _ewma_rate(rows if len(rows) >= 2 else s.rows)
        if not math.isnan(r):
            rates.append(r)
    return statistics.median(rates) if rates else None


def progress_status(
    series: Sequence[RankSeries],
    ready_rows: dict[Any, list[array[float]]],
    settings: Settings,
    now: float,
    step_rate: float | None,
    targets: Targets | None = None,
) -> dict[str, Any]:
    """status.progress (camelCase, matching api.Progress) of the ranks that speak for now;
    the total is the job's target steps (`targets.job_targets`, computed when not given)."""
    out: dict[str, Any] = {}
    steps = [v for s in series if not math.isnan(v := latest(s.rows, R_STEPS))]
    if not steps:
        return out
    step = int(min(steps))
    out["step"] = step
    total = (targets or job_targets(series, settings.total_steps)).total
    if total:
        out["totalSteps"] = total
        out["percent"] = round(min(100.0, 100.0 * step / total), 2)
    epochs = [v for s in series if not math.isnan(v := latest(s.rows, R_EPOCH))]
    if epochs:
        out["epoch"] = max(epochs)

    def throughput(index: int) -> float | None:
        vals = []
        for s in series:
            rows = ready_rows.get((s.pod, s.rank)) or []
            r = rate(rows if len(rows) >= 2 else s.rows, index)
            if not math.isnan(r):
                vals.append(r)
        return round(sum(vals), 3) if vals else None

    sps = throughput(R_SAMPLES)
    if sps is not None:
        out["samplesPerSecond"] = sps
    tps = throughput(R_TOKENS)
    if tps is not None:
        out["tokensPerSecond"] = tps
    if total and step_rate is not None and step_rate > 0:
        eta = max(0.0, (total - step) / step_rate)
        out["etaSeconds"] = round(eta, 1)
        if eta <= MAX_ETA_SECONDS:  # beyond, a date means nothing (and may not exist)
            out["estimatedCompletionTime"] = iso(now + eta)
    elif total and step >= total:
        out["etaSeconds"] = 0.0
    last = [v for s in series if not math.isnan(v := _last_step_time(s))]
    if last:
        out["lastStepTime"] = iso(max(last))
    losses = [v for s in series if math.isfinite(v := latest(s.rows, R_LOSS))]
    if losses:
        out["loss"] = round(statistics.fmean(losses), 6)
    return out
