"""Ports for components started later stay out of the range outgoing connections use."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from gpujob_localcluster import ports
from gpujob_localcluster.ports import (
    LINUX_DEFAULT,
    LOWEST,
    bindable,
    ephemeral_range,
    free_port,
    listener_ranges,
)


def test_ephemeral_range_is_read_and_checked(tmp_path: Path) -> None:
    f = tmp_path / "range"
    f.write_text("40000\t50000\n")
    assert ephemeral_range(f) == (40000, 50000)
    for bad in ("", "1 2 3", "x y", "50000 40000", "0 70000"):
        f.write_text(bad)
        assert ephemeral_range(f) == LINUX_DEFAULT, bad
    assert ephemeral_range(tmp_path / "missing") == LINUX_DEFAULT


def test_listener_ranges_leave_room_for_a_whole_run() -> None:
    assert listener_ranges((32768, 60999)) == [range(LOWEST, 32768), range(61000, 65536)]
    assert listener_ranges((32768, 60999), count=4) == [
        range(LOWEST, 32765),
        range(61000, 65533),
    ]
    assert listener_ranges((LOWEST, 65535)) == []  # the whole space is ephemeral


def test_ports_are_outside_the_ephemeral_range_free_and_never_repeated() -> None:
    low, high = ephemeral_range()
    seen = set()
    for _ in range(200):
        port = free_port()
        assert not low <= port <= high
        assert port >= LOWEST and port not in seen
        seen.add(port)
        assert bindable(port)


def test_a_run_of_ports_is_all_free() -> None:
    base = free_port(8)
    assert all(bindable(p) for p in range(base, base + 8))
    low, high = ephemeral_range()
    assert base + 7 < low or base > high


def test_a_port_in_use_is_never_handed_out(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", free_port()))
        taken = held.getsockname()[1]
        assert not bindable(taken)
        other = free_port()
        draws = iter([taken, other])
        monkeypatch.setattr(ports._rng, "randrange", lambda a, b: next(draws))
        ports._given.difference_update({taken, other})  # as if chosen by another process
        assert free_port() == other


def test_no_room_outside_the_range_falls_back_to_the_kernel(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(ports, "ephemeral_range", lambda: (LOWEST, 65535))
    assert bindable(free_port())
    with pytest.raises(RuntimeError, match="no run of 3 free ports"):
        free_port(3)
