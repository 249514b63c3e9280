"""What the hooks use of a tracker: the narrow handle between `hooks` and `tracker`.

The tracker installs the hooks (`hooks.attach_model`, the loader, the optimizers) and hands
them itself; the hooks then record into it inline, on the training thread, every step. They
name the tracker only through :class:`Recorder`, so `hooks` never imports `tracker` (which
imports `hooks` and `flops`, and `flops` uses `hooks.batch_size`): the library's modules
import each other in one direction only, even for annotations, and
``tests/unit/repo/test_repository.py`` keeps it so.

The members keep the tracker's underscored names: they are the tracker's internals, shared
with the hooks of this package alone (a public name here would invite users to call them),
and reading them is all the hot path costs (a protocol adds no call at run time).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol


class Recorder(Protocol):
    """A tracker as its hooks see it (`tracker.Tracker` is the one implementation)."""

    @property
    def _events(self) -> list[Any]:
        """The event list the hooks extend with (host time, op, device record); never
        rebound, so a hook may hold it."""
        ...

    @property
    def _now(self) -> Callable[[], float]:
        """The host clock of the events."""
        ...

    @property
    def _record(self) -> Callable[[], Any] | None:
        """The device clock's `record`, or None for host timing (read at each event: the
        tracker switches to CUDA timing once it sees a CUDA model)."""
        ...

    @property
    def _held(self) -> int:
        """Open busy phases (eval, checkpoint): inside one, the hooks record nothing."""
        ...

    @property
    def _flush_at(self) -> int:
        """Events kept before the training thread replays them itself."""
        ...

    @property
    def _step_optimizers(self) -> set[int]:
        """Ids of the watched optimizers (never rebound)."""
        ...

    @property
    def _flops_countdown(self) -> int:
        """Training forwards left before the counted one (0: no count to take)."""
        ...

    @property
    def _flops_mode(self) -> Any:
        """The open FLOP counter, while a forward and its backward are counted."""
        ...

    @property
    def _profiling(self) -> bool:
        """Whether a profile capture is pending or running (step boundaries then tick it)."""
        ...

    _bwd: int
    """Where the current backward pass is (`hooks` owns its states); 0 outside one."""
    _samples: int
    """Samples trained so far (the loader counts them)."""
    _tokens: int | None
    """Tokens trained so far; None while nobody counted any."""

    def _enter(self, phase: str) -> None: ...

    def _exit(self, phase: str) -> None: ...

    def _pop(self, phase: str) -> None:
        """Leave `phase` without a boundary (the next event draws it)."""
        ...

    def _mark(self) -> None: ...

    def _loader_epoch_started(self) -> None:
        """A wrapped loader began a pass over its data (an epoch, unless set explicitly)."""
        ...

    def _flops_forward(self, args: Any, kwargs: Any) -> None:
        """A training forward while the FLOPs are still to count (or open)."""
        ...

    def _flops_end(self) -> None:
        """The counted backward is over: read the count."""
        ...

    def _profile_tick(self, optimizer: Any) -> None:
        """A step boundary (an optimizer step's end, by the optimizer's key) while a
        profile capture is pending or running."""
        ...

    def flush(self) -> None:
        """Replay the events recorded so far (the training thread, when many are kept)."""
        ...
