"""The per-rank training tracker: counters, the phase stack, and step attribution.

Hooks on the model, the DataLoader and the optimizer (see `hooks.py`) or explicit `phase()`
blocks record events: a host timestamp and an op (enter, exit, end of step ...) appended to a
list. Nothing else runs on the training thread: at 10 ms steps every microsecond is 0.01% of
the step, and Python code that runs between two large kernels runs with cold caches, at
several times its cost in a tight loop. The phase stack, the marks and the attribution of
each step to phases are replayed from the events (`timing.Timeline`) when the exporter is
scraped, or by the training thread itself every few thousand events without scrapes (on CUDA
every few steps, once the steps' device times are readable, which also returns their events
to the pool). Counters the training thread alone writes (samples, tokens, the loss) are plain
attributes; the replay and what it adds up (`snapshot.Counters`) sit under one lock with the
scrape.
"""

from __future__ import annotations

import contextlib
import logging
import math
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

from gpujob_trainer import contract, flops, hooks, profiling
from gpujob_trainer.env import RankInfo, total_steps_from_env
from gpujob_trainer.snapshot import Counters, Snapshot
from gpujob_trainer.timing import (
    END_STEP,
    ENTERS,
    EXITS,
    MARK_HERE,
    POPS,
    SWITCH,
    Clock,
    CudaEventClock,
    HostClock,
    Mark,
    Op,
    Timeline,
    attribute,
    steps_ready,
)

if TYPE_CHECKING:
    from gpujob_trainer.exporter import Exporter

log = logging.getLogger("gpujob_trainer")

T = TypeVar("T")
M = TypeVar("M")
Opt = TypeVar("Opt")

_FLUSH_HOST = 40_000
"""Events (about ten a step) kept before the training thread replays them itself (no scrape)."""
_FLUSH_CUDA = 320
"""The same on CUDA: the ready steps' events then go back to the pool, not made anew."""
_MAX_PENDING_STEPS = 1024
"""CUDA steps kept waiting for a device that never catches up; older ones are dropped."""
_NUMBERS = (int, float)
_LOSS_EVERY = 0.5
"""Seconds between two loss tensors taken (the first is always taken)."""
_REANCHOR_SECONDS = 1.0
"""How far the wall and host clocks may drift apart before the mapping is re-read."""


def _step_number(value: Any, name: str) -> int:
    """A step count given by the user: a whole number, never negative, never a bool."""
    if isinstance(value, bool) or not isinstance(value, int | float) or value != int(value):
        raise ValueError(f"{name} must be a whole number of steps, got {value!r}")
    if value < 0:
        raise ValueError(f"{name} must be 0 or more, got {value}")
    return int(value)


class Tracker:
    """Records one rank's steps, phases, samples and loss.

    Make one per process (`gpujob_trainer.init()` does that and starts the exporter), wrap the
    model and the DataLoader, and each iteration of the loop is a training step, ended by its
    last optimizer step (see `watch_optimizer`, `end_step`). Everything is safe to call from
    autograd threads; nothing blocks on the GPU.
    """

    def __init__(
        self,
        *,
        total_steps: int | None = None,
        rank: RankInfo | None = None,
        clock: Clock | None = None,
        hook_optimizers: bool = True,
        wall_clock: Callable[[], float] = time.time,
        host_clock: Callable[[], float] = time.perf_counter,
        flops_per_sample: float | None = None,
        flops_per_token: float | None = None,
        measure_flops: bool = True,
        peak_tflops: float | None = None,
        device_uuid: Callable[[int], str] | None = None,
        start_step: int = 0,
    ) -> None:
        self.rank = rank if rank is not None else RankInfo.from_env()
        self.target_steps = total_steps if total_steps is not None else total_steps_from_env()
        self._clock: Clock = clock if clock is not None else HostClock()
        self._clock_fixed = clock is not None
        self._record: Callable[[], Any] | None = None
        """The clock's `record`, or None for host timing: an event then calls nothing more."""
        self._flush_at = _FLUSH_HOST
        self._set_clock(self._clock)
        self._wall = wall_clock
        self._now = host_clock
        self._lock = threading.Lock()
        self._c = Counters()
        # Written by the training thread only, read by scrapes: no lock.
        self._samples = 0
        self._tokens: int | None = None
        self._loss: Any = None
        """The last loss logged: a number, or a CPU tensor read at scrape time."""
        self._cpu_loss = False
        self._loss_at = -math.inf
        self._loss_warned = False
        self._events: list[Any] = []
        """Events (`timing.Event`, flattened) added by the training thread, consumed from the
        front under the lock. Never rebound: hooks hold it."""
        self._timeline = Timeline()
        self._anchor = (wall_clock(), host_clock())
        """(wall, host) seconds read together: event host times are moved onto the wall clock
        through it. Re-read only when the clocks drifted apart by over `_REANCHOR_SECONDS`
        (an NTP step, a suspended VM), so a heartbeat only moves when an event happened."""
        self._held = 0
        """Open busy phases (eval, checkpoint): inside one, the hooks neither switch phases
        nor count samples, so the whole block is that phase's time."""
        self._pending: deque[list[Mark]] = deque()
        self._pending_loss: deque[tuple[Any, Any]] = deque()
        self._epoch_explicit = False
        self._hook_optimizers = hook_optimizers
        self._step_optimizers: set[int] = set()
        self._handles: list[Any] = []
        self._optimizer_hooks_installed = False
        self._bwd = 0
        """Where the current backward pass is (see `hooks.attach_model`); 0 outside one."""
        self.exporter: Exporter | None = None
        self.cuda_device: int | None = None
        """Index of the model's CUDA device, once a CUDA model was wrapped."""
        self.flops = flops.FlopsCount(
            per_sample=flops_per_sample,
            per_token=flops_per_token,
            measure=measure_flops,
            peak_tflops=peak_tflops,
        )
        self._flops_countdown = flops.MEASURE_AT
        """Training forwards left before the one whose FLOPs are counted and whose precision
        is read; -1 while that count is open (the next forward closes it), 0 when done.
        Checked on every forward: one attribute read."""
        self._flops_mode: Any = None
        """The open FlopCounterMode while one forward and backward are counted."""
        self._flops_owner = 0
        """The thread that opened it: a dispatch mode is closed on the thread it was
        opened on, so a backward ending elsewhere leaves it to the next forward."""
        self._device_uuid = device_uuid if device_uuid is not None else flops.cuda_uuid
        self.devices: tuple[str, ...] = ()
        """UUIDs of the GPUs this rank drives: one under DDP, several under nn.DataParallel
        (the first gathers the outputs and holds the loss and the optimizer)."""
        self.start_step = _step_number(start_step, "start_step")
        """The run's step this process started from; the exported global step is this plus
        the steps this process made (`Snapshot.global_step`)."""
        self._profiling = False
        """Whether a profile capture is pending or running: the one attribute the step
        boundaries read (the optimizer hooks, `end_step`); while true they tick it."""
        self.profiler = profiling.Profiler(
            rank=self.rank.rank,
            arm=self._arm_profiling,
            cuda=lambda: self.cuda_device is not None,
            available=profiling.why_unavailable(),
        )
        """Profile captures on request (`contract.PROFILE_PATH`, see `profiling.py`)."""
        self.closed = False

    def _arm_profiling(self, on: bool) -> None:
        self._profiling = on

    def _profile_tick(self, optimizer: Any) -> None:
        """A step boundary while a capture is pending or running (see `profiling.Profiler`)."""
        self.profiler.tick(optimizer)

    # ----------------------------------------------------------------- events
    # The training threads take turns (the main thread waits while autograd runs the backward
    # hooks), so recording takes no lock. The hooks in `hooks.py` append the same tuples
    # inline, without these methods' extra call.
    def _event(self, op: Op) -> None:
        record = self._record
        self._events.extend((self._now(), op, None if record is None else record()))

    def _enter(self, phase: str) -> None:
        self._event(ENTERS[phase])

    def _exit(self, phase: str) -> None:
        self._event(EXITS[phase])

    def _switch(self, old: str, new: str) -> None:
        """Replace the innermost phase `old` by `new` (backward -> comm_wait)."""
        self._event((SWITCH, old, new))

    def _pop(self, phase: str) -> None:
        """Leave `phase` without a boundary (the next event draws it)."""
        self._events.extend((0.0, POPS[phase], None))

    def _mark(self) -> None:
        self._event(MARK_HERE)

    @property
    def _stack(self) -> list[str]:
        """The phase stack as of the last event (replays what is queued)."""
        with self._lock:
            self._flush_locked()
            return list(self._timeline.stack)

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Count the block's time as phase `name` (one of `contract.PHASES`).

        `eval` and `checkpoint` are busy phases (`contract.BUSY_PHASES`): the model and loader
        hooks stay quiet inside them (an evaluation's forwards count as eval, its batches as
        no training samples), and the operator reads a rank in one as busy, not hung.
        """
        if name not in contract.PHASES:
            raise ValueError(f"unknown phase {name!r}; expected one of {contract.PHASES}")
        busy = name in contract.BUSY_PHASES
        self._enter(name)
        if busy:
            self._held += 1
        try:
            yield
        finally:
            if busy:
                self._held -= 1
            self._exit(name)

    def evaluating(self) -> contextlib.AbstractContextManager[None]:
        """`phase("eval")`: wrap an evaluation loop between training steps."""
        return self.phase(contract.PHASE_EVAL)

    def transfer(self) -> contextlib.AbstractContextManager[None]:
        """`phase("h2d")`: wrap host-to-device copies written in the loop (`x.to(device)`).

        On CUDA the phase is timed by device events around the copies, so an asynchronous
        copy counts for what the GPU spent on it and nothing is synchronised.
        """
        return self.phase(contract.PHASE_H2D)

    def checkpointing(self) -> contextlib.AbstractContextManager[None]:
        """`phase("checkpoint")`: wrap saving (or loading) a checkpoint."""
        return self.phase(contract.PHASE_CHECKPOINT)

    def _on_wall_clock(self, host: float | None) -> float | None:
        """A host time as Unix time, through the anchor."""
        if host is None:
            return None
        wall0, host0 = self._anchor
        return wall0 + (host - host0)

    def _reanchor(self) -> None:
        wall, host = self._wall(), self._now()
        wall0, host0 = self._anchor
        if abs((wall - host) - (wall0 - host0)) > _REANCHOR_SECONDS:
            self._anchor = (wall, host)

    def end_step(self) -> None:
        """End the current step; call it where each iteration of your loop ends.

        Without optimizer hooks (`hook_optimizers=False`, nothing watched) this is what ends
        steps: the step ends now. With the global hooks an iteration's step already ends at its
        last optimizer step, counted at the loop's next boundary (a fetch, an eval); this
        counts it now instead, ending where that optimizer step ended, so calling it there
        too never makes two steps of one iteration. With no optimizer step since the last
        step's end, it ends a step now.

        Replays here when nothing scraped for a long while (the optimizer hook does the same).
        """
        self._event(END_STEP)
        if self._profiling:
            self.profiler.tick(None)
        if len(self._events) >= self._flush_at:
            self.flush()

    # ----------------------------------------------------------------- attribution
    def _flush_locked(self, final: bool = False) -> None:
        """Replay the queued events; attribute the steps they finished (host) or queue them
        until their device times are readable (CUDA). `final`: training is over, so a step
        whose end waits for the loop's next boundary ends where it stands."""
        events = self._events
        n = len(events)
        finished: list[list[Mark]] = []
        if n:
            batch = events[:n]
            del events[:n]  # one C call under the GIL: appends made meanwhile stay
            finished = self._timeline.feed(batch)
        if final:
            finished += self._timeline.finish()
        if finished:
            pending = self._pending
            for marks in finished:
                if not pending and marks[-1][2] is None:  # host timing: attribute now
                    self._c.account(attribute(marks))
                else:
                    pending.append(marks)
            while len(pending) > _MAX_PENDING_STEPS:  # the device never caught up: drop
                pending.popleft()
        self._resolve_locked()

    def _resolve_locked(self) -> None:
        clock, pending = self._clock, self._pending
        while pending and steps_ready(pending[0], clock):
            marks = pending.popleft()
            self._c.account(attribute(marks, clock))
            for m in marks[:-1]:  # the last mark starts the next step
                clock.release(m[2])
        while self._pending_loss and clock.ready(self._pending_loss[0][1]):
            host, event = self._pending_loss.popleft()
            self._loss = float(host)
            clock.release(event)

    def flush(self) -> None:
        """Attribute every step whose device times are readable now (never blocks)."""
        with self._lock:
            self._flush_locked()

    # ----------------------------------------------------------------- counters
    def resume(self, step: int) -> None:
        """Say the run is at global step `step` now (a checkpoint was loaded).

        Call it after loading a checkpoint, before or after this process made steps of its
        own: the exported global step becomes `step` and goes on from there, while the
        per-process counters (steps, samples, phase seconds) keep counting this process's
        work, so rates stay true. The operator shows the global step and records where the
        attempt resumed.
        """
        step = _step_number(step, "step")
        with self._lock:
            self._flush_locked()
            own = self._timeline.steps
            if step < own:  # e.g. a tracker reused by a second, fresh train() call
                log.warning(
                    "gpujob: resume(%d) is below the %d steps this process made; the run's "
                    "step stays this process's count",
                    step,
                    own,
                )
            self.start_step = max(0, step - own)

    @property
    def global_step(self) -> int:
        """The run's step: where this process started (or resumed) plus its own steps."""
        with self._lock:
            self._flush_locked()
            return self.start_step + self._timeline.steps

    def add_samples(self, samples: int, tokens: int | None = None) -> None:
        """Count samples (and tokens) consumed; the wrapped DataLoader does this per batch.

        Call it from the training thread (the counters have one writer and take no lock).
        """
        self._samples += int(samples)
        if tokens is not None:
            self._tokens = (self._tokens or 0) + int(tokens)

    def set_epoch(self, epoch: int) -> None:
        """Set the current epoch (0-based); stops the wrapped loader counting epochs itself."""
        with self._lock:
            self._epoch_explicit = True
            self._c.epoch = int(epoch)

    def _loader_epoch_started(self) -> None:
        with self._lock:
            if not self._epoch_explicit:
                self._c.epoch = 0 if self._c.epoch is None else self._c.epoch + 1

    def log(
        self,
        *,
        loss: Any = None,
        samples: int | None = None,
        tokens: int | None = None,
        epoch: int | None = None,
    ) -> None:
        """Report values the hooks cannot see.

        `loss` is a number or a one-element tensor. A tensor is taken at most every
        `_LOSS_EVERY` seconds (each torch call on the training thread costs microseconds at
        10 ms steps, and the gauge is scraped every few seconds): a CPU one is kept (detached)
        and read at scrape time, a CUDA one is copied behind the queued work and read once the
        copy landed, never synchronised.
        """
        if loss is not None:  # inline: most steps call this with a loss tensor and no more
            if isinstance(loss, _NUMBERS):
                self._loss = float(loss)
            elif self._now() - self._loss_at >= _LOSS_EVERY:  # else a recent one will do
                self._take_loss(loss)
        if samples is not None or tokens is not None:
            self.add_samples(samples or 0, tokens)
        if epoch is not None:
            self.set_epoch(epoch)

    def _take_loss(self, loss: Any) -> None:
        self._loss_at = self._now()
        if self._record is None and (self._cpu_loss or loss.is_cpu):
            self._cpu_loss = True  # the loss stays on the CPU: no need to ask each step
            self._loss = loss.detach()
            return
        value = loss.detach()
        if not value.is_cuda:  # another accelerator: read now
            self._loss = float(value)
            return
        # Copy to pinned host memory behind the work already queued; read when it lands.
        host = value.to("cpu", non_blocking=True)
        event = self._use_cuda_clock().record()
        if event is None:  # a host clock was forced on a CUDA loss: read it plainly
            self._loss = float(value)
            return
        with self._lock:
            self._pending_loss.append((host, event))
            while len(self._pending_loss) > 4:
                self._pending_loss.popleft()

    def _loss_value(self) -> float | None:
        loss = self._loss
        if loss is None or isinstance(loss, float):
            return loss
        try:
            return float(loss.detach())
        except (TypeError, ValueError, RuntimeError) as err:  # e.g. a tensor of many values
            if not self._loss_warned:
                self._loss_warned = True
                log.warning("gpujob: the logged loss is not one number, not exported: %s", err)
            return None

    def _drain(self) -> None:
        """After training: count the last step (its end no longer waits for a boundary) and
        wait for the last device events so the final steps are attributed."""
        with self._lock:
            self._flush_locked(final=True)
            events = [m[2] for marks in self._pending for m in marks]
            events += [event for _, event in self._pending_loss]
        for event in events:
            wait = getattr(event, "synchronize", None)
            if wait is not None:
                wait()
        self.flush()

    def snapshot(self) -> Snapshot:
        """Replay the events, attribute what is ready, then copy the counters.

        The heartbeat is the host time of the last event that drew a boundary (every phase
        change does), put on the wall clock; the current phase is the top of the replayed
        stack. So liveness costs the training thread nothing beyond its events. The clock
        timestamp is now on that same mapping, so the operator takes ages on this rank's clock.
        """
        with self._lock:
            self._flush_locked()
            self._reanchor()
            timeline = self._timeline
            heartbeat = self._on_wall_clock(timeline.last_mark_host)
            c = self._c
            loss = self._loss_value()
            return Snapshot(
                rank=self.rank,
                steps=timeline.steps,
                target_steps=self.target_steps,
                samples=self._samples,
                tokens=self._tokens,
                epoch=c.epoch,
                loss=loss,
                phase_seconds=dict(c.phase_seconds),
                compute_seconds=c.compute_seconds,
                step_count=c.step_count,
                step_sum=c.step_sum,
                step_buckets=c.step_buckets(),
                last_step_timestamp=self._on_wall_clock(timeline.last_step_host),
                heartbeat_timestamp=self._anchor[0] if heartbeat is None else heartbeat,
                clock_timestamp=self._on_wall_clock(self._now()),
                current_phase=timeline.stack[-1],
                model_flops=self.flops.total(timeline.steps, self._samples, self._tokens),
                peak=self.flops.peak(),
                devices=self.devices,
                start_step=self.start_step,
            )

    # ----------------------------------------------------------------- wrapping
    def wrap_model(self, model: M) -> M:
        """Time forward and backward (and DDP's exposed all-reduce wait); returns `model`.

        Also installs the global optimizer step hooks unless the tracker was made with
        `hook_optimizers=False`: an iteration's last optimizer step ends its training step. A CUDA model switches the tracker to CUDA event timing.
        """
        parameters = getattr(model, "parameters", None)
        first = next(iter(parameters()), None) if parameters is not None else None
        self._maybe_use_cuda_clock(first)
        self._note_devices(model, first)
        self._handles.extend(hooks.attach_model(self, model))
        if self._hook_optimizers:
            self._install_optimizer_hooks()
        return model

    def wrap_loader(
        self,
        loader: Iterable[T],
        *,
        tokens: Callable[[T], int] | None = None,
        samples: Callable[[T], int] | None = None,
        device: Any = None,
        non_blocking: bool = True,
    ) -> hooks.InstrumentedLoader[T]:
        """Time the wait for each batch and count its samples (and `tokens(batch)`).

        With `device`, each batch's tensors (in tuples, lists and dicts) are also moved there
        (`non_blocking`; asynchronous when the DataLoader pins memory) and the copy is timed
        as the `h2d` phase.
        """
        return hooks.InstrumentedLoader(
            self,
            loader,
            tokens_fn=tokens,
            samples_fn=samples,
            device=device,
            non_blocking=non_blocking,
        )

    def watch_optimizer(self, optimizer: Opt) -> Opt:
        """Hook this optimizer's steps: each ends a training step at once. Once any optimizer
        is watched, only watched ones end steps; the others' steps count as optimizer time.

        Not needed for several optimizers in one loop: the global hooks already make one
        step of an iteration, however many optimizers step in it. It is the escape hatch for
        steps that are not iterations: several updates per fetched batch, or a GAN without a
        wrapped loader (its generator's forward would start a step; watch the generator's
        optimizer). With `hook_optimizers=False` it hooks this instance and no other.
        """
        with self._lock:
            if id(optimizer) in self._step_optimizers:
                return optimizer
            self._step_optimizers.add(id(optimizer))
        self._handles.extend(hooks.attach_optimizer(self, optimizer))
        return optimizer

    def _install_optimizer_hooks(self) -> None:
        if self._optimizer_hooks_installed:
            return
        self._handles.extend(hooks.attach_optimizers(self))
        self._optimizer_hooks_installed = True

    def _maybe_use_cuda_clock(self, first: Any) -> None:
        """A model whose first parameter is on CUDA switches the tracker to CUDA events."""
        if first is not None and first.device.type == "cuda":
            self.cuda_device = first.device.index
            self._use_cuda_clock()

    def _note_devices(self, model: Any, first: Any) -> None:
        """The GPUs this rank drives: nn.DataParallel's device list, else the model's one."""
        ids = getattr(model, "device_ids", None)
        indexes: list[int] = []
        if type(model).__name__ == "DataParallel" and ids:
            indexes = [int(getattr(i, "index", i)) for i in ids]
        elif self.cuda_device is not None:
            indexes = [self.cuda_device]
        try:
            self.devices = tuple(self._device_uuid(i) for i in indexes)
        except Exception as exc:  # telemetry never stops training
            log.warning("gpujob: cannot name the rank's GPUs: %s", exc)
        if len(indexes) > 1:
            if self.cuda_device is None:
                self.cuda_device = indexes[0]
            # DataParallel runs the replicas' forwards on threads of its own, which a
            # dispatch mode (thread-local) does not follow: a count would miss them.
            self.flops.refuse("nn.DataParallel: give flops_per_sample for MFU")
        self.flops.note_device(flops.cuda_name(indexes[0]) if indexes else None)
        if first is not None:
            self.flops.note_params(str(first.dtype))

    def set_flops(self, *, per_sample: float | None = None, per_token: float | None = None) -> None:
        """Give the model's FLOPs (forward and backward) per sample or per token, when you
        know them better than one counted pass (then none is counted)."""
        self.flops.given(per_sample=per_sample, per_token=per_token)

    def _flops_forward(self, args: Any, kwargs: Any) -> None:
        """On a training forward while the count is still to take (or open)."""
        if self._flops_countdown < 0:  # the counted pass is over, whatever ended it
            self._flops_end()
            if self._flops_mode is None:
                self._flops_countdown = 0
            return
        torch = sys.modules.get("torch")
        if torch is not None and not torch.is_grad_enabled():
            return  # an inference forward outside evaluating(): not a training pass
        self._flops_countdown -= 1
        if self._flops_countdown <= 0:
            self._flops_mode = self.flops.begin(args, kwargs)
            self._flops_owner = threading.get_ident()
            self._flops_countdown = -1 if self._flops_mode is not None else 0

    def _flops_end(self) -> None:
        """After the counted backward (or at the next forward, or at close): read the count.
        Only on the thread that opened it; elsewhere the next forward does it."""
        mode = self._flops_mode
        if mode is None or threading.get_ident() != self._flops_owner:
            return
        self._flops_mode = None
        self.flops.end(mode)

    def _use_cuda_clock(self) -> Clock:
        with self._lock:
            if not self._clock_fixed and not isinstance(self._clock, CudaEventClock):
                self._set_clock(CudaEventClock())
            return self._clock

    def _set_clock(self, clock: Clock) -> None:
        self._clock = clock
        host = isinstance(clock, HostClock)
        self._record = None if host else clock.record
        self._flush_at = _FLUSH_HOST if host else _FLUSH_CUDA

    # ----------------------------------------------------------------- exporter, close
    def start_exporter(
        self,
        port: int | None = None,
        addr: str | None = None,
        *,
        gpu_telemetry: bool | None = None,
    ) -> Exporter:
        """Serve this rank's metrics over HTTP on `port` (default: base port + LOCAL_RANK).

        `gpu_telemetry` (default: local rank 0) adds the NVML collector for the node's GPUs.
        """
        from gpujob_trainer.exporter import Exporter

        if self.exporter is None:
            exporter = Exporter.for_tracker(self, port=port, addr=addr, gpu=gpu_telemetry)
            exporter.start()
            self.exporter = exporter
        return self.exporter

    def close(self, linger: float = 0.0) -> None:
        """Remove hooks, then keep serving for `linger` seconds and stop the exporter."""
        self._flops_end()  # a count still open (a forward that never had a backward)
        self.profiler.close()  # a capture not yet captured fails: no step will come
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        self._optimizer_hooks_installed = False
        self._drain()
        if self.exporter is not None:
            if linger > 0:
                self.exporter.wait_stopped(linger)
            self.exporter.stop()
        self.closed = True
