"""Hysteresis for bottleneck verdicts (pure): publish what holds, not what flickers.

A candidate must hold for `n` consecutive evaluations before it is published, and the
published verdict is only cleared after `n` consecutive evaluations without it, so a job
near a threshold does not flap (and post an Event) every scrape. Stalled and HardwareFault
are facts rather than trends (a stall already waited its timeout; an XID happened), so they
are published, and cleared, at once. The state is a small plain object the shell keeps
per job; `step()` returns the next state instead of mutating.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Final

from gpujob_operator.monitoring.verdicts.verdict import HARDWARE_FAULT, HEALTHY, STALLED, Verdict

IMMEDIATE: Final = frozenset({STALLED, HARDWARE_FAULT})


@dataclass(frozen=True, slots=True)
class VerdictState:
    """What is published, since when, and the candidate that may replace it."""

    published: Verdict | None = None
    since: float | None = None
    pending: str | None = None
    """The candidate verdict not yet published, and for how many evaluations it held."""
    streak: int = 0
    absent: int = 0
    """Consecutive evaluations in which the published verdict did not hold."""


@dataclass(frozen=True, slots=True)
class Change:
    """A change of the published verdict (the shell posts an Event for each)."""

    previous: str | None
    current: str
    verdict: Verdict
    since: float


def step(
    state: VerdictState, candidate: Verdict | None, now: float, n: int
) -> tuple[VerdictState, Change | None]:
    """Fold one evaluation into the state; `candidate` None means "no evaluation" (warm-up).

    The published verdict's numbers are refreshed whenever it holds again.
    """
    if candidate is None:
        return state, None
    n = max(1, n)
    pub = state.published
    if pub is not None and candidate.verdict == pub.verdict:
        return VerdictState(candidate, state.since, None, 0, 0), None
    absent = state.absent + 1 if pub is not None else 0
    streak = state.streak + 1 if candidate.verdict == state.pending else 1
    needed = 1 if candidate.verdict in IMMEDIATE else n
    if pub is None and candidate.verdict == HEALTHY:
        needed = 1  # first evaluation: nothing to protect, say what holds
    clear_now = pub is not None and (pub.verdict in IMMEDIATE or absent >= n)
    if streak >= needed and (pub is None or clear_now or candidate.verdict in IMMEDIATE):
        change = Change(pub.verdict if pub else None, candidate.verdict, candidate, now)
        return VerdictState(candidate, now, None, 0, 0), change
    if clear_now and pub is not None and pub.verdict != HEALTHY:
        # The published verdict is gone for good but no successor has proven itself yet
        # (e.g. two candidates alternate): fall back to Healthy with the latest numbers.
        healthy = Verdict(HEALTHY, "Info", f"{pub.verdict} no longer detected")
        change = Change(pub.verdict, HEALTHY, healthy, now)
        return VerdictState(healthy, now, candidate.verdict, streak, 0), change
    return replace(state, pending=candidate.verdict, streak=streak, absent=absent), None
