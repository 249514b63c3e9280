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

From the env: with `GPUJOB_FRAMEWORK_CALLBACK=1`, Lightning's `callbacks_factory` entry
point (declared in pyproject.toml) adds the callback to every Trainer of the process.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from gpujob_trainer import contract, hooks
from gpujob_trainer.integrations.common import TrackerOwner, asked_from_env, never_raises
from gpujob_trainer.tracker import Tracker

F = TypeVar("F", bound=Callable[..., Any])


def _hook(method: F) -> F:
    """A Lightning hook: skipped by a second gpujob callback in the same Trainer (one the
    entry point added beside one the user passed), and never raising."""

    @functools.wraps(method)
    def run(self: LightningHooks, trainer: Any, *args: Any, **kwargs: Any) -> Any:
        if not self._first_in(trainer):
            return None
        return method(self, trainer, *args, **kwargs)

    return never_raises(run)  # type: ignore[return-value]


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
        self._owner = TrackerOwner(tracker, init_kwargs)
        self._wrap_model = wrap_model
        self._linger = linger
        self._seen_step: int | None = None
        self._unpatch: Callable[[], None] | None = None
        self._first: tuple[int, bool] | None = None
        """(id of the Trainer, whether this is its first gpujob callback)."""

    def _first_in(self, trainer: Any) -> bool:
        if self._first is None or self._first[0] != id(trainer):
            ours = [cb for cb in getattr(trainer, "callbacks", None) or [self] if _is_ours(cb)]
            self._first = (id(trainer), not ours or ours[0] is self)
        return self._first[1]

    @property
    def tracker(self) -> Tracker | None:
        """The tracker in use (None before fitting began)."""
        return self._owner.tracker

    @_hook
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

    @_hook
    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        tracker = self._owner.get()
        self._time_saves(trainer)
        total = _target(trainer)
        if total is not None:
            tracker.target_steps = total
        self._seen_step = int(trainer.global_step)
        tracker.resume(self._seen_step)
        if self._wrap_model:
            self._owner.wrap_model(pl_module)

    @_hook
    def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        self._owner.get().set_epoch(int(trainer.current_epoch))

    @_hook
    def on_train_batch_start(
        self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int
    ) -> None:
        self._owner.get().add_samples(hooks.batch_size(batch))

    @_hook
    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        self._owner.open_phases().open(contract.PHASE_OPTIMIZER)

    @_hook
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

    @_hook
    def on_validation_start(self, trainer: Any, pl_module: Any) -> None:
        self._owner.open_phases().open(contract.PHASE_EVAL)

    @_hook
    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        self._owner.open_phases().close(contract.PHASE_EVAL)

    @_hook
    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self._close()

    @_hook
    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self._close()

    @_hook
    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if stage == "fit":
            self._close()

    def _close(self) -> None:
        if self._unpatch is not None:
            self._unpatch()
            self._unpatch = None
        self._owner.close(self._linger)


def _is_ours(callback: Any) -> bool:
    return isinstance(callback, LightningHooks)


def from_env(make: Callable[[], LightningHooks]) -> list[LightningHooks]:
    """What the `callbacks_factory` entry points return: one callback when the env asks for
    it (`GPUJOB_FRAMEWORK_CALLBACK`), else none. A callback the user passed too goes first,
    and this one then does nothing."""
    return [make()] if asked_from_env() else []


def _target(trainer: Any) -> int | None:
    """The run's optimizer steps: max_steps when set, else Lightning's estimate if finite."""
    max_steps = int(getattr(trainer, "max_steps", -1) or -1)
    if max_steps > 0:
        return max_steps
    estimate = float(trainer.estimated_stepping_batches)
    return int(estimate) if math.isfinite(estimate) and estimate > 0 else None
