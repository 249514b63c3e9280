"""What held the event loop when it woke late: its own work, the GIL, the CPU, or a block.

A late loop is the operator's latency for every job, but not always the operator's doing.
On a busy machine the loop thread may sit runnable on a run queue; with busy API or parsing
threads it may wait for the GIL; it may block in a system call; only the first of these,
work the loop itself ran, is fixed by moving that work off the loop. Over the stretch a lag
spans, three figures tell them apart: the loop thread's CPU time (``time.thread_time`` on
it), the CPU time of the process's other threads (``time.process_time`` less that), and how
long the loop thread waited on a run queue (Linux's ``/proc/thread-self/schedstat``).
`cpu_times` reads them (on the loop, for the loop thread); `spent` and `lag_cause` are pure.
"""

from __future__ import annotations

import time
from typing import Final

COUNTED_LAG: Final = 0.1
"""Lags longer than this are counted by cause (the loop-lag probe wakes every 0.1 s)."""
LOOP, GIL, CPU, BLOCKED = "loop", "gil", "cpu", "blocked"
LAG_CAUSES: Final = (LOOP, GIL, CPU, BLOCKED)
SAYS: Final = {
    LOOP: "the loop's own work",
    GIL: "the loop thread waiting for the GIL while the operator's other threads ran",
    CPU: "the loop thread runnable but not run (the machine is busy, or a CPU limit)",
    BLOCKED: "the loop thread blocked (a system call, a lock, paging) or unaccounted",
}


CpuTimes = tuple[float, float, float | None]
"""CPU seconds of a thread and of its process, and the thread's run-queue wait (None: unknown)."""


def cpu_times() -> CpuTimes:
    """`CpuTimes` of the calling thread."""
    return time.thread_time(), time.process_time(), read_queued()


def spent(before: CpuTimes, after: CpuTimes) -> tuple[float, float, float | None]:
    """What a stretch between two readings cost: the thread's CPU, the process's, and the
    thread's run-queue wait (None when either reading lacks it)."""
    queued = None if before[2] is None or after[2] is None else after[2] - before[2]
    return after[0] - before[0], after[1] - before[1], queued


def lag_cause(
    wall: float, loop_cpu: float, process_cpu: float, loop_queued: float | None = None
) -> str:
    """Why a stretch of ``wall`` seconds ran late: the largest of the loop thread's CPU
    (LOOP), its wait on a run queue (CPU) and the other threads' CPU (GIL); BLOCKED when
    even the largest is under a quarter of the stretch. ``loop_queued`` None (no schedstat):
    the time neither the loop nor the other threads ran is taken as the run-queue wait."""
    others = max(0.0, process_cpu - loop_cpu)
    if loop_queued is None:
        loop_queued = max(0.0, wall - loop_cpu - others)
    seconds, cause = max((loop_cpu, LOOP), (loop_queued, CPU), (others, GIL))
    return cause if seconds >= wall / 4 else BLOCKED


def read_queued(path: str = "/proc/thread-self/schedstat") -> float | None:
    """Seconds the calling thread has waited on a run queue (None where Linux does not say)."""
    try:
        with open(path, "rb") as f:
            return int(f.read().split()[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return None
