"""What held the event loop when it woke late: its own work, the GIL, or no CPU (pure).

A late loop is the operator's latency for every job, but not always the operator's doing.
On a busy machine the process may get no CPU at all; with busy API or parsing threads the
loop thread may wait for the GIL; only the first cause, work the loop itself ran, is fixed
by moving that work off the loop. Over the stretch a lag spans, the loop thread's CPU time
(``time.thread_time`` on it) and the process's (``time.process_time``) tell them apart.
"""

from __future__ import annotations

from typing import Final

COUNTED_LAG: Final = 0.1
"""Lags longer than this are counted by cause (the loop-lag probe wakes every 0.1 s)."""
LOOP, GIL, CPU = "loop", "gil", "cpu"
LAG_CAUSES: Final = (LOOP, GIL, CPU)
SAYS: Final = {
    LOOP: "the loop's own work",
    GIL: "the loop thread waiting for the GIL while the operator's other threads ran",
    CPU: "the process waiting for CPU (the machine is busy)",
}


def lag_cause(wall: float, loop_cpu: float, process_cpu: float) -> str:
    """Why a stretch of ``wall`` seconds ran late, given the CPU seconds the loop thread
    (``loop_cpu``) and the whole process (``process_cpu``) used in it: LOOP when the loop
    thread ran for half of it or more, GIL when the other threads did, else CPU."""
    if loop_cpu >= wall / 2:
        return LOOP
    if process_cpu - loop_cpu >= wall / 2:
        return GIL
    return CPU
