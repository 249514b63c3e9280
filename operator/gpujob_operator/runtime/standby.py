"""The standby guard: a replica that kopf peering pauses stops its job loops, and restarts.

kopf pauses a replica's watches when a peer outranks it, but a job loop is a plain task
that keeps reconciling. Two replicas can briefly both work (both start while the peering
object has no status yet, or the active one's keep-alive came late); the guard reads the
peering objects every few seconds and, while this replica is not the active one, stops
every job loop it has.

A replica that has served and is then paused also restarts (``demote``): kopf keeps its
indexes across a pause and never learns of the pods deleted meanwhile, so a resumed replica
would plan with ghosts of deleted pods. A fresh process starts paused with empty indexes
and fills them from a full listing when it becomes active.

The guard fails closed: a replica whose keep-alive lapsed (now, or since its last look:
frozen, or cut off for longer than a lifetime) while another replica is live may already
have been replaced, so it stops its loops and restarts rather than come back working beside
its successor; every write passes a fence that only the guard's reads keep open.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

from gpujob_operator.runtime import peers

log = logging.getLogger("gpujob.standby")

GROUP, VERSION = "kopf.dev", "v1"
INTERVAL_SECONDS = 2.0


def read_statuses(
    api: client.CustomObjectsApi, name: str, namespaces: Sequence[str]
) -> list[dict[str, Any]] | None:
    """The ``status`` of every peering object this replica takes part in; [] when none
    exists at all (peering not set up: nothing to defer to), None when only some are
    missing (unread: another replica may be active in the namespaces that have one)."""
    objs: list[Any] = []
    missing = 0
    refs: list[str | None] = list(namespaces) if namespaces else [None]
    for ns in refs:
        try:
            if ns is None:
                objs.append(
                    api.get_cluster_custom_object(GROUP, VERSION, "clusterkopfpeerings", name)
                )
            else:
                objs.append(
                    api.get_namespaced_custom_object(GROUP, VERSION, ns, "kopfpeerings", name)
                )
        except ApiException as e:
            if e.status != 404:
                raise
            missing += 1
    if missing and objs:
        return None
    return [dict(o.get("status") or {}) for o in objs]


class Fence:
    """Until when this replica's writes are allowed (monotonic seconds; None: no peering).

    The guard opens it after each read that finds this replica active, for at most half a
    keep-alive's lifetime and never past this replica's own keep-alive deadline (less a
    guard interval): no successor can start before that deadline. A process frozen or cut
    off finds it shut when it comes back, so no job loop writes before the guard has
    looked. The API client checks it in the worker thread, right before the request
    is sent, so a write queued while the fence was open is not sent after it shut.
    """

    def __init__(self) -> None:
        self.until: float | None = None

    def open(self) -> bool:
        return self.until is None or time.monotonic() < self.until


FENCE = Fence()


@dataclass(frozen=True)
class Judgement:
    """One look at the peering state: may this replica work, why, for how long."""

    active: bool
    why: str
    fence_seconds: float = 0.0
    """How long after the read the write fence may stay open."""
    deadline: dt.datetime | None = None
    """This replica's keep-alive deadline as read (``lastseen + lifetime``), for the next look."""
    peer_live: bool = False
    """Another peer was live in this look (a possible successor), for the next look."""


def judge(
    statuses: Sequence[Mapping[str, Any]] | None,
    me: str,
    priority: int,
    now: dt.datetime,
    away_for: float,
    lifetime: float,
    last_deadline: dt.datetime | None = None,
    frozen: bool = False,
    peer_before: bool = False,
    margin: float = INTERVAL_SECONDS,
) -> Judgement | None:
    """Whether this replica may work now, and why (pure: the guard's whole decision).

    None when the peering objects could not be read (``statuses`` None): nothing changes,
    and the fence, not refreshed, shuts by itself. ``away_for`` is how long since the last
    read that could (or since the guard started); ``last_deadline`` is this replica's
    keep-alive deadline seen then; ``frozen``: the process stood still (its event loop ran
    nothing for longer than a guard interval) at some time since the last look, so for a
    while neither did its kopf keep-alive; ``peer_before``: another peer was live at the
    last look.

    Fail closed where a successor may have taken over, that is where another peer is live
    now or was at the last look, and this replica's keep-alive lapsed (a successor seen
    before the lapse may be missing now: thawed, this replica's own kopf removes the peers
    it finds dead in the events it queued before the freeze):
    - its entry is lapsed now;
    - its entry is gone though it was there at the last look (a successor's kopf removes
      the peers it finds dead);
    - its keep-alive was touched again only after the deadline seen at the last look (a
      thaw: kopf may touch before the guard looks), where that proves a lapse: the looks
      were closer than kopf's shortest keep-alive period (at most one touch in between),
      or the process stood still since (taken as a lapse: after a thaw, the usual case,
      kopf touched nothing while frozen; a stall within a long spell without reads does
      not strictly rule out touches around it, and then this errs on the side of a restart);
    - no keep-alive of its own was ever seen and it could not look for a lifetime.
    All compare times this replica's own kopf wrote, on its own clock. A guard that merely
    could not read while kopf kept touching has not been replaced; alone, a replica that
    was away goes on (nobody took over; the ghost-pod audit handles what its index missed).
    """
    if statuses is None:
        return None
    entries = [s[me] for s in statuses if isinstance(s.get(me), Mapping)]
    deadlines = [d for e in entries if (d := peers.deadline(e)) is not None]
    mine = min(deadlines) if deadlines else None
    others = any(
        k != me and isinstance(v, Mapping) and peers.live(v, now)
        for s in statuses
        for k, v in s.items()
    )
    if others or peer_before:
        why = None
        shortest_touch = max(1.0, lifetime - 10)
        if mine is not None and mine <= now:
            why = "this replica's keep-alive has lapsed"
        elif last_deadline is not None and len(entries) < len(statuses):
            why = "this replica's peering entry was removed as dead"
        elif (
            last_deadline is not None
            and (away_for < shortest_touch or frozen)
            and any((t := peers.lastseen(e)) is not None and t >= last_deadline for e in entries)
        ):
            why = "this replica's keep-alive lapsed since its last look (frozen or cut off)"
        elif mine is None and last_deadline is None and away_for > lifetime:
            why = f"this replica could not see its peers for {away_for:.0f}s"
        if why is not None:
            return Judgement(
                False, f"{why} and a live peer may have taken over", deadline=mine, peer_live=others
            )
    if not all(peers.is_active(s, me, priority, now) for s in statuses):
        return Judgement(False, "another replica is active", deadline=mine, peer_live=others)
    fence = lifetime / 2
    if mine is not None:
        fence = min(fence, (mine - now).total_seconds() - margin)
    return Judgement(True, "no live peer outranks this replica", max(fence, 0.0), mine, others)


_READER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="standby-guard")
"""The guard's own thread: its reads never queue behind the job loops' API calls."""


async def guard(
    api: client.CustomObjectsApi,
    name: str,
    namespaces: Sequence[str],
    me: str,
    priority: int,
    stop_loops: Callable[[], int],
    demote: Callable[[], None],
    lifetime: float = peers.DEFAULT_LIFETIME,
    interval: float = INTERVAL_SECONDS,
    fence: Fence = FENCE,
) -> None:
    """Forever: while another replica is (or may be) the active one, shut the write fence
    and stop this replica's job loops; call ``demote`` when this replica, once seen active,
    is no longer. While the peering state cannot be read, the fence is not refreshed and
    shuts by itself: the loops go on but write nothing until a read finds this replica
    active again.

    Survives every error of a read (a refused connection, a reset, a timeout, not only an
    ``ApiException``); a read during which the process stood still is not trusted (its
    answer may predate the stall) and is made again at once. The task that runs it is
    supervised by the caller, which ends the process should the guard (or its stall ticker)
    ever end.
    """
    active, confirmed = True, False
    last_read = time.monotonic()
    deadline: dt.datetime | None = None
    peer_seen = False
    loop = asyncio.get_running_loop()
    stalls = Stalls(interval)
    ticker = asyncio.create_task(stalls.watch(), name="standby stall watch")
    try:
        while True:
            if ticker.done():  # without it every stall would look under way: never active
                raise RuntimeError(f"the standby stall ticker ended: {ticker!r}")
            stalls.check()  # a stall that ended before this read is not one during it
            started = time.monotonic()
            statuses: list[dict[str, Any]] | None
            try:
                statuses = await loop.run_in_executor(_READER, read_statuses, api, name, namespaces)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # any failure of a read is "unread", never the end of the guard
                log.warning("standby guard could not read the peering object: %s", _why(e))
                statuses = None
            if statuses is not None and stalls.since(started):
                # The process stood still while the answer was on its way: it may describe
                # the peers as they were before (a replica frozen mid-read would judge
                # itself live on it, and its next look would no longer see the freeze).
                log.info("standby guard: this process stalled during a read; reading again")
                continue
            now = dt.datetime.now(dt.UTC)
            verdict = judge(
                statuses,
                me,
                priority,
                now,
                started - last_read,
                lifetime,
                deadline,
                stalls.since(last_read),
                peer_seen,
            )
            if verdict is not None:
                last_read, deadline = started, verdict.deadline or deadline
                peer_seen = verdict.peer_live
                active, confirmed = _act(
                    verdict, active, confirmed, me, started, fence, stop_loops, demote
                )
            await asyncio.sleep(interval)
    finally:
        ticker.cancel()


def _act(
    verdict: Judgement,
    active: bool,
    confirmed: bool,
    me: str,
    started: float,
    fence: Fence,
    stop_loops: Callable[[], int],
    demote: Callable[[], None],
) -> tuple[bool, bool]:
    """Carry out one judgement; the new (active, confirmed)."""
    if verdict.active != active:
        log.warning(
            "peering: this replica (%s) is now %s: %s",
            me,
            "active" if verdict.active else "standby",
            verdict.why,
        )
    if verdict.active:
        fence.until = started + verdict.fence_seconds
        return True, True
    fence.until = 0.0
    stopped = stop_loops()
    if stopped:
        log.info("standby: stopped %d job loops (%s)", stopped, verdict.why)
    if confirmed:
        demote()  # once: the process is on its way out
    return False, False


class Stalls:
    """When this process last stood still (SIGSTOP, a paused VM, a starved host): its event
    loop ran nothing for longer than a guard interval, so neither did kopf's keep-alive.

    A ticker records the end of each stall, and so does the guard (:meth:`check`) before
    each read; :meth:`since` also counts a stall still under way (the ticker overdue), so
    the answer does not depend on whether the guard or the ticker runs first after a thaw.
    """

    def __init__(self, interval: float) -> None:
        self.tick = max(interval / 2, 0.05)
        self.lag = max(interval, 0.5)
        """Lateness past a tick that counts as a stall: a guard interval (2 s in production),
        at least 0.5 s, well above the event-loop lag of a loaded host."""
        self.last_tick = time.monotonic()
        self.ended = float("-inf")

    async def watch(self) -> None:
        while True:
            await asyncio.sleep(self.tick)
            self.check()

    def check(self) -> None:
        """Record a stall that has just ended (the last tick came too long ago)."""
        now = time.monotonic()
        if self._late(now):
            self.ended = now
        self.last_tick = now

    def since(self, t: float) -> bool:
        """Whether the process stood still at some time after monotonic ``t``."""
        return self.ended > t or self._late(time.monotonic())

    def _late(self, now: float) -> bool:
        """The last tick came too long before ``now``: a stall (ended now, or under way)."""
        return now - self.last_tick > self.tick + self.lag


def _why(e: BaseException) -> str:
    return e.reason if isinstance(e, ApiException) else f"{type(e).__name__}: {str(e)[:200]}"
