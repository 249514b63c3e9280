"""The standby guard: survives any read error, fails closed, fences writes, demotes once.

The guard's decision is the pure :func:`standby.judge`; the loop around it is driven here
with a scripted peering API (what the API server would answer, or the transport errors a
failover throws) and a fence, on a real event loop.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
import urllib3
from kubernetes.client.rest import ApiException

from gpujob_operator.runtime import standby

NOW = dt.datetime(2026, 1, 1, 12, 0, 0, tzinfo=dt.UTC)
ME, OLD, NEW = "me", "old", "new"


def entry(priority: int, seen_ago: float, lifetime: int = 20) -> dict[str, object]:
    return {
        "priority": priority,
        "lifetime": lifetime,
        "lastseen": (NOW - dt.timedelta(seconds=seen_ago)).isoformat(),
    }


def judge(
    statuses: list[dict[str, Any]] | None,
    away: float = 2.0,
    last_deadline: dt.datetime | None = None,
    frozen: bool = False,
) -> standby.Judgement | None:
    return standby.judge(statuses, ME, -20, NOW, away, 20, last_deadline, frozen)


def active(statuses: list[dict[str, Any]], **kw: Any) -> bool:
    verdict = judge(statuses, **kw)
    assert verdict is not None
    return verdict.active


def test_the_oldest_live_replica_works_and_others_stand_by() -> None:
    assert active([{ME: entry(-20, 0), NEW: entry(-30, 1)}])
    assert not active([{ME: entry(-20, 0), OLD: entry(-10, 1)}])
    assert active([{ME: entry(-20, 0), OLD: entry(-10, 25)}])  # the older one's keep-alive lapsed


def test_an_unreadable_peering_state_changes_nothing_and_the_fence_shuts_by_itself() -> None:
    """No judgement: the loops go on, the fence is not refreshed (no exit on an outage)."""
    assert judge(None, away=500) is None


def test_the_fence_never_outlives_this_replicas_keep_alive() -> None:
    verdict = judge([{ME: entry(-20, 15)}])  # touched 15 s ago, lifetime 20: 5 s left
    assert verdict is not None and verdict.active
    assert verdict.fence_seconds == pytest.approx(5 - standby.INTERVAL_SECONDS)
    fresh = judge([{ME: entry(-20, 0)}])
    assert fresh is not None and fresh.fence_seconds == pytest.approx(10)  # half a lifetime


def test_a_replica_that_could_not_read_but_kept_its_keep_alive_was_not_replaced() -> None:
    """A guard whose reads failed for longer than a lifetime while kopf kept touching: its
    peers never saw it lapse, so it goes on. Where no keep-alive of its own was ever seen,
    the time away stands in: beside a live peer it stops; alone it goes on."""
    fresh = [{ME: entry(-20, 0), NEW: entry(-30, 1)}]
    assert active(fresh, away=45, last_deadline=NOW + dt.timedelta(seconds=5))
    unseen = [{NEW: entry(-30, 1)}]
    verdict = judge(unseen, away=45)
    assert verdict is not None and not verdict.active and "45s" in verdict.why
    assert active([{}], away=45)


def test_a_lapse_since_the_last_look_stops_it_even_after_kopf_touched_again() -> None:
    """Thawed, kopf's keep-alive may write a fresh lastseen before the guard looks: the
    snapshot shows a live replica, but it was touched only after the deadline seen at the
    last look. That proves a lapse when the process was frozen (kopf did not run) or the
    looks were closer than kopf's shortest keep-alive period (one touch at most)."""
    touched = [{ME: entry(-20, 0), NEW: entry(-30, 1)}]
    before = NOW - dt.timedelta(seconds=3)
    verdict = judge(touched, away=15, last_deadline=before, frozen=True)
    assert verdict is not None and not verdict.active and "since its last look" in verdict.why
    assert not active(touched, away=2, last_deadline=before)
    # Slow reads while kopf ran: two touches may lie between the looks, no lapse is proven.
    assert active(touched, away=15, last_deadline=before)
    assert active(touched, away=2, last_deadline=NOW + dt.timedelta(seconds=10))


def test_an_entry_removed_as_dead_by_a_successor_stops_this_replica() -> None:
    """A successor's kopf removes the peers it finds dead: back from a split before its own
    kopf touches again, the replica finds no entry of its own and a live younger peer."""
    gone = [{NEW: entry(-30, 1)}]
    verdict = judge(gone, away=60, last_deadline=NOW - dt.timedelta(seconds=30))
    assert verdict is not None and not verdict.active and "removed as dead" in verdict.why


def test_a_missing_peering_object_in_one_namespace_is_unread_not_active() -> None:
    class Api:
        def get_namespaced_custom_object(self, g: str, v: str, ns: str, *_: Any) -> Any:
            if ns == "b":
                raise ApiException(status=404, reason="Not Found")
            return {"status": {OLD: entry(-10, 1)}}

    assert standby.read_statuses(Api(), "p", ["a", "b"]) is None  # type: ignore[arg-type]
    assert standby.read_statuses(Api(), "p", ["b"]) == []  # type: ignore[arg-type]
    assert standby.read_statuses(Api(), "p", ["a"]) == [{OLD: entry(-10, 1)}]  # type: ignore[arg-type]


def test_a_lapsed_own_keep_alive_with_a_live_successor_stops_this_replica() -> None:
    """Its successor already counts it as gone and works; alone, it keeps working."""
    assert not active([{ME: entry(-20, 30), NEW: entry(-30, 1)}])
    assert active([{ME: entry(-20, 30)}])
    assert active([{ME: entry(-20, 30), NEW: entry(-30, 40)}])  # nobody live took over


class ScriptedPeering:
    """The peering API as the guard reads it: each call takes the next answer (a status
    mapping, or an exception to raise), and the last answer repeats."""

    def __init__(self, answers: list[Any]) -> None:
        self.answers = answers
        self.calls = 0

    def get_cluster_custom_object(self, *_: Any) -> dict[str, Any]:
        answer = self.answers[min(self.calls, len(self.answers) - 1)]
        self.calls += 1
        if isinstance(answer, BaseException):
            raise answer
        if callable(answer):
            return {"status": answer()}
        return {"status": answer}


def live(priority: int) -> Callable[[], dict[str, Any]]:
    """A peer entry that is fresh at every read (the guard judges on the wall clock)."""

    def fresh() -> dict[str, Any]:
        now = dt.datetime.now(dt.UTC)
        return {"priority": priority, "lifetime": 20, "lastseen": now.isoformat()}

    return fresh


def status_of(**peers_: Callable[[], dict[str, Any]]) -> Callable[[], dict[str, Any]]:
    return lambda: {name: make() for name, make in peers_.items()}


class Seen:
    """What the guard did: loops stopped, demotions."""

    def __init__(self) -> None:
        self.stops: list[int] = []
        self.demotes: list[int] = []

    def stop(self) -> int:
        self.stops.append(1)
        return 0


async def run_guard(
    api: ScriptedPeering,
    until: Callable[[], bool],
    fence: standby.Fence,
    seen: Seen,
    lifetime: float = 20,
) -> None:
    task = asyncio.create_task(
        standby.guard(
            api,  # type: ignore[arg-type]
            "gpujob",
            [],
            ME,
            -20,
            seen.stop,
            lambda: seen.demotes.append(1),
            lifetime=lifetime,
            interval=0.01,
            fence=fence,
        )
    )
    deadline = time.monotonic() + 20
    try:
        while not until():
            assert not task.done(), task.exception()
            assert time.monotonic() < deadline, "the guard never got there"
            await asyncio.sleep(0.01)
        assert not task.done(), "the guard ended"
    finally:
        task.cancel()


@pytest.mark.parametrize(
    "error",
    [
        urllib3.exceptions.ProtocolError("Connection aborted.", ConnectionResetError(104, "reset")),
        urllib3.exceptions.MaxRetryError(None, "/apis", reason="Connection refused"),  # type: ignore[arg-type]
        ConnectionRefusedError(111, "Connection refused"),
        TimeoutError("read timed out"),
        ApiException(status=500, reason="Internal Server Error"),
    ],
    ids=["reset", "refused", "socket", "timeout", "api-500"],
)
def test_the_guard_survives_every_read_error_and_goes_on_judging(error: Exception) -> None:
    """Before, only an ``ApiException`` was caught: a reset ended the guard silently."""
    newer_active = status_of(**{ME: live(-20), OLD: live(-10)})
    api = ScriptedPeering([error, error, newer_active])
    fence, seen = standby.Fence(), Seen()
    asyncio.run(run_guard(api, lambda: api.calls >= 4, fence, seen))
    assert seen.stops, "the read after the errors found an older live peer: loops stopped"
    assert not fence.open()
    assert not seen.demotes, "never confirmed active: nothing to drop"


def test_an_active_replica_that_loses_its_place_demotes_once_and_shuts_the_fence() -> None:
    alone = status_of(**{ME: live(-20)})
    outranked = status_of(**{ME: live(-20), OLD: live(-10)})
    api = ScriptedPeering([alone, alone, outranked])
    fence, seen = standby.Fence(), Seen()
    fence.until = 0.0
    opened: list[bool] = []

    def done() -> bool:
        opened.append(fence.open())
        return api.calls >= 8

    asyncio.run(run_guard(api, done, fence, seen))
    assert True in opened, "the fence opened while this replica was the active one"
    assert not fence.open()
    assert seen.demotes == [1], "demoted once, not at every round"
    assert seen.stops


def test_a_guard_that_cannot_read_keeps_the_loops_and_lets_the_fence_shut() -> None:
    alone = status_of(**{ME: live(-20)})
    reset = urllib3.exceptions.ProtocolError("Connection aborted.")
    api = ScriptedPeering([alone, reset])
    fence, seen = standby.Fence(), Seen()
    opened: list[bool] = []

    def done() -> bool:
        opened.append(fence.open())
        return api.calls >= 6 and not fence.open()

    asyncio.run(run_guard(api, done, fence, seen, lifetime=0.4))
    assert True in opened, "open after the first read"
    assert not seen.stops and not seen.demotes, "an outage alone neither stops nor exits"


def test_a_read_that_straddles_a_freeze_is_not_trusted_and_the_freeze_still_counts() -> None:
    """Frozen (SIGSTOP) while a read was on its way, the guard got its peers as they were
    before the freeze. Before, it judged on that (alone: active), and its next look, an
    ordinary sleep later, no longer knew of the freeze: a replaced replica came back working
    beside its successor. The freeze is played here by blocking the event loop mid-read."""
    loops: list[asyncio.AbstractEventLoop] = []

    def touched(priority: int) -> dict[str, Any]:
        return {
            "priority": priority,
            "lifetime": 1,
            "lastseen": dt.datetime.now(dt.UTC).isoformat(),
        }

    def frozen_mid_read() -> dict[str, Any]:
        answer = {ME: touched(-20)}  # as it left the API server, before the freeze
        blocked = threading.Event()

        def freeze() -> None:
            blocked.set()
            time.sleep(1.6)  # longer than the keep-alive's lifetime: a successor took over

        loops[0].call_soon_threadsafe(freeze)
        assert blocked.wait(10)
        return answer

    def thawed() -> dict[str, Any]:  # kopf touched again before the guard looked
        return {ME: touched(-20), NEW: touched(-30)}

    api = ScriptedPeering([lambda: {ME: touched(-20)}, frozen_mid_read, thawed])
    fence, seen = standby.Fence(), Seen()

    async def main() -> None:
        loops.append(asyncio.get_running_loop())
        await run_guard(api, lambda: bool(seen.demotes) or api.calls >= 12, fence, seen, lifetime=1)

    asyncio.run(main())
    assert seen.demotes == [1], (
        "the thawed replica restarts instead of working beside its successor"
    )
    assert not fence.open()


def test_a_successor_seen_before_a_freeze_counts_though_this_replicas_kopf_removed_it() -> None:
    """Thawed, this replica's own kopf handles the peering events it queued before the
    freeze: it finds its successor's entry dead in them, removes it, and touches its own.
    The guard's next look then shows this replica alone and fresh; the successor seen live
    at the last look still counts, so the proven lapse stops this replica."""
    alone_again = [{ME: entry(-20, 0)}]
    before = NOW - dt.timedelta(seconds=3)
    verdict = standby.judge(
        alone_again, ME, -20, NOW, 15, 20, before, frozen=True, peer_before=True
    )
    assert verdict is not None and not verdict.active and "since its last look" in verdict.why
    # Each kopf removed the other's entry: nobody is left in the object at all.
    emptied = standby.judge([{}], ME, -20, NOW, 15, 20, before, frozen=True, peer_before=True)
    assert emptied is not None and not emptied.active and "removed as dead" in emptied.why
    # Nobody was there before either: a replica alone that was frozen goes on.
    assert active(alone_again, away=15, last_deadline=before, frozen=True)


def test_a_stall_that_ended_before_a_read_is_not_one_during_it() -> None:
    """Thawed, the guard may run before the stall ticker: it records the stall itself
    before reading, so its first read after the thaw is trusted (not thrown away while
    the thawed replica's kopf already outranks its successor), and the stall still counts
    for the look that follows the last one before it."""
    stalls = standby.Stalls(2.0)
    before_freeze = time.monotonic()
    stalls.last_tick = before_freeze - 10  # the ticker has not run for 10 s: frozen
    assert stalls.since(before_freeze), "a stall under way counts before anyone records it"
    stalls.check()
    read_started = time.monotonic()
    assert stalls.since(before_freeze)
    assert not stalls.since(read_started)
