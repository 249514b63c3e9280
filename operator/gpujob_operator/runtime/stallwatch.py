"""Where the event loop is when it stalls: a thread that looks at the loop's stack.

The loop-lag metric says that every job's handling waited, not on what. A watchdog thread
reads how long ago the loop last ticked (:meth:`StallWatch.tick`, called by the loop-lag
probe); when that passes :data:`STALL_SECONDS` it takes the loop thread's innermost frames
(``sys._current_frames``: no signal, nothing stops) and logs them once per stall, with how
long the stall lasted once it ends. A stall's culprit is then in the operator's log; when a
full garbage collection ended inside the stall, the log says how long it ran, since the
stack then shows only where the collector happened to be set off. It also says what held
the loop (`looplag`): its own work, the GIL, a machine that left the loop thread waiting for
CPU, or a block, from what the loop thread and the process did over the stall.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
import traceback
from collections.abc import Callable
from typing import Final

from gpujob_operator.observability.gcpause import GcPauses
from gpujob_operator.observability.looplag import SAYS, CpuTimes, cpu_times, lag_cause, spent

log = logging.getLogger("gpujob.stall")

STALL_SECONDS: Final = 0.5
"""A loop that has not ticked for this long is stalled (its probe ticks every 0.1 s)."""
CHECK_SECONDS: Final = 0.1
FRAMES: Final = 12
"""The innermost frames logged of a stalled loop's stack."""


def stack_of(thread_id: int, frames: int = FRAMES) -> list[str]:
    """The innermost ``frames`` of a thread's stack as ``file:line in function`` lines,
    innermost last; empty when the thread is gone."""
    frame = sys._current_frames().get(thread_id)
    if frame is None:
        return []
    summary = traceback.extract_stack(frame, limit=frames)
    return [f"{f.filename}:{f.lineno} in {f.name}" for f in summary]


class StallWatch:
    """Watch one loop thread; :meth:`tick` from that loop, :meth:`start` from anywhere."""

    def __init__(
        self,
        thread_id: int,
        stall_seconds: float = STALL_SECONDS,
        clock: Callable[[], float] = time.monotonic,
        gc_pauses: GcPauses | None = None,
        cpu: Callable[[], CpuTimes] = cpu_times,
    ) -> None:
        self.thread_id = thread_id
        self.cpu = cpu
        """The loop thread's `CpuTimes`, read on the loop (in tick)."""
        self.last_cpu = cpu()
        self.gc_pauses = gc_pauses
        self.stall_seconds = stall_seconds
        self.clock = clock
        self.last_tick = clock()
        self.stalls = 0
        self.reported: list[str] | None = None
        """The stack of the stall being reported (None: the loop is ticking)."""
        self._stop = threading.Event()

    def tick(self, cpu: CpuTimes | None = None) -> None:
        """The loop ran: called by the loop-lag probe on each of its wake-ups, with the loop
        thread's `CpuTimes` it read then (None: read them here)."""
        now = self.clock()
        cpu = self.cpu() if cpu is None else cpu
        if self.reported is not None:
            full = self.gc_pauses.full_within(self.last_tick, now) if self.gc_pauses else None
            wall = now - self.last_tick
            loop_cpu, process_cpu, queued = spent(self.last_cpu, cpu)
            waited = "" if queued is None else f", it waited {queued:.2f}s for a CPU"
            log.warning(
                "the event loop was stalled for %.2fs (every job's handling waited); it was in "
                "%s%s; the loop thread ran %.2fs of it%s, the operator's other threads %.2fs: %s",
                wall,
                self.reported[-1] if self.reported else "an unknown frame",
                f"; a full garbage collection took {full.seconds:.2f}s of it" if full else "",
                loop_cpu,
                waited,
                max(0.0, process_cpu - loop_cpu),
                SAYS[lag_cause(wall, loop_cpu, process_cpu, queued)],
            )
            self.reported = None
        self.last_tick = now
        self.last_cpu = cpu

    def check(self) -> None:
        """One look (the thread calls it every :data:`CHECK_SECONDS`)."""
        since = self.last_tick
        stalled = self.clock() - since
        if stalled < self.stall_seconds or self.reported is not None:
            return
        stack = stack_of(self.thread_id)
        if self.last_tick != since:
            return  # the loop ran again meanwhile: this stack is not the stall's
        self.reported = stack
        self.stalls += 1
        log.warning(
            "the event loop has not run for %.2fs; its stack, innermost last:\n  %s",
            stalled,
            "\n  ".join(self.reported) or "(not found)",
        )

    def start(self) -> None:
        threading.Thread(target=self._run, name="stall watch", daemon=True).start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(CHECK_SECONDS):
            self.check()
