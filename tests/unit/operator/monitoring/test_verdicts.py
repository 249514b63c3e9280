"""Hysteresis: verdicts are published after n evaluations and cleared after n absences."""

from __future__ import annotations

from gpujob_operator.monitoring.verdicts.hysteresis import VerdictState, step
from gpujob_operator.monitoring.verdicts.verdict import (
    COMMUNICATION_BOUND,
    HARDWARE_FAULT,
    HEALTHY,
    INPUT_BOUND,
    STALLED,
    WARNING,
    Verdict,
)


def v(name: str) -> Verdict:
    return Verdict(name, WARNING, f"{name} summary")


def feed(names: list[str | None], n: int = 3) -> tuple[VerdictState, list[tuple[int, str]]]:
    state = VerdictState()
    changes = []
    for i, name in enumerate(names):
        state, change = step(state, v(name) if name else None, float(i), n)
        if change is not None:
            changes.append((i, change.current))
    return state, changes


H, IB, CB = HEALTHY, INPUT_BOUND, COMMUNICATION_BOUND


def test_first_healthy_is_published_at_once_and_warmup_is_ignored() -> None:
    state, changes = feed([None, None, H])
    assert changes == [(2, H)] and state.published is not None and state.since == 2.0


def test_candidate_needs_n_consecutive_evaluations() -> None:
    state, changes = feed([H, IB, IB, H, IB, IB, IB])
    assert changes == [(0, H), (6, IB)]
    assert state.since == 6.0


def test_published_is_cleared_only_after_n_absences() -> None:
    _, changes = feed([H, IB, IB, IB, H, IB, H, H, H])
    # IB published at 3; H at 4 is one absence, IB at 5 resets, then three H clear it
    assert changes == [(0, H), (3, IB), (8, H)]


def test_flapping_candidates_clear_to_healthy() -> None:
    state, changes = feed([H, IB, IB, IB, CB, H, CB])
    assert changes[-1] == (6, H)
    assert state.published is not None and "no longer detected" in state.published.summary


def test_stall_and_hardware_fault_are_immediate_both_ways() -> None:
    _, changes = feed([H, STALLED, H, HARDWARE_FAULT, HARDWARE_FAULT, IB])
    assert changes == [(0, H), (1, STALLED), (2, H), (3, HARDWARE_FAULT), (5, H)]


def test_numbers_refresh_while_held_and_since_stays() -> None:
    state = VerdictState()
    for i in range(3):
        state, _ = step(state, v(IB), float(i), 3)
    assert state.since == 2.0
    newer = Verdict(IB, WARNING, "newer numbers")
    state, change = step(state, newer, 10.0, 3)
    assert change is None and state.published == newer and state.since == 2.0


def test_n_of_one_switches_immediately() -> None:
    _, changes = feed([H, IB, CB, H], n=1)
    assert changes == [(0, H), (1, IB), (2, CB), (3, H)]
