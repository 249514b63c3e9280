"""Step timelines: marks taken at phase boundaries, and how a step's span splits into phases.

A step is a chain of marks; each mark names the phase that runs until the next mark, so the
phases partition the step by construction and their sum is the step time. On CPU a mark is a
host timestamp. On CUDA each mark also records an event on the current stream, and the step
is attributed from GPU event times once every event has completed (queried, never waited
for), because host timestamps of asynchronous launches say little about where the GPU spent
its time. Nothing here synchronises the device.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from gpujob_trainer import contract

Mark = tuple[float, str, Any]
"""A phase boundary: (host seconds, the phase that runs from here, CUDA event or None).

A plain tuple because the training thread makes about ten per step.
"""


class Clock(Protocol):
    """Takes marks and, later, tells when a step's device times can be read."""

    def record(self) -> Any:
        """Record a device timestamp on the current stream (None when there is no device)."""

    def ready(self, event: Any) -> bool:
        """Whether a recorded event has completed; must not block."""

    def elapsed(self, start: Any, end: Any) -> float:
        """Seconds between two completed events."""

    def release(self, event: Any) -> None:
        """Give an event back for reuse once no step needs it."""


class HostClock:
    """No device: marks carry host timestamps only and are ready at once."""

    def record(self) -> Any:
        return None

    def ready(self, event: Any) -> bool:
        return True

    def elapsed(self, start: Any, end: Any) -> float:
        raise TypeError("HostClock has no events")

    def release(self, event: Any) -> None:
        return None


class CudaEventClock:
    """CUDA events from a small pool, recorded on the caller's current stream.

    `event_factory` makes a timing event; tests pass a fake. Events are only ever queried, so
    the training loop is never blocked by its own instrumentation.
    """

    def __init__(self, event_factory: Callable[[], Any] | None = None, pool_limit: int = 256):
        if event_factory is None:
            import torch  # lazy: only a CUDA job gets here

            def event_factory() -> Any:
                return torch.cuda.Event(enable_timing=True)

        self._factory = event_factory
        self._pool: list[Any] = []
        self._pool_limit = pool_limit

    def record(self) -> Any:
        event = self._pool.pop() if self._pool else self._factory()
        event.record()
        return event

    def ready(self, event: Any) -> bool:
        return bool(event.query())

    def elapsed(self, start: Any, end: Any) -> float:
        return float(start.elapsed_time(end)) / 1000.0

    def release(self, event: Any) -> None:
        if event is not None and len(self._pool) < self._pool_limit:
            self._pool.append(event)


def attribute(marks: Sequence[Mark], clock: Clock | None = None) -> dict[str, float]:
    """Seconds per phase between the first and the last mark.

    Device time is used when every mark carries an event (a CUDA step), else host time (a
    step during which the tracker switched to CUDA timing). Negative intervals (clock noise)
    count as zero; an unknown phase counts as `other`.
    """
    out = dict.fromkeys(contract.PHASES, 0.0)
    if len(marks) < 2:
        return out
    first = marks[0]
    prev_phase = first[1]
    if clock is not None and first[2] is not None and all(m[2] is not None for m in marks):
        prev_event = first[2]
        for _, phase, event in itertools.islice(marks, 1, None):
            seconds = clock.elapsed(prev_event, event)
            if seconds > 0:
                out[prev_phase if prev_phase in out else contract.PHASE_OTHER] += seconds
            prev_phase, prev_event = phase, event
    else:
        prev_host = first[0]
        for host, phase, _ in itertools.islice(marks, 1, None):
            seconds = host - prev_host
            if seconds > 0:
                out[prev_phase if prev_phase in out else contract.PHASE_OTHER] += seconds
            prev_phase, prev_host = phase, host
    return out


def steps_ready(marks: Sequence[Mark], clock: Clock) -> bool:
    """Whether a step can be attributed now (all its events done); never blocks."""
    return all(m[2] is None or clock.ready(m[2]) for m in marks)


def host_now() -> float:
    """The monotonic host clock the marks use."""
    return time.perf_counter()
