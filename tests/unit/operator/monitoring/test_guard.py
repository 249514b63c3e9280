"""guard.admit: what a scrape may put into a job's window (identity, caps, value ranges)."""

from __future__ import annotations

import math

from gpujob_operator.api.patches import json_safe
from gpujob_operator.monitoring.rows import G_MEM_USED, G_UTIL, R_CLOCK, R_LAST_STEP, R_STEPS
from gpujob_operator.monitoring.scrape import expfmt, guard
from gpujob_operator.monitoring.scrape.frame import frame

T = 1_800_000_000.0


def admitted(text: str, rank: int | None = 0) -> guard.Admitted:
    return guard.admit(frame(expfmt.parse(text), T), rank, T)


def test_sane_values_pass_untouched() -> None:
    a = admitted(
        'gpujob_train_steps_total{rank="0"} 12\n'
        f'gpujob_train_last_step_timestamp_seconds{{rank="0"}} {T - 3}\n'
        f'gpujob_train_clock_timestamp_seconds{{rank="0"}} {T - 1200}\n'  # a node behind
        'gpujob_gpu_utilization_ratio{gpu="0",UUID="G"} 1.0\n'
    )
    assert a.dropped_values == 0 and a.dropped_series == 0 and a.notes == ()
    assert a.frame.ranks[0][R_STEPS] == 12 and a.frame.ranks[0][R_LAST_STEP] == T - 3
    assert a.frame.ranks[0][R_CLOCK] == T - 1200


def test_implausible_values_become_absent_and_are_described() -> None:
    a = admitted(
        'gpujob_train_steps_total{rank="0"} -1\n'
        f'gpujob_train_last_step_timestamp_seconds{{rank="0"}} {T * 1000:.0f}\n'
        f'gpujob_train_clock_timestamp_seconds{{rank="0"}} {T * 1000:.0f}\n'
        'gpujob_gpu_utilization_ratio{gpu="0",UUID="G"} 87\n'  # percent, not a ratio
        'gpujob_gpu_memory_used_bytes{gpu="0",UUID="G"} -Inf\n'
    )
    assert a.dropped_values == 5
    row = a.frame.ranks[0]
    assert math.isnan(row[R_STEPS]) and math.isnan(row[R_LAST_STEP]) and math.isnan(row[R_CLOCK])
    gpu = a.frame.gpus[0][1]
    assert math.isnan(gpu[G_UTIL]) and math.isnan(gpu[G_MEM_USED])
    ((kind, text),) = a.notes
    assert kind == guard.KIND_VALUES and "gpujob_gpu_utilization_ratio=87" in text


def test_other_ranks_and_too_many_gpus_are_dropped() -> None:
    lines = [f'gpujob_train_steps_total{{rank="{r}"}} 5' for r in range(3)]
    lines += [f'gpujob_gpu_utilization_ratio{{gpu="{g}",UUID="G{g}"}} 0.5' for g in range(100)]
    a = admitted("\n".join(lines) + "\n", rank=2)
    assert list(a.frame.ranks) == [2] and len(a.frame.gpus) == guard.MAX_GPUS_PER_ENDPOINT
    assert a.dropped_series == 2 + 100 - guard.MAX_GPUS_PER_ENDPOINT
    assert [k for k, _ in a.notes] == [guard.KIND_RANK, guard.KIND_GPUS]
    assert admitted("\n".join(lines) + "\n", rank=None).frame.ranks.keys() == {0, 1, 2}


def test_json_safe_turns_non_finite_numbers_into_null() -> None:
    got = json_safe({"a": math.inf, "b": [1.0, math.nan], "c": {"d": -math.inf, "e": "x"}})
    assert got == {"a": None, "b": [1.0, None], "c": {"d": None, "e": "x"}}
