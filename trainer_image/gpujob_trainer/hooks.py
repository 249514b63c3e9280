"""Hooks that move a tracker between phases without changes to the training loop.

- DataLoader: a wrapper times each `next()` (data_wait) and counts the batch's samples;
  given a device, it also moves the batch there, timed as the h2d phase.
- Model: the model's `forward`, replaced on the instance, times the forward (inside
  `tracker.phase("eval")` or "checkpoint" a forward belongs to that phase instead).
  `torch.Tensor.backward`, wrapped while a tracker listens, opens the backward phase and
  closes it on return, after DDP has waited for every all-reduce. In between, the gradient
  of the model's last trainable parameter (or its first, once the last went without one)
  queues an autograd final callback that switches to comm_wait: it runs once the graph is
  done (the rank's own backward compute is over) and before DDP's finalizer.
  No comm hook is registered, so a user's own comm hook keeps working.
- Optimizer: step pre/post hooks (global, or on watched instances) time `step()`. A watched
  optimizer's step ends the training step; with the global hooks an optimizer step's end is
  a pending end, which the loop's next boundary commits (`timing.Timeline`): a training step
  is one iteration, however many optimizers step in it.

The hooks see their tracker as a `recorder.Recorder` (the few attributes and calls they
record through), never as `tracker.Tracker`: the tracker imports this module, not the
other way round.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, Generic, TypeVar

from gpujob_trainer import contract
from gpujob_trainer.recorder import Recorder
from gpujob_trainer.timing import END_OPTIMIZER, ENTERS, EXITS, SWITCH, Op, optimizer_done

T = TypeVar("T")


_SEQUENCES = (list, tuple)
_SCALARS = (int, float, str, bytes)


def batch_size(batch: Any) -> int:
    """Samples in a batch: the leading dimension of its first tensor-like leaf."""
    if isinstance(batch, _SEQUENCES):  # the common (inputs, labels) first: no getattr miss
        if batch and not isinstance(batch[0], _SCALARS):
            return batch_size(batch[0])
        return len(batch)
    shape = getattr(batch, "shape", None)
    if shape is not None:
        return int(shape[0]) if len(shape) else 1
    if isinstance(batch, Mapping):
        for value in batch.values():
            return batch_size(value)
        return 0
    return 1


def to_device(batch: Any, device: Any, non_blocking: bool) -> Any:
    """The batch with every tensor (in tuples, lists and dicts) moved to `device`.

    Anything with its own `.to()` that is not a plain container moves itself (a tensor, a
    PackedSequence, a BatchEncoding), so it keeps what it knows must stay on the host.
    """
    kind = type(batch)
    if kind is tuple or kind is list:  # the usual (inputs, labels): one call, every step
        # Each leaf that moves itself is moved here, not through a call of this function
        # (nor a comprehension, a call of its own before Python 3.12): ~2 us a step less.
        moved = []
        for value in batch:
            inner = type(value)
            if inner is tuple or inner is list or inner is dict:
                moved.append(to_device(value, device, non_blocking))
                continue
            move = getattr(value, "to", None)
            if move is None:
                moved.append(to_device(value, device, non_blocking))
            else:
                moved.append(move(device, non_blocking=non_blocking))
        return kind(moved)
    move = getattr(batch, "to", None)
    if move is not None and kind is not dict:
        return move(device, non_blocking=non_blocking)
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # a namedtuple
        return type(batch)(*(to_device(v, device, non_blocking) for v in batch))
    if isinstance(batch, _SEQUENCES):
        return type(batch)(to_device(v, device, non_blocking) for v in batch)
    if isinstance(batch, Mapping):
        try:
            return type(batch)(  # type: ignore[call-arg]
                {k: to_device(v, device, non_blocking) for k, v in batch.items()}
            )
        except TypeError:  # a mapping type that takes no dict (BatchEncoding does)
            return {k: to_device(v, device, non_blocking) for k, v in batch.items()}
    return batch


class InstrumentedLoader(Generic[T]):
    """An iterable over the wrapped loader's batches that times the wait for each one."""

    def __init__(
        self,
        tracker: Recorder,
        loader: Iterable[T],
        *,
        tokens_fn: Callable[[T], int] | None = None,
        samples_fn: Callable[[T], int] | None = None,
        device: Any = None,
        non_blocking: bool = True,
    ) -> None:
        self._tracker = tracker
        self._loader = loader
        self._tokens_fn = tokens_fn
        self._samples_fn = samples_fn or batch_size
        self._device = device
        self._non_blocking = non_blocking

    def __iter__(self) -> Iterator[T]:
        if not self._tracker._held:
            self._tracker._loader_epoch_started()
        return self._batches(iter(self._loader))

    def _batches(self, it: Iterator[T]) -> Iterator[T]:
        # A generator: resuming its frame costs less than a Python __next__ call, and the
        # names it uses are bound once per epoch.
        tracker = self._tracker
        events, now = tracker._events, tracker._now
        count, tokens_fn = self._samples_fn, self._tokens_fn
        default_count = count is batch_size
        enter, leave = ENTERS[contract.PHASE_DATA_WAIT], EXITS[contract.PHASE_DATA_WAIT]
        h2d_out = EXITS[contract.PHASE_H2D]
        device, non_blocking = self._device, self._non_blocking
        # The fetch ends where the copy to the device starts: one event for both (a now(),
        # and on CUDA an event record, fewer every step).
        to_h2d: Op = (SWITCH, contract.PHASE_DATA_WAIT, contract.PHASE_H2D)
        fetched = leave if device is None else to_h2d
        while True:
            if tracker._held:  # an evaluation's batches: its time is eval, no training samples
                try:
                    batch = next(it)
                except StopIteration:
                    return
                yield batch if device is None else to_device(batch, device, non_blocking)
                continue
            record = tracker._record
            events.extend((now(), enter, None if record is None else record()))
            try:
                batch = next(it)
            except BaseException as exc:  # the epoch's end, or the loader's error
                record = tracker._record
                events.extend((now(), leave, None if record is None else record()))
                if isinstance(exc, StopIteration):
                    return
                raise
            record = tracker._record
            events.extend((now(), fetched, None if record is None else record()))
            # With a device, what follows is the copy (h2d), closed whatever happens.
            try:
                if default_count and isinstance(batch, _SEQUENCES) and batch:
                    # batch_size() inline for the usual (inputs, labels): two calls fewer
                    shape = getattr(batch[0], "shape", None)
                    tracker._samples += int(shape[0]) if shape else count(batch)
                else:
                    tracker._samples += count(batch)
                if tokens_fn is not None:
                    tracker._tokens = (tracker._tokens or 0) + int(tokens_fn(batch))
                if device is not None:  # the copy to the GPU is the h2d phase
                    batch = to_device(batch, device, non_blocking)
            finally:
                if device is not None:
                    record = tracker._record
                    events.extend((now(), h2d_out, None if record is None else record()))
            yield batch

    def __len__(self) -> int:
        return len(self._loader)  # type: ignore[arg-type]

    def __getattr__(self, name: str) -> Any:
        # sampler, dataset, batch_size …: behave like the wrapped loader
        return getattr(self._loader, name)


# Where a tracker is in one backward pass (`Tracker._bwd`).
_IDLE, _OPEN, _QUEUED, _COMM, _LATE_QUEUED, _LATE_COMM = range(6)
"""_OPEN: Tensor.backward began (phase backward); _QUEUED: a gradient is ready and the split is
queued; _COMM: the graph is done, waiting for DDP (phase comm_wait). The _LATE states are the
same for a backward that did not come through Tensor.backward (torch.autograd.backward called
directly): it is seen from its first gradient on and ends with a callback after DDP's."""


_Listener = Callable[[Callable[..., Any], Any, tuple[Any, ...], dict[str, Any]], Any]
"""A tracker's backward: `listener(inner, tensor, args, kwargs)` runs `inner(tensor, *args,
**kwargs)` (the backward it wraps), timing it or not."""


class _BackwardListeners:
    """`torch.Tensor.backward`, wrapped while any tracker listens.

    The wrapper marks where a backward starts and ends with nothing registered on each
    step's autograd graph: a hook on every step's output node cost ~25 us per step (its
    registration and the engine's Python pre-hook path); the wrapper and the tracker's
    listener, which runs the backward it wraps, are two Python calls.
    Each wrapper calls the function it replaced, so one left buried under another library's
    wrapper (ours are only removed from the top) passes calls through and never calls
    itself; a nested call finds the backward already open and records nothing.
    """

    def __init__(self) -> None:
        self.listeners: list[_Listener] = []
        self.ours: dict[Any, Callable[..., Any]] = {}
        """Each wrapper we installed -> what it replaced."""

    def add(self, entry: _Listener) -> _Removable:
        import torch  # lazy: only a PyTorch model gets here

        current = torch.Tensor.backward
        if current not in self.ours:
            wrapper = _timed(current, self.listeners)
            self.ours[wrapper] = current
            torch.Tensor.backward = wrapper  # type: ignore[method-assign]
        self.listeners.append(entry)
        return _Removable(lambda: self.remove(entry))

    def remove(self, entry: _Listener) -> None:
        import torch

        if entry in self.listeners:
            self.listeners.remove(entry)
        current = torch.Tensor.backward
        # Restore only from the top: a wrapper installed over ours stays, and ours under it
        # then passes calls through.
        if not self.listeners and current in self.ours:
            torch.Tensor.backward = self.ours.pop(current)  # type: ignore[method-assign]


_BACKWARD = _BackwardListeners()


def _timed(original: Callable[..., Any], listeners: list[_Listener]) -> Callable[..., Any]:
    """A `Tensor.backward` that tells `listeners` where each backward starts and ends."""

    def backward(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not listeners:
            return original(self, *args, **kwargs)
        if len(listeners) == 1:  # the usual process: one tracker, nothing to chain
            return listeners[0](original, self, args, kwargs)
        inner = original  # several trackers: the first listed runs outermost
        for listener in reversed(listeners):
            inner = _through(listener, inner)
        return inner(self, *args, **kwargs)

    backward.__doc__ = original.__doc__  # help() and inspect.signature() still show torch's
    backward.__wrapped__ = original  # type: ignore[attr-defined]
    return backward


def _through(listener: _Listener, inner: Callable[..., Any]) -> Callable[..., Any]:
    """`inner` (a backward) run through `listener`."""

    def call(tensor: Any, *args: Any, **kwargs: Any) -> Any:
        return listener(inner, tensor, args, kwargs)

    return call


class _Removable:
    """A handle like torch's: `remove()` undoes what made it."""

    def __init__(self, remove: Callable[[], None]) -> None:
        self.remove = remove


def attach_model(tracker: Recorder, model: Any) -> list[Any]:
    """Install forward and backward timing on `model`; returns removable handles.

    Forward: `model.forward`, replaced on the instance (`_TimedForward`). Backward:
    `Tensor.backward` (see `_BackwardListeners`) opens the backward phase. A
    post-accumulate-grad hook on the last trainable parameter: its gradient queues an
    autograd final callback. Final callbacks run
    in the order queued once the graph is done; DDP queues its finalizer (which waits for
    every all-reduce) when its last bucket is ready, so no earlier than that gradient, and a
    tensor's post-accumulate hooks run before the post hooks of its AccumulateGrad node where
    DDP's hook sits. So the callback runs when the rank's own backward compute is over and
    before DDP waits; it switches to comm_wait, and the return of `Tensor.backward` ends
    that. A model may leave that parameter unused (an auxiliary head, a layer a config
    switches off): a backward that ends without its gradient hooks the first parameter too,
    and whichever of the two is ready first queues the callback from then on. A step in
    which neither gets a gradient counts its wait as backward.
    """
    import torch  # lazy: only a PyTorch model gets here

    queue_callback = torch.autograd.Variable._execution_engine.queue_callback
    backward, comm = contract.PHASE_BACKWARD, contract.PHASE_COMM_WAIT
    events, now = tracker._events, tracker._now
    enter_bwd, exit_bwd, exit_comm = ENTERS[backward], EXITS[backward], EXITS[comm]
    to_comm: Op = (SWITCH, backward, comm)
    # Each hook appends its event inline (see Tracker._event): a method call more per event
    # is measurable at 10 ms steps.

    def timed(inner: Callable[..., Any], tensor: Any, args: Any, kwargs: Any) -> Any:
        """`Tensor.backward` (`inner`) as the backward phase, up to DDP's last wait."""
        if tracker._bwd != _IDLE or tracker._held:
            # nested, or inside eval/checkpoint: that phase keeps the time
            return inner(tensor, *args, **kwargs)
        tracker._bwd = _OPEN
        record = tracker._record
        events.extend((now(), enter_bwd, None if record is None else record()))
        try:
            return inner(tensor, *args, **kwargs)
        finally:
            state, tracker._bwd = tracker._bwd, _IDLE
            record = tracker._record
            op = exit_comm if state == _COMM else exit_bwd
            events.extend((now(), op, None if record is None else record()))
            if tracker._flops_mode is not None:  # the counted pass's backward is done
                tracker._flops_end()
            if state == _OPEN and spare:  # the watched parameter got no gradient: watch
                watch.add(spare.pop())  # the other

    def split() -> None:  # the graph is done; DDP's finalizer has not run yet
        record = tracker._record
        events.extend((now(), to_comm, None if record is None else record()))
        if tracker._bwd == _LATE_QUEUED:
            tracker._bwd = _LATE_COMM
            queue_callback(late_end)  # after DDP's finalizer, queued before this one ran
        else:
            tracker._bwd = _COMM

    def late_end() -> None:
        tracker._bwd = _IDLE
        tracker._exit(comm)
        # A count still open is left to the next forward: closed from inside the engine, it
        # would come back with the thread state autograd restores after the backward.

    def grad_ready(param: Any) -> None:
        state = tracker._bwd
        if state == _OPEN:
            tracker._bwd = _QUEUED
            queue_callback(split)
        elif state == _IDLE and not tracker._held:
            tracker._enter(backward)
            tracker._bwd = _LATE_QUEUED
            queue_callback(split)

    trainable = [p for p in model.parameters() if p.requires_grad]
    watch = _ParamHooks(grad_ready)
    if trainable:
        watch.add(trainable[-1])
    spare = trainable[:1] if len(trainable) > 1 else []
    """The first parameter, hooked too once a backward ends with no gradient for the last:
    each hook is a call from autograd into Python every step, so the second waits until
    needed (the one step that finds the last unused counts its wait as backward)."""
    return [
        _TimedForward.install(tracker, model),
        _BACKWARD.add(timed),
        watch,
    ]


class _StandIn:
    """A callable set on a model instance in place of one of its methods.

    It stands in for the bound method it replaced: `inspect.signature` follows `__wrapped__`,
    other attributes (`__func__`, `__self__`) come from it, and a copy of the model
    (`copy.deepcopy`, an EMA copy, a pickle) gets the model's own method bound to the copy,
    never ours bound to the original.
    """

    def __init__(self, inner: Callable[..., Any]) -> None:
        self.__wrapped__ = inner

    def __getattr__(self, name: str) -> Any:
        if name == "__wrapped__":  # not set yet: no recursion
            raise AttributeError(name)
        return getattr(self.__wrapped__, name)

    def __deepcopy__(self, memo: dict[int, Any]) -> Any:
        import copy

        return copy.deepcopy(self.__wrapped__, memo)

    def __reduce_ex__(self, protocol: Any) -> Any:
        return self.__wrapped__.__reduce_ex__(protocol)


def _set_on(model: Any, name: str, value: Any) -> tuple[Any, Callable[[], None]]:
    """Set `name` in the instance's own attributes; returns what was there (None: nothing)
    and how to undo it. Undoing leaves alone a value someone set over ours since."""
    own = model.__dict__
    before = own.get(name)
    own[name] = value

    def undo() -> None:
        if own.get(name) is value:
            _put_back(own, name, before)

    return before, undo


def _put_back(attributes: dict[str, Any], name: str, before: Any) -> None:
    """Give `name` the value it had before us (None: none of its own)."""
    if before is None:
        attributes.pop(name, None)
    else:
        attributes[name] = before


class _TimedForward(_StandIn):
    """The model's `forward`, set on the instance: times each training forward.

    An instance attribute rather than forward hooks: any forward hook sends every call of the
    model through `Module._call_impl`'s slow path (~6 us a step here); this is one call.
    `Module.__call__` finds it as it finds any `forward`.
    """

    def __init__(self, tracker: Recorder, inner: Callable[..., Any]) -> None:
        super().__init__(inner)
        phase = contract.PHASE_FORWARD
        self._hot: tuple[Any, ...] | None = (
            tracker,
            tracker._events,
            tracker._now,
            ENTERS[phase],
            EXITS[phase],
            inner,
        )
        """The tracker and what a call reads of it, in one attribute: the class defines
        `__getattr__`, so Python does not specialise its attribute reads, and each costs a
        generic lookup, every step. None once removed: a wrapper set over ours meanwhile
        still calls ours, which then passes calls through (removing it would drop the other
        wrapper)."""

    @classmethod
    def install(cls, tracker: Recorder, model: Any) -> _Removable:
        forward = cls(tracker, model.forward)
        forward_before, unset_forward = _set_on(model, "forward", forward)
        undo = [unset_forward]
        replicate = getattr(model, _REPLICATE, None)
        if replicate is not None:  # an nn.Module: DataParallel may replicate it
            before = {"forward": forward_before, _REPLICATE: model.__dict__.get(_REPLICATE)}
            undo.append(_set_on(model, _REPLICATE, _UntimedReplicas(replicate, before))[1])

        def remove() -> None:
            forward._hot = None
            for step in undo:
                step()

        return _Removable(remove)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        # Inline, like the hooks below: this runs every step.
        hot = self._hot
        if hot is None:
            return self.__wrapped__(*args, **kwargs)
        tracker, events, now, enter, leave, inner = hot
        if tracker._held:  # inside eval/checkpoint: that phase's time
            return inner(*args, **kwargs)
        if tracker._flops_countdown:  # the model's FLOPs are still to count (early steps)
            tracker._flops_forward(args, kwargs)
        if tracker._bwd >= _LATE_QUEUED:  # a late backward that never finished (it raised)
            tracker._bwd = _IDLE
            tracker._pop(contract.PHASE_COMM_WAIT)
            tracker._pop(contract.PHASE_BACKWARD)
        record = tracker._record
        events.extend((now(), enter, None if record is None else record()))
        try:
            return inner(*args, **kwargs)
        finally:
            record = tracker._record
            events.extend((now(), leave, None if record is None else record()))


_REPLICATE = "_replicate_for_data_parallel"


class _UntimedReplicas(_StandIn):
    """The model's `_replicate_for_data_parallel`, set beside the timed forward.

    `nn.DataParallel` builds a replica per device by copying the module's `__dict__`, which
    would give each replica our forward, bound to the original module and its weights on the
    first device. A replica gets the attributes the model had before us instead: it runs its
    own weights, untimed (replicas run on DataParallel's threads; time the DataParallel itself
    by wrapping it, as the README does with DDP).
    """

    def __init__(self, inner: Callable[..., Any], before: dict[str, Any]) -> None:
        super().__init__(inner)
        self._before = before
        """Each attribute we set on the model -> what it had before (None: nothing)."""

    def __call__(self) -> Any:
        replica = self.__wrapped__()
        for name, before in self._before.items():
            _put_back(replica.__dict__, name, before)
        return replica


class _ParamHooks:
    """Post-accumulate-grad hooks on some parameters, added over time, removed together."""

    def __init__(self, hook: Callable[[Any], None]) -> None:
        self._hook = hook
        self._handles: list[tuple[Any, Any]] = []
        self._removed = False

    def add(self, param: Any) -> None:
        if not self._removed:  # a backward that ends after close() adds nothing
            self._handles.append((param, param.register_post_accumulate_grad_hook(self._hook)))

    def remove(self) -> None:
        self._removed = True
        for param, handle in self._handles:
            handle.remove()
            if not param._post_accumulate_grad_hooks:  # else autograd still calls into Python
                param._post_accumulate_grad_hooks = None
        self._handles.clear()


_StepHook = Callable[[Any, Any, Any], None]
_MAX_OPTIMIZERS = 64
"""Optimizers whose pending-end op is kept; more are made anew (a new optimizer per step)."""


def optimizer_hooks(tracker: Recorder, *, watched: bool) -> tuple[_StepHook, _StepHook]:
    """Step pre/post hooks: an optimizer's step is the optimizer phase.

    `watched`: the hooks of one instance (`Tracker.watch_optimizer`), whose step's end ends
    the training step. Otherwise the global hooks, which see every optimizer: each step's end
    is a pending end of the training step (`timing.OPTIMIZER_DONE`), so the last optimizer
    step before the loop's next boundary ends it; once any optimizer is watched, they leave
    the watched ones to their own hooks and count another's step as optimizer time that ends
    no training step. Both record inline: these run every step.
    """
    events, now = tracker._events, tracker._now
    watching = tracker._step_optimizers  # never rebound
    phase = contract.PHASE_OPTIMIZER
    enter = ENTERS[phase]
    done_ops: dict[int, Op] = {}
    """Each optimizer's pending-end op, made once: the replay tells a second step of the same
    optimizer (a new iteration) from another optimizer's step (the same iteration)."""

    def done_op(optimizer: Any) -> Op:
        key = id(optimizer)
        op = done_ops.get(key)
        if op is None:
            if len(done_ops) >= _MAX_OPTIMIZERS:
                done_ops.clear()  # optimizers made and dropped in a loop: keep it bounded
            op = done_ops[key] = optimizer_done(key)
        return op

    def pre(optimizer: Any, args: Any, kwargs: Any) -> None:
        if not watched and watching and id(optimizer) in watching:
            return  # its own hooks count it
        record = tracker._record
        events.extend((now(), enter, None if record is None else record()))

    def post(optimizer: Any, args: Any, kwargs: Any) -> None:
        if not watched and watching:
            if id(optimizer) not in watching:
                tracker._pop(phase)  # a step of another optimizer: time, not a step's end
                tracker._mark()
            return
        record = tracker._record
        # done_op() inline for an optimizer seen before: a call fewer every step
        end = END_OPTIMIZER if watched else done_ops.get(id(optimizer)) or done_op(optimizer)
        events.extend((now(), end, None if record is None else record()))
        if tracker._profiling:  # a profile capture is pending or running: a step boundary
            tracker._profile_tick(id(optimizer))
        if len(events) >= tracker._flush_at:
            tracker.flush()

    return pre, post


def attach_optimizers(tracker: Recorder) -> list[Any]:
    """Global optimizer step hooks (every torch.optim optimizer); returns removable handles."""
    from torch.optim.optimizer import (
        register_optimizer_step_post_hook,
        register_optimizer_step_pre_hook,
    )

    pre, post = optimizer_hooks(tracker, watched=False)
    return [register_optimizer_step_pre_hook(pre), register_optimizer_step_post_hook(post)]


def attach_optimizer(tracker: Recorder, optimizer: Any) -> list[Any]:
    """Step hooks on one optimizer instance, whose step ends a training step at once."""
    pre, post = optimizer_hooks(tracker, watched=True)
    return [optimizer.register_step_pre_hook(pre), optimizer.register_step_post_hook(post)]
