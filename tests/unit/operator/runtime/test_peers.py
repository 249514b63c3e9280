"""Which operator replica kopf peering lets work: the oldest live one."""

from __future__ import annotations

import datetime as dt

from gpujob_operator.runtime import peers

NOW = dt.datetime(2026, 1, 1, 12, 0, 0, tzinfo=dt.UTC)


def entry(priority: int, seen_ago: float, lifetime: int = 20) -> dict[str, object]:
    return {
        "priority": priority,
        "lifetime": lifetime,
        "lastseen": (NOW - dt.timedelta(seconds=seen_ago)).isoformat(),
    }


def test_older_replicas_outrank_newer_ones() -> None:
    assert peers.priority(1000.0, 5) > peers.priority(1000.001, 0)
    assert peers.priority(1000.0, 1) != peers.priority(1000.0, 2)


def test_a_live_higher_or_equal_peer_pauses_us() -> None:
    status = {"old": entry(-10, 1), "me": entry(-20, 0)}
    assert not peers.is_active(status, "me", -20, NOW)
    assert peers.is_active(status, "old", -10, NOW)
    tie = {"a": entry(-5, 1), "b": entry(-5, 1)}
    assert not peers.is_active(tie, "a", -5, NOW)  # kopf pauses both on a tie


def test_a_dead_peer_does_not_count() -> None:
    status = {"old": entry(-10, 25), "me": entry(-20, 0)}
    assert peers.is_active(status, "me", -20, NOW)
    assert peers.is_active({}, "me", -20, NOW)
