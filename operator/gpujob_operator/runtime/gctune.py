"""Short collector pauses on a heap of thousands of ranks: freeze what has lived a while.

CPython's full (generation 2) collection walks every container object the process holds,
holding the GIL, so the event loop waits it out. Beside a 4,096-rank job the operator holds
half a million of them (each rank's endpoint, connection, series and task) and the frontier
bench logged 0.3-0.7 s pauses, about 18 a minute while scraping: each in-flight scrape's
objects outlived two young collections (every 700 allocations) and were promoted, and a full
collection runs whenever promotions reach a quarter of the old generation.

:func:`tune_collector` does three things:

- raises the young generation's threshold to :data:`GEN0_THRESHOLD` allocations, so an
  object must outlive a few hundred milliseconds of scraping, not a few, to be promoted;
- every ``freeze_seconds`` collects what is not frozen (a minute's worth of promotions:
  cheap) and moves every object left into the permanent generation (``gc.freeze``: a list
  splice, no walk). Full collections then walk only what was promoted since; the first
  one walks the whole heap once. A frozen object is still freed by reference counting;
  only a reference cycle that dies while frozen, and whatever it holds, waits for the next
  thaw (as does garbage of a collection skipped because another thread was collecting:
  ``gc.collect`` then returns 0 and does nothing);
- every ``thaw_seconds`` puts them back (``gc.unfreeze``) and collects once: one full pause
  per thaw instead of dozens a minute, logged with what it found (cycles that died frozen).

``freeze_seconds`` 0 leaves the collector as CPython sets it.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Final, Protocol

log = logging.getLogger("gpujob.gc")

GEN0_THRESHOLD: Final = 20_000
"""Allocations (net of frees) between young collections: each walks at most this many young
objects (a few milliseconds); CPython's 700 promoted every in-flight scrape."""
FREEZE_SECONDS: Final = 60.0
THAW_SECONDS: Final = 1800.0


class Collector(Protocol):
    """The parts of the ``gc`` module used (a fake in unit tests)."""

    def set_threshold(
        self, threshold0: int, threshold1: int = ..., threshold2: int = ...
    ) -> None: ...
    def get_threshold(self) -> tuple[int, int, int]: ...
    def freeze(self) -> None: ...
    def unfreeze(self) -> None: ...
    def get_freeze_count(self) -> int: ...
    def collect(self, generation: int = ...) -> int: ...


async def tune_collector(
    freeze_seconds: float,
    thaw_seconds: float,
    *,
    collector: Collector = gc,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> None:
    """For ever (cancel to stop): freeze every ``freeze_seconds``, thaw and collect every
    ``thaw_seconds``. Returns at once when ``freeze_seconds`` is 0."""
    if freeze_seconds <= 0:
        return
    _, gen1, gen2 = collector.get_threshold()
    collector.set_threshold(GEN0_THRESHOLD, gen1, gen2)
    last_thaw = clock()
    while True:
        await sleep(freeze_seconds)
        if clock() - last_thaw >= thaw_seconds:
            frozen = collector.get_freeze_count()
            collector.unfreeze()
            started = clock()
            found = collector.collect()
            last_thaw = clock()
            log.info(
                "thawed %d objects; a full collection took %.2fs and found %d unreachable "
                "(cycles that died frozen)",
                frozen,
                last_thaw - started,
                found,
            )
        else:
            # Only what was promoted since the last freeze is in generation 2: a full
            # collection walks a minute's worth, and what is frozen next is alive now.
            collector.collect()
        collector.freeze()
