"""Progress, throughput and ETA of a job's window (status.progress).

- `step` is the run's step every rank has completed: the minimum over ranks of the step the
  rank's process started from (`gpujob_train_start_step`, a resumed checkpoint's step) plus
  its own step counter. Between a restart and the new attempt's first step on every rank it
  stays the last known step, so the status never shows 0 while a gang comes back;
- throughput sums the ranks' rates: in DDP each rank counts only its own samples;
- the ETA divides the remaining steps by the step rate since a basis: the first scrape after
  warm-up (`warmupSteps` of the process) since the latest start or resume. A long-run
  average includes checkpoints and evaluations as often as they recur, so the ETA does not
  saw-tooth around them; while the basis is younger than `BASIS_MIN_SCRAPES` scrape
  intervals or `BASIS_MIN_STEPS` steps, an EWMA of the recent step rate stands in. The
  basis lives in status (`rateSince`), so an operator restart keeps it.

What progress remembers between scrapes and across attempts is a `ProgressMemory` (plain
data, read from and written to status.progress), so this module stays pure.
"""

from __future__ import annotations

import math
import statistics
from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, Final

from gpujob_operator.monitoring.rows import (
    NAN,
    R_EPOCH,
    R_LAST_STEP,
    R_LOSS,
    R_SAMPLES,
    R_START_STEP,
    R_STEPS,
    R_T,
    R_TOKENS,
    global_step,
    latest,
    own_clock_age,
    rate,
)
from gpujob_operator.monitoring.verdicts.analysis_settings import Settings
from gpujob_operator.monitoring.verdicts.formatting import iso
from gpujob_operator.monitoring.verdicts.targets import Targets, job_targets
from gpujob_operator.monitoring.window import RankSeries

EWMA_ALPHA: Final = 0.3
"""Weight of the newest scrape interval in the smoothed step rate."""
MAX_ETA_SECONDS: Final = 100 * 365 * 86400.0
"""No estimated completion date beyond a century (a datetime ends at year 9999)."""
BASIS_MIN_SCRAPES: Final = 2
"""Scrape intervals the ETA's basis must span before its average replaces the EWMA."""
BASIS_MIN_STEPS: Final = 2
"""Steps the job must have made since the basis before its average replaces the EWMA."""


@dataclass(frozen=True, slots=True)
class RateBasis:
    """Where the ETA's step rate is measured from: a scrape after warm-up (status.progress.
    rateSince), valid for one attempt and one resume point."""

    time: float
    """Scrape time, seconds since the epoch."""
    step: int
    """The job's step then."""
    attempt: int
    start: int = 0
    """The resume point (min over ranks of their start step) the basis was taken under."""


@dataclass(frozen=True, slots=True)
class ProgressMemory:
    """What progress keeps between scrapes and across attempts, seeded from status.progress."""

    attempt: int = 0
    last_step: int | None = None
    """The last step shown (of an earlier scrape, or of an earlier attempt)."""
    furthest: int | None = None
    """The furthest step any attempt reached (never goes down)."""
    basis: RateBasis | None = None
    carried: bool = False
    """`last_step` came from status (an earlier attempt, or before an operator restart): it is
    shown until every rank of this attempt made its first step."""

    @classmethod
    def from_status(cls, progress: Mapping[str, Any] | None, attempt: int) -> ProgressMemory:
        """The memory of a job's status.progress for its attempt `attempt`: the basis only
        when it was taken in that attempt (a gang restart measures afresh)."""
        p = progress or {}
        step = _int_or_none(p.get("step"))
        furthest = max(
            (v for v in (step, _int_or_none(p.get("furthestStep"))) if v is not None),
            default=None,
        )
        basis = None
        since = p.get("rateSince") or {}
        at, b_step = _time_or_none(since.get("time")), _int_or_none(since.get("step"))
        if at is not None and b_step is not None and _int_or_none(since.get("attempt")) == attempt:
            start = _int_or_none(p.get("resumedFromStep")) or 0
            basis = RateBasis(at, b_step, attempt, start)
        return cls(attempt, step, furthest, basis, carried=step is not None)

    def restarted(self) -> ProgressMemory:
        """The memory after the window was dropped: the steps kept, the basis forgotten."""
        return replace(self, basis=None, carried=self.last_step is not None)


def _int_or_none(v: Any) -> int | None:
    return int(v) if isinstance(v, int | float) and not isinstance(v, bool) and v == v else None


def _time_or_none(v: Any) -> float | None:
    if not isinstance(v, str):
        return None
    try:
        return datetime.fromisoformat(v.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def rate_since(basis: RateBasis) -> dict[str, Any]:
    """status.progress.rateSince of a basis."""
    return {"time": iso(basis.time), "step": basis.step, "attempt": basis.attempt}


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


def _min_latest(series: Sequence[RankSeries], index: int) -> float:
    values = [v for s in series if not math.isnan(v := latest(s.rows, index))]
    return min(values) if values else NAN


def progress_status(
    series: Sequence[RankSeries],
    ready_rows: dict[Any, list[array[float]]],
    settings: Settings,
    now: float,
    step_rate: float | None,
    targets: Targets | None = None,
    memory: ProgressMemory | None = None,
) -> tuple[dict[str, Any], ProgressMemory]:
    """status.progress (camelCase, matching api.Progress) of the ranks that speak for now, and
    the memory for the next scrape; the total is the job's target steps (`targets.job_targets`,
    computed when not given)."""
    mem = memory or ProgressMemory()
    out: dict[str, Any] = {}
    steps = [v for s in series if not math.isnan(v := global_step(s.rows))]
    if not steps:
        return out, mem
    own = _min_latest(series, R_STEPS)  # steps of the ranks' own processes
    start_f = _min_latest(series, R_START_STEP)
    start = int(start_f) if not math.isnan(start_f) else 0
    now_step = int(min(steps))
    stepped = not math.isnan(own) and own >= 1  # every rank made a step in this process
    carried = mem.carried and not stepped and mem.last_step is not None
    step = mem.last_step if carried and mem.last_step is not None else now_step
    furthest = max(step, mem.furthest if mem.furthest is not None else step)
    out["step"] = step
    if not math.isnan(start_f):
        # Only a trainer that says where it resumed speaks the run's global step: a process
        # count from 0 after a resume would make a furthest step no attempt could pass.
        out["furthestStep"] = furthest
    if start > 0:
        out["resumedFromStep"] = start
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

    # The ETA's basis: the first scrape after warm-up since the latest start or resume.
    seen_at = max(s.rows[-1][R_T] for s in series if s.rows)
    basis = mem.basis
    if basis is not None and (
        basis.attempt != mem.attempt or basis.start != start or now_step < basis.step
    ):
        basis = None  # another attempt, a resume or a process restart: measure afresh
    warm = max(1, settings.warmup_steps)
    if basis is None and not carried and not math.isnan(own) and own >= warm:
        basis = RateBasis(seen_at, now_step, mem.attempt, start)
    if basis is not None:
        out["rateSince"] = rate_since(basis)
    eta_rate, why = _eta_rate(basis, now_step, seen_at, settings, step_rate)
    if carried:
        resumed = f"resumed from step {start}" if start else "started"
        why = f"resuming: attempt {mem.attempt} {resumed}; the ETA returns after its first steps"
    elif basis is None:
        left = warm - (int(own) if not math.isnan(own) else 0)
        why = f"measuring: {left} more step{'s' if left != 1 else ''} of warm-up"
    if total and step >= total:
        out["etaSeconds"] = 0.0
        out["estimatedCompletionTime"] = iso(now)  # done stepping: its GPUs free up now
    elif not total:
        out["etaUnavailable"] = (
            "no target: the ranks export no target steps and spec.training.totalSteps is unset"
        )
    elif eta_rate is not None and not carried:
        eta = max(0.0, (total - step) / eta_rate)
        out["etaSeconds"] = round(eta, 1)
        if eta <= MAX_ETA_SECONDS:  # beyond, a date means nothing (and may not exist)
            out["estimatedCompletionTime"] = iso(now + eta)
    else:
        out["etaUnavailable"] = why or "measuring: no step rate yet"
    last = [v for s in series if not math.isnan(v := _last_step_time(s))]
    if last:
        out["lastStepTime"] = iso(max(last))
    losses = [v for s in series if math.isfinite(v := latest(s.rows, R_LOSS))]
    if losses:
        out["loss"] = round(statistics.fmean(losses), 6)
    new_mem = replace(mem, last_step=step, furthest=furthest, basis=basis, carried=carried)
    return out, new_mem


def _eta_rate(
    basis: RateBasis | None,
    step: int,
    seen_at: float,
    settings: Settings,
    ewma: float | None,
) -> tuple[float | None, str]:
    """The step rate the ETA divides by, and why there is none ("" when there is one): the
    average since the basis once it is old enough, the EWMA while it is young."""
    if basis is None:
        return None, ""
    age = seen_at - basis.time
    made = step - basis.step
    if age >= BASIS_MIN_SCRAPES * settings.scrape_interval_seconds and made >= BASIS_MIN_STEPS:
        return made / age, ""
    if ewma is not None and ewma > 0:
        return ewma, ""
    return None, "measuring: waiting for the next scrape's steps"
