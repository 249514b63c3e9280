"""When will a waiting gang start? A pure simulation over the GPUs' holders and their ETAs.

The world is a set of *pools* of GPUs: the GPU nodes (native gangs, or none), or a Kueue
ClusterQueue's quota per flavor (and its cohort's, where it borrows). *Holders* use GPUs of
some pools until they end (a running job's ETA; unknown for pods gpujob does not manage and
jobs without an ETA). *Waiters* queue in order: whenever GPUs are released, the waiters that
fit start, in queue order. How one that does not fit affects those behind it is its queue's
strategy: under strict FIFO (Kueue's StrictFIFO) no one behind it in its ClusterQueue
starts first; under best effort (Kueue's default BestEffortFIFO, and kube-scheduler, which
places each pod on its own) it holds back no one, and a smaller gang behind it may start
now. A waiter that starts while one ahead of it still waits is never Exact: were the ETAs a
little off, the one ahead might fit first and take the GPUs, and neither Kueue nor the
scheduler promises otherwise.

Unknown ends are bracketed, not guessed: the simulation runs twice, once with every
unknown holder gone now (and every waiter of unknown duration done the moment it starts)
and once with them never ending. The first gives the earliest possible start (a lower
bound); where both agree the forecast is exact as far as the ETAs are; where they differ
the second, if finite, is the latest start. Cost: each holder's end is consumed once per
waiter group; waiters that fit or not together (same queue, slots and size) share one count
of their roomy slots, updated as GPUs are held and released, so each moment GPUs are
released costs a look per kind of waiter, not per waiter (``bench/forecast.py``).
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final, Literal

EXACT: Final = "Exact"
LOWER_BOUND: Final = "LowerBound"
UNKNOWN: Final = "Unknown"
Confidence = Literal["Exact", "LowerBound", "Unknown"]

SAME_SECONDS: Final = 1.0
"""Two start times this close are the same forecast (clock granularity of the inputs)."""
NAMES_SHOWN: Final = 4
"""How many holders a basis or reason names before it says "and N more"."""


@dataclass(frozen=True)
class Holder:
    """Something that holds GPUs now: a running job's gang, an unmanaged pod, a Workload."""

    name: str
    usage: Mapping[str, int]
    """GPUs held in each pool."""
    ends_at: float | None
    """Epoch seconds at which it releases them (its ETA); None: unknown."""


@dataclass(frozen=True)
class Waiter:
    """A gang that waits: it needs ``count`` distinct slots, ``per`` GPUs in each pool of each.

    A slot is a tuple of pools that must all have room: a node ``(n7,)`` for a native gang
    (``count`` = nodes), a Kueue flavor ``(cq/f,)`` or ``(cq/f, cohort/f)`` (``count`` = 1,
    ``per`` = the gang's GPUs).
    """

    name: str
    slots: tuple[tuple[str, ...], ...]
    count: int
    per: int
    duration: float | None = None
    """Seconds it runs once started, where known (a requeued job's last ETA)."""
    target: bool = True
    """Forecast wanted (a gpujob job); False for other frameworks' waiting Workloads, which
    only take their place in the queue."""
    preempts: tuple[str, ...] = ()
    """Holders its queue will evict for it (Kueue's preemption): they end as it starts."""
    queue: str = ""
    """The queue it waits in (a Kueue ClusterQueue); what ``strict`` orders."""
    strict: bool = False
    """Strict FIFO (Kueue's StrictFIFO): while it does not fit, no one behind it in its queue
    starts. Otherwise best effort (Kueue's BestEffortFIFO, kube-scheduler): a waiter that
    does not fit holds back no one."""

    @property
    def pools(self) -> list[str]:
        """Every pool of every slot, in slot order."""
        return [p for slot in self.slots for p in slot]


@dataclass(frozen=True)
class Forecast:
    """One waiter's forecast: when, on what basis, and how sure."""

    name: str
    start: float | None
    """Earliest start (epoch seconds); None when it cannot be forecast."""
    latest: float | None
    """Latest start where the unknowns make it uncertain and it is still bounded."""
    confidence: Confidence
    basis: str
    reason: str = ""
    ahead: int = 0
    """Waiters ahead of it in its queue."""
    waits_for: tuple[str, ...] = field(default_factory=tuple)
    """Holders (or waiters ahead) whose end lets it start: at the earliest, then at the latest."""


@dataclass
class _Placed:
    start: float | None
    waits_for: tuple[str, ...]
    passes: str = ""
    """The first waiter ahead of it that still waited when it started (best-effort order)."""
    order: int = -1
    """Its place among the waiters started in this scenario (-1: never started)."""


class _Shape:
    """The waiters that fit or not together (same queue, slots, count and share): whether
    they fit is kept up to date as GPUs are held and released, so a step of the simulation
    looks only at the shapes that fit, not at every waiter."""

    def __init__(self, w: Waiter, free: Mapping[str, int]) -> None:
        self.slots, self.count, self.per = w.slots, w.count, w.per
        self.roomy = [all(free.get(p, 0) >= w.per for p in s) for s in w.slots]
        self.room = sum(self.roomy)
        self.pending: deque[int] = deque()
        self.since = 0
        """The step in which it last came to fit (releases made room for it then)."""

    @property
    def fits(self) -> bool:
        return self.room >= self.count

    def update(self, j: int, free: Mapping[str, int], step: int) -> None:
        roomy = all(free.get(p, 0) >= self.per for p in self.slots[j])
        if roomy != self.roomy[j]:
            was = self.fits
            self.roomy[j] = roomy
            self.room += 1 if roomy else -1
            if self.fits and not was:
                self.since = step


class _Pools:
    """Free GPUs per pool over a simulation whose clock only moves forward."""

    def __init__(self, capacity: Mapping[str, int]) -> None:
        self.free = dict(capacity)
        self._ends: list[tuple[float, int, str, Mapping[str, int]]] = []
        self._seq = 0
        self._watch: dict[str, list[tuple[_Shape, int]]] = {}
        self.step = 0

    def watch(self, shape: _Shape) -> None:
        """Keep ``shape.fits`` current from now on."""
        for j, slot in enumerate(shape.slots):
            for pool in slot:
                self._watch.setdefault(pool, []).append((shape, j))

    def _change(self, usage: Mapping[str, int], sign: int) -> None:
        for pool, gpus in usage.items():
            if pool in self.free:
                self.free[pool] += sign * gpus
                for shape, j in self._watch.get(pool, ()):
                    shape.update(j, self.free, self.step)

    def hold(self, name: str, usage: Mapping[str, int], end: float) -> None:
        self._change(usage, -1)
        if not math.isinf(end):
            self._seq += 1
            heapq.heappush(self._ends, (end, self._seq, name, usage))

    def release_until(self, t: float) -> list[str]:
        """Release everything that ended at or before ``t``; the names released."""
        names = []
        while self._ends and self._ends[0][0] <= t:
            _, _, name, usage = heapq.heappop(self._ends)
            self._change(usage, +1)
            names.append(name)
        return names

    def next_end(self) -> float | None:
        return self._ends[0][0] if self._ends else None

    def choose(self, w: Waiter) -> list[tuple[str, ...]] | None:
        """The slots the gang takes (fullest first that fit), or None if it does not fit."""
        fitting = []
        for slot in w.slots:
            frees = [self.free.get(p, 0) for p in slot]
            if all(f >= w.per for f in frees):
                fitting.append((min(frees), slot))
        if len(fitting) < w.count:
            return None
        fitting.sort()
        return [slot for _, slot in fitting[: w.count]]


def _usage(slots: Iterable[tuple[str, ...]], per: int) -> dict[str, int]:
    out: dict[str, int] = {}
    for slot in slots:
        for pool in slot:
            out[pool] = out.get(pool, 0) + per
    return out


def _simulate(
    now: float,
    capacity: Mapping[str, int],
    holders: Sequence[Holder],
    waiters: Sequence[Waiter],
    unknown_end: float,
) -> list[_Placed]:
    """One scenario: unknown ends at ``unknown_end`` (now, or never). At each moment GPUs are
    released, the waiters that fit start in queue order; one that does not fit holds back
    those behind it only in a strict queue."""
    pools = _Pools(capacity)
    for h in holders:
        pools.hold(h.name, h.usage, unknown_end if h.ends_at is None else max(h.ends_at, now))
    out = [_Placed(None, ()) for _ in waiters]  # never fits: it blocks no one behind it
    shapes: dict[tuple[object, ...], _Shape] = {}
    shape_of: dict[int, _Shape] = {}
    strict: dict[str, deque[int]] = {}  # a strict queue's waiters still waiting, in order
    for i, w in enumerate(waiters):
        if not _fits_empty(capacity, w):
            continue
        k = (w.queue, w.strict, w.slots, w.count, w.per)
        shape = shapes.get(k)
        if shape is None:
            shape = shapes[k] = _Shape(w, pools.free)
            pools.watch(shape)
        shape.pending.append(i)
        shape_of[i] = shape
        if w.strict:
            strict.setdefault(w.queue, deque()).append(i)
    waiting = sorted(shape_of)  # a heap: the first waiter still waiting (lazily cleaned)
    placed: set[int] = set()
    clock = now
    pools.release_until(clock)
    released: list[str] = []
    while True:
        heads = [(s.pending[0], id(s), s) for s in shapes.values() if s.pending and s.fits]
        heapq.heapify(heads)
        while heads:
            i, _, shape = heapq.heappop(heads)
            w = waiters[i]
            if w.strict and strict[w.queue][0] != i:
                continue  # its queue's head waits: nothing behind it starts before it
            chosen = pools.choose(w) if shape.fits else None
            if chosen is None:
                continue  # nor does any other of its shape, now
            end = clock + w.duration if w.duration is not None else unknown_end
            pools.hold(w.name, _usage(chosen, w.per), end)
            shape.pending.popleft()
            if w.strict:
                strict[w.queue].popleft()
            placed.add(i)
            while waiting and waiting[0] in placed:
                heapq.heappop(waiting)
            passes = waiters[waiting[0]].name if waiting and waiting[0] < i else ""
            # Releases made room for it now, or it only waited for those ahead to start.
            waits = tuple(released) if shape.since == pools.step else ()
            out[i] = _Placed(clock, waits, passes, len(placed))
            if shape.pending:
                heapq.heappush(heads, (shape.pending[0], id(shape), shape))
        if not waiting:
            return out
        nxt = pools.next_end()
        if nxt is None:
            return out  # what still waits never starts in this scenario
        clock = max(clock, nxt)
        pools.step += 1
        released = pools.release_until(clock)


def _roomy(capacity: Mapping[str, int], w: Waiter) -> int:
    """Slots that could hold the gang's share were the whole cluster empty."""
    return sum(1 for s in w.slots if all(capacity.get(p, 0) >= w.per for p in s))


def _fits_empty(capacity: Mapping[str, int], w: Waiter) -> bool:
    return _roomy(capacity, w) >= w.count


def forecast_queue(
    now: float,
    capacity: Mapping[str, int],
    holders: Sequence[Holder],
    waiters: Sequence[Waiter],
) -> list[Forecast]:
    """The forecast of every target waiter of one queue (waiters in queue order)."""
    early = _simulate(now, capacity, holders, waiters, unknown_end=now)
    late = _simulate(now, capacity, holders, waiters, unknown_end=math.inf)
    unknown = [(h.name, set(h.usage)) for h in holders if h.ends_at is None]
    # The waiters of unknown duration that start before each one: ahead of it, or behind it
    # where a best-effort queue lets them start first (the order the earliest run placed them).
    unknown_before: list[str] = []
    found: dict[int, Forecast] = {}
    started = sorted((i for i, p in enumerate(early) if p.order >= 0), key=lambda i: early[i].order)
    for i in started + [i for i, p in enumerate(early) if p.order < 0]:
        w = waiters[i]
        if w.target:
            found[i] = _one(now, w, i, early[i], late[i], capacity, unknown, unknown_before)
        if w.duration is None and early[i].order >= 0:
            unknown_before.append(w.name)
    out = [found[i] for i in sorted(found)]
    return out


def _one(
    now: float,
    w: Waiter,
    ahead: int,
    early: _Placed,
    late: _Placed,
    capacity: Mapping[str, int],
    unknown: Sequence[tuple[str, set[str]]],
    unknown_before: Sequence[str],
) -> Forecast:
    """One waiter's forecast from its two scenarios; ``unknown``: the holders without an
    ETA and their pools, ``unknown_before``: the waiters of unknown duration that start
    before it."""
    if early.start is None:
        return Forecast(
            w.name, None, None, UNKNOWN, "never fits", reason=_too_big(capacity, w), ahead=ahead
        )
    start = early.start
    basis = _basis(early, late, ahead, now, w.preempts)
    first = w.preempts + early.waits_for
    same = late.start is not None and abs(late.start - start) < SAME_SECONDS
    passes = early.passes or late.passes
    if same and not passes:
        return Forecast(w.name, start, None, EXACT, basis, ahead=ahead, waits_for=first)
    reasons = []
    if passes:
        # Were the ETAs a little off, the one ahead might fit first and take the GPUs.
        reasons.append(
            f"jumps ahead of {passes}, which does not fit yet; best-effort queues do not "
            "promise who gets freed GPUs first"
        )
    if not same:
        pools = set(w.pools)
        relevant = [name for name, used in unknown if pools & used]
        named = relevant + list(unknown_before)
        reasons.append("no known end: " + _names(named or [name for name, _ in unknown]))
    waits = tuple(dict.fromkeys(first + late.waits_for))
    latest = max(late.start, start) if late.start is not None and not passes else None
    return Forecast(
        w.name, start, latest, LOWER_BOUND, basis, reason="; ".join(reasons), ahead=ahead,
        waits_for=waits,
    )  # fmt: skip


def _basis(
    early: _Placed, late: _Placed, ahead: int, now: float, preempts: tuple[str, ...] = ()
) -> str:
    """What it waits for: whom its queue preempts for it, the holders whose end lets it
    start (at the earliest and, where the unknowns make that differ, at the latest), and
    its place in the queue."""
    lead = f"by preempting {_names(list(preempts))}" if preempts else ""
    if early.waits_for:
        first = f"after {_names(list(early.waits_for))} end"
    elif early.start is not None and early.start > now + SAME_SECONDS:
        first = "once the jobs ahead of it have started"
    elif late.start is None or abs(late.start - (early.start or now)) >= SAME_SECONDS:
        first = "now if the holders without a known end were over"
    else:
        first = lead or "GPUs free"
        lead = ""
    if late.start is not None and late.waits_for != early.waits_for and late.waits_for:
        first += f", at the latest after {_names(list(late.waits_for))} end"
    parts = [f"{lead}, {first}" if lead else first]
    if ahead:
        parts.append(f"{ahead} ahead in queue")
    return "; ".join(parts)


def _names(names: Sequence[str]) -> str:
    shown = ", ".join(names[:NAMES_SHOWN])
    more = len(names) - NAMES_SHOWN
    return f"{shown} and {more} more" if more > 0 else shown


def _too_big(capacity: Mapping[str, int], w: Waiter) -> str:
    best = max((min(capacity.get(p, 0) for p in s) for s in w.slots), default=0)
    roomy = _roomy(capacity, w)
    if w.count == 1:
        return f"needs {w.per} GPUs; the most its queue can ever give is {best}"
    return (
        f"needs {w.count} nodes with {w.per} GPUs each; "
        f"{roomy} eligible node{'s' if roomy != 1 else ''} can hold {w.per}"
    )


def groups(waiters: Sequence[Waiter]) -> list[list[Waiter]]:
    """Split waiters into independent queues: waiters that share no pool never wait for each
    other (two teams' ClusterQueues, two node pools). Order inside each group is kept."""
    parent: dict[str, str] = {}

    def find(x: str) -> str:
        while parent.setdefault(x, x) != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for w in waiters:
        pools = w.pools
        for p in pools[1:]:
            parent[find(p)] = find(pools[0])
    out: dict[str, list[Waiter]] = {}
    lonely: list[list[Waiter]] = []
    for w in waiters:
        pools = w.pools
        if not pools:
            lonely.append([w])
            continue
        out.setdefault(find(pools[0]), []).append(w)
    return list(out.values()) + lonely


def forecast_all(
    now: float,
    capacity: Mapping[str, int],
    holders: Sequence[Holder],
    waiters: Sequence[Waiter],
) -> dict[str, Forecast]:
    """Every target waiter's forecast, each group of waiters simulated on its own pools."""
    by_pool: dict[str, list[Holder]] = {}
    for h in holders:
        for pool in h.usage:
            by_pool.setdefault(pool, []).append(h)
    out: dict[str, Forecast] = {}
    for group in groups(waiters):
        pools = {p for w in group for p in w.pools}
        cap = {p: capacity.get(p, 0) for p in pools}
        seen: dict[str, Holder] = {}
        for p in pools:
            for h in by_pool.get(p, ()):
                seen.setdefault(h.name, h)
        for f in forecast_queue(now, cap, list(seen.values()), group):
            out[f.name] = f
    return out
