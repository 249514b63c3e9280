"""Step attribution and the tracker's counters, with fake host clocks and fake CUDA events."""

from __future__ import annotations

import math
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import pytest

from gpujob_trainer import contract
from gpujob_trainer.env import RankInfo
from gpujob_trainer.exporter import render_snapshot
from gpujob_trainer.hooks import batch_size, optimizer_hooks
from gpujob_trainer.timing import (
    END_OPTIMIZER,
    END_STEP,
    ENTERS,
    EXITS,
    POPS,
    SWITCH,
    CudaEventClock,
    HostClock,
    Mark,
    Timeline,
    attribute,
    current_stream_reader,
)
from gpujob_trainer.tracker import Tracker

WALL0, HOST0 = 1_700_000_000.0, 100.0


class FakeTime:
    """A host clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = HOST0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@dataclass
class FakeEvent:
    """A CUDA event stand-in: device time set by the test, done when the test says so."""

    device_time: float | None = None
    done: bool = False
    records: int = 0
    stream: Any = None

    def record(self, stream: Any = None) -> None:
        self.records += 1
        self.stream = stream

    def query(self) -> bool:
        return self.done

    def elapsed_time(self, end: FakeEvent) -> float:
        assert self.done and end.done, "elapsed_time on an unfinished event would block"
        assert self.device_time is not None and end.device_time is not None
        return (end.device_time - self.device_time) * 1000.0


def make_tracker(clock: Any = None, total_steps: int | None = 10) -> tuple[Tracker, FakeTime]:
    t = FakeTime()
    tracker = Tracker(
        total_steps=total_steps,
        rank=RankInfo(rank=3, local_rank=1, node_rank=1, world_size=4),
        clock=clock,
        wall_clock=lambda: WALL0 + (t.now - HOST0),  # the two clocks tick together
        host_clock=t,
    )
    return tracker, t


def run_step(tracker: Tracker, t: FakeTime, seconds: dict[str, float]) -> None:
    """One step through the private transitions the hooks use, with given phase times."""
    tracker._enter("data_wait")
    t.advance(seconds.get("data_wait", 0.0))
    tracker._exit("data_wait")
    tracker._enter("forward")
    t.advance(seconds.get("forward", 0.0))
    tracker._exit("forward")
    t.advance(seconds.get("other", 0.0))
    tracker._enter("backward")
    t.advance(seconds.get("backward", 0.0))
    tracker._switch("backward", "comm_wait")
    t.advance(seconds.get("comm_wait", 0.0))
    tracker._exit("comm_wait")
    begin, end = optimizer_hooks(tracker, watched=False)
    opt = object()
    begin(opt, (), {})
    t.advance(seconds.get("optimizer", 0.0))
    end(opt, (), {})


STEP = {
    "data_wait": 0.010,
    "forward": 0.020,
    "other": 0.001,
    "backward": 0.040,
    "comm_wait": 0.015,
    "optimizer": 0.005,
}


def test_attribute_host_partitions_span() -> None:
    marks: list[Mark] = [(0.0, "data_wait", None), (0.5, "forward", None)]
    marks += [(0.75, "other", None), (1.0, "x", None)]
    got = attribute(marks, HostClock())
    assert got["data_wait"] == 0.5
    assert got["forward"] == 0.25
    assert got["other"] == 0.25
    assert sum(got.values()) == 1.0
    assert set(got) == set(contract.PHASES)


def test_attribute_unknown_phase_and_negative_interval() -> None:
    got = attribute([(1.0, "nope", None), (2.0, "forward", None), (1.5, "other", None)])
    assert got["other"] == 1.0
    assert got["forward"] == 0.0


def test_attribute_prefers_device_time_when_every_mark_has_an_event() -> None:
    events = [FakeEvent(0.0, True), FakeEvent(0.2, True), FakeEvent(0.3, True)]
    marks: list[Mark] = [(0.0, "forward", events[0]), (0.01, "backward", events[1])]
    marks.append((0.02, "other", events[2]))
    got = attribute(marks, CudaEventClock(event_factory=FakeEvent))
    assert got["forward"] == pytest.approx(0.2)
    assert got["backward"] == pytest.approx(0.1)
    marks[1] = (0.01, "backward", None)  # a mark without an event: host times for the step
    got = attribute(marks, CudaEventClock(event_factory=FakeEvent))
    assert got["forward"] == pytest.approx(0.01)


def test_tracker_counts_phases_steps_and_histogram() -> None:
    tracker, t = make_tracker()
    for _ in range(3):
        run_step(tracker, t, STEP)
        tracker.add_samples(32, tokens=4096)
    assert tracker.snapshot().steps == 2  # the last step's end waits for a boundary
    t.advance(1.0)
    tracker.end_step()  # one: it ends the step where its last optimizer step ended
    snap = tracker.snapshot()
    assert snap.steps == 3
    assert snap.step_count == 3
    assert snap.samples == 96
    assert snap.tokens == 3 * 4096
    assert snap.target_steps == 10
    per_step = sum(STEP.values())
    assert snap.last_step_timestamp == pytest.approx(WALL0 + 3 * per_step)
    assert snap.step_sum == pytest.approx(3 * per_step)
    assert sum(snap.phase_seconds.values()) == pytest.approx(snap.step_sum)
    for phase, seconds in STEP.items():
        assert snap.phase_seconds[phase] == pytest.approx(3 * seconds)
    assert snap.compute_seconds == pytest.approx(3 * (0.020 + 0.040 + 0.005))
    idx = next(i for i, b in enumerate(contract.STEP_DURATION_BUCKETS) if per_step <= b)
    assert snap.step_buckets[idx - 1] == 0
    assert snap.step_buckets[idx] == 3
    assert snap.step_buckets[-1] == 3


def test_first_step_starts_at_first_mark() -> None:
    tracker, t = make_tracker()
    t.advance(50.0)  # model building, process group setup: not a step
    run_step(tracker, t, STEP)
    tracker._enter("data_wait")  # the next fetch ends it
    snap = tracker.snapshot()
    assert snap.steps == 1
    assert snap.step_sum == pytest.approx(sum(STEP.values()))


def test_explicit_phase_context_and_validation() -> None:
    tracker, t = make_tracker()
    tracker._enter("data_wait")
    t.advance(0.001)
    tracker._exit("data_wait")
    with tracker.phase("checkpoint"):
        t.advance(2.0)
        with tracker.phase("other"):
            t.advance(0.5)
    tracker.end_step()
    snap = tracker.snapshot()
    assert snap.phase_seconds["checkpoint"] == pytest.approx(2.0)
    assert snap.phase_seconds["other"] == pytest.approx(0.5)
    with pytest.raises(ValueError, match="unknown phase 'evaluation'"), tracker.phase("evaluation"):
        pass


def test_watched_optimizer_alone_ends_steps() -> None:
    tracker, t = make_tracker()
    gen, disc = object(), object()
    tracker._step_optimizers.add(id(gen))  # what watch_optimizer(gen) records
    every_pre, every_post = optimizer_hooks(tracker, watched=False)
    own_pre, own_post = optimizer_hooks(tracker, watched=True)
    for opt in (disc, gen, disc, gen):
        # the global hooks see both; the watched one's own hooks see it too
        every_pre(opt, (), {})
        if opt is gen:
            own_pre(opt, (), {})
        t.advance(0.01)
        if opt is gen:
            own_post(opt, (), {})
        every_post(opt, (), {})
    snap = tracker.snapshot()
    assert snap.steps == 2
    assert snap.phase_seconds["optimizer"] == pytest.approx(0.04)


def test_cuda_steps_are_attributed_lazily_from_events() -> None:
    made: list[FakeEvent] = []

    def factory() -> FakeEvent:
        made.append(FakeEvent())
        return made[-1]

    clock = CudaEventClock(event_factory=factory)
    tracker, t = make_tracker(clock=clock)
    run_step(tracker, t, STEP)
    run_step(tracker, t, STEP)
    tracker.end_step()
    snap = tracker.snapshot()
    assert snap.steps == 2  # progress is host-side and immediate
    assert snap.step_count == 0  # nothing attributed: no event has completed
    # The GPU ran each interval for 2 ms longer than the host saw (the host ran ahead).
    for i, ev in enumerate(made):
        ev.device_time = i * 0.002
        ev.done = True
    snap = tracker.snapshot()
    assert snap.step_count == 2
    marks_per_step = 9  # the second step starts at the first one's end mark
    assert snap.step_sum == pytest.approx(((marks_per_step - 1) + marks_per_step) * 0.002)
    assert sum(snap.phase_seconds.values()) == pytest.approx(snap.step_sum)
    # events of attributed steps go back to the pool and are reused
    n = len(made)
    run_step(tracker, t, STEP)
    assert len(made) < n + marks_per_step


def test_events_are_recorded_on_the_callers_current_stream() -> None:
    current = ["s0"]
    clock = CudaEventClock(event_factory=FakeEvent, current_stream=lambda: current[0])
    first = clock.record()
    current[0] = "side"
    assert (first.stream, clock.record().stream) == ("s0", "side")
    clock.release(first)
    assert clock.record() is first and first.stream == "side"  # a pooled event follows too


class FakeTorchC:
    """The two C entry points `current_stream_reader` uses, with a device and raw handles."""

    def __init__(self) -> None:
        self.device, self.raw = 0, {0: 100, 1: 200}

    def _cuda_getDevice(self) -> int:
        return self.device

    def _cuda_getCurrentRawStream(self, device: int) -> int:
        return self.raw[device]


def test_current_stream_reader_makes_one_stream_object_per_stream() -> None:
    c = FakeTorchC()
    made: list[tuple[int, int]] = []

    def public(device: int) -> tuple[int, int]:
        made.append((device, c.raw[device]))
        return made[-1]

    fake = SimpleNamespace(_C=c, cuda=SimpleNamespace(current_stream=public))
    current = current_stream_reader(fake, cache_limit=3)
    assert current() == (0, 100) and current() == (0, 100)
    assert len(made) == 1  # the Stream object is reused while the stream stays current
    c.device = 1
    assert current() == (1, 200)
    c.raw[1] = 201  # `with torch.cuda.stream(s)`: another stream is current
    assert current() == (1, 201)
    c.raw[1] = 200
    assert current() == (1, 200) and len(made) == 3
    for handle in range(300, 310):  # streams made without end do not grow the cache
        c.raw[1] = handle
        assert current() == (1, handle)
    assert len(made) == 13


def test_current_stream_reader_falls_back_to_the_public_call() -> None:
    def public(device: int | None = None) -> str:
        return "public"

    fake = SimpleNamespace(_C=object(), cuda=SimpleNamespace(current_stream=public))
    assert current_stream_reader(fake)() == "public"


def test_cuda_attribution_waits_for_every_event_of_a_step() -> None:
    made: list[FakeEvent] = []

    def factory() -> FakeEvent:
        made.append(FakeEvent(device_time=len(made) * 0.001))
        return made[-1]

    tracker, t = make_tracker(clock=CudaEventClock(event_factory=factory))
    run_step(tracker, t, STEP)
    run_step(tracker, t, STEP)
    tracker.end_step()
    for ev in made[:5]:
        ev.done = True
    assert tracker.snapshot().step_count == 0
    for ev in made:
        ev.done = True
    assert tracker.snapshot().step_count == 2


def test_loss_values() -> None:
    tracker, _ = make_tracker()
    assert tracker.snapshot().loss is None
    tracker.log(loss=2.5, samples=8, tokens=80, epoch=3)
    snap = tracker.snapshot()
    assert (snap.loss, snap.samples, snap.tokens, snap.epoch) == (2.5, 8, 80, 3)
    tracker.log(loss=float("nan"))
    assert math.isnan(tracker.snapshot().loss or 0.0)


def test_epochs_from_loader_unless_set() -> None:
    tracker, _ = make_tracker()
    assert tracker.snapshot().epoch is None
    tracker._loader_epoch_started()
    tracker._loader_epoch_started()
    assert tracker.snapshot().epoch == 1
    tracker.set_epoch(7)
    tracker._loader_epoch_started()
    assert tracker.snapshot().epoch == 7


def test_render_snapshot_names_types_and_labels() -> None:
    tracker, t = make_tracker(total_steps=None)
    run_step(tracker, t, STEP)
    run_step(tracker, t, STEP)
    fams = {f.name: f for f in render_snapshot(tracker.snapshot())}
    assert "gpujob_train_target_steps" not in fams  # unknown target: absent, not 0
    assert "gpujob_train_loss" not in fams
    assert fams["gpujob_train_steps"].type == "counter"
    assert fams["gpujob_train_step_duration_seconds"].type == "histogram"
    rank = {"rank": "3", "local_rank": "1", "node_rank": "1"}
    for fam in fams.values():
        assert fam.name + "_created" not in {s.name for s in fam.samples}
        for sample in fam.samples:
            assert rank.items() <= sample.labels.items(), sample
    phases = {s.labels["phase"] for s in fams["gpujob_train_phase_seconds"].samples}
    assert phases == set(contract.PHASES)


@pytest.mark.parametrize(
    ("batch", "size"),
    [
        (FakeEvent, 1),
        ([], 0),
        ({"input_ids": type("T", (), {"shape": (8, 128)})()}, 8),
        ((type("T", (), {"shape": (4, 3)})(), type("T", (), {"shape": (4,)})()), 4),
        ([1, 2, 3], 3),
        (type("S", (), {"shape": ()})(), 1),
    ],
)
def test_batch_size(batch: Any, size: int) -> None:
    assert batch_size(batch) == size


# ---- liveness between steps: heartbeat and current phase ------------------------------------


def test_heartbeat_is_the_last_phase_change_in_wall_time() -> None:
    wall = FakeTime()
    wall.now = 1_700_000_000.0
    host = FakeTime()
    tracker = Tracker(total_steps=10, rank=RankInfo(), wall_clock=wall, host_clock=host)
    host.advance(5)
    wall.advance(5)
    snap = tracker.snapshot()  # nothing happened yet: alive since the tracker was made
    assert snap.heartbeat_timestamp == 1_700_000_000.0 and snap.current_phase == "other"
    tracker._enter("forward")
    host.advance(30)  # a forward that takes 30 s: no phase change meanwhile
    wall.advance(30)
    snap = tracker.snapshot()
    assert snap.heartbeat_timestamp == 1_700_000_005.0 and snap.current_phase == "forward"
    wall.advance(0.25)  # the two clocks never tick together (NTP, reading order): without
    host.advance(0.5)  # a phase change the exported value must not move, or every scrape
    assert tracker.snapshot().heartbeat_timestamp == 1_700_000_005.0  # would look alive
    wall.advance(0.25)
    tracker._exit("forward")
    assert tracker.snapshot().heartbeat_timestamp == 1_700_000_035.5  # on the host clock
    assert tracker.snapshot().current_phase == "other"


def test_a_wall_clock_step_moves_the_mapping_once() -> None:
    """An NTP step or a resumed VM moves the wall clock against the host clock: event times
    are mapped through the new offset from then on, and the heartbeat stands still again."""
    wall, host = FakeTime(), FakeTime()
    wall.now = WALL0
    tracker = Tracker(rank=RankInfo(), wall_clock=wall, host_clock=host)
    tracker._enter("forward")
    assert tracker.snapshot().heartbeat_timestamp == WALL0
    wall.advance(10.0)  # the wall clock steps ahead; the host clock does not
    beat = tracker.snapshot().heartbeat_timestamp
    assert beat == WALL0 + 10.0
    assert tracker.snapshot().heartbeat_timestamp == beat


def test_the_clock_timestamp_is_on_the_same_clock_as_the_heartbeat_and_the_last_step() -> None:
    """The operator ages the rank's timestamps against its clock timestamp, never against
    its own clock: all three come through one host-to-wall mapping, read at scrape time."""
    wall, host = FakeTime(), FakeTime()
    wall.now = WALL0
    tracker = Tracker(rank=RankInfo(), wall_clock=wall, host_clock=host)
    tracker._enter("forward")
    host.advance(3.0)
    wall.advance(3.0)
    tracker.end_step()
    host.advance(40.0)  # a long step: neither the last step nor the heartbeat moves
    wall.advance(40.25)  # the wall clock never ticks exactly with the host clock
    snap = tracker.snapshot()
    assert snap.last_step_timestamp == WALL0 + 3.0
    assert snap.clock_timestamp == WALL0 + 43.0  # the age of the last step is exact: 40 s
    fams = {f.name: f for f in render_snapshot(snap)}
    clock = fams[contract.CLOCK_TIMESTAMP.name]
    assert [s.value for s in clock.samples] == [WALL0 + 43.0]


def test_eval_and_checkpoint_are_busy_phases_that_own_their_time() -> None:
    tracker, t = make_tracker()
    run_step(tracker, t, STEP)
    with tracker.evaluating():
        assert tracker.snapshot().current_phase == "eval"
        for _ in range(3):  # the hooks of an evaluation's batches and forwards stay quiet
            it = iter([1])
            from gpujob_trainer.hooks import InstrumentedLoader

            next(iter(InstrumentedLoader(tracker, it)))
            t.advance(2.0)
    with tracker.checkpointing():
        assert tracker.snapshot().current_phase == "checkpoint"
        t.advance(5.0)
    run_step(tracker, t, STEP)
    tracker.end_step()
    snap = tracker.snapshot()
    assert snap.phase_seconds["eval"] == pytest.approx(6.0)
    assert snap.phase_seconds["checkpoint"] == pytest.approx(5.0)
    assert snap.phase_seconds["data_wait"] == pytest.approx(2 * STEP["data_wait"])
    assert snap.samples == 0  # the eval batches are not training samples
    assert snap.current_phase == "other" and tracker._held == 0


def test_busy_phase_survives_an_exception() -> None:
    tracker, _ = make_tracker()
    with pytest.raises(RuntimeError), tracker.phase("eval"):
        raise RuntimeError("eval failed")
    assert tracker._held == 0 and tracker.snapshot().current_phase == "other"


def test_render_heartbeat_and_one_hot_current_phase() -> None:
    tracker, t = make_tracker()
    run_step(tracker, t, STEP)
    with tracker.phase("checkpoint"):
        fams = {f.name: f for f in render_snapshot(tracker.snapshot())}
    (beat,) = fams[contract.HEARTBEAT_TIMESTAMP.name].samples
    assert beat.value == pytest.approx(WALL0 + sum(STEP.values()))  # entered checkpoint
    current = {s.labels["phase"]: s.value for s in fams[contract.CURRENT_PHASE.name].samples}
    assert set(current) == set(contract.PHASES)
    assert current["checkpoint"] == 1.0 and sum(current.values()) == 1.0


# ---- the event replay: what the hooks record, turned into marks and steps ----------------


def _flat(*events: tuple[float, Any]) -> list[Any]:
    out: list[Any] = []
    for host, op in events:
        out.extend((host, op, None))
    return out


def test_timeline_replays_a_step_and_carries_state_across_feeds() -> None:
    tl = Timeline()
    first = _flat(
        (1.0, ENTERS["data_wait"]),
        (2.0, EXITS["data_wait"]),
        (3.0, ENTERS["forward"]),
    )
    assert tl.feed(first) == []  # no step ended yet
    assert tl.stack == ["other", "forward"] and tl.last_mark_host == 3.0
    rest = _flat(
        (4.0, EXITS["forward"]),
        (5.0, ENTERS["backward"]),
        (6.0, (SWITCH, "backward", "comm_wait")),
        (7.0, EXITS["comm_wait"]),
        (8.0, ENTERS["optimizer"]),
        (9.0, END_OPTIMIZER),
    )
    (step,) = tl.feed(rest)
    assert [m[1] for m in step] == [
        "data_wait", "other", "forward", "other", "backward", "comm_wait", "other",
        "optimizer", "other",
    ]  # fmt: skip
    assert attribute(step)["comm_wait"] == 1.0 and sum(attribute(step).values()) == 8.0
    assert tl.steps == 1 and tl.last_step_host == 9.0 and tl.stack == ["other"]
    # the end mark starts the next step
    (second,) = tl.feed(_flat((10.0, ENTERS["forward"]), (12.0, END_STEP)))
    assert second[0] == step[-1] and attribute(second)["forward"] == 2.0


def test_timeline_tolerates_unbalanced_events() -> None:
    """An exception mid-phase can leave an exit without its enter, or the reverse: the stack
    never loses its bottom and the step still partitions its span."""
    tl = Timeline()
    events = _flat(
        (0.0, EXITS["forward"]),  # exit of a phase never entered
        (1.0, ENTERS["backward"]),  # never left
        (0.0, POPS["optimizer"]),  # pop of a phase not there: no mark
        (2.0, ENTERS["data_wait"]),
        (3.0, END_STEP),
    )
    (step,) = tl.feed(events)
    got = attribute(step)
    assert got["backward"] == 1.0 and got["data_wait"] == 1.0 and sum(got.values()) == 3.0
    assert tl.stack == ["other", "backward", "data_wait"]
    assert len(step) == 4  # the pop drew no boundary
