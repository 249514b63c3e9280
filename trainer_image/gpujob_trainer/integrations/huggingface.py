"""`GPUJobCallback` for the Hugging Face `transformers.Trainer`.

    trainer = Trainer(model=model, args=args, ..., callbacks=[GPUJobCallback()])

What each Trainer event does to the tracker:

- on_train_begin: the tracker is made (`gpujob_trainer.init(hook_optimizers=False)`, unless
  one was given); its target is `state.max_steps` and its global step `state.global_step`,
  which the Trainer restored from the checkpoint's `trainer_state.json` before this event
  when resuming. The model (`kwargs["model"]`, the module DDP wraps) gets forward and
  backward timing (`Tracker.wrap_model`).
- on_pre_optimizer_step / on_optimizer_step: the optimizer phase, around `optimizer.step()`.
- on_step_end: one training step ends (the Trainer calls it once per optimizer step, after
  its gradient accumulation), with `state.train_batch_size x gradient_accumulation_steps`
  samples and the epoch `state.epoch` reached.
- Evaluation and saving: the Trainer has no event before either. It decides both in
  on_step_end (or on_epoch_end, or `eval_on_start`) by setting `control.should_evaluate` and
  `control.should_save` (DefaultFlowCallback runs before any user callback) and then
  evaluates, fires on_evaluate, saves and fires on_save, in that order. So the eval phase
  opens at on_step_end when an evaluation is due and closes at on_evaluate; the checkpoint
  phase opens when a save is due and no evaluation comes first (else at on_evaluate) and
  closes at on_save. A phase left open (another callback cancelled the evaluation) is
  closed at the next step's start.
- on_log: the loss (`logs["loss"]`, the Trainer's mean over ranks and logging steps).
- on_train_end: the tracker made here is closed (exporter stopped after `linger` seconds).
"""

from __future__ import annotations

import math
from typing import Any

from transformers import TrainerCallback

from gpujob_trainer import contract
from gpujob_trainer.integrations.common import TrackerOwner, never_raises
from gpujob_trainer.tracker import Tracker

__all__ = ["GPUJobCallback"]


def _epoch(value: float | None) -> int | None:
    """The 0-based epoch in progress from the Trainer's fractional `state.epoch`, where
    1.0 is the end of the first epoch (so still epoch 0)."""
    if value is None:
        return None
    return max(0, math.ceil(value) - 1)


class GPUJobCallback(TrainerCallback):
    """Reports a `transformers.Trainer`'s steps, phases, samples and loss to gpujob.

    `tracker`: use this one (made with `hook_optimizers=False`) instead of making one; it is
    then left open at the end. `wrap_model`: time the model's forward and backward.
    `linger`: seconds the exporter keeps serving after training. Other keyword arguments go
    to `gpujob_trainer.init` (port, flops_per_token ...).
    """

    def __init__(
        self,
        tracker: Tracker | None = None,
        *,
        wrap_model: bool = True,
        linger: float = 0.0,
        **init_kwargs: Any,
    ) -> None:
        self._owner = TrackerOwner(tracker, init_kwargs)
        self._wrap_model = wrap_model
        self._linger = linger
        self._samples_per_step = 0
        self._tokens_seen: int | None = None
        self._world = 1
        self._epoch: int | None = None

    @property
    def tracker(self) -> Tracker | None:
        """The tracker in use (None before training began)."""
        return self._owner.tracker

    @never_raises
    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        tracker = self._owner.get()
        if state.max_steps and state.max_steps > 0:
            tracker.target_steps = int(state.max_steps)
        tracker.resume(int(state.global_step))
        accumulation = max(1, int(args.gradient_accumulation_steps))
        per_device = state.train_batch_size or args.per_device_train_batch_size
        self._samples_per_step = int(per_device) * accumulation
        self._world = max(1, int(getattr(args, "world_size", 1) or 1))
        self._tokens_seen = state.num_input_tokens_seen if self._counts_tokens(args) else None
        model = kwargs.get("model")
        if self._wrap_model and model is not None:
            self._owner.wrap_model(model)
        if getattr(args, "eval_on_start", False):
            self._owner.open_phases().open(contract.PHASE_EVAL)

    @staticmethod
    def _counts_tokens(args: Any) -> bool:
        setting = getattr(args, "include_num_input_tokens_seen", "no")
        return setting not in ("no", False, None)

    @never_raises
    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._owner.open_phases().close_all()  # an evaluation or save that never came

    @never_raises
    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._owner.open_phases().open(contract.PHASE_OPTIMIZER)

    @never_raises
    def on_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._owner.open_phases().close(contract.PHASE_OPTIMIZER)

    @never_raises
    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        tracker = self._owner.get()
        phases = self._owner.open_phases()
        phases.close(contract.PHASE_OPTIMIZER)
        tokens = None
        if self._tokens_seen is not None:
            seen = int(state.num_input_tokens_seen)
            # The Trainer sums every rank's tokens; this rank's share is taken as 1/world.
            tokens, self._tokens_seen = (seen - self._tokens_seen) // self._world, seen
        tracker.add_samples(self._samples_per_step, tokens)
        epoch = _epoch(state.epoch)
        if epoch is not None and epoch != self._epoch:
            self._epoch = epoch
            tracker.set_epoch(epoch)
        tracker.end_step()
        self._open_due(control)

    @never_raises
    def on_epoch_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._open_due(control)

    def _open_due(self, control: Any) -> None:
        """Open the phase of what the Trainer does next: evaluate, then save."""
        phases = self._owner.open_phases()
        if control.should_evaluate:
            phases.open(contract.PHASE_EVAL)
        elif control.should_save:
            phases.open(contract.PHASE_CHECKPOINT)

    @never_raises
    def on_evaluate(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        phases = self._owner.phases
        if phases is None or contract.PHASE_EVAL not in phases:
            return  # an evaluation outside training (trainer.evaluate()): not a step's
        phases.close(contract.PHASE_EVAL)
        if control.should_save:
            phases.open(contract.PHASE_CHECKPOINT)

    @never_raises
    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._owner.phases is not None:
            self._owner.phases.close(contract.PHASE_CHECKPOINT)

    @never_raises
    def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any) -> None:
        loss = (logs or {}).get("loss")
        if isinstance(loss, int | float) and self._owner.tracker is not None:
            self._owner.tracker.log(loss=float(loss))

    @never_raises
    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._owner.close(self._linger)
