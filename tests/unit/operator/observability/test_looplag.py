"""What held a late event loop: the loop thread's CPU, its run-queue wait, the other threads."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpujob_operator.observability.looplag import (
    BLOCKED,
    CPU,
    GIL,
    LOOP,
    lag_cause,
    read_queued,
)
from gpujob_operator.observability.opmetrics import JobMetrics


@pytest.mark.parametrize(
    ("wall", "loop_cpu", "process_cpu", "queued", "cause"),
    [
        (0.6, 0.45, 0.5, 0.1, LOOP),  # the loop ran most of it: its own work
        (0.6, 0.05, 0.6, 0.0, GIL),  # the other threads ran, the loop waited for the GIL
        (0.6, 0.05, 0.1, 0.5, CPU),  # runnable on a run queue: the machine gave it no CPU
        (0.74, 0.28, 0.30, 0.40, CPU),  # a mixed stretch: blamed on what took the most
        (1.0, 0.3, 0.7, 0.0, GIL),  # the other threads ran 0.4 s, more than the loop
        (0.6, 0.02, 0.03, 0.01, BLOCKED),  # nobody ran nor waited to: a system call, a lock
        (0.6, 0.05, 0.1, None, CPU),  # no schedstat: the unaccounted time is the queue's
    ],
)
def test_a_lag_is_blamed_on_what_took_most_of_it(
    wall: float, loop_cpu: float, process_cpu: float, queued: float | None, cause: str
) -> None:
    assert lag_cause(wall, loop_cpu, process_cpu, queued) == cause


def test_the_run_queue_wait_is_read_from_schedstat(tmp_path: Path) -> None:
    stat = tmp_path / "schedstat"
    stat.write_text("119562 1836327000 2\n")
    assert read_queued(str(stat)) == pytest.approx(1.836327)
    assert read_queued(str(tmp_path / "absent")) is None
    stat.write_text("garbage\n")
    assert read_queued(str(stat)) is None


def test_only_lags_over_a_tenth_of_a_second_are_counted_by_cause() -> None:
    metrics = JobMetrics(process=False)
    metrics.observe_loop_lag(0.05, LOOP)
    metrics.observe_loop_lag(0.3, LOOP)
    metrics.observe_loop_lag(0.3, CPU)
    metrics.observe_loop_lag(0.4, CPU)
    metrics.observe_loop_lag(0.4)  # no cause given: in the histogram only
    text = "\n".join(
        f"{s.name}{s.labels} {s.value}"
        for fam in metrics.registry.collect()
        for s in fam.samples
        if s.name == "gpujob_operator_event_loop_lags_total"
    )
    assert "{'cause': 'loop'} 1.0" in text and "{'cause': 'cpu'} 2.0" in text, text
    assert "{'cause': 'gil'} 0.0" in text and "{'cause': 'blocked'} 0.0" in text, text
