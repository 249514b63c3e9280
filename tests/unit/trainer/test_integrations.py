"""The framework callbacks' hook logic, driven with stand-in trainers (no training run; the
torchrun tests in tests/trainer run the real frameworks)."""

from __future__ import annotations

import inspect
import logging
from types import SimpleNamespace
from typing import Any

import pytest

from gpujob_trainer import contract
from gpujob_trainer.integrations.lightning_hooks import LightningHooks
from gpujob_trainer.tracker import Tracker

OTHER, EVAL, CKPT, OPT = (
    contract.PHASE_OTHER,
    contract.PHASE_EVAL,
    contract.PHASE_CHECKPOINT,
    contract.PHASE_OPTIMIZER,
)


def phase_now(tracker: Tracker) -> str:
    return tracker.snapshot().current_phase


# ----------------------------------------------------------------- Hugging Face
def hf_args(**kw: Any) -> SimpleNamespace:
    base = {
        "gradient_accumulation_steps": 2,
        "per_device_train_batch_size": 4,
        "world_size": 2,
        "include_num_input_tokens_seen": "no",
        "eval_on_start": False,
    }
    return SimpleNamespace(**{**base, **kw})


def hf_state(**kw: Any) -> SimpleNamespace:
    base = {
        "max_steps": 20,
        "global_step": 0,
        "epoch": 0.0,
        "train_batch_size": 4,
        "num_input_tokens_seen": 0,
    }
    return SimpleNamespace(**{**base, **kw})


def control(evaluate: bool = False, save: bool = False) -> SimpleNamespace:
    return SimpleNamespace(should_evaluate=evaluate, should_save=save)


@pytest.fixture
def hf() -> Any:
    return pytest.importorskip("gpujob_trainer.integrations.huggingface")


def test_hf_epoch_is_the_epoch_in_progress(hf: Any) -> None:
    assert [hf._epoch(e) for e in (None, 0.0, 0.5, 1.0, 1.05, 2.0)] == [None, 0, 0, 0, 1, 1]


def test_hf_resume_target_samples_and_the_busy_phases_the_trainer_announces(hf: Any) -> None:
    tracker = Tracker(hook_optimizers=False)
    cb = hf.GPUJobCallback(tracker, wrap_model=False)
    args = hf_args()
    cb.on_train_begin(args, hf_state(global_step=7), control())
    assert tracker.target_steps == 20 and tracker.global_step == 7
    cb.on_step_begin(args, hf_state(global_step=7), control())
    cb.on_pre_optimizer_step(args, hf_state(global_step=7), control())
    assert phase_now(tracker) == OPT
    cb.on_optimizer_step(args, hf_state(global_step=7), control())
    # step 8 is due an evaluation and a save: eval until on_evaluate, then checkpoint
    cb.on_step_end(args, hf_state(global_step=8, epoch=1.2), control(evaluate=True, save=True))
    assert tracker.global_step == 8 and phase_now(tracker) == EVAL
    cb.on_evaluate(args, hf_state(global_step=8), control(save=True), metrics={})
    assert phase_now(tracker) == CKPT
    cb.on_save(args, hf_state(global_step=8), control())
    snap = tracker.snapshot()
    assert snap.current_phase == OTHER
    assert snap.samples == 4 * 2 and snap.epoch == 1
    # a save announced but cancelled by a later callback: closed when the next step begins
    cb.on_step_end(args, hf_state(global_step=9), control(save=True))
    assert phase_now(tracker) == CKPT
    cb.on_step_begin(args, hf_state(global_step=9), control())
    assert phase_now(tracker) == OTHER
    # trainer.evaluate() outside training opens nothing and closes nothing
    cb.on_evaluate(args, hf_state(global_step=9), control(), metrics={})
    assert phase_now(tracker) == OTHER
    cb.on_log(args, hf_state(), control(), logs={"loss": 2.5})
    assert tracker.snapshot().loss == 2.5
    cb.on_train_end(args, hf_state(), control())
    assert not tracker.closed  # given, not made here: left open


def test_hf_tokens_are_the_trainers_count_shared_out_over_ranks(hf: Any) -> None:
    tracker = Tracker(hook_optimizers=False)
    cb = hf.GPUJobCallback(tracker, wrap_model=False)
    args = hf_args(include_num_input_tokens_seen="all")
    cb.on_train_begin(args, hf_state(num_input_tokens_seen=1000), control())
    cb.on_step_end(args, hf_state(global_step=1, num_input_tokens_seen=1256), control())
    assert tracker.snapshot().tokens == 128


def test_hf_errors_are_logged_never_raised(hf: Any, caplog: pytest.LogCaptureFixture) -> None:
    cb = hf.GPUJobCallback(Tracker(hook_optimizers=False), wrap_model=False)
    with caplog.at_level(logging.ERROR, logger="gpujob_trainer"):
        cb.on_train_begin(hf_args(), None, control())  # no state: an AttributeError inside
    assert "on_train_begin failed" in caplog.text


# ----------------------------------------------------------------- Lightning (its hooks only)
class FakeTrainer:
    def __init__(self) -> None:
        self.global_step = 0
        self.max_steps = 6
        self.current_epoch = 0
        self.estimated_stepping_batches: float = 6
        self.phase_in_save: str | None = None
        self.tracker: Tracker | None = None

    def save_checkpoint(self, path: str) -> str:
        assert self.tracker is not None
        self.phase_in_save = phase_now(self.tracker)
        return path


def test_lightning_steps_follow_the_global_step_and_saves_are_checkpoint_time() -> None:
    tracker = Tracker(hook_optimizers=False)
    cb = LightningHooks(tracker, wrap_model=False)
    trainer = FakeTrainer()
    trainer.tracker = tracker
    trainer.global_step = 3  # restored from ckpt_path before on_train_start
    cb.on_fit_start(trainer, None)
    cb.on_train_start(trainer, None)
    assert tracker.target_steps == 6 and tracker.global_step == 3
    batch = (SimpleNamespace(shape=(4, 8)), SimpleNamespace(shape=(4,)))  # four samples
    # accumulation: the first batch steps no optimizer, the second does
    cb.on_train_batch_start(trainer, None, batch, 0)
    cb.on_train_batch_end(trainer, None, {"loss": 1.5}, batch, 0)
    assert tracker.global_step == 3
    cb.on_train_batch_start(trainer, None, batch, 1)
    cb.on_before_optimizer_step(trainer, None, None)
    assert phase_now(tracker) == OPT
    trainer.global_step = 4
    cb.on_train_batch_end(trainer, None, {"loss": 1.0}, batch, 1)
    snap = tracker.snapshot()
    assert tracker.global_step == 4 and snap.samples == 8 and snap.current_phase == OTHER
    assert trainer.save_checkpoint("x.ckpt") == "x.ckpt"
    assert trainer.phase_in_save == CKPT
    cb.on_validation_start(trainer, None)
    assert phase_now(tracker) == EVAL
    cb.on_validation_end(trainer, None)
    cb.on_train_end(trainer, None)
    assert "save_checkpoint" not in vars(trainer)  # the stand-in is gone with training
    assert phase_now(tracker) == OTHER and not tracker.closed


def test_lightning_target_is_the_estimate_when_no_max_steps() -> None:
    tracker = Tracker(hook_optimizers=False)
    trainer = FakeTrainer()
    trainer.max_steps, trainer.estimated_stepping_batches = -1, float("inf")
    LightningHooks(tracker, wrap_model=False).on_train_start(trainer, None)
    assert tracker.target_steps is None
    trainer.estimated_stepping_batches = 30
    LightningHooks(tracker, wrap_model=False).on_train_start(trainer, None)
    assert tracker.target_steps == 30


def test_lightning_second_callback_in_a_trainer_does_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from gpujob_trainer.integrations import lightning_hooks

    monkeypatch.delenv(contract.ENV_FRAMEWORK_CALLBACK, raising=False)
    assert lightning_hooks.from_env(lambda: LightningHooks(Tracker())) == []
    monkeypatch.setenv(contract.ENV_FRAMEWORK_CALLBACK, "1")
    (from_env,) = lightning_hooks.from_env(lambda: LightningHooks(Tracker(hook_optimizers=False)))
    user = LightningHooks(Tracker(hook_optimizers=False), wrap_model=False)
    trainer = FakeTrainer()
    trainer.callbacks = [user, from_env]  # type: ignore[attr-defined]
    for cb in (user, from_env):
        cb.on_train_start(trainer, None)
        trainer.global_step += 1
        cb.on_train_batch_end(trainer, None, None, [], 0)
    assert user.tracker is not None and user.tracker.global_step == 1
    assert from_env.tracker is not None and from_env.tracker.global_step == 0


def test_hf_a_second_train_with_a_given_tracker_times_the_model_once(hf: Any) -> None:
    torch = pytest.importorskip("torch")
    tracker = Tracker(hook_optimizers=False)
    cb = hf.GPUJobCallback(tracker)
    model = torch.nn.Linear(4, 2)
    for _ in range(2):  # trainer.train() twice
        cb.on_train_begin(hf_args(), hf_state(), control(), model=model)
    # one timed stand-in, directly over the model's own bound method
    assert inspect.ismethod(model.forward.__wrapped__)
    tracker.close()


@pytest.mark.parametrize(
    ("ours", "framework"),
    [("lightning", "lightning.pytorch"), ("pytorch_lightning", "pytorch_lightning")],
)
def test_each_lightning_namespace_gets_a_callback_of_its_own_kind(
    ours: str, framework: str
) -> None:
    base = pytest.importorskip(framework).Callback
    cls = pytest.importorskip(f"gpujob_trainer.integrations.{ours}").GPUJobCallback
    cb = cls(Tracker(hook_optimizers=False))
    assert isinstance(cb, LightningHooks)
    assert isinstance(cb, base) and cb.state_key  # Lightning's own Callback machinery works
