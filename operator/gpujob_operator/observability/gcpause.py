"""How long the garbage collector held the process, by generation.

A full (generation 2) collection walks every container object the process holds; with
thousands of ranks' state that is long enough to stall the event loop, and the loop-lag
metric alone cannot tell such a pause from a slow handler. :class:`GcPauses` hooks
``gc.callbacks`` and keeps a histogram per generation plus the last full collection, which
the stall watch names when a stall overlapped it.

The callback runs inside whatever allocation set the collector off, on any thread, possibly
while that thread holds a lock: so it takes none and allocates next to nothing. Readers copy
its lists (atomic under the GIL); a reading may be a collection behind, never torn by type.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from gpujob_operator.observability.histogram import Histogram

PAUSE_BUCKETS: Final = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
GENERATIONS: Final = (0, 1, 2)


@dataclass(frozen=True)
class FullCollection:
    """The last generation-2 collection: when it ended (the clock's time) and how long it ran."""

    ended: float
    seconds: float


class GcPauses:
    """Per-generation pause histograms, fed by ``gc.callbacks`` once :meth:`install`-ed."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.histograms = {g: Histogram(PAUSE_BUCKETS) for g in GENERATIONS}
        self.longest = 0.0
        self.last_full: FullCollection | None = None
        self._started: float | None = None
        """When the collection under way began; None: none heard of (a callback installed
        mid-collection hears its stop without its start)."""

    def callback(self, phase: str, info: dict[str, Any]) -> None:
        """``gc.callbacks``' signature: ``start`` then ``stop`` around each collection."""
        now = self.clock()
        if phase == "start":
            self._started = now
            return
        started, self._started = self._started, None
        if started is None:
            return
        self.observe(int(info.get("generation", 2)), max(now - started, 0.0), now)

    def observe(self, generation: int, seconds: float, ended: float) -> None:
        """One collection of ``generation`` ran ``seconds``, ending at ``ended``."""
        histogram = self.histograms.get(generation)
        if histogram is None:
            return
        histogram.observe(seconds)
        self.longest = max(self.longest, seconds)
        if generation == 2:
            self.last_full = FullCollection(ended, seconds)

    def full_within(self, start: float, end: float) -> FullCollection | None:
        """The last full collection if it ended between ``start`` and ``end`` (a stall's span)."""
        full = self.last_full
        return full if full is not None and start <= full.ended <= end else None

    @property
    def sums(self) -> dict[int, float]:
        """Seconds spent in each generation's collections."""
        return {g: h.sum for g, h in self.histograms.items()}

    def buckets(self, generation: int) -> list[tuple[str, float]]:
        """Cumulative ``(le, count)`` pairs, as a Prometheus histogram renders them."""
        return self.histograms[generation].buckets()

    def install(self) -> GcPauses:
        """Start hearing of collections (idempotent)."""
        if self.callback not in gc.callbacks:
            gc.callbacks.append(self.callback)
        return self

    def uninstall(self) -> None:
        while self.callback in gc.callbacks:
            gc.callbacks.remove(self.callback)


GC_PAUSES: Final = GcPauses()
"""The process's one instrument: the operator installs it at start-up, its /metrics renders it."""
