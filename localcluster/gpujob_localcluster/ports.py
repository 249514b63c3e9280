"""Loopback ports for the processes the local cluster and the tests start: chosen here, bound
later by another process.

A port chosen now and bound seconds later can be taken in between. `bind(port 0)` picks from
the kernel's ephemeral range, which every outgoing connection draws from as well (the API
server's connections to etcd, a test's HTTP client), so one such connection on the chosen
port makes the component fail with "address already in use". CI saw it: a
kube-controller-manager could not listen on the port picked for it a few seconds earlier.
Ports here come from outside that range, where only listeners go, at random, and never
twice from one process.
"""

from __future__ import annotations

import os
import random
import socket
import threading
from pathlib import Path

EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LINUX_DEFAULT = (32768, 60999)
LOWEST = 10000
"""Below this, well-known and registered services live; we stay out of their way."""
LOOPBACK = "127.0.0.1"

_rng = random.Random(os.urandom(16))  # our own: tests seed the global one
_given: set[int] = set()
_lock = threading.Lock()


def ephemeral_range(path: Path = EPHEMERAL_RANGE) -> tuple[int, int]:
    """The kernel's ephemeral port range (inclusive), or Linux's default if unreadable."""
    try:
        low, high = (int(x) for x in path.read_text().split())
    except (OSError, ValueError):
        return LINUX_DEFAULT
    return (low, high) if 0 < low <= high <= 65535 else LINUX_DEFAULT


def listener_ranges(ephemeral: tuple[int, int], count: int = 1) -> list[range]:
    """The ranges of first ports whose `count`-run lies between LOWEST and 65535 and
    outside `ephemeral`; empty when the ephemeral range leaves no room."""
    low, high = ephemeral
    out = [range(LOWEST, low - count + 1), range(high + 1, 65536 - count + 1)]
    return [r for r in out if len(r) > 0]


def bindable(port: int, host: str = LOOPBACK) -> bool:
    """Whether a listener could bind `port` right now (a lingering TIME_WAIT counts as no)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def free_port(count: int = 1, host: str = LOOPBACK, tries: int = 500) -> int:
    """The first of `count` consecutive ports on `host`, all free right now, outside the
    ephemeral range, and never handed out before by this process.

    Falls back to the kernel's choice (`bind` to port 0, single ports only) when no such run
    turns up in `tries` draws.
    """
    ranges = listener_ranges(ephemeral_range(), count)
    weights = [len(r) for r in ranges]
    for _ in range(tries if ranges else 0):
        (r,) = _rng.choices(ranges, weights)
        base = _rng.randrange(r.start, r.stop)
        ports = range(base, base + count)
        with _lock:
            if any(p in _given for p in ports):
                continue
            _given.update(ports)  # claimed even if taken: the draw moves on either way
        if all(bindable(p, host) for p in ports):
            return base
    if count != 1:
        raise RuntimeError(f"no run of {count} free ports on {host}")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])
