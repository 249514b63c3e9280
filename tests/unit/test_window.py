"""The scrape window: reset-aware counters, bounds, frames from real payloads, memory."""

from __future__ import annotations

import math
import sys
import tracemalloc
from array import array
from pathlib import Path

import pytest

from gpujob_operator import expfmt
from gpujob_operator.window import (
    G_THROTTLE,
    G_UTIL,
    R_PHASE,
    R_STEPS,
    R_WIDTH,
    Window,
    frame,
    increase,
    rate,
    throttle_reasons,
)
from gpujob_trainer import contract

PAYLOADS = Path(__file__).resolve().parents[1] / "data" / "payloads"


def rows(*points: tuple[float, float]) -> list[array[float]]:
    out = []
    for t, v in points:
        row = array("d", [math.nan]) * R_WIDTH
        row[0], row[R_STEPS] = t, v
        out.append(row)
    return out


def test_increase_and_rate_handle_resets_like_prometheus() -> None:
    r = rows((0, 100), (10, 150), (20, 5), (30, 25))  # restart between 10 and 20
    assert increase(r, R_STEPS) == 50 + 5 + 20
    assert rate(r, R_STEPS) == pytest.approx(75 / 30)


def test_missing_values_are_skipped_and_one_point_gives_nan() -> None:
    r = rows((0, 1), (10, math.nan), (20, 3))
    assert increase(r, R_STEPS) == 2
    assert math.isnan(increase(rows((0, 1)), R_STEPS))


def test_frame_from_a_recorded_payload() -> None:
    text = (PAYLOADS / "healthy-scrape2-rank0.prom").read_bytes()
    fr = frame(expfmt.parse(text), 5.0)
    assert list(fr.ranks) == [0] and fr.local_rank == {0: 0} and fr.node_rank == {0: 0}
    row = fr.ranks[0]
    assert row[0] == 5.0 and row[R_STEPS] == 100
    assert row[R_PHASE[contract.PHASE_COMM_WAIT]] > 0
    assert fr.telemetry == contract.TELEMETRY_NVML_INIT_FAILED and fr.gpus == {}
    assert fr.buckets[0][-1] == 100


def test_gpu_rows_and_throttle_mask() -> None:
    lab = 'node_rank="0",gpu="3",UUID="GPU-x"'
    text = (
        f"gpujob_gpu_utilization_ratio{{{lab}}} 0.5\n"
        f'gpujob_gpu_clock_event_active{{{lab},reason="gpu_idle"}} 1\n'
        f'gpujob_gpu_clock_event_active{{{lab},reason="hw_slowdown"}} 1\n'
        f'gpujob_gpu_clock_event_active{{{lab},reason="sw_power_cap"}} 0\n'
    )
    fr = frame(expfmt.parse(text), 1.0)
    uuid, row = fr.gpus[3]
    assert uuid == "GPU-x" and row[G_UTIL] == 0.5
    assert throttle_reasons(row[G_THROTTLE]) == ["hw_slowdown"]  # gpu_idle is no throttle


def test_window_is_bounded_by_count_and_age_and_drops_gone_pods() -> None:
    w = Window(max_points=4, max_age=30)
    for i in range(10):
        fr = frame(expfmt.parse(f'gpujob_train_steps_total{{rank="0"}} {i}\n'), float(i * 10))
        w.add(i * 10.0, "p", "n", fr)
        w.end_round(i * 10.0, ["p"])
    s = w.ranks[("p", 0)]
    assert [r[0] for r in s.rows] == [60.0, 70.0, 80.0, 90.0]
    w.end_round(100.0, [])
    assert w.ranks == {}


def test_progress_clock_moves_only_on_step_changes() -> None:
    w = Window()
    for t, steps in ((0.0, 5), (10.0, 5), (20.0, 6), (30.0, 6)):
        w.add(t, "p", "n", frame(expfmt.parse(f'gpujob_train_steps_total{{rank="0"}} {steps}'), t))
        w.end_round(t)
    assert w.progress_time == 20.0


def test_memory_of_a_thousand_jobs_of_eight_ranks() -> None:
    """Full windows (9 rows per series) of 1,000 jobs x 8 ranks, GPUs on local rank 0."""
    rank_texts = [(PAYLOADS / f"healthy-scrape2-rank{r % 2}.prom").read_text() for r in range(8)]
    gpu_text = "".join(
        f'gpujob_gpu_utilization_ratio{{node_rank="0",gpu="{g}",UUID="GPU-{g}"}} 0.9\n'
        f'gpujob_gpu_memory_used_bytes{{node_rank="0",gpu="{g}",UUID="GPU-{g}"}} 1e9\n'
        for g in range(8)
    )
    parsed = [expfmt.parse(t.replace('rank="1"', f'rank="{r}"')) for r, t in enumerate(rank_texts)]
    parsed[0] += expfmt.parse(gpu_text)
    tracemalloc.start()
    windows = []
    for _ in range(200):  # 200 jobs measured, scaled to 1,000
        w = Window(max_points=9, max_age=1e9)
        for i in range(12):
            for r, samples in enumerate(parsed):
                w.add(float(i), f"job-node-{r}", "node", frame(samples, float(i)))
            w.end_round(float(i))
        windows.append(w)
    size, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    per_thousand = size * 5 / 2**20
    print(f"windows of 1,000 jobs x 8 ranks: {per_thousand:.0f} MiB", file=sys.stderr)
    assert per_thousand < 150
