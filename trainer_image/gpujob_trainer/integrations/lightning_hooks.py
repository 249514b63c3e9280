"""The Lightning callback's hooks, written once for both namespaces (`lightning.pytorch` and
`pytorch_lightning`): `lightning.py` and `pytorch_lightning.py` mix this class into each
one's `Callback`. It imports no framework.

What each Lightning hook does to the tracker:

- on_train_start: the target is `trainer.max_steps` (else `estimated_stepping_batches`, when
  finite) and the global step `trainer.global_step`, which Lightning restored from
  `ckpt_path` before this hook (the loops' state is loaded before the fit loop starts). The
  LightningModule gets forward and backward timing (`Tracker.wrap_model`; forward is timed
  when `training_step` calls the module, `self(x)`).
- on_train_batch_start: the batch's samples (its leading dimension, every micro-batch).
- on_before_optimizer_step: the optimizer phase opens (the step runs right after it).
- on_train_batch_end: when `trainer.global_step` moved (an optimizer step happened; with
  `accumulate_grad_batches` only every few batches), the step ends; the loss is `outputs`.
- on_validation_start / on_validation_end: the eval phase (the sanity check's too).
- `trainer.save_checkpoint`, timed on the Trainer instance from on_fit_start to the end (no
  hook runs after a checkpoint is written): the checkpoint phase, around the whole save.
- on_train_epoch_start: the epoch (`trainer.current_epoch`).
- on_train_end, on_exception, teardown: the tracker made here is closed.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

from gpujob_trainer import contract, hooks
from gpujob_trainer.integrations.common import TrackerOwner, log, never_raises
from gpujob_trainer.tracker import Tracker


class LightningHooks:
    """Reports a Lightning Trainer's steps, phases, samples and loss to gpujob.

    `tracker`: use this one (made with `hook_optimizers=False`) instead of making one; it is
    then left open at the end. `wrap_model`: time the LightningModule's forward and backward.
    `linger`: seconds the exporter keeps serving after training. Other keyword arguments go
    to `gpujob_trainer.init`.
    """

    def __init__(
        self,
        tracker: Tracker | None = None,
        *,
        wrap_model: bool = True,
        linger: float = 0.0,
        **init_kwargs: Any,
    ) -> None:
        super().__init__()
        if tracker is not None and tracker._hook_optimizers:
            log.warning(
                "gpujob: the tracker given to GPUJobCallback hooks every optimizer; make it "
                "with hook_optimizers=False, else each step counts twice"
            )
        self._owner = TrackerOwner(tracker, init_kwargs)
        self._wrap_model = wrap_model
        self._linger = linger
        self._seen_step: int | None = None
        self._unpatch: Callable[[], None] | None = None

    @property
    def tracker(self) -> Tracker | None:
        """The tracker in use (None before fitting began)."""
        return self._owner.tracker

    @never_raises
    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        self._owner.get()
        self._time_saves(trainer)

    def _time_saves(self, trainer: Any) -> None:
        """Time `trainer.save_checkpoint` (every save goes through it) as the checkpoint
        phase: a stand-in set on this Trainer instance, removed when training ends."""
        if self._unpatch is not None:
            return
        owner = self._owner
        inner = trainer.save_checkpoint

        def save_checkpoint(*args: Any, **kwargs: Any) -> Any:
            tracker = owner.tracker
            if tracker is None or tracker.closed:
                return inner(*args, **kwargs)
            with tracker.checkpointing():
                return inner(*args, **kwargs)

        save_checkpoint.__wrapped__ = inner  # type: ignore[attr-defined]
        trainer.__dict__["save_checkpoint"] = save_checkpoint

        def unpatch() -> None:
            if trainer.__dict__.get("save_checkpoint") is save_checkpoint:
                del trainer.__dict__["save_checkpoint"]

        self._unpatch = unpatch

    @never_raises
    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        tracker = self._owner.get()
        self._time_saves(trainer)
        total = _target(trainer)
        if total is not None:
            tracker.target_steps = total
        self._seen_step = int(trainer.global_step)
        tracker.resume(self._seen_step)
        if self._wrap_model:
            tracker.wrap_model(pl_module)

    @never_raises
    def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        self._owner.get().set_epoch(int(trainer.current_epoch))

    @never_raises
    def on_train_batch_start(
        self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int
    ) -> None:
        self._owner.get().add_samples(hooks.batch_size(batch))

    @never_raises
    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        self._owner.open_phases().open(contract.PHASE_OPTIMIZER)

    @never_raises
    def on_train_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        tracker = self._owner.get()
        self._owner.open_phases().close(contract.PHASE_OPTIMIZER)
        loss = outputs.get("loss") if isinstance(outputs, Mapping) else outputs
        if loss is not None:
            tracker.log(loss=loss)
        step = int(trainer.global_step)
        if self._seen_step is None:
            self._seen_step = step
        # global_step counts optimizer steps: none during accumulation, one per optimizer
        # stepped in this batch otherwise.
        for _ in range(max(0, step - self._seen_step)):
            tracker.end_step()
        self._seen_step = step

    @never_raises
    def on_validation_start(self, trainer: Any, pl_module: Any) -> None:
        self._owner.open_phases().open(contract.PHASE_EVAL)

    @never_raises
    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        self._owner.open_phases().close(contract.PHASE_EVAL)

    @never_raises
    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self._close()

    @never_raises
    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self._close()

    @never_raises
    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if stage == "fit":
            self._close()

    def _close(self) -> None:
        if self._unpatch is not None:
            self._unpatch()
            self._unpatch = None
        self._owner.close(self._linger)


def _target(trainer: Any) -> int | None:
    """The run's optimizer steps: max_steps when set, else Lightning's estimate if finite."""
    max_steps = int(getattr(trainer, "max_steps", -1) or -1)
    if max_steps > 0:
        return max_steps
    estimate = float(trainer.estimated_stepping_batches)
    return int(estimate) if math.isfinite(estimate) and estimate > 0 else None
