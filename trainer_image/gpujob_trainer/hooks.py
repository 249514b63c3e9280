"""Hooks that move a tracker between phases without changes to the training loop.

- DataLoader: a wrapper times each `next()` (data_wait) and counts the batch's samples.
- Model: forward pre/post hooks time the forward (inside `tracker.phase("eval")` or
  "checkpoint" a forward belongs to that phase instead). A pre-hook on the autograd node that made
  the output fires when backward reaches the model; from there two autograd final callbacks
  are queued. The first runs when the backward graph is done (the rank's own backward
  compute is over), before DDP's own finalizer, which DDP queues only once its last gradient
  bucket is ready; the first queues the second, which therefore runs after DDP has waited
  for every all-reduce. The time between the two is the rank's exposed communication wait.
  No comm hook is registered, so a user's own comm hook keeps working.
- Optimizer: step pre/post hooks (global, or on watched instances) time `step()`, whose
  end ends the training step.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from gpujob_trainer import contract

if TYPE_CHECKING:
    from gpujob_trainer.tracker import Tracker

T = TypeVar("T")

_MAX_OUTPUT_HOOKS = 8


def batch_size(batch: Any) -> int:
    """Samples in a batch: the leading dimension of its first tensor-like leaf."""
    shape = getattr(batch, "shape", None)
    if shape is not None:
        return int(shape[0]) if len(shape) else 1
    if isinstance(batch, Mapping):
        for value in batch.values():
            return batch_size(value)
        return 0
    if isinstance(batch, list | tuple):
        if batch and not isinstance(batch[0], int | float | str | bytes):
            return batch_size(batch[0])
        return len(batch)
    return 1


class InstrumentedLoader(Generic[T]):
    """An iterable over the wrapped loader's batches that times the wait for each one."""

    def __init__(
        self,
        tracker: Tracker,
        loader: Iterable[T],
        *,
        tokens_fn: Callable[[T], int] | None = None,
        samples_fn: Callable[[T], int] | None = None,
    ) -> None:
        self._tracker = tracker
        self._loader = loader
        self._tokens_fn = tokens_fn
        self._samples_fn = samples_fn or batch_size

    def __iter__(self) -> Iterator[T]:
        if not self._tracker._held:
            self._tracker._loader_epoch_started()
        return _InstrumentedIterator(self, iter(self._loader))

    def __len__(self) -> int:
        return len(self._loader)  # type: ignore[arg-type]

    def __getattr__(self, name: str) -> Any:
        # sampler, dataset, batch_size …: behave like the wrapped loader
        return getattr(self._loader, name)


class _InstrumentedIterator(Iterator[T]):
    def __init__(self, owner: InstrumentedLoader[T], it: Iterator[T]) -> None:
        self._owner = owner
        self._it = it

    def __next__(self) -> T:
        owner = self._owner
        tracker = owner._tracker
        if tracker._held:  # an evaluation's batches: its time is eval, no training samples
            return next(self._it)
        tracker._enter(contract.PHASE_DATA_WAIT)
        try:
            batch = next(self._it)
        finally:
            tracker._exit(contract.PHASE_DATA_WAIT)
        tokens = owner._tokens_fn(batch) if owner._tokens_fn is not None else None
        tracker.add_samples(owner._samples_fn(batch), tokens)
        return batch


def _grad_nodes(output: Any, limit: int) -> list[Any]:
    """Autograd nodes that produced a model's output (where backward enters the model)."""
    node = getattr(output, "grad_fn", None)
    if node is not None:  # the common case: one tensor
        return [node]
    found: list[Any] = []
    todo = [output]
    while todo and len(found) < limit:
        item = todo.pop()
        node = getattr(item, "grad_fn", None)
        if node is not None:
            if node not in found:
                found.append(node)
        elif isinstance(item, Mapping):
            todo.extend(reversed(list(item.values())))
        elif isinstance(item, list | tuple):
            todo.extend(reversed(item))
    return found


def attach_model(tracker: Tracker, model: Any) -> list[Any]:
    """Install forward and backward timing on `model`; returns removable handles."""
    import torch  # lazy: only a PyTorch model gets here

    queue_callback = torch.autograd.Variable._execution_engine.queue_callback

    def backward_compute_done() -> None:
        tracker._switch(contract.PHASE_BACKWARD, contract.PHASE_COMM_WAIT)
        queue_callback(backward_done)  # runs after DDP's finalizer (queued after this one)

    def backward_done() -> None:
        tracker._exit(contract.PHASE_COMM_WAIT)

    def on_output_grad(grad_outputs: Any) -> None:
        if not tracker._bwd_armed:
            return
        tracker._bwd_armed = False
        tracker._enter(contract.PHASE_BACKWARD)
        queue_callback(backward_compute_done)

    def forward_pre(module: Any, args: Any) -> None:
        if not tracker._held:  # inside eval/checkpoint the forward is that phase's time
            tracker._enter(contract.PHASE_FORWARD)

    def forward_post(module: Any, args: Any, output: Any) -> None:
        if tracker._held:
            return
        tracker._exit(contract.PHASE_FORWARD)
        nodes = _grad_nodes(output, _MAX_OUTPUT_HOOKS)
        if nodes:
            tracker._bwd_armed = True
            for node in nodes:
                # a pre-hook on the node runs as soon as backward reaches the output
                node.register_prehook(on_output_grad)

    return [
        model.register_forward_pre_hook(forward_pre),
        model.register_forward_hook(forward_post),
    ]


def attach_optimizers(tracker: Tracker) -> list[Any]:
    """Global optimizer step hooks (every torch.optim optimizer); returns removable handles."""
    from torch.optim.optimizer import (
        register_optimizer_step_post_hook,
        register_optimizer_step_pre_hook,
    )

    def pre(optimizer: Any, args: Any, kwargs: Any) -> None:
        tracker._optimizer_begin(optimizer)

    def post(optimizer: Any, args: Any, kwargs: Any) -> None:
        tracker._optimizer_end(optimizer)

    return [register_optimizer_step_pre_hook(pre), register_optimizer_step_post_hook(post)]


def attach_optimizer(tracker: Tracker, optimizer: Any) -> list[Any]:
    """Step hooks on one optimizer instance, whose step ends a training step."""

    def pre(opt: Any, args: Any, kwargs: Any) -> None:
        tracker._optimizer_begin(opt, watched=True)

    def post(opt: Any, args: Any, kwargs: Any) -> None:
        tracker._optimizer_end(opt, watched=True)

    return [optimizer.register_step_pre_hook(pre), optimizer.register_step_post_hook(post)]
