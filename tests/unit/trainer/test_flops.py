"""The tracker's MFU inputs and the h2d phase on a real (CPU) PyTorch loop, in one process:
model FLOPs counted once (or given), the peak and why there is none, the GPUs a rank
drives, and batches moved to the device as their own phase."""

from __future__ import annotations

import time
from collections import namedtuple
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from torch import nn

from gpujob_trainer import contract, flops
from gpujob_trainer.env import RankInfo
from gpujob_trainer.exporter import render_snapshot
from gpujob_trainer.hooks import to_device
from gpujob_trainer.tracker import Tracker
from tests.unit.trainer.test_hooks import make_loop, train

PER_SAMPLE = 2 * 16 * 32 * 2 + 2 * 32 * 4 * 3
"""FlopCounterMode's count for make_loop's model: each Linear's forward (2·in·out) and its
weight gradient (2·in·out); the first layer needs no input gradient, the second does."""


@pytest.fixture
def tracker() -> Iterator[Tracker]:
    t = Tracker(total_steps=12, rank=RankInfo())
    yield t
    t.close()


def families(tracker: Tracker) -> dict[str, list[tuple[dict[str, str], float]]]:
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for fam in render_snapshot(tracker.snapshot()):
        for s in fam.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def test_model_flops_are_counted_once_early_and_scale_with_samples(tracker: Tracker) -> None:
    model, loader = make_loop()  # batches of 8
    train(tracker, model, loader, epochs=2)
    assert tracker.flops.per_sample == PER_SAMPLE
    assert tracker.flops.per_pass == PER_SAMPLE * 8
    assert tracker._flops_countdown == 0 and tracker._flops_mode is None  # counted, closed
    snap = tracker.snapshot()
    assert snap.model_flops == PER_SAMPLE * snap.samples == PER_SAMPLE * 96
    got = families(tracker)
    assert got[contract.MODEL_FLOPS.name] == [
        ({"rank": "0", "local_rank": "0", "node_rank": "0"}, PER_SAMPLE * 96.0)
    ]


def test_the_count_happens_on_the_third_forward_not_before(tracker: Tracker) -> None:
    model, loader = make_loop(batches=2)
    train(tracker, model, loader)
    assert tracker.flops.per_sample is None and tracker.snapshot().model_flops is None
    assert tracker._flops_countdown == flops.MEASURE_AT - 2


def test_given_flops_win_and_nothing_is_counted() -> None:
    t = Tracker(rank=RankInfo(), flops_per_sample=1e6)
    try:
        model, loader = make_loop()
        train(t, model, loader)
        assert t.flops.per_pass is None  # never counted
        assert t.snapshot().model_flops == 1e6 * 48
        t.set_flops(per_token=10.0)
        assert t.snapshot().model_flops == 10.0 * 48 * 16  # train() counts 16 tokens a sample
    finally:
        t.close()


def test_a_failing_counter_costs_the_mfu_only(
    tracker: Tracker, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import torch.utils.flop_counter as fc

    class Broken:
        def __init__(self, **kw: object) -> None:
            raise RuntimeError("no dispatch modes here")

    monkeypatch.setattr(fc, "FlopCounterMode", Broken)
    model, loader = make_loop()
    assert train(tracker, model, loader) == 6
    assert tracker.snapshot().model_flops is None
    assert "model FLOPs not counted, so no MFU: no dispatch modes here" in caplog.text


def test_cpu_peak_says_no_gpu_unless_given() -> None:
    t = Tracker(rank=RankInfo())
    t.wrap_model(nn.Linear(4, 4))
    peak = t.snapshot().peak
    assert peak is not None
    assert (peak.flops, peak.device, peak.dtype, peak.reason) == (None, "", "fp32", "no_gpu")
    labels, value = families(t)[contract.PEAK_FLOPS.name][0]
    assert value == 0.0 and labels["reason"] == "no_gpu" and labels["dtype"] == "fp32"
    t.close()
    given = Tracker(rank=RankInfo(), peak_tflops=0.5)
    given.wrap_model(nn.Linear(4, 4).to(torch.bfloat16))
    peak = given.snapshot().peak
    assert peak is not None and (peak.flops, peak.dtype, peak.reason) == (5e11, "bf16", "ok")
    given.close()


def test_a_known_gpu_gets_its_table_peak_at_the_autocast_precision() -> None:
    count = flops.FlopsCount()
    count.note_device("NVIDIA H100 80GB HBM3")
    count.note_params("torch.float32")
    assert count.peak().reason == "ok" and count.peak().dtype == "fp32"
    count._dtype = "bf16"  # what counting inside torch.autocast(dtype=bfloat16) records
    assert count.peak().flops == pytest.approx(989.4e12)
    count.note_params("torch.float8_e4m3fn")
    count._dtype = None
    assert count.peak().reason == contract.PEAK_FP8 and count.peak().flops is None


class DataParallel(nn.Module):
    """Stands in for nn.DataParallel over three GPUs (there are none here): the tracker
    recognises it by its type's name and its device list."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.module = module
        self.device_ids = [0, 1, 2]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.module(x)


def test_dataparallel_exports_every_gpu_it_drives_first_one_first() -> None:
    t = Tracker(rank=RankInfo(), device_uuid=lambda i: f"GPU-fake-{i}")
    try:
        t.wrap_model(DataParallel(nn.Linear(4, 4)))
        assert t.devices == ("GPU-fake-0", "GPU-fake-1", "GPU-fake-2")
        got = families(t)[contract.RANK_DEVICE.name]
        assert [(labels["UUID"], value) for labels, value in got] == [
            ("GPU-fake-0", 0.0),
            ("GPU-fake-1", 1.0),
            ("GPU-fake-2", 2.0),
        ]
    finally:
        t.close()
    plain = Tracker(rank=RankInfo(), device_uuid=lambda i: f"GPU-fake-{i}")
    plain.wrap_model(nn.Linear(4, 4))  # a CPU model drives no GPU
    assert plain.devices == () and contract.RANK_DEVICE.name not in families(plain)
    plain.close()


def test_the_loader_moves_batches_to_the_device_as_the_h2d_phase(tracker: Tracker) -> None:
    model, loader = make_loop()
    model = tracker.wrap_model(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in tracker.wrap_loader(loader, device="cpu"):
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    snap = tracker.snapshot()
    assert snap.steps == 6 and snap.samples == 48
    assert snap.phase_seconds[contract.PHASE_H2D] > 0
    assert sum(snap.phase_seconds.values()) == pytest.approx(snap.step_sum, rel=1e-9)


def test_copies_written_in_the_loop_count_inside_transfer() -> None:
    tracker = Tracker(rank=RankInfo(), measure_flops=False)  # no counted (slower) step
    model, loader = make_loop(batches=3)
    model = tracker.wrap_model(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in tracker.wrap_loader(loader):
        with tracker.transfer():
            x = x.to("cpu")
            time.sleep(0.1)  # stands in for a slow synchronous copy
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    snap = tracker.snapshot()
    assert snap.phase_seconds[contract.PHASE_H2D] >= 3 * 0.1
    assert snap.compute_seconds < snap.phase_seconds[contract.PHASE_H2D]  # not compute
    tracker.close()


def test_to_device_reaches_every_tensor_in_nested_batches() -> None:
    Pair = namedtuple("Pair", "a b")
    moved: list[str] = []

    class Probe:
        shape = (2,)

        def to(self, device: str, non_blocking: bool = False) -> str:
            moved.append(f"{device}:{non_blocking}")
            return "moved"

    batch = {"x": Probe(), "pair": Pair(Probe(), 3), "list": [Probe(), "text"]}
    got = to_device(batch, "cuda:1", True)
    assert got == {"x": "moved", "pair": Pair("moved", 3), "list": ["moved", "text"]}
    assert moved == ["cuda:1:True"] * 3


def _dispatch_modes() -> int:
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

    return len(_get_current_dispatch_mode_stack())


def test_a_count_never_outlives_its_pass_whatever_ends_the_step() -> None:
    """autograd.backward (no Tensor.backward), a forward that raises, a forward with no
    backward before close(): the counter is closed, never left over every later op."""
    t = Tracker(rank=RankInfo())
    model, loader = make_loop()
    model = t.wrap_model(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in t.wrap_loader(loader):
        loss = nn.functional.cross_entropy(model(x), y)
        torch.autograd.backward(loss)  # the late path: no Tensor.backward wrapper
        opt.step()
    assert t._flops_mode is None and _dispatch_modes() == 0
    assert t.flops.per_sample == PER_SAMPLE
    t.close()

    raising = Tracker(rank=RankInfo())
    net = raising.wrap_model(nn.Linear(16, 4))
    for i in range(5):
        try:
            out = net(torch.randn(8, 16) if i != 2 else torch.randn(8, 3))  # the third raises
            out.sum().backward()
        except RuntimeError:
            pass
    assert raising._flops_mode is None and _dispatch_modes() == 0
    raising.close()

    early = Tracker(rank=RankInfo())
    net = early.wrap_model(nn.Linear(16, 4))
    for _ in range(3):
        net(torch.randn(8, 16))  # forwards only: the third opens the count
    assert early._flops_mode is not None
    early.close()
    assert early._flops_mode is None and _dispatch_modes() == 0


def test_keyword_inputs_and_inference_forwards_do_not_skew_the_count() -> None:
    class Keyworded(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.body = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.body(x)

    t = Tracker(rank=RankInfo())
    model = t.wrap_model(Keyworded())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(4):
        with torch.no_grad():
            model(x=torch.randn(1, 16))  # a probe outside evaluating(): not a training pass
        loss = nn.functional.cross_entropy(model(x=torch.randn(8, 16)), torch.zeros(8).long())
        loss.backward()
        opt.step()
    assert t.flops.per_sample == PER_SAMPLE  # per sample of the batch of 8, not of 1
    t.close()


def test_given_flops_still_read_the_precision_from_autocast() -> None:
    t = Tracker(rank=RankInfo(), flops_per_sample=1e6, peak_tflops=1.0)
    model, loader = make_loop()
    model = t.wrap_model(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in t.wrap_loader(loader):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
    peak = t.snapshot().peak
    assert peak is not None and peak.dtype == "bf16" and t.flops.per_pass is None
    t.close()


def test_dataparallel_refuses_a_count_that_would_miss_its_replicas(
    caplog: pytest.LogCaptureFixture,
) -> None:
    t = Tracker(rank=RankInfo(), device_uuid=lambda i: f"GPU-fake-{i}")
    model = t.wrap_model(DataParallel(nn.Linear(16, 4)))
    for _ in range(4):
        model(torch.randn(8, 16)).sum().backward()
    assert t.flops.per_pass is None and t.snapshot().model_flops is None
    assert "nn.DataParallel: give flops_per_sample" in caplog.text
    t.close()


def test_the_fetch_hands_over_to_the_copy_in_one_event(tracker: Tracker) -> None:
    """With a device, the fetch's end is the copy's start: three events a batch, not four
    (each is a clock read, and on CUDA an event record, every step)."""
    batches = iter(tracker.wrap_loader([(torch.zeros(4, 2), torch.zeros(4))], device="cpu"))
    before = len(tracker._events)
    next(batches)
    assert len(tracker._events) - before == 3 * 3  # enter, fetch -> copy, copy's end
    assert tracker._stack == [contract.PHASE_OTHER]


class _Broken:
    def __iter__(self) -> _Broken:
        return self

    def __next__(self) -> Any:
        raise OSError("the dataset's disk went away")


def test_a_loader_or_a_copy_that_raises_leaves_no_phase_open(tracker: Tracker) -> None:
    with pytest.raises(OSError, match="went away"):
        next(iter(tracker.wrap_loader(_Broken(), device="cpu")))
    assert tracker._stack == [contract.PHASE_OTHER]

    def refuse(batch: Any) -> int:
        raise ValueError("no samples here")

    with pytest.raises(ValueError, match="no samples"):
        next(iter(tracker.wrap_loader([torch.zeros(2)], device="cpu", samples=refuse)))
    assert tracker._stack == [contract.PHASE_OTHER]
    # the epoch's end closes the fetch too
    assert list(tracker.wrap_loader([], device="cpu")) == []
    assert tracker._stack == [contract.PHASE_OTHER]
