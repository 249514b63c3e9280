"""A training step is an iteration: real (CPU) PyTorch loops with several optimizers, a GAN,
gradient accumulation, a scheduler and clipping, under the default global optimizer hooks."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from gpujob_trainer.env import RankInfo
from gpujob_trainer.snapshot import Snapshot
from gpujob_trainer.tracker import Tracker

BATCHES, BATCH = 6, 8


@pytest.fixture
def tracker() -> Iterator[Tracker]:
    t = Tracker(rank=RankInfo())
    yield t
    t.close()


def loader(batches: int = BATCHES) -> DataLoader[tuple[torch.Tensor, ...]]:
    torch.manual_seed(0)
    n = batches * BATCH
    return DataLoader(TensorDataset(torch.randn(n, 16), torch.randint(0, 4, (n,))), BATCH)


def net() -> nn.Sequential:
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))


def assert_sensible(snap: Snapshot, steps: int) -> None:
    """Every step counted once and attributed; its phases add up to its time."""
    assert snap.steps == snap.step_count == steps
    assert snap.step_sum > 0
    assert sum(snap.phase_seconds.values()) == pytest.approx(snap.step_sum, rel=1e-9)
    assert snap.step_buckets[-1] == steps  # every step in the histogram once


def test_two_optimizers_an_iteration_make_one_step(tracker: Tracker) -> None:
    model = net()
    body = torch.optim.SGD(model[0].parameters(), lr=0.1)
    head = torch.optim.Adam(model[2].parameters(), lr=1e-3)
    model = tracker.wrap_model(model)
    for x, y in tracker.wrap_loader(loader()):
        nn.functional.cross_entropy(model(x), y).backward()
        body.step()
        head.step()
        body.zero_grad()
        head.zero_grad()
    snap = tracker.snapshot()  # the loader's end (its last fetch) ended the last step
    assert_sensible(snap, BATCHES)
    assert snap.phase_seconds["optimizer"] > 0


def test_two_optimizers_without_a_wrapped_loader(tracker: Tracker) -> None:
    model = net()
    body = torch.optim.SGD(model[0].parameters(), lr=0.1)
    head = torch.optim.SGD(model[2].parameters(), lr=0.1)
    model = tracker.wrap_model(model)
    for x, y in loader():  # not wrapped: each forward starts a step
        nn.functional.cross_entropy(model(x), y).backward()
        body.step()
        head.step()
    assert tracker.snapshot().steps == BATCHES - 1  # the last waits for a boundary
    tracker.close()
    assert_sensible(tracker.snapshot(), BATCHES)


def test_a_gan_with_a_wrapped_loader_is_one_step_per_iteration(tracker: Tracker) -> None:
    torch.manual_seed(0)
    gen = tracker.wrap_model(nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 16)))
    disc = tracker.wrap_model(nn.Sequential(nn.Linear(16, 8), nn.ReLU(), nn.Linear(8, 1)))
    opt_g = torch.optim.Adam(gen.parameters(), lr=1e-3)
    opt_d = torch.optim.Adam(disc.parameters(), lr=1e-3)
    bce = nn.functional.binary_cross_entropy_with_logits
    for real, _ in tracker.wrap_loader(loader()):
        ones, zeros = torch.ones(len(real), 1), torch.zeros(len(real), 1)
        fake = gen(torch.randn(len(real), 4))
        d_loss = bce(disc(real), ones) + bce(disc(fake.detach()), zeros)
        opt_d.zero_grad()
        d_loss.backward()
        opt_d.step()
        g_loss = bce(disc(fake), ones)  # forwards after D's optimizer step: same iteration
        opt_g.zero_grad()
        g_loss.backward()
        opt_g.step()
    assert_sensible(tracker.snapshot(), BATCHES)


def test_gradient_accumulation_counts_optimizer_steps(tracker: Tracker) -> None:
    model = tracker.wrap_model(net())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    micro = 4
    for i, (x, y) in enumerate(tracker.wrap_loader(loader(batches=3 * micro))):
        (nn.functional.cross_entropy(model(x), y) / micro).backward()
        if (i + 1) % micro == 0:
            opt.step()
            opt.zero_grad()
    snap = tracker.snapshot()
    assert_sensible(snap, 3)
    assert snap.samples == 3 * micro * BATCH


def test_a_scheduler_and_clipping_stay_inside_the_step(tracker: Tracker) -> None:
    model = tracker.wrap_model(net())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=1e-2, total_steps=BATCHES)
    for x, y in tracker.wrap_loader(loader()):
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
    assert_sensible(tracker.snapshot(), BATCHES)


def test_an_eval_between_steps_counts_the_step_before_it(tracker: Tracker) -> None:
    model = tracker.wrap_model(net())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    batches = tracker.wrap_loader(loader())
    seen = []
    for i, (x, y) in enumerate(batches):
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        if i == 2:
            with tracker.evaluating(), torch.no_grad():
                seen.append(tracker.snapshot().steps)  # entering eval ended step 3
                for ex, _ in batches:
                    model(ex)
    assert seen == [3]
    snap = tracker.snapshot()
    assert_sensible(snap, BATCHES)
    assert snap.phase_seconds["eval"] > 0


def test_a_watched_optimizer_still_ends_a_step_at_each_of_its_steps(tracker: Tracker) -> None:
    model = tracker.wrap_model(net())
    main = tracker.watch_optimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    side = torch.optim.SGD(model.parameters(), lr=0.1)
    counts = []
    for x, y in tracker.wrap_loader(loader()):
        for _ in range(2):  # two updates a batch, each its own step: the escape hatch
            nn.functional.cross_entropy(model(x), y).backward()
            side.step()
            main.step()
            counts.append(tracker.snapshot().steps)  # counted at once, no boundary needed
    assert counts == list(range(1, 2 * BATCHES + 1))
    assert_sensible(tracker.snapshot(), 2 * BATCHES)


def test_manual_end_step_with_the_global_hooks_is_one_step(tracker: Tracker) -> None:
    model = tracker.wrap_model(net())
    body = torch.optim.SGD(model[0].parameters(), lr=0.1)
    head = torch.optim.SGD(model[2].parameters(), lr=0.1)
    for i, (x, y) in enumerate(tracker.wrap_loader(loader())):
        nn.functional.cross_entropy(model(x), y).backward()
        body.step()
        head.step()
        tracker.end_step()  # where the loop's iteration ends: the step is counted now
        assert tracker.snapshot().steps == i + 1
    assert_sensible(tracker.snapshot(), BATCHES)
