"""Step timelines: marks taken at phase boundaries, and how a step's span splits into phases.

A step is a chain of marks; each mark names the phase that runs until the next mark, so the
phases partition the step by construction and their sum is the step time. On CPU a mark is a
host timestamp. On CUDA each mark also records an event on the current stream, and the step
is attributed from GPU event times once every event has completed (queried, never waited
for), because host timestamps of asynchronous launches say little about where the GPU spent
its time. Nothing here synchronises the device.

A training step is an iteration of the loop. The global optimizer hooks record each
optimizer step's end as a *tentative* end (`OPTIMIZER_DONE`); the replay commits the last one
when the loop reaches its next boundary (`Timeline`), so two optimizers stepping in one
iteration (a GAN, a separate embedding optimizer) make one step, which ends where the last
of them ended.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from gpujob_trainer import contract

Mark = tuple[float, str, Any]
"""A phase boundary: (host seconds, the phase that runs from here, CUDA event or None)."""

ENTER, EXIT, SWITCH, POP, MARK, END, DONE = range(7)
Op = tuple[int, str | None, Any]
"""What an event does to the phase stack: (kind, phase, second phase (SWITCH), the
optimizer's key (DONE) or None)."""
Event = tuple[float, Op, Any]
"""What the training thread records: (host seconds, op, CUDA event or None), the least a hook
can do. The three values are added to one flat list (`list.extend`, one C call, so a reader
never sees part of an event): no tuple survives, so a run of queued events adds no work for
the garbage collector. The stack and the marks are replayed from them later, on the scrape's
side (`Timeline`)."""


def ops(kind: int) -> dict[str, Op]:
    """One op per phase, made once: the hooks append these constants."""
    return {phase: (kind, phase, None) for phase in contract.PHASES}


ENTERS, EXITS, POPS = ops(ENTER), ops(EXIT), ops(POP)
END_STEP: Op = (END, None, None)
"""End the step where the stack is."""
END_OPTIMIZER: Op = (END, contract.PHASE_OPTIMIZER, None)
"""Leave the optimizer phase, then end the step (an optimizer step's end)."""
MARK_HERE: Op = (MARK, None, None)
"""A boundary without a change of phase (a step's second optimizer)."""
OPTIMIZER_DONE: Op = (DONE, contract.PHASE_OPTIMIZER, None)
"""Leave the optimizer phase; the step ends here unless another optimizer step follows before
the loop's next boundary (what the global optimizer hooks record, with the optimizer's
identity: `optimizer_done`)."""


def optimizer_done(key: int) -> Op:
    """OPTIMIZER_DONE of one optimizer: a second step of the same optimizer before any
    boundary starts a new iteration (a loop whose batches come from no wrapped loader after
    one that did), while another optimizer's step belongs to the same one (a GAN)."""
    return (DONE, contract.PHASE_OPTIMIZER, key)


ALWAYS_BOUNDARIES = frozenset((contract.PHASE_DATA_WAIT, *contract.BUSY_PHASES))
"""Entering one of these commits a pending step end: a data fetch starts the next iteration,
and an evaluation or a checkpoint comes after the step it follows."""
LOOP_STARTS = frozenset((contract.PHASE_H2D, contract.PHASE_FORWARD))
"""Also boundaries until a data fetch was seen: a loop without a wrapped loader starts each
iteration with its copy to the device or its forward. Once fetches are seen they are not (a
GAN's generator step runs its forwards after the discriminator's optimizer step)."""
MAX_OPEN_MARKS = 8192
"""Marks a pending end may gather before it is committed anyway: a loop with no boundary at
all would otherwise grow one step without end (and hold its CUDA events)."""


def _pop(stack: list[str], phase: str | None) -> None:
    """Pop the innermost `phase`; a mismatch (an exception mid-phase) is tolerated, never
    raised, so bookkeeping cannot break training. The bottom entry stays."""
    if stack[-1] == phase and len(stack) > 1:
        stack.pop()
        return
    for i in range(len(stack) - 1, 0, -1):
        if stack[i] == phase:
            del stack[i]
            return


class Timeline:
    """Replays events into the phase stack, phase marks and finished steps.

    Each op but POP takes a mark naming the phase on top of the stack after it; END also
    closes the step (its mark starts the next one). DONE (an optimizer step's end, global
    hooks) takes a mark and leaves the step's end pending there: the next boundary commits
    it (a data fetch, an eval or checkpoint, before any fetch was seen a copy to the device
    or a forward; `ALWAYS_BOUNDARIES`, `LOOP_STARTS`), an explicit END_STEP commits it too,
    and a later DONE before any boundary moves it there (one step, however many optimizers).
    A watched optimizer's end (END with the optimizer phase) ends the step where it is.
    The time from the pending mark to the boundary belongs to the next step. State carries
    over between `feed` calls; `finish` commits what is still pending.
    """

    def __init__(self) -> None:
        self.stack: list[str] = [contract.PHASE_OTHER]
        self.marks: list[Mark] = []
        self.steps = 0
        self.last_step_host: float | None = None
        self.last_mark_host: float | None = None
        self.pending: int | None = None
        """Index in `marks` of the mark where the step ends unless another optimizer steps."""
        self.fetched = False
        """Whether a data fetch (`data_wait`) was replayed: then forwards no longer start
        steps (fetches, busy phases and an optimizer's second step do)."""
        self.stepped: set[Any] = set()
        """Optimizers (their ops' keys) that stepped since the last committed end."""
        self.closed_by_boundary = False
        """A boundary committed the step and no optimizer stepped since: an `end_step()` now
        ends nothing more (the iteration was counted)."""

    def feed(self, flat: Sequence[Any]) -> list[list[Mark]]:
        """Apply the events in `flat` (three values each, see `Event`); returns the marks of
        each step they finished (two marks or more)."""
        done: list[list[Mark]] = []
        stack, marks = self.stack, self.marks
        values = iter(flat)
        # Three values at a time (a trailing partial event is left, as it always was).
        for host, (kind, phase, other), event in zip(values, values, values, strict=False):
            if kind == ENTER:
                if self.pending is not None and (
                    phase in ALWAYS_BOUNDARIES or (not self.fetched and phase in LOOP_STARTS)
                ):
                    marks = self._commit(marks, done)
                    self.closed_by_boundary = True
                if phase == contract.PHASE_DATA_WAIT:
                    self.fetched = True
                stack.append(phase)
                marks.append((host, stack[-1], event))
                self.last_mark_host = host
                continue
            if kind != MARK and (kind != END or phase is not None):
                # Every other op leaves `phase` first: `_pop` inline for the innermost one
                # (nearly always), a call fewer per event at every scrape.
                if stack[-1] == phase and len(stack) > 1:
                    stack.pop()
                else:
                    _pop(stack, phase)
            if kind == SWITCH:
                stack.append(other)
            elif kind == POP:
                continue
            elif kind == DONE:
                self.closed_by_boundary = False
                if self.pending is not None and (
                    other in self.stepped or self.pending >= MAX_OPEN_MARKS
                ):  # the same optimizer again: the iteration before ended at the pending mark
                    marks = self._commit(marks, done)
                self.pending = len(marks)
                self.stepped.add(other)
            elif kind == END:
                if phase is None and (self.pending is not None or self.closed_by_boundary):
                    # end_step(): the last optimizer's end it is, or a boundary already
                    # ended this iteration (a checkpoint after the optimizer step)
                    if self.pending is not None:
                        marks = self._commit(marks, done)
                    self.closed_by_boundary = False
                    marks.append((host, stack[-1], event))
                    self.last_mark_host = host
                    continue
                self.pending = None  # a watched optimizer ends the step here
                self.stepped.clear()
                self.closed_by_boundary = False
                end = (host, stack[-1], event)
                marks.append(end)
                if len(marks) > 1:
                    done.append(marks)
                marks = [end]
                self.steps += 1
                self.last_step_host = self.last_mark_host = host
                continue
            marks.append((host, stack[-1], event))
            self.last_mark_host = host
        self.marks = marks
        return done

    def finish(self) -> list[list[Mark]]:
        """Commit a pending step end (training is over); returns the step it finished."""
        done: list[list[Mark]] = []
        if self.pending is not None:
            self.marks = self._commit(self.marks, done)
        return done

    def _commit(self, marks: list[Mark], done: list[list[Mark]]) -> list[Mark]:
        """End the step at the pending mark; returns the marks of the step it starts."""
        at = self.pending
        assert at is not None
        self.pending = None
        self.stepped.clear()
        if at > 0:
            done.append(marks[: at + 1])
        self.steps += 1
        self.last_step_host = marks[at][0]
        return marks[at:]


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


def current_stream_reader(torch: Any, cache_limit: int = 256) -> Callable[[], Any]:
    """A `torch.cuda.current_stream()` that costs two C calls and a dict lookup.

    The public call resolves the device index through several Python layers and builds a new
    Stream object each time: 8.6 us a call on an H200 host, more than recording the event
    itself (3.3 us), nine times a step. The device and the raw stream handle identify the
    stream; its Stream object is made once. Falls back to the public call on a torch
    without those C entry points.
    """
    get_device = getattr(torch._C, "_cuda_getDevice", None)
    get_raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    public: Callable[..., Any] = torch.cuda.current_stream
    if get_device is None or get_raw is None:
        return public
    streams: dict[tuple[int, int], Any] = {}

    def current() -> Any:
        device = get_device()
        key = (device, get_raw(device))
        stream = streams.get(key)
        if stream is None:
            if len(streams) >= cache_limit:  # a loop that makes streams without end
                streams.clear()
            stream = streams[key] = public(device)
        return stream

    return current


class CudaEventClock:
    """CUDA events from a small pool, recorded on the caller's current stream.

    `event_factory` makes a timing event and `current_stream` names the stream to record on
    (None: the event's own default); tests pass fakes. Events are only ever queried, so the
    training loop is never blocked by its own instrumentation.
    """

    def __init__(
        self,
        event_factory: Callable[[], Any] | None = None,
        pool_limit: int = 1024,
        current_stream: Callable[[], Any] | None = None,
    ):
        if event_factory is None:
            import torch  # lazy: only a CUDA job gets here

            def event_factory() -> Any:
                return torch.cuda.Event(enable_timing=True)

            if current_stream is None:
                current_stream = current_stream_reader(torch)
        self._factory = event_factory
        self._stream = current_stream
        self._pool: list[Any] = []
        self._pool_limit = pool_limit

    def record(self) -> Any:
        event = self._pool.pop() if self._pool else self._factory()
        stream = self._stream
        if stream is None:
            event.record()
        else:
            event.record(stream())
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
