"""The job's target steps when its ranks disagree, and the target each rank is judged by.

Every rank exports the steps it means to run (`gpujob_train_target_steps`). They should
agree, but one rank with a huge target (a bug, an unset value read as 2^63) or a slightly
different one (uneven shards) must neither hold the percent at 0 nor keep the job from
ever counting as finished (then a stall is confirmed after training ended). So:

- a target above `MAX_TARGET_STEPS`, or above `OUTLIER_FACTOR` x the ranks' low median, is
  rejected: no single rank can move the job's total far; so is a target that its own rank
  has already passed `UNDERSHOOT_FACTOR` times over (a loader's length, say), which would
  otherwise pull the median down and have the real targets rejected;
- the job's target is the one most of the other ranks report (on a tie the spec's when a
  rank reports it, else the larger, so the percent never reaches 100 before a real target
  is done), or the spec's when none does;
- a rank is finished against its own target; a rank with none, or a rejected one, against
  the job's;
- when the ranks disagree, `note` says which report what (bounded, for MetricsAvailable).
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final

from gpujob_operator.monitoring.rows import R_TARGET, global_step, latest
from gpujob_operator.monitoring.window import RankSeries

MAX_TARGET_STEPS: Final = 1e12
"""No job means to run more steps (a billion steps of a millisecond is eleven days)."""
OUTLIER_FACTOR: Final = 10.0
"""A target this many times the ranks' low median is one rank's mistake, not the job's."""
UNDERSHOOT_FACTOR: Final = 2.0
"""A rank this many times past its own target reported a figure that was never its total."""
MAX_LISTED: Final = 4
"""Disagreeing ranks named in the note; the others are counted."""


@dataclass(frozen=True, slots=True)
class Targets:
    """The job's target steps and the one each rank (pod, rank) is judged by."""

    total: int | None
    """The job's target: what the percent and ETA count towards (None: none known)."""
    own: dict[tuple[str, int], float] = field(default_factory=dict)
    """The accepted targets of the ranks that report one."""
    note: str = ""
    """Which ranks report another target than the job's ("" when they all agree)."""

    def of(self, s: RankSeries) -> float | None:
        """The target rank `s` is finished at: its own accepted one, else the job's."""
        own = self.own.get((s.pod, s.rank))
        return own if own is not None else self.total

    def finished(self, series: Sequence[RankSeries]) -> bool:
        """Every rank that reports its step reached its own target (and one does)."""
        seen = False
        for s in series:
            step = global_step(s.rows)
            if math.isnan(step):
                continue
            target = self.of(s)
            if not target or step < target:
                return False
            seen = True
        return seen


def job_targets(series: Sequence[RankSeries], fallback: int | None) -> Targets:
    """The job's target steps from its ranks' (`fallback`, the spec's, when none reports)."""
    reported = {
        (s.pod, s.rank): v
        for s in series
        if not math.isnan(v := latest(s.rows, R_TARGET)) and v > 0
    }
    # A target far below the steps its own rank has already taken is impossible (a rank
    # that exports its loader's length, say): it is refused before it can pull the median
    # down and have the real targets rejected, the job judged finished early, never
    # stalled. A rank a little past its target (an off-by-one, a finished epoch) keeps it.
    passed = {
        (s.pod, s.rank)
        for s in series
        if (k := (s.pod, s.rank)) in reported
        and global_step(s.rows) > UNDERSHOOT_FACTOR * reported[k]
    }
    plausible = [v for k, v in reported.items() if v <= MAX_TARGET_STEPS and k not in passed]
    bound = OUTLIER_FACTOR * statistics.median_low(plausible) if plausible else 0.0
    own = {
        k: v for k, v in reported.items() if v <= min(bound, MAX_TARGET_STEPS) and k not in passed
    }
    total = fallback
    if own:
        counts = Counter(own.values())
        best = max(counts.values())
        tied = [v for v, n in counts.items() if n == best]
        # The spec's figure breaks a tie when a rank reports it; else the larger, so the
        # percent never reaches 100 before a real target is done.
        total = int(fallback if fallback in tied else max(tied))
    return Targets(total, own, _note(series, reported, own, total))


def _note(
    series: Sequence[RankSeries],
    reported: dict[tuple[str, int], float],
    own: dict[tuple[str, int], float],
    total: int | None,
) -> str:
    odd = sorted(
        (s.rank, reported[k], k not in own)
        for s in series
        if (k := (s.pod, s.rank)) in reported and (reported[k] != total or k not in own)
    )
    if not odd:
        return ""
    shown = ", ".join(
        f"rank {rank}: {_steps(v)}" + (" (rejected)" if rejected else "")
        for rank, v, rejected in odd[:MAX_LISTED]
    )
    more = f" and {len(odd) - MAX_LISTED} more" if len(odd) > MAX_LISTED else ""
    job = _steps(total) if total else "unknown"
    what = "ranks disagree on" if len(set(reported.values())) > 1 else "rejected"
    return f"{what} the target steps (the job's is {job}): {shown}{more}"


def _steps(v: float) -> str:
    return f"{v:.0f}" if v < 1e9 else f"{v:.3g}"
