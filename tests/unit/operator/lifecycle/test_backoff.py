"""Exponential backoff with jitter: growth, cap, jitter bounds, the server's hint."""

from __future__ import annotations

import pytest

from gpujob_operator.lifecycle import backoff


def test_exponential_doubles_from_the_base_up_to_the_cap() -> None:
    got = [backoff.exponential(n, 10, 360) for n in range(0, 8)]
    assert got == [0, 10, 20, 40, 80, 160, 320, 360]
    assert backoff.exponential(10_000, 1, 300) == 300


@pytest.mark.parametrize("rnd", [0.0, 0.3, 0.999, 1.0])
def test_jitter_only_lengthens_and_keeps_delays_growing(rnd: float) -> None:
    policy = backoff.Policy(1.0, 300.0, 0.5)
    worst_previous = 0.0
    for n in range(1, 9):
        d = policy.delay(n, rnd)
        base = backoff.exponential(n, 1.0, 300.0)
        assert base <= d <= base * 1.5
        # even the longest jittered delay is shorter than the next unjittered one
        assert d > worst_previous
        worst_previous = base * 1.5


def test_jitter_spreads_clients_that_reached_the_cap() -> None:
    policy = backoff.Policy(1.0, 300.0, 0.5)
    assert policy.delay(50, 0.0) == 300.0 and policy.delay(50, 1.0) == 450.0


def test_the_servers_retry_after_is_a_floor_but_never_past_the_cap() -> None:
    policy = backoff.Policy(1.0, 60.0)
    assert policy.delay(1, hint=7.0) == 7.0
    assert policy.delay(6, hint=7.0) == 32.0
    assert policy.delay(1, hint=3600.0) == 60.0
