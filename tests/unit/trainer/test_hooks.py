"""The model, DataLoader and optimizer hooks on a real (CPU) PyTorch loop, in one process."""

from __future__ import annotations

import copy
import inspect
import pickle
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset

from gpujob_trainer import contract
from gpujob_trainer.env import RankInfo
from gpujob_trainer.tracker import Tracker


def make_loop(
    batches: int = 6, batch: int = 8
) -> tuple[nn.Module, DataLoader[tuple[torch.Tensor, ...]]]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    data = TensorDataset(torch.randn(batches * batch, 16), torch.randint(0, 4, (batches * batch,)))
    return model, DataLoader(data, batch_size=batch)


def train(
    tracker: Tracker,
    model: nn.Module,
    loader: DataLoader[tuple[torch.Tensor, ...]],
    epochs: int = 1,
) -> int:
    model = tracker.wrap_model(model)
    batches = tracker.wrap_loader(loader, tokens=lambda b: int(b[0].numel()))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    steps = 0
    for _ in range(epochs):
        for x, y in batches:
            loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            tracker.log(loss=loss)
            steps += 1
    return steps


@pytest.fixture
def tracker() -> Iterator[Tracker]:
    t = Tracker(total_steps=12, rank=RankInfo())
    yield t
    t.close()


def test_plain_loop_counts_steps_samples_and_phases(tracker: Tracker) -> None:
    model, loader = make_loop()
    steps = train(tracker, model, loader, epochs=2)
    snap = tracker.snapshot()
    assert snap.steps == steps == 12
    assert snap.step_count == 12
    assert snap.samples == 12 * 8
    assert snap.tokens == 12 * 8 * 16
    assert snap.epoch == 1
    assert snap.loss is not None and 0 < snap.loss < 10
    for phase in ("data_wait", "forward", "backward", "optimizer", "other"):
        assert snap.phase_seconds[phase] > 0, phase
    assert snap.phase_seconds["checkpoint"] == 0
    assert sum(snap.phase_seconds.values()) == pytest.approx(snap.step_sum, rel=1e-9)
    compute = sum(snap.phase_seconds[p] for p in contract.COMPUTE_PHASES)
    assert snap.compute_seconds == pytest.approx(compute, rel=1e-9)


def test_close_removes_every_hook(tracker: Tracker) -> None:
    model, loader = make_loop(batches=2)
    train(tracker, model, loader)
    assert tracker.snapshot().steps == 2
    tracker.close()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in loader:
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    assert tracker.snapshot().steps == 2
    assert not model._forward_hooks and not model._forward_pre_hooks
    assert "forward" not in model.__dict__  # the class's own forward again
    assert "_replicate_for_data_parallel" not in model.__dict__


def test_the_timed_forward_stands_in_for_the_models_own(tracker: Tracker) -> None:
    model, _loader = make_loop(batches=1)
    own_signature = inspect.signature(model.forward)
    tracker.wrap_model(model)
    assert not model._forward_hooks and not model._forward_pre_hooks  # the fast call path
    assert inspect.signature(model.forward) == own_signature
    assert model.forward.__self__ is model and model.forward.__func__ is nn.Sequential.forward
    # A copy (an EMA model, a pickled one) runs its own weights, untimed.
    for copy_ in (copy.deepcopy(model), pickle.loads(pickle.dumps(model))):
        with torch.no_grad():
            copy_[0].weight.zero_()
            copy_[0].bias.zero_()
        x = torch.randn(2, 16)
        before = len(tracker._events)
        assert torch.equal(copy_(x), copy_[2](torch.zeros(2, 32)))
        assert not torch.equal(model(x), copy_(x))
        assert "forward" not in copy_.__dict__ or copy_.forward.__self__ is copy_
        assert len(tracker._events) == before + 6  # only the original's call was timed


def test_a_data_parallel_replica_runs_its_own_forward(tracker: Tracker) -> None:
    """nn.DataParallel replicates a module by copying its __dict__ (on CUDA only, so the
    replication step is called here directly): a replica must not inherit our forward, which
    is bound to the original module and its weights."""
    model, _ = make_loop(batches=1)
    tracker.wrap_model(model)
    replica = model._replicate_for_data_parallel()
    assert "forward" not in replica.__dict__
    assert "_replicate_for_data_parallel" not in replica.__dict__
    assert replica.forward.__self__ is replica
    assert model.forward.__self__ is model and "forward" in model.__dict__  # still timed
    before = len(tracker._events)
    model(torch.randn(2, 16))
    assert len(tracker._events) == before + 6


@pytest.mark.parametrize(
    "compile_first", [True, False], ids=["compile-then-wrap", "wrap-then-compile"]
)
def test_a_compiled_model_is_timed(compile_first: bool) -> None:
    """torch.compile either side of wrap_model: steps and forward time counted, and a
    compiled model wrapped afterwards keeps its graph whole (the clock is read outside it)."""
    import torch._dynamo as dynamo
    from torch._dynamo.utils import counters

    dynamo.reset()
    counters.clear()
    tracker = Tracker(rank=RankInfo())
    model, loader = make_loop(batches=3)
    if compile_first:
        compiled = torch.compile(model, backend="eager")
        tracker.wrap_model(compiled)
    else:
        tracker.wrap_model(model)
        compiled = torch.compile(model, backend="eager")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    try:
        for x, y in tracker.wrap_loader(loader):
            loss = nn.functional.cross_entropy(compiled(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
        snap = tracker.snapshot()
        assert snap.steps == 3
        assert snap.phase_seconds[contract.PHASE_FORWARD] > 0
        assert snap.phase_seconds[contract.PHASE_BACKWARD] > 0
        if compile_first:
            assert not counters["graph_break"]
    finally:
        tracker.close()
        dynamo.reset()


def test_a_forward_that_raises_leaves_no_phase_open(tracker: Tracker) -> None:
    model, loader = make_loop(batches=2)
    tracker.wrap_model(model)
    with pytest.raises(RuntimeError):
        model(torch.randn(2, 3))  # wrong width
    assert tracker._stack == [contract.PHASE_OTHER]
    train(tracker, model, loader)
    assert tracker.snapshot().steps == 2


def test_a_forward_wrapper_set_over_ours_is_left_in_place() -> None:
    tracker = Tracker(rank=RankInfo())
    model, _ = make_loop(batches=1)
    tracker.wrap_model(model)
    ours = model.forward
    calls: list[int] = []

    def theirs(*args: object) -> torch.Tensor:
        calls.append(1)
        return ours(*args)  # type: ignore[no-any-return]

    model.forward = theirs  # type: ignore[method-assign]
    tracker.close()
    assert model.forward is theirs
    before = len(tracker._events)
    assert model(torch.randn(2, 16)).shape == (2, 4)  # ours passes through, records nothing
    assert calls == [1] and len(tracker._events) == before


def test_eval_forward_leaves_no_phase_open(tracker: Tracker) -> None:
    model, loader = make_loop(batches=2)
    train(tracker, model, loader)
    with torch.no_grad():
        model(torch.randn(2, 16))
    assert tracker._bwd == 0
    assert tracker._stack == [contract.PHASE_OTHER]


def test_tensor_backward_is_wrapped_while_a_tracker_listens() -> None:
    original = torch.Tensor.backward
    first, second = Tracker(rank=RankInfo()), Tracker(rank=RankInfo())
    first.wrap_model(make_loop(batches=2)[0])
    second.wrap_model(nn.Linear(2, 2))
    assert torch.Tensor.backward is not original
    first.close()
    assert torch.Tensor.backward is not original  # the second still listens
    second.close()
    assert torch.Tensor.backward is original


def test_a_wrapper_installed_over_ours_is_left_in_place() -> None:
    original = torch.Tensor.backward
    tracker = Tracker(rank=RankInfo())
    tracker.wrap_model(make_loop()[0])
    ours = torch.Tensor.backward
    calls: list[int] = []

    def theirs(self: torch.Tensor, *args: object, **kwargs: object) -> None:
        calls.append(1)
        ours(self, *args, **kwargs)

    torch.Tensor.backward = theirs  # type: ignore[method-assign]
    try:
        tracker.close()
        assert torch.Tensor.backward is theirs  # not clobbered by our restore
        x = torch.ones(2, requires_grad=True)
        (x * 2).sum().backward()  # ours passes through to the original
        assert calls == [1] and x.grad is not None
        # A new tracker wraps theirs; ours, still under theirs, passes through (calling what
        # it replaced, never itself) and records nothing twice.
        again = Tracker(rank=RankInfo())
        model, loader = make_loop(batches=2)
        train(again, model, loader)
        assert calls == [1, 1, 1]
        snap = again.snapshot()
        assert snap.steps == 2 and snap.phase_seconds["backward"] > 0
        assert sum(snap.phase_seconds.values()) == pytest.approx(snap.step_sum, rel=1e-9)
        again.close()
        assert torch.Tensor.backward is theirs
    finally:
        torch.Tensor.backward = original  # type: ignore[method-assign]


def test_backward_through_autograd_backward_is_still_timed(tracker: Tracker) -> None:
    """torch.autograd.backward bypasses Tensor.backward: the first gradient opens it late."""
    model, loader = make_loop(batches=3)
    model = tracker.wrap_model(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in tracker.wrap_loader(loader):
        torch.autograd.backward(nn.functional.cross_entropy(model(x), y))
        opt.step()
    snap = tracker.snapshot()
    assert snap.steps == 3
    assert snap.phase_seconds["backward"] > 0
    assert tracker._bwd == 0 and tracker._stack == [contract.PHASE_OTHER]
    assert sum(snap.phase_seconds.values()) == pytest.approx(snap.step_sum, rel=1e-9)


def test_a_backward_that_raises_leaves_the_tracker_usable(tracker: Tracker) -> None:
    model, loader = make_loop(batches=3)
    model = tracker.wrap_model(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = next(iter(loader))
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    with pytest.raises(RuntimeError, match="second time"):
        loss.backward()  # the graph was freed by the first
    assert tracker._bwd == 0 and tracker._stack == [contract.PHASE_OTHER]
    opt.step()
    for x, y in loader:
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    assert tracker.snapshot().steps == 3  # the last one ends at the next forward ...
    tracker.close()  # ... or at close()
    snap = tracker.snapshot()
    assert snap.steps == 1 + 3
    assert snap.phase_seconds["backward"] > 0
    assert tracker._stack == [contract.PHASE_OTHER]


def test_forward_inside_eval_or_checkpoint_counts_as_that_phase() -> None:
    now = [0.0]
    tracker = Tracker(rank=RankInfo(), host_clock=lambda: now[0])
    model, loader = make_loop(batches=1)
    wrapped = tracker.wrap_model(model)
    opt = torch.optim.SGD(wrapped.parameters(), lr=0.1)
    for phase in ("eval", "checkpoint"):
        with tracker.phase(phase), torch.no_grad():
            now[0] += 1.0
            wrapped(torch.randn(2, 16))  # its hooks must not switch to forward
            now[0] += 1.0
        assert tracker._stack == [contract.PHASE_OTHER]
    x, y = next(iter(loader))
    loss = nn.functional.cross_entropy(wrapped(x), y)
    loss.backward()
    opt.step()
    tracker.close()  # the step's end is committed here: no later boundary
    snap = tracker.snapshot()
    assert snap.phase_seconds["eval"] == 2.0 and snap.phase_seconds["checkpoint"] == 2.0
    assert snap.phase_seconds["forward"] == 0.0  # the training forward took no clock time


def test_an_evaluation_between_steps_is_eval_time_not_training(tracker: Tracker) -> None:
    model, loader = make_loop(batches=4)
    model = tracker.wrap_model(model)
    batches = tracker.wrap_loader(loader)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for i, (x, y) in enumerate(batches):
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        if i == 1:
            with tracker.evaluating(), torch.no_grad():
                marks = len(tracker._events)
                for ex, _ in batches:  # the same wrapped loader: no samples, no epoch
                    model(ex)
                # no forward or data_wait event inside: the whole block is eval time
                assert len(tracker._events) == marks
                assert tracker.snapshot().current_phase == "eval"
    snap = tracker.snapshot()
    assert snap.steps == 4 and snap.samples == 4 * 8 and snap.epoch == 0
    assert snap.phase_seconds["eval"] > 0 and snap.current_phase == "other"
    assert sum(snap.phase_seconds.values()) == pytest.approx(snap.step_sum, rel=1e-9)


def test_watch_optimizer_only_that_one_ends_steps(tracker: Tracker) -> None:
    model, loader = make_loop(batches=3)
    tracker.wrap_model(model)
    main = tracker.watch_optimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    side = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in loader:
        nn.functional.cross_entropy(model(x), y).backward()
        side.step()
        main.step()
    snap = tracker.snapshot()
    assert snap.steps == 3
    assert snap.step_count == 3


def test_watch_optimizer_alone_hooks_only_that_instance() -> None:
    tracker = Tracker(rank=RankInfo(), hook_optimizers=False)
    model, loader = make_loop(batches=3)
    opt = tracker.watch_optimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    assert tracker.watch_optimizer(opt) is opt  # idempotent
    other = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in loader:
        nn.functional.cross_entropy(model(x), y).backward()
        other.step()  # not hooked at all
        opt.step()
    snap = tracker.snapshot()
    assert snap.steps == 3
    assert snap.phase_seconds["optimizer"] > 0
    tracker.close()
    opt.step()
    assert tracker.snapshot().steps == 3


def test_ddp_exposed_comm_wait_is_its_own_phase(tracker: Tracker) -> None:
    """A one-rank DDP: the callbacks run around DDP's finalizer and comm_wait is counted."""
    store = dist.HashStore()
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        model, loader = make_loop()
        ddp = DDP(model)
        steps = train(tracker, ddp, loader)
        snap = tracker.snapshot()
        assert snap.steps == steps == 6
        assert snap.phase_seconds["backward"] > 0
        assert snap.phase_seconds["comm_wait"] > 0
        assert tracker._stack == [contract.PHASE_OTHER]  # every phase was left again
        assert sum(snap.phase_seconds.values()) == pytest.approx(snap.step_sum, rel=1e-9)
    finally:
        dist.destroy_process_group()


class _Unused(nn.Module):
    """Two used layers and an unused one first or last (its parameters get no gradient)."""

    def __init__(self, unused: str) -> None:
        super().__init__()
        torch.manual_seed(0)
        if unused == "first":
            self.spare = nn.Linear(16, 16)
        self.l1, self.l2 = nn.Linear(16, 32), nn.Linear(32, 4)
        if unused == "last":
            self.spare = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.l2(torch.relu(self.l1(x)))


@pytest.mark.parametrize("unused", ["none", "first", "last"])
def test_a_slow_all_reduce_is_comm_wait_not_backward(tracker: Tracker, unused: str) -> None:
    """A comm hook whose all-reduce lands 80 ms late: DDP's finalizer waits for it, and that
    wait must fall after the split, in comm_wait, also when the first or the last parameter
    (where the split is hooked) gets no gradient."""
    store = dist.HashStore()
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    delay = 0.08
    landing = ThreadPoolExecutor(1)
    landing.submit(lambda: None).result()  # its thread starts now, not inside a backward

    def land(fut: torch.futures.Future[torch.Tensor], value: torch.Tensor) -> None:
        time.sleep(delay)  # the network, slow
        fut.set_result(value)

    def late(state, bucket):  # type: ignore[no-untyped-def]  # DDP reads real annotations
        fut: torch.futures.Future[torch.Tensor] = torch.futures.Future()
        landing.submit(land, fut, bucket.buffer())
        return fut

    try:
        model, loader = make_loop(batches=3)
        if unused != "none":
            model = _Unused(unused)
        ddp = DDP(model, find_unused_parameters=unused != "none")
        ddp.register_comm_hook(None, late)
        steps = train(tracker, ddp, loader)
        snap = tracker.snapshot()
        # comm_wait only grows between the split and the end of backward: in any step split
        # after DDP's finalizer the wait would be backward, and this total would fall short
        # by 80 ms. The one step that finds the last parameter unused counts its wait as
        # backward; from then on the first is watched too. (No bound on backward itself: on
        # a loaded machine a preempted backward is long for reasons of its own.)
        split_steps = steps - 1 if unused == "last" else steps
        assert snap.phase_seconds["comm_wait"] >= split_steps * delay * 0.9
    finally:
        landing.shutdown()
        dist.destroy_process_group()


def test_manual_end_step_without_optimizer_hooks() -> None:
    tracker = Tracker(rank=RankInfo(), hook_optimizers=False)
    model, loader = make_loop(batches=3)
    tracker.wrap_model(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in tracker.wrap_loader(loader):
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        tracker.end_step()
    snap = tracker.snapshot()
    assert snap.steps == 3
    assert snap.phase_seconds["optimizer"] == 0  # not hooked: counted as other
    tracker.close()


def test_wrapped_loader_behaves_like_the_loader(tracker: Tracker) -> None:
    _, loader = make_loop(batches=5)
    wrapped = tracker.wrap_loader(loader)
    assert len(wrapped) == 5
    assert wrapped.batch_size == 8
    assert wrapped.dataset is loader.dataset
