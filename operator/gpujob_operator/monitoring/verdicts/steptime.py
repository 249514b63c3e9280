"""The step-time verdicts: where the ranks' step time goes, and who makes the others wait.

Judged on the ranks past warm-up, from their phase seconds summed over the window
(`ranktimes.RankTimes`):

- a rank's *own* time is its whole step minus its waits (data_wait, exposed comm_wait) and
  minus checkpoint and eval: forward/backward/optimizer plus everything the loop does
  around them (a loss head outside the model, augmentation on the GPU, metrics, clipping).
  Straggler compares the slowest rank's own time with the other ranks' median, so a rank
  that is slow anywhere in its step is named; the asymmetry it leaves (the others wait in
  all-reduce, it hardly waits) is published as evidence;
- exposed communication is judged on the rank that waits least for it (the critical
  path): the part of the others' wait that one slower rank explains never counts, so
  CommunicationBound means the wait is there on every rank (symmetric);
- data and comm ratios are shares of *training* time (step time minus checkpoint and
  eval), so a job that also checkpoints is judged on its steps; checkpoint and eval have
  verdicts of their own, as shares of the whole time between steps.
"""

from __future__ import annotations

import math
import statistics
from array import array
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from gpujob_operator import api
from gpujob_operator.monitoring.verdicts.formatting import pct, round4
from gpujob_operator.monitoring.verdicts.ranktimes import RankTimes, rank_times
from gpujob_operator.monitoring.verdicts.verdict import (
    ADVICE,
    CHECKPOINT_BOUND,
    COMMUNICATION_BOUND,
    EVAL_BOUND,
    INPUT_BOUND,
    STRAGGLER,
    WARNING,
    Evidence,
    RankBreakdown,
    Verdict,
)
from gpujob_operator.monitoring.window import Window

BREAKDOWN_WORST: Final = 3
"""Slowest ranks listed in status.bottleneck.breakdown (plus the median and the fastest)."""


@dataclass(frozen=True)
class StepTimeFindings:
    """What the ready ranks' step times say: verdicts, notes and the numbers behind them."""

    candidates: tuple[Verdict, ...] = ()
    notes: tuple[str, ...] = ()
    """Findings below a verdict's bound, for the Healthy summary (input wait over the warning
    ratio)."""
    evidence: Evidence = field(default_factory=dict)
    """The job's data and comm wait ratios, mean step time and straggler score."""
    breakdown: tuple[RankBreakdown, ...] = ()
    times: Mapping[Any, RankTimes] = field(default_factory=dict)
    """Each ready rank's phase seconds over the window (for the verdicts judged elsewhere)."""


def step_time_verdicts(
    window: Window, ready: Mapping[Any, list[array[float]]], th: api.Thresholds
) -> StepTimeFindings:
    """Straggler, InputBound, CheckpointBound, EvalBound and CommunicationBound of the ranks
    with enough rows past warm-up (`ready`), from their phase seconds in the window."""
    per = {}
    for k, rows in ready.items():
        t = rank_times(window.ranks[k], rows)
        if t is not None:
            per[k] = t
    if not per:
        return StepTimeFindings()
    candidates: list[Verdict] = []
    notes: list[str] = []
    evidence: Evidence = {}
    breakdown = _breakdown(per)
    training = sum(t.training for t in per.values())
    data_ratio = sum(t.data_wait for t in per.values()) / training if training > 0 else math.nan
    comm = {k: t.comm_wait / t.training for k, t in per.items() if t.training > 0}
    evidence["dataWaitRatio"] = round4(data_ratio)
    if comm:
        evidence["commWaitRatio"] = round4(min(comm.values()))
    evidence["stepSeconds"] = round4(
        sum(t.step for t in per.values()) / sum(t.steps for t in per.values())
    )
    strag = _straggler(per, th.straggler_score)
    if strag is not None:
        candidates.append(strag)
    elif len(per) > 1:
        score = _own_score(per)
        if score is not None:
            evidence["stragglerScore"] = round4(score[0])
    if data_ratio > th.input_bound_ratio:
        candidates.append(_input_bound(data_ratio, per, th))
    elif data_ratio > th.input_warn_ratio:
        notes.append(_input_text(data_ratio, th))
    for phase_bound in (
        _phase_bound(per, CHECKPOINT_BOUND, th.checkpoint_bound_ratio),
        _phase_bound(per, EVAL_BOUND, th.eval_bound_ratio),
    ):
        if phase_bound is not None:
            candidates.append(phase_bound)
    if comm:
        exposed = min(comm.values())
        if exposed > th.comm_bound_ratio:
            candidates.append(_comm_bound(exposed, comm, per, th))
    return StepTimeFindings(tuple(candidates), tuple(notes), evidence, breakdown, per)


def phase_ratios(per: Mapping[Any, RankTimes]) -> dict[str, float]:
    """``progress.checkpointRatio``/``evalRatio``: each phase's share of step time since the
    ranks started, on the rank that spends most in it (the gang waits for that rank); the
    planner's goodput charges these shares of the stepping time to checkpoint and eval."""
    out: dict[str, float] = {}
    for attr, key in (("checkpoint", "checkpointRatio"), ("eval", "evalRatio")):
        shares = [
            getattr(t, "run_" + attr) / t.run_step
            if t.run_step > 0
            else (getattr(t, attr) / t.step if t.step > 0 else 0.0)
            for t in per.values()
        ]
        if shares:
            out[key] = round4(min(1.0, max(shares)))
    return out


def _breakdown(per: Mapping[Any, RankTimes]) -> tuple[RankBreakdown, ...]:
    """The slowest few ranks by own time, the median one and the fastest (bounded)."""
    order = sorted(per.values(), key=lambda t: (-t.per_step(t.own), t.rank))
    roles: dict[int, str] = {len(order) - 1: "fastest", 0: "slowest"}
    roles.setdefault(len(order) // 2, "median")
    for i in range(1, min(BREAKDOWN_WORST, len(order))):
        roles.setdefault(i, "slowest")
    chosen = [(order[i], role) for i, role in sorted(roles.items())]
    return tuple(RankBreakdown.of(t, role) for t, role in chosen)


def _input_text(ratio: float, th: api.Thresholds) -> str:
    return (
        f"data loading takes {pct(ratio)} of step time "
        f"(warn > {pct(th.input_warn_ratio)}, bound > {pct(th.input_bound_ratio)})"
    )


def _input_bound(ratio: float, per: Mapping[Any, RankTimes], th: api.Thresholds) -> Verdict:
    worst = max(per.values(), key=lambda t: t.data_wait / t.training if t.training > 0 else 0.0)
    ev: Evidence = {
        "dataWaitRatio": round4(ratio),
        "maxRankDataWaitRatio": round4(worst.data_wait / worst.training if worst.training else 0.0),
        "maxRank": worst.rank,
        "boundRatio": th.input_bound_ratio,
        "warnRatio": th.input_warn_ratio,
    }
    return Verdict(INPUT_BOUND, WARNING, _input_text(ratio, th), ev, ADVICE[INPUT_BOUND])


def _comm_bound(
    exposed: float, comm: Mapping[Any, float], per: Mapping[Any, RankTimes], th: api.Thresholds
) -> Verdict:
    mean = statistics.fmean(comm.values())
    waits = [t.per_step(t.comm_wait) for t in per.values()]
    symmetry = min(waits) / max(waits) if max(waits) > 0 else 1.0
    summary = (
        f"exposed communication takes {pct(exposed)} of step time even on the rank that "
        f"waits least (mean {pct(mean)}; bound > {pct(th.comm_bound_ratio)}): every rank "
        "waits, so no slower rank explains it"
    )
    ev: Evidence = {
        "commWaitRatio": round4(exposed),
        "meanCommWaitRatio": round4(mean),
        "commWaitSymmetry": round4(symmetry),
        "boundRatio": th.comm_bound_ratio,
    }
    return Verdict(COMMUNICATION_BOUND, WARNING, summary, ev, ADVICE[COMMUNICATION_BOUND])


def _named(t: RankTimes) -> dict[str, Any]:
    """The Verdict fields that name one rank: rank, pod, node and GPU UUID (when known)."""
    return {"rank": t.rank, "pod": t.pod, "node": t.node or None, "gpu_uuid": t.uuid or None}


def _own_score(per: Mapping[Any, RankTimes]) -> tuple[float, RankTimes, list[RankTimes]] | None:
    """(the others' median own time / the slowest rank's, the slowest, the others)."""
    if len(per) < 2:
        return None
    slowest = max(per.values(), key=lambda t: (t.per_step(t.own), -t.rank))
    slow = slowest.per_step(slowest.own)
    if slow <= 0:
        return None
    others = [t for t in per.values() if t is not slowest]
    typical = statistics.median(t.per_step(t.own) for t in others)
    return typical / slow, slowest, others


def _straggler(per: Mapping[Any, RankTimes], bound: float) -> Verdict | None:
    scored = _own_score(per)
    if scored is None:
        return None
    score, s, others = scored
    if score >= bound:
        return None
    slow_own = s.per_step(s.own)
    typical_own = statistics.median(t.per_step(t.own) for t in others)
    typical_compute = statistics.median(t.per_step(t.compute) for t in others)
    others_wait = statistics.median(t.per_step(t.comm_wait) for t in others)
    own_wait = s.per_step(s.comm_wait)
    gap = slow_own - typical_own
    compute_gap = s.per_step(s.compute) - typical_compute
    outside = gap > 0 and compute_gap < gap / 2
    where = (
        "mostly outside forward/backward/optimizer (loss, preprocessing, metrics, logging…)"
        if outside
        else "mostly in forward/backward/optimizer"
    )
    summary = (
        f"rank {s.rank} (pod {s.pod}) takes {slow_own / typical_own if typical_own > 0 else math.inf:.1f}x "
        f"as long for its own work per step as the other ranks' median "
        f"({slow_own:.3g}s vs {typical_own:.3g}s; {where}): score {score:.2f} "
        f"(bound < {bound:.2f}); the others wait {others_wait:.3g}s per step for it in "
        f"all-reduce, it waits {own_wait:.3g}s"
    )
    ev: Evidence = {
        "stragglerScore": round4(score),
        "ownSecondsPerStep": round4(slow_own),
        "othersOwnSecondsPerStep": round4(typical_own),
        "computeSecondsPerStep": round4(s.per_step(s.compute)),
        "othersComputeSecondsPerStep": round4(typical_compute),
        "commWaitSecondsPerStep": round4(own_wait),
        "othersCommWaitSecondsPerStep": round4(others_wait),
        "othersCommWaitRatio": round4(
            statistics.median(t.comm_wait / t.training for t in others if t.training > 0)
        )
        if any(t.training > 0 for t in others)
        else 0.0,
        "gapOutsideCompute": "true" if outside else "false",
        "boundScore": bound,
    }
    if gap > 0:
        # In lockstep DDP the others' extra wait matches the straggler's extra work.
        ev["waitExplainedRatio"] = round4(max(0.0, others_wait - own_wait) / gap)
    return Verdict(
        STRAGGLER,
        WARNING,
        summary,
        ev,
        ADVICE[STRAGGLER],
        **_named(s),
    )


_PHASE_OF: Final = {CHECKPOINT_BOUND: "checkpoint", EVAL_BOUND: "eval"}
_PHASE_WORDS: Final = {CHECKPOINT_BOUND: "checkpointing", EVAL_BOUND: "evaluation"}


def _phase_bound(per: Mapping[Any, RankTimes], verdict: str, bound: float) -> Verdict | None:
    """CheckpointBound/EvalBound: that phase's share of the time between steps.

    The share is taken over the rank's whole run (its cumulative counters), since both come
    in bursts that a short window may or may not contain, and on the rank that spends most
    in it: when rank 0 alone saves, the others wait for it in their next all-reduce, so the
    whole gang loses that share.
    """
    attr = _PHASE_OF[verdict]

    def share(t: RankTimes) -> float:
        if t.run_step > 0:
            return getattr(t, "run_" + attr) / t.run_step
        return getattr(t, attr) / t.step if t.step > 0 else 0.0

    shares = {k: share(t) for k, t in per.items()}
    if not shares:
        return None
    worst_key = max(shares, key=lambda k: shares[k])
    worst = shares[worst_key]
    if worst <= bound:
        return None
    t = per[worst_key]
    others = [v for k, v in shares.items() if k != worst_key]
    median = statistics.median(others) if others else worst
    one_rank = bool(others) and median < worst / 2
    window_share = getattr(t, attr) / t.step if t.step > 0 else 0.0
    who = f" on rank {t.rank} (pod {t.pod}), the others waiting for it" if one_rank else ""
    summary = (
        f"{_PHASE_WORDS[verdict]} takes {pct(worst)} of the time between steps{who} since "
        f"the rank started ({pct(window_share)} in the window; bound > {pct(bound)})"
    )
    cap = attr[0].upper() + attr[1:]
    ev: Evidence = {
        f"{attr}Ratio": round4(worst),
        f"others{cap}Ratio": round4(median),
        f"window{cap}Ratio": round4(window_share),
        f"{attr}SecondsPerStep": round4(t.per_step(getattr(t, attr))),
        "maxRank": t.rank,
        "boundRatio": bound,
    }
    return Verdict(
        verdict,
        WARNING,
        summary,
        ev,
        ADVICE[verdict],
        **(_named(t) if one_rank else {}),
    )
