"""A stalled event loop is logged with where it was, once per stall."""

from __future__ import annotations

import logging
import threading

import pytest

from gpujob_operator.observability.gcpause import GcPauses
from gpujob_operator.runtime import stallwatch
from gpujob_operator.runtime.stallwatch import StallWatch, stack_of


class Clock:
    def __init__(self) -> None:
        self.now = 10.0

    def __call__(self) -> float:
        return self.now


def busy_in_training_code(entered: threading.Event, release: threading.Event) -> None:
    entered.set()
    release.wait(30)


def test_a_stall_is_logged_once_with_the_stalled_thread_s_frames(
    caplog: pytest.LogCaptureFixture,
) -> None:
    entered, release = threading.Event(), threading.Event()
    worker = threading.Thread(target=busy_in_training_code, args=(entered, release))
    worker.start()
    try:
        assert entered.wait(10)
        assert worker.ident is not None
        clock = Clock()
        watch = StallWatch(worker.ident, stall_seconds=0.5, clock=clock)
        caplog.set_level(logging.WARNING, "gpujob.stall")
        clock.now += 0.4
        watch.check()
        assert watch.stalls == 0 and not caplog.records
        clock.now += 0.3
        watch.check()
        watch.check()  # the same stall: not again
        assert watch.stalls == 1 and len(caplog.records) == 1
        assert "busy_in_training_code" in caplog.records[0].getMessage()
        clock.now += 1.0
        watch.tick()  # the loop ran again: how long it lasted, and where
        assert "stalled for 1.70s" in caplog.records[1].getMessage()
        assert watch.reported is None
        clock.now += 0.2
        watch.check()
        assert watch.stalls == 1
    finally:
        release.set()
        worker.join()


def test_the_stack_of_a_thread_that_is_gone_is_empty() -> None:
    assert stack_of(-1) == []


def test_a_stack_taken_after_the_loop_ran_again_is_not_reported(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = Clock()
    watch = StallWatch(threading.get_ident(), stall_seconds=0.5, clock=clock)
    clock.now += 1.0

    def ticked_meanwhile(thread_id: int) -> list[str]:
        watch.tick()  # the loop ran between the look at the clock and the look at the stack
        return ["somewhere"]

    monkeypatch.setattr(stallwatch, "stack_of", ticked_meanwhile)
    watch.check()
    assert watch.stalls == 0 and watch.reported is None


def test_a_stall_that_a_full_collection_ended_in_says_how_long_the_collector_ran(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    pauses = GcPauses(clock=clock)
    watch = StallWatch(threading.get_ident(), stall_seconds=0.5, clock=clock, gc_pauses=pauses)
    caplog.set_level(logging.WARNING, "gpujob.stall")
    pauses.observe(2, 0.3, ended=clock.now - 1)  # before the stall: not its cause
    clock.now += 1.0
    watch.check()
    pauses.observe(2, 0.9, ended=clock.now + 0.1)
    clock.now += 0.2
    watch.tick()
    ended = caplog.records[-1].getMessage()
    assert "stalled for 1.20s" in ended and "full garbage collection took 0.90s" in ended, ended
    clock.now += 1.0
    watch.check()
    clock.now += 0.1
    watch.tick()  # the next stall had no full collection in it
    assert "garbage" not in caplog.records[-1].getMessage()


@pytest.mark.parametrize(
    ("loop_cpu", "process_cpu", "queued", "says"),
    [
        (0.9, 1.0, 0.1, "the loop's own work"),
        (0.1, 1.4, 0.0, "waiting for the GIL"),
        (0.05, 0.2, 1.0, "runnable but not run (the machine is busy, or a CPU limit)"),
    ],
)
def test_a_stall_says_whether_the_loop_worked_waited_for_the_gil_or_for_a_cpu(
    caplog: pytest.LogCaptureFixture, loop_cpu: float, process_cpu: float, queued: float, says: str
) -> None:
    clock = Clock()
    cpu: list[tuple[float, float, float | None]] = [(5.0, 20.0, 3.0)]
    watch = StallWatch(threading.get_ident(), stall_seconds=0.5, clock=clock, cpu=lambda: cpu[-1])
    caplog.set_level(logging.WARNING, "gpujob.stall")
    clock.now += 1.2
    watch.check()
    cpu.append((5.0 + loop_cpu, 20.0 + process_cpu, 3.0 + queued))
    watch.tick()
    ended = caplog.records[-1].getMessage()
    assert f"the loop thread ran {loop_cpu:.2f}s of it, it waited {queued:.2f}s for a CPU" in ended
    assert f"other threads {process_cpu - loop_cpu:.2f}s" in ended and says in ended, ended
