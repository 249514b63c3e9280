"""What a training step is: the replay of the global optimizer hooks' pending step ends.

A step is one iteration of the loop: the last optimizer step before the loop's next boundary
ends it. These replay hand-made events (host times only) and one tracker with fake CUDA
events; `tests/trainer/test_training_steps.py` runs the same rule on real torch loops.
"""

from __future__ import annotations

from typing import Any

import pytest

from gpujob_trainer import timing
from gpujob_trainer.env import RankInfo
from gpujob_trainer.hooks import optimizer_hooks
from gpujob_trainer.timing import (
    END_OPTIMIZER,
    END_STEP,
    ENTERS,
    EXITS,
    CudaEventClock,
    Mark,
    Timeline,
    attribute,
    optimizer_done,
)
from gpujob_trainer.tracker import Tracker

Script = list[tuple[float, Any]]


def _flat(events: Script) -> list[Any]:
    out: list[Any] = []
    for host, op in events:
        out.extend((host, op, None))
    return out


def fetch(t: float) -> Script:
    return [(t, ENTERS["data_wait"]), (t + 1, EXITS["data_wait"])]


def forward(t: float) -> Script:
    return [(t, ENTERS["forward"]), (t + 1, EXITS["forward"])]


def optimizer(t: float, which: int = 0) -> Script:
    """One step of optimizer `which` from `t` to `t + 1`, as the global hooks record it."""
    return [(t, ENTERS["optimizer"]), (t + 1, optimizer_done(which))]


def replay(events: Script, tl: Timeline | None = None) -> tuple[Timeline, list[list[Mark]]]:
    tl = tl if tl is not None else Timeline()
    return tl, tl.feed(_flat(events))


def test_two_optimizers_in_an_iteration_make_one_step_ending_at_the_last() -> None:
    # fetch, forward, then a body's and a head's optimizer: three iterations
    events: Script = []
    for i in range(3):
        t = 10.0 * i
        events += fetch(t) + forward(t + 2) + optimizer(t + 4) + optimizer(t + 6, 1)
    tl, done = replay(events)
    assert tl.steps == len(done) == 2  # the third waits for the next boundary
    assert [s[-1][0] for s in done] == [7.0, 17.0]  # the second optimizer's end
    assert tl.last_step_host == 17.0
    # the time from the end to the next fetch belongs to the next step
    assert done[1][0][0] == 7.0 and attribute(done[1])["other"] == 3.0 + 1.0 + 1.0 + 1.0
    assert sum(attribute(done[1]).values()) == 10.0
    (last,) = tl.finish()  # close(): the pending end is committed where it stands
    assert tl.steps == 3 and last[-1][0] == 27.0 and tl.last_step_host == 27.0
    assert tl.finish() == [] and tl.steps == 3


def test_a_gan_with_a_fetched_batch_is_one_step_per_iteration() -> None:
    # D: forward, optimizer; G: forward (after D's optimizer step), optimizer
    events: Script = []
    for i in range(4):
        t = 10.0 * i
        events += (
            fetch(t) + forward(t + 2) + optimizer(t + 3) + forward(t + 5) + optimizer(t + 7, 1)
        )
    tl, done = replay(events + fetch(40.0))
    assert tl.steps == 4
    assert [s[-1][0] for s in done] == [8.0, 18.0, 28.0, 38.0]
    assert all(attribute(s)["optimizer"] == 2.0 for s in done)


def test_without_fetches_a_forward_starts_the_next_step() -> None:
    # no wrapped loader: two optimizers back to back are one step ...
    events = (
        forward(0) + optimizer(1) + optimizer(2, 1) + forward(5) + optimizer(6) + optimizer(7, 1)
    )
    tl, done = replay(events + forward(10))
    assert tl.steps == 2 and [s[-1][0] for s in done] == [3.0, 8.0]
    # ... but a forward between them (a GAN without a wrapped loader) is a boundary
    tl, _ = replay(forward(0) + optimizer(1) + forward(3) + optimizer(4, 1) + forward(6))
    assert tl.steps == 2
    # a copy to the device is one too, until a fetch was seen
    tl, _ = replay([(0.0, ENTERS["h2d"]), (1.0, EXITS["h2d"]), *optimizer(2), (4.0, ENTERS["h2d"])])
    assert tl.steps == 1 and not tl.fetched


def test_gradient_accumulation_is_one_step_per_optimizer_step() -> None:
    events: Script = []
    t = 0.0
    for _ in range(3):
        for _ in range(4):  # micro-batches: fetch and forward, no optimizer step
            events += fetch(t) + forward(t + 2)
            t += 4
        events += optimizer(t)
        t += 2
    tl, done = replay(events + fetch(t))
    assert tl.steps == 3
    assert [s[-1][0] for s in done] == [17.0, 35.0, 53.0]
    assert all(attribute(s)["data_wait"] == 4.0 for s in done)


def test_entering_eval_or_checkpoint_counts_the_step_before_it() -> None:
    events = fetch(0) + forward(2) + optimizer(4)
    tl, done = replay([*events, (7.0, ENTERS["eval"])])
    assert tl.steps == 1 and done[0][-1][0] == 5.0  # its end, not the eval's start
    tl, done = replay([(9.0, EXITS["eval"]), *fetch(10), *optimizer(12)], tl)
    assert done == [] and tl.steps == 1
    tl, done = replay([(14.0, ENTERS["checkpoint"])], tl)
    assert tl.steps == 2
    assert attribute(done[0])["eval"] == 2.0  # the eval is time of the step after it


def test_end_step_commits_the_pending_end_and_ends_no_second_step() -> None:
    tl, done = replay(fetch(0) + optimizer(2) + [(6.0, END_STEP)])
    assert tl.steps == 1 and done[0][-1][0] == 3.0
    assert tl.last_mark_host == 6.0  # it still draws a boundary
    # without a pending end it ends a step where it is (hook_optimizers=False)
    tl, done = replay([*fetch(7), (9.0, END_STEP)], tl)
    assert tl.steps == 2 and done[0][-1][0] == 9.0 and done[0][0][0] == 3.0


def test_a_watched_optimizer_ends_the_step_at_its_own_end() -> None:
    events = fetch(0) + optimizer(2) + [(4.0, ENTERS["optimizer"]), (5.0, END_OPTIMIZER)]
    tl, done = replay(events + fetch(6))
    assert tl.steps == 1 and done[0][-1][0] == 5.0  # one step: the pending end joined it
    assert tl.pending is None and tl.finish() == []


def test_a_loop_without_boundaries_still_ends_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(timing, "MAX_OPEN_MARKS", 8)
    events: Script = []
    for i in range(20):
        events += optimizer(2.0 * i)
    tl, done = replay(events)
    assert 1 <= tl.steps < 20 and all(len(s) <= 8 + 3 for s in done)
    assert len(tl.marks) <= 8 + 3


class FakeEvent:
    """A CUDA event stand-in that is done at once; its device time is its creation order."""

    made = 0

    def __init__(self) -> None:
        FakeEvent.made += 1
        self.device_time = float(FakeEvent.made)

    def record(self, stream: Any = None) -> None:
        return None

    def query(self) -> bool:
        return True

    def elapsed_time(self, end: FakeEvent) -> float:
        return (end.device_time - self.device_time) * 1000.0


def test_the_events_of_superseded_pending_ends_go_back_to_the_pool() -> None:
    FakeEvent.made = 0
    clock = CudaEventClock(event_factory=FakeEvent)
    now = [0.0]
    tracker = Tracker(rank=RankInfo(), clock=clock, host_clock=lambda: now[0])
    pre, post = optimizer_hooks(tracker, watched=False)
    body, head = object(), object()
    made = []
    for _ in range(50):
        tracker._enter("data_wait")
        tracker._exit("data_wait")
        for opt in (body, head):  # two pending ends an iteration, the first superseded
            pre(opt, (), {})
            now[0] += 0.01
            post(opt, (), {})
        tracker.flush()
        made.append(FakeEvent.made)
    snap = tracker.snapshot()
    assert snap.steps == snap.step_count == 49
    assert made[-1] == made[4]  # every attributed step's events were reused: none made anew
    tracker.close()
    assert tracker.snapshot().steps == 50


def test_the_same_optimizer_again_ends_the_iteration_before_it() -> None:
    # one batch from a wrapped loader, then batches from an unwrapped one: no fetch and no
    # forward boundary any more, but each step of the one optimizer starts a new iteration
    events: Script = fetch(0) + forward(2) + optimizer(4)
    for i in range(1, 5):
        t = 10.0 * i
        events += forward(t) + optimizer(t + 2)
    tl, done = replay(events)
    assert tl.fetched and tl.steps == len(done) == 4  # the fifth waits for its boundary
    assert [s[-1][0] for s in done] == [5.0, 13.0, 23.0, 33.0]  # each at its optimizer's end
    assert tl.finish() and tl.steps == 5


def test_end_step_after_a_checkpoint_that_ended_the_iteration_counts_no_second_step() -> None:
    # opt.step(); with tracker.checkpointing(): save(); tracker.end_step()
    events: Script = []
    for i in range(10):
        t = 10.0 * i
        events += fetch(t) + forward(t + 2) + optimizer(t + 4)
        events += [(t + 6, ENTERS["checkpoint"]), (t + 7, EXITS["checkpoint"]), (t + 8, END_STEP)]
    tl, done = replay(events)
    assert tl.steps == len(done) == 10
    assert all(s[-1][0] == 10.0 * i + 5.0 for i, s in enumerate(done))
    # without the optimizer hooks, end_step() alone still ends each step
    tl, _ = replay([(1.0, END_STEP), (2.0, ENTERS["checkpoint"]), (3.0, END_STEP)])
    assert tl.steps == 2
