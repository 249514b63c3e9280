"""What held a late event loop, from the CPU its thread and the process used."""

from __future__ import annotations

import pytest

from gpujob_operator.observability.looplag import CPU, GIL, LOOP, lag_cause
from gpujob_operator.observability.opmetrics import JobMetrics


@pytest.mark.parametrize(
    ("wall", "loop_cpu", "process_cpu", "cause"),
    [
        (0.6, 0.45, 0.5, LOOP),  # the loop ran most of it: its own work
        (0.6, 0.3, 0.3, LOOP),  # half is enough
        (0.6, 0.05, 0.6, GIL),  # the other threads ran, the loop waited for the GIL
        (0.6, 0.05, 0.1, CPU),  # nobody ran: the machine gave the process no CPU
        (1.0, 0.3, 0.9, GIL),
        (1.0, 0.3, 0.7, CPU),  # 0.4 s of other threads: the process mostly waited
    ],
)
def test_a_lag_is_blamed_on_what_ran_during_it(
    wall: float, loop_cpu: float, process_cpu: float, cause: str
) -> None:
    assert lag_cause(wall, loop_cpu, process_cpu) == cause


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
    assert "{'cause': 'gil'} 0.0" in text, text
