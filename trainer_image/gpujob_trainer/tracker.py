"""The per-rank training tracker: counters, the phase stack, and step attribution.

Hooks on the model, the DataLoader and the optimizer (see `hooks.py`) or explicit `phase()`
blocks move the tracker between phases; each move takes a mark (`timing.py`). An optimizer
step ends a step: its marks are queued and attributed once their device times are readable
(at once on CPU). Counters are plain floats under one lock, read by the exporter at scrape
time, so the training thread pays for a few timestamps per step and nothing else.
"""

from __future__ import annotations

import bisect
import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from gpujob_trainer import contract
from gpujob_trainer.env import RankInfo, total_steps_from_env
from gpujob_trainer.timing import Clock, CudaEventClock, HostClock, Mark, attribute, steps_ready

if TYPE_CHECKING:
    from gpujob_trainer.exporter import Exporter
    from gpujob_trainer.hooks import InstrumentedLoader

log = logging.getLogger("gpujob_trainer")

T = TypeVar("T")
M = TypeVar("M")
Opt = TypeVar("Opt")

_MAX_PENDING_STEPS = 1024


@dataclass(frozen=True)
class Snapshot:
    """A consistent copy of a rank's counters, taken at scrape time."""

    rank: RankInfo
    steps: int
    target_steps: int | None
    samples: int
    tokens: int | None
    epoch: int | None
    loss: float | None
    phase_seconds: dict[str, float]
    compute_seconds: float
    step_count: int
    step_sum: float
    step_buckets: tuple[int, ...]
    """Cumulative counts per bound of `contract.STEP_DURATION_BUCKETS`, then +Inf."""
    last_step_timestamp: float | None
    heartbeat_timestamp: float | None = None
    """Unix time the training thread last changed phase (or made the tracker)."""
    current_phase: str = contract.PHASE_OTHER
    """The phase the rank is in now (the innermost one)."""


@dataclass
class _Counters:
    steps: int = 0
    samples: int = 0
    tokens: int | None = None
    epoch: int | None = None
    loss: float | None = None
    phase_seconds: dict[str, float] = field(
        default_factory=lambda: dict.fromkeys(contract.PHASES, 0.0)
    )
    compute_seconds: float = 0.0
    step_count: int = 0
    step_sum: float = 0.0
    step_hits: list[int] = field(
        default_factory=lambda: [0] * (len(contract.STEP_DURATION_BUCKETS) + 1)
    )
    last_step_timestamp: float | None = None


class Tracker:
    """Records one rank's steps, phases, samples and loss.

    Make one per process (`gpujob_trainer.init()` does that and starts the exporter), wrap the
    model and the DataLoader, and the optimizer's steps delimit training steps. Everything is
    safe to call from autograd threads; nothing blocks on the GPU.
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
    ) -> None:
        self.rank = rank if rank is not None else RankInfo.from_env()
        self.target_steps = total_steps if total_steps is not None else total_steps_from_env()
        self._clock: Clock = clock if clock is not None else HostClock()
        self._clock_fixed = clock is not None
        self._wall = wall_clock
        self._now = host_clock
        self._lock = threading.Lock()
        self._c = _Counters()
        self._marks: list[Mark] = []
        self._stack: list[str] = [contract.PHASE_OTHER]
        self._anchor = (wall_clock(), host_clock())
        """(wall, host) seconds read together, re-read at each step's end: heartbeats are
        mark host times moved onto the wall clock through it, so they only change when a
        mark does (a value that moved between scrapes means the rank changed phase)."""
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
        self._bwd_armed = False
        self.exporter: Exporter | None = None
        self.cuda_device: int | None = None
        """Index of the model's CUDA device, once a CUDA model was wrapped."""
        self.closed = False

    # ----------------------------------------------------------------- marks and phases
    # The phase stack and the current step's marks belong to the training threads, which take
    # turns (the main thread waits while autograd runs the backward hooks), so marking takes
    # no lock: only the hand-off of a finished step and the counters are shared with scrapes.
    def _mark(self, phase: str) -> Mark:
        mark = (self._now(), phase, self._clock.record())
        self._marks.append(mark)
        return mark

    def _enter(self, phase: str) -> None:
        self._stack.append(phase)
        self._marks.append((self._now(), phase, self._clock.record()))

    def _exit(self, phase: str) -> None:
        stack = self._stack
        if stack[-1] == phase and len(stack) > 1:
            stack.pop()
        else:
            self._pop(phase)
        self._marks.append((self._now(), stack[-1], self._clock.record()))

    def _switch(self, old: str, new: str) -> None:
        """Replace the innermost phase `old` by `new` (backward -> comm_wait)."""
        self._pop(old)
        self._enter(new)

    def _pop(self, phase: str) -> None:
        # Pop the innermost occurrence; tolerate a mismatch (an exception mid-phase) rather
        # than let bookkeeping break training.
        stack = self._stack
        for i in range(len(stack) - 1, 0, -1):
            if stack[i] == phase:
                del stack[i]
                return

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

    def checkpointing(self) -> contextlib.AbstractContextManager[None]:
        """`phase("checkpoint")`: wrap saving (or loading) a checkpoint."""
        return self.phase(contract.PHASE_CHECKPOINT)

    def _liveness(self) -> tuple[float, str]:
        """(heartbeat as Unix time, current phase), read at scrape time.

        The heartbeat is the host time of the last mark (every phase change takes one), so the
        training thread pays nothing extra; it is put on the wall clock at scrape time.
        """
        marks = self._marks
        wall0, host0 = self._anchor
        last = marks[-1][0] if marks else host0
        return wall0 + (last - host0), self._stack[-1]

    def end_step(self) -> None:
        """End the current step. Called by the optimizer hook; call it yourself without one."""
        end = self._mark(self._stack[-1])
        marks, self._marks = self._marks, [end]
        wall = self._wall()
        self._anchor = (wall, end[0])
        with self._lock:
            c = self._c
            c.steps += 1
            c.last_step_timestamp = wall
            if len(marks) < 2:
                return
            if end[2] is None and not self._pending:  # host timing: attribute at once
                self._account_locked(attribute(marks))
                return
            self._pending.append(marks)
            if len(self._pending) > _MAX_PENDING_STEPS:  # the device never caught up: drop
                self._pending.popleft()
            self._resolve_locked()

    # ----------------------------------------------------------------- attribution
    def _resolve_locked(self) -> None:
        clock = self._clock
        while self._pending and steps_ready(self._pending[0], clock):
            marks = self._pending.popleft()
            self._account_locked(attribute(marks, clock))
            for m in marks[:-1]:  # the last mark starts the next step
                clock.release(m[2])
        while self._pending_loss and clock.ready(self._pending_loss[0][1]):
            host, event = self._pending_loss.popleft()
            self._c.loss = float(host)
            clock.release(event)

    def _account_locked(self, phases: dict[str, float]) -> None:
        c = self._c
        totals = c.phase_seconds
        duration = 0.0
        for name, seconds in phases.items():
            totals[name] += seconds
            duration += seconds
        c.compute_seconds += (
            phases[contract.PHASE_FORWARD]
            + phases[contract.PHASE_BACKWARD]
            + phases[contract.PHASE_OPTIMIZER]
        )
        c.step_count += 1
        c.step_sum += duration
        c.step_hits[bisect.bisect_left(contract.STEP_DURATION_BUCKETS, duration)] += 1

    def flush(self) -> None:
        """Attribute every step whose device times are readable now (never blocks)."""
        with self._lock:
            self._resolve_locked()

    # ----------------------------------------------------------------- counters
    def add_samples(self, samples: int, tokens: int | None = None) -> None:
        """Count samples (and tokens) consumed; the wrapped DataLoader does this per batch."""
        with self._lock:
            self._c.samples += int(samples)
            if tokens is not None:
                self._c.tokens = (self._c.tokens or 0) + int(tokens)

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
        """Report values the hooks cannot see. A CUDA loss tensor is read lazily, never synced."""
        if samples is not None or tokens is not None:
            self.add_samples(samples or 0, tokens)
        if epoch is not None:
            self.set_epoch(epoch)
        if loss is not None:
            self._log_loss(loss)

    def _log_loss(self, loss: Any) -> None:
        if isinstance(loss, int | float):
            with self._lock:
                self._c.loss = float(loss)
            return
        value = loss.detach()
        if value.device.type != "cuda":
            with self._lock:
                self._c.loss = float(value)
            return
        # Copy to pinned host memory behind the work already queued; read when it lands.
        host = value.to("cpu", non_blocking=True)
        event = self._use_cuda_clock().record()
        if event is None:  # a host clock was forced on a CUDA loss: read it plainly
            with self._lock:
                self._c.loss = float(value)
            return
        with self._lock:
            self._pending_loss.append((host, event))
            while len(self._pending_loss) > 4:
                self._pending_loss.popleft()

    def _drain(self) -> None:
        """After training: wait for the last device events so the final steps count."""
        with self._lock:
            events = [m[2] for marks in self._pending for m in marks]
            events += [event for _, event in self._pending_loss]
        for event in events:
            wait = getattr(event, "synchronize", None)
            if wait is not None:
                wait()
        self.flush()

    def snapshot(self) -> Snapshot:
        """Attribute what is ready, then copy the counters."""
        heartbeat, current = self._liveness()
        with self._lock:
            self._resolve_locked()
            c = self._c
            cumulative: list[int] = []
            running = 0
            for hits in c.step_hits:
                running += hits
                cumulative.append(running)
            return Snapshot(
                rank=self.rank,
                steps=c.steps,
                target_steps=self.target_steps,
                samples=c.samples,
                tokens=c.tokens,
                epoch=c.epoch,
                loss=c.loss,
                phase_seconds=dict(c.phase_seconds),
                compute_seconds=c.compute_seconds,
                step_count=c.step_count,
                step_sum=c.step_sum,
                step_buckets=tuple(cumulative),
                last_step_timestamp=c.last_step_timestamp,
                heartbeat_timestamp=heartbeat,
                current_phase=current,
            )

    # ----------------------------------------------------------------- wrapping
    def wrap_model(self, model: M) -> M:
        """Time forward and backward (and DDP's exposed all-reduce wait); returns `model`.

        Also installs the optimizer step hooks unless the tracker was made with
        `hook_optimizers=False`. A CUDA model switches the tracker to CUDA event timing.
        """
        from gpujob_trainer import hooks

        self._maybe_use_cuda_clock(model)
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
    ) -> InstrumentedLoader[T]:
        """Time the wait for each batch and count its samples (and `tokens(batch)`)."""
        from gpujob_trainer.hooks import InstrumentedLoader

        return InstrumentedLoader(self, loader, tokens_fn=tokens, samples_fn=samples)

    def watch_optimizer(self, optimizer: Opt) -> Opt:
        """Hook this optimizer's steps; once any is watched, only watched ones end a step.

        Use it for loops with several optimizers (a GAN's), or with `hook_optimizers=False`
        to hook one optimizer instance instead of every optimizer in the process.
        """
        from gpujob_trainer import hooks

        with self._lock:
            if id(optimizer) in self._step_optimizers:
                return optimizer
            self._step_optimizers.add(id(optimizer))
        self._handles.extend(hooks.attach_optimizer(self, optimizer))
        return optimizer

    def _install_optimizer_hooks(self) -> None:
        if self._optimizer_hooks_installed:
            return
        from gpujob_trainer import hooks

        self._handles.extend(hooks.attach_optimizers(self))
        self._optimizer_hooks_installed = True

    def _optimizer_begin(self, optimizer: object, *, watched: bool = False) -> None:
        if watched or id(optimizer) not in self._step_optimizers:
            self._enter(contract.PHASE_OPTIMIZER)

    def _optimizer_end(self, optimizer: object, *, watched: bool = False) -> None:
        if not watched and id(optimizer) in self._step_optimizers:
            return  # its own hooks count it
        self._pop(contract.PHASE_OPTIMIZER)
        if watched or not self._step_optimizers:
            self.end_step()
        else:
            self._mark(self._stack[-1])

    def _maybe_use_cuda_clock(self, model: object) -> None:
        parameters = getattr(model, "parameters", None)
        if parameters is None:
            return
        first = next(iter(parameters()), None)
        if first is not None and first.device.type == "cuda":
            self.cuda_device = first.device.index
            self._use_cuda_clock()

    def _use_cuda_clock(self) -> Clock:
        with self._lock:
            if not self._clock_fixed and not isinstance(self._clock, CudaEventClock):
                self._clock = CudaEventClock()
            return self._clock

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
