"""The scrape window: reset-aware counters, bounds, frames from real payloads, memory."""

from __future__ import annotations

import math
import sys
import tracemalloc
from array import array
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpujob_operator import expfmt
from gpujob_operator.window import (
    G_MEM_USED,
    G_POWER,
    G_THROTTLE,
    G_UTIL,
    NEEDED,
    R_PHASE,
    R_STEPS,
    R_WIDTH,
    Window,
    frame,
    frame_payload,
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


# ---- the scraper's one-pass path equals parse + frame ----------------------------------------


def outcome(fn: object, text: str | bytes) -> str:
    """repr of the frame (NaN-safe) or of the ParseError."""
    try:
        return repr(fn(text))  # type: ignore[operator]
    except expfmt.ParseError as exc:
        return f"ParseError({exc})"


def assert_same(text: str | bytes) -> None:
    fast = outcome(lambda x: frame_payload(x, 7.0), text)
    slow = outcome(lambda x: frame(expfmt.parse(x, NEEDED), 7.0), text)
    assert fast == slow


GPU_TEXT = "".join(
    f'# HELP {m} x\n# TYPE {m} gauge\n{m}{{UUID="GPU-{g}",gpu="{g}",node_rank="0"{extra}}} {v}\n'
    for g in range(3)
    for m, extra, v in (
        ("gpujob_gpu_utilization_ratio", "", "0.5"),
        ("gpujob_gpu_memory_used_bytes", "", "1.2e+10"),
        ("gpujob_gpu_power_watts", "", "300"),
        ("gpujob_gpu_clock_event_active", ',reason="gpu_idle"', "1.0"),
        ("gpujob_gpu_clock_event_active", ',reason="hw_slowdown"', f"{g % 2}.0"),
        ("gpujob_gpu_telemetry_available", ',reason="ok"', "1.0"),
    )
)


@pytest.mark.parametrize("path", sorted(PAYLOADS.glob("*.prom")), ids=lambda p: p.name)
def test_frame_payload_equals_parse_then_frame_on_recorded_payloads(path: Path) -> None:
    raw = path.read_bytes()
    assert_same(raw)
    assert_same(raw + GPU_TEXT.encode())
    assert_same(raw.replace(b"\n", b"\r\n"))  # the general parser's path
    assert_same(raw.decode() + 'gpujob_train_loss{rank="0",rank="1"} 1\n')  # duplicate label


def test_frame_payload_reads_gpus_and_leaves_unused_fields_nan() -> None:
    fr = frame_payload(GPU_TEXT, 1.0)
    uuid, row = fr.gpus[1]
    assert uuid == "GPU-1" and row[G_UTIL] == 0.5 and row[G_MEM_USED] == 1.2e10
    assert throttle_reasons(row[G_THROTTLE]) == ["hw_slowdown"]
    assert math.isnan(row[G_POWER]) and fr.telemetry == contract.TELEMETRY_OK


_PARTS = st.sampled_from(
    [
        "gpujob_train_loss",
        "gpujob_train_steps_total",
        "gpujob_gpu_clock_event_active",
        "gpujob_train_step_duration_seconds_bucket",
        "gpujob_gpu_power_watts",
        "x",
        "{",
        "}",
        '"',
        "\\",
        "=",
        ",",
        " ",
        "rank",
        "local_rank",
        "gpu",
        "le",
        "reason",
        '"0"',
        '"1"',
        '"+Inf"',
        '"hw_slowdown"',
        "1.5",
        "NaN",
        "+Inf",
        "\n",
        "#",
        " TYPE ",
        "counter",
        "\t",
        "\r",
        "e",
        "-",
    ]
)


@settings(max_examples=600, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(st.lists(_PARTS, max_size=40))
def test_fuzz_frame_payload_agrees_with_parse_then_frame(parts: list[str]) -> None:
    assert_same("".join(parts))


@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(st.data())
def test_fuzz_frame_payload_on_mutated_real_payloads(data: st.DataObject) -> None:
    raw = bytearray((PAYLOADS / "healthy-scrape2-rank0.prom").read_bytes() + GPU_TEXT.encode())
    for _ in range(data.draw(st.integers(1, 8))):
        i = data.draw(st.integers(0, len(raw) - 1))
        raw[i] = data.draw(st.sampled_from(b' \t\n\r{}",=_.#\\e0aZ\xff'))
    assert_same(bytes(raw))
