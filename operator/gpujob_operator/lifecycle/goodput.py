"""Goodput: the share of a job's GPU time that made steps it kept, and where the rest went.

A ledger persisted in ``status.goodput`` (what the user reads: the seconds by cause, the ratio,
GPU-hours, the mean throughput while stepping, the verdicts and the rank named longest) and
``status.operatorState.goodput`` (its cursor) is advanced by every planning pass (pure: the
previous ledger, the job's state and ``now`` in, the new ledger out). The time since the
ledger's ``accountedUntil`` is charged to one cause, the one the ledger recorded when it last
accounted (what the job was doing then), so a change of state is charged from the pass that
saw it. A gap longer than :data:`GAP_SECONDS` means no operator accounted meanwhile (it was
restarted, or had lost its lease): that gap is charged to the state found after it (unless
the job finished meanwhile: then to the cause before it, up to its completionTime), since a
job left alone mostly stays in the state it reached.

The causes, in the order they are decided:

- ``queued``: suspended, or no pod of the job ever had every rank of its gang on a node;
- ``startup``: the gang was placed but the job never finished a step, for at most
  ``spec.monitoring.startupTimeoutSeconds`` (summed over the attempts);
- ``unobserved``: past that timeout the operator has still never seen a step (monitoring
  off, a trainer without the library, a blocked metrics port), or monitoring is off while
  the job runs: whether that time made steps is unknown, so while the ledger holds any,
  it publishes no ratio and no lost GPU-hours rather than calling all of it lost. Seen
  steps after all, it was start-up: the unobserved seconds move to ``startup``;
- ``stall``: the job runs and its Stalled condition is True;
- ``restart``: the job stepped before, and now restarts, or its current attempt has not
  stepped yet, or its step is below the furthest step reached (steps recomputed);
- ``checkpoint``, ``eval``, ``productive``: the job steps; the ranks' share of step time in
  the checkpoint and eval phases (``status.progress.checkpointRatio``/``evalRatio``) is
  charged to those causes, the rest is productive.

The ledger is small and bounded: a few numbers per cause, the published verdicts' seconds
(at most :data:`MAX_VERDICTS`) and the seconds each rank was named (at most
:data:`MAX_RANKS`), so it can live in the status of a job that runs for weeks.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any, Final

from gpujob_operator.api import conditions as c

QUEUED: Final = "queued"
STARTUP: Final = "startup"
UNOBSERVED: Final = "unobserved"
RESTART: Final = "restart"
STALL: Final = "stall"
CHECKPOINT: Final = "checkpoint"
EVAL: Final = "eval"
PRODUCTIVE: Final = "productive"
CAUSES: Final = (QUEUED, STARTUP, UNOBSERVED, RESTART, STALL, CHECKPOINT, EVAL, PRODUCTIVE)
LOST_CAUSES: Final = tuple(x for x in CAUSES if x not in (PRODUCTIVE, UNOBSERVED))
"""Causes of time known to have made no kept step (unobserved time is not known either way)."""
STEPPING: Final = (CHECKPOINT, EVAL, PRODUCTIVE)
"""Causes of time in which the job made steps it kept."""

STAGE_QUEUED: Final = "Queued"
STAGE_STARTING: Final = "Starting"
STAGE_STEPPED: Final = "Stepped"
"""How far the job ever got: never placed, placed but no step yet, stepped."""

GAP_SECONDS: Final = 600.0
"""A longer unaccounted interval is charged to the state found after it (see the module)."""
REFRESH_SECONDS: Final = 300.0
"""A ledger whose cause did not change is written at least this often (and whenever the
status is written anyway): between writes the same cause holds, so nothing is lost."""
MAX_VERDICTS: Final = 16
"""The verdict vocabulary has 14 words; an unknown one may take a place, never more."""
MAX_RANKS: Final = 8
"""Ranks remembered in ``rankSeconds``: the ones named longest."""


@dataclass(frozen=True)
class JobState:
    """What the planner knows of the job now (read from the status it is writing)."""

    phase: str
    placed: bool
    """Every rank of the current attempt's gang is bound to a node."""
    stalled: bool = False
    attempt: int = 0
    step: int | None = None
    furthest_step: int | None = None
    """``status.progress.furthestStep`` when the trainer's global step is known."""
    last_step_time: datetime | None = None
    checkpoint_ratio: float | None = None
    eval_ratio: float | None = None
    verdict: str | None = None
    rank: int | None = None
    samples_per_second: float | None = None
    tokens_per_second: float | None = None
    completion_time: datetime | None = None
    monitored: bool = True
    """``spec.monitoring.enabled``: off, the operator never sees a step."""
    startup_timeout: float | None = None
    """``spec.monitoring.startupTimeoutSeconds``: start-up time past it, still without a
    step, is unobserved (None: never)."""

    @property
    def finished(self) -> bool:
        return self.phase in (c.PHASE_SUCCEEDED, c.PHASE_FAILED)


@dataclass(frozen=True)
class Ledger:
    """``status.goodput`` as numbers: seconds per cause and what the accounting tracks."""

    since: datetime
    until: datetime
    cause: str | None
    """What the time from ``until`` counts as; None once the job finished."""
    seconds: Mapping[str, float] = field(default_factory=dict)
    stage: str = STAGE_QUEUED
    attempt: int = 0
    attempt_since: datetime | None = None
    attempt_stepped: bool = False
    furthest: int | None = None
    verdict: str | None = None
    rank: int | None = None
    verdict_seconds: Mapping[str, float] = field(default_factory=dict)
    rank_seconds: Mapping[str, float] = field(default_factory=dict)
    samples: float = 0.0
    """Samples of kept steps: the published samples/s integrated over stepping time."""
    tokens: float = 0.0
    checkpoint_ratio: float = 0.0
    """The last checkpoint share seen while the job stepped: what a stepping interval that
    ended in another state (a failure, the end) is split with."""
    eval_ratio: float = 0.0
    samples_per_second: float = 0.0
    tokens_per_second: float = 0.0

    @property
    def total(self) -> float:
        return sum(self.seconds.values())

    @property
    def productive(self) -> float:
        return self.seconds.get(PRODUCTIVE, 0.0)

    @property
    def stepping(self) -> float:
        return sum(self.seconds.get(x, 0.0) for x in STEPPING)

    @property
    def unobserved(self) -> float:
        return self.seconds.get(UNOBSERVED, 0.0)

    @property
    def ratio(self) -> float | None:
        """Productive over all seconds; None with none, or with unobserved ones (unknown)."""
        total = self.total
        return self.productive / total if total > 0 and self.unobserved <= 0 else None


def start(state: JobState, now: datetime, created: datetime | None) -> Ledger:
    """A new ledger: from the job's creation while it still waits for its first pods, else
    from now (a job that ran before this accounting existed is not guessed at)."""
    since = created if created is not None and state.phase == c.PHASE_PENDING else now
    since = min(_whole(since), _whole(now))
    ledger = Ledger(since=since, until=since, cause=None, attempt=state.attempt)
    ledger = replace(ledger, attempt_since=since)
    ledger = _track(ledger, state, since)
    return replace(ledger, cause=cause_of(ledger, state))


def advance(
    prev: Ledger | None, state: JobState, now: datetime, created: datetime | None
) -> Ledger:
    """The ledger with the time since ``prev.until`` charged, and the cause from now on."""
    ledger = prev if prev is not None else start(state, now, created)
    end = _whole(now)
    if state.finished and state.completion_time is not None:
        end = min(end, _whole(state.completion_time))
    end = max(end, ledger.until)
    tracked = _track(ledger, state, end)
    dt = (end - ledger.until).total_seconds()
    found = cause_of(tracked, state)
    # A long gap went unaccounted: what the job is doing now is the better guess, unless it
    # finished meanwhile (then it did what it did before, until its completionTime).
    cause = found if dt > GAP_SECONDS and found is not None else ledger.cause
    cap = None if state.stalled else state.startup_timeout
    charged = _charge(tracked, cause, dt, cap)
    if ledger.stage == STAGE_STARTING and tracked.stage == STAGE_STEPPED:
        # A step after all: the time that looked unobserved was a long start-up.
        charged = _reclassify(charged, UNOBSERVED, STARTUP)
    return replace(
        charged,
        until=end,
        cause=cause_of(charged, state),
        verdict=state.verdict if not state.finished else None,
        rank=state.rank if not state.finished else None,
    )


def cause_of(ledger: Ledger, state: JobState) -> str | None:
    """What the job's time counts as in this state (None: finished, nothing to count)."""
    if state.finished:
        return None
    if state.phase == c.PHASE_SUSPENDED:
        return QUEUED
    if ledger.stage == STAGE_QUEUED:
        return QUEUED
    if ledger.stage == STAGE_STARTING:
        timeout = state.startup_timeout
        past = timeout is not None and ledger.seconds.get(STARTUP, 0.0) >= timeout
        return UNOBSERVED if past and not state.stalled else STARTUP
    if state.phase == c.PHASE_RUNNING and not state.monitored:
        return UNOBSERVED
    if state.phase == c.PHASE_RUNNING and state.stalled:
        return STALL
    if state.phase != c.PHASE_RUNNING or not ledger.attempt_stepped:
        return RESTART
    furthest = max(_known(ledger.furthest, state.furthest_step), default=None)
    if state.step is not None and furthest is not None and state.step < furthest:
        return RESTART
    return PRODUCTIVE


def due(old: Ledger | None, new: Ledger) -> bool:
    """Whether the new ledger is worth a status write of its own (else the old one stays,
    and the next pass charges the same cause from the old ``until``)."""
    if old is None:
        return True
    tracked = ("cause", "stage", "attempt", "attempt_stepped", "verdict", "rank")
    if any(getattr(old, k) != getattr(new, k) for k in tracked):
        return True
    return (new.until - old.until).total_seconds() >= REFRESH_SECONDS


def _track(ledger: Ledger, state: JobState, now: datetime) -> Ledger:
    """Follow the attempt, the stage and the furthest step to ``now``."""
    if state.attempt != ledger.attempt:
        ledger = replace(ledger, attempt=state.attempt, attempt_since=now, attempt_stepped=False)
    since = ledger.attempt_since or ledger.since
    stepped_now = state.last_step_time is not None and state.last_step_time > since
    if stepped_now and not ledger.attempt_stepped:
        ledger = replace(ledger, attempt_stepped=True)
    stage = ledger.stage
    if stage == STAGE_QUEUED and (state.placed or stepped_now):
        stage = STAGE_STARTING
    if stage == STAGE_STARTING and stepped_now:
        stage = STAGE_STEPPED
    furthest = ledger.furthest
    if state.furthest_step is not None:  # the trainer speaks the run's global step
        furthest = max(_known(furthest, state.furthest_step, state.step), default=None)
    ledger = replace(ledger, stage=stage, furthest=furthest)
    # status.progress keeps the last values published while the ranks stepped (a finished
    # job's too), so the pass that sees the end still splits the time before it with them;
    # a stalled job's rates describe the stall.
    if not state.stalled:
        for name in ("checkpoint_ratio", "eval_ratio", "samples_per_second", "tokens_per_second"):
            value = getattr(state, name)
            if value is not None and math.isfinite(value):
                ledger = replace(ledger, **{name: value})
    return ledger


def _charge(ledger: Ledger, cause: str | None, dt: float, cap: float | None = None) -> Ledger:
    """Charge `dt` seconds to `cause`; start-up beyond `cap` seconds is unobserved."""
    if cause is None or dt <= 0:
        return ledger
    seconds = dict(ledger.seconds)
    samples, tokens = ledger.samples, ledger.tokens
    if cause == STARTUP and cap is not None:
        room = min(max(cap - seconds.get(STARTUP, 0.0), 0.0), dt)
        if room > 0:
            seconds[STARTUP] = seconds.get(STARTUP, 0.0) + room
        if dt > room:
            seconds[UNOBSERVED] = seconds.get(UNOBSERVED, 0.0) + dt - room
    elif cause == PRODUCTIVE:
        ck = _ratio(ledger.checkpoint_ratio)
        ev = min(_ratio(ledger.eval_ratio), 1.0 - ck)
        for name, part in ((CHECKPOINT, ck), (EVAL, ev), (PRODUCTIVE, 1.0 - ck - ev)):
            seconds[name] = seconds.get(name, 0.0) + dt * part
        samples += dt * _rate(ledger.samples_per_second)
        tokens += dt * _rate(ledger.tokens_per_second)
    else:
        seconds[cause] = seconds.get(cause, 0.0) + dt
    verdicts = dict(ledger.verdict_seconds)
    if ledger.verdict:
        verdicts[ledger.verdict] = verdicts.get(ledger.verdict, 0.0) + dt
    ranks = dict(ledger.rank_seconds)
    if ledger.rank is not None:
        ranks[str(ledger.rank)] = ranks.get(str(ledger.rank), 0.0) + dt
    return replace(
        ledger,
        seconds=seconds,
        samples=samples,
        tokens=tokens,
        verdict_seconds=_bounded(verdicts, MAX_VERDICTS),
        rank_seconds=_bounded(ranks, MAX_RANKS),
    )


def _reclassify(ledger: Ledger, old: str, new: str) -> Ledger:
    if old not in ledger.seconds:
        return ledger
    seconds = dict(ledger.seconds)
    seconds[new] = seconds.get(new, 0.0) + seconds.pop(old)
    return replace(ledger, seconds=seconds)


def _bounded(d: Mapping[str, float], limit: int) -> dict[str, float]:
    """The `limit` longest entries (ties by name, so the result does not depend on order)."""
    keep = sorted(d.items(), key=lambda kv: (-kv[1], kv[0]))[:limit]
    return dict(sorted(keep))


def _known(*values: int | None) -> list[int]:
    return [v for v in values if v is not None]


def _ratio(v: float) -> float:
    return min(max(v, 0.0), 1.0) if math.isfinite(v) else 0.0


def _rate(v: float | None) -> float:
    return v if v is not None and math.isfinite(v) and v > 0 else 0.0


def _whole(t: datetime) -> datetime:
    """Times are persisted in whole seconds: account to the same, so nothing is lost."""
    return t.replace(microsecond=0)


# ---- the status form ------------------------------------------------------------------------


def to_status(ledger: Ledger, gpus: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """The ledger as ``status.goodput`` (what the user reads: seconds by cause, the ratio,
    GPU-hours, the mean throughput while stepping, the verdicts) and ``operatorState.goodput``
    (the cursor the next pass charges from), both camelCase.

    Mean throughput is the kept samples (the published samples/s integrated over the time
    the job stepped) over that time (productive, checkpoint and eval seconds): what the job
    did while it ran, not diluted by its waits, which the ratio already tells.
    """
    total = ledger.total
    known = ledger.unobserved <= 0  # else neither the ratio nor the loss is known
    lost = total - ledger.productive
    stepping = ledger.stepping
    worst = worst_rank(ledger.rank_seconds)
    public: dict[str, Any] = {
        "since": c.format_time(ledger.since),
        "seconds": {k: round(ledger.seconds.get(k, 0.0), 3) for k in CAUSES},
        "ratio": round(ledger.productive / total, 4) if total > 0 and known else None,
        "gpuHours": round(total * max(gpus, 0) / 3600.0, 3),
        "lostGPUHours": round(lost * max(gpus, 0) / 3600.0, 3) if known else None,
        "meanSamplesPerSecond": (
            round(ledger.samples / stepping, 3) if stepping > 0 and ledger.samples > 0 else None
        ),
        "meanTokensPerSecond": (
            round(ledger.tokens / stepping, 3) if stepping > 0 and ledger.tokens > 0 else None
        ),
        "verdicts": verdict_shares(ledger.verdict_seconds) or None,
        "worstRank": worst[0] if worst else None,
        "worstRankSeconds": worst[1] if worst else None,
    }
    cursor: dict[str, Any] = {
        "accountedUntil": c.format_time(ledger.until),
        "cause": ledger.cause,
        "stage": ledger.stage,
        "attempt": ledger.attempt,
        "attemptSince": c.format_time(ledger.attempt_since) if ledger.attempt_since else None,
        "attemptStepped": ledger.attempt_stepped,
        "furthestStep": ledger.furthest,
        "verdict": ledger.verdict,
        "rank": ledger.rank,
        "verdictSeconds": {k: round(v, 3) for k, v in ledger.verdict_seconds.items()} or None,
        "rankSeconds": {k: round(v, 3) for k, v in ledger.rank_seconds.items()} or None,
        "samples": round(ledger.samples, 1),
        "tokens": round(ledger.tokens, 1),
        "checkpointRatio": round(ledger.checkpoint_ratio, 4) or None,
        "evalRatio": round(ledger.eval_ratio, 4) or None,
        "samplesPerSecond": round(ledger.samples_per_second, 3) or None,
        "tokensPerSecond": round(ledger.tokens_per_second, 3) or None,
    }
    return (
        {k: v for k, v in public.items() if v is not None},
        {k: v for k, v in cursor.items() if v is not None},
    )


def from_status(
    public: Mapping[str, Any] | None, cursor: Mapping[str, Any] | None
) -> Ledger | None:
    """The ledger in ``status.goodput`` and its cursor ``operatorState.goodput``, read
    leniently (None: none, or unreadable)."""
    if not isinstance(public, Mapping) or not isinstance(cursor, Mapping):
        return None
    raw = {**public, **cursor}
    since = c.time_or_none(raw.get("since"))
    until = c.time_or_none(raw.get("accountedUntil"))
    if since is None or until is None:
        return None
    cause = raw.get("cause")
    stage = raw.get("stage")
    return Ledger(
        since=since,
        until=until,
        cause=cause if cause in CAUSES else None,
        seconds=_floats(raw.get("seconds"), CAUSES),
        stage=stage if stage in (STAGE_QUEUED, STAGE_STARTING, STAGE_STEPPED) else STAGE_QUEUED,
        attempt=_int(raw.get("attempt")) or 0,
        attempt_since=c.time_or_none(raw.get("attemptSince")),
        attempt_stepped=raw.get("attemptStepped") is True,
        furthest=_int(raw.get("furthestStep")),
        verdict=str(raw["verdict"]) if raw.get("verdict") else None,
        rank=_int(raw.get("rank")),
        verdict_seconds=_bounded(_floats(raw.get("verdictSeconds")), MAX_VERDICTS),
        rank_seconds=_bounded(_floats(raw.get("rankSeconds")), MAX_RANKS),
        samples=_float(raw.get("samples")) or 0.0,
        tokens=_float(raw.get("tokens")) or 0.0,
        checkpoint_ratio=_float(raw.get("checkpointRatio")) or 0.0,
        eval_ratio=_float(raw.get("evalRatio")) or 0.0,
        samples_per_second=_float(raw.get("samplesPerSecond")) or 0.0,
        tokens_per_second=_float(raw.get("tokensPerSecond")) or 0.0,
    )


def verdict_shares(seconds: Mapping[str, float]) -> list[dict[str, Any]]:
    """Each verdict with its seconds and its share of the time a verdict was published,
    longest first (at most :data:`MAX_VERDICTS`)."""
    total = sum(seconds.values())
    if total <= 0:
        return []
    order = sorted(seconds.items(), key=lambda kv: (-kv[1], kv[0]))[:MAX_VERDICTS]
    return [
        {"verdict": v, "seconds": round(s, 1), "share": round(s / total, 4)}
        for v, s in order
        if s > 0
    ]


def worst_rank(seconds: Mapping[str, float]) -> tuple[int, float] | None:
    """The rank the verdicts named longest, with those seconds (ties: the lowest rank)."""
    named = [(int(k), s) for k, s in seconds.items() if k.lstrip("-").isdigit() and s > 0]
    if not named:
        return None
    rank, s = min(named, key=lambda kv: (-kv[1], kv[0]))
    return rank, round(s, 1)


def _float(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        return None
    return float(v)


def _int(v: Any) -> int | None:
    f = _float(v)
    return int(f) if f is not None else None


def _floats(v: Any, keys: tuple[str, ...] | None = None) -> dict[str, float]:
    if not isinstance(v, Mapping):
        return {}
    out = {}
    for k, x in v.items():
        f = _float(x)
        if f is not None and f >= 0 and (keys is None or k in keys):
            out[str(k)] = f
    return out
