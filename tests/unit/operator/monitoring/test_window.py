"""The scrape window: reset-aware counters, bounds, frames from real payloads, memory."""

from __future__ import annotations

import math
import re
import sys
import tracemalloc
from array import array
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpujob_operator.monitoring.rows import (
    G_MEM_USED,
    G_POWER,
    G_THROTTLE,
    G_UTIL,
    N_BUCKETS,
    R_BUCKET0,
    R_CURRENT_PHASE,
    R_HEARTBEAT,
    R_PHASE,
    R_STEPS,
    R_WIDTH,
    increase,
    rate,
    throttle_reasons,
)
from gpujob_operator.monitoring.scrape import expfmt
from gpujob_operator.monitoring.scrape import frame as fm
from gpujob_operator.monitoring.scrape.frame import NEEDED, frame, frame_payload
from gpujob_operator.monitoring.verdicts.latency import window_counts
from gpujob_operator.monitoring.window import Window
from gpujob_trainer import contract

PAYLOADS = Path(__file__).resolve().parents[3] / "data" / "payloads"


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


def test_heartbeat_and_current_phase_are_read_and_timed_by_the_operator_clock() -> None:
    w = Window()

    def scrape(t: float, beat: float | None, phase: str, clock: float | None = None) -> None:
        lab = 'rank="0",local_rank="0",node_rank="0"'
        text = f"gpujob_train_steps_total{{{lab}}} 5\n"
        if beat is not None:
            text += f"gpujob_train_heartbeat_timestamp_seconds{{{lab}}} {beat}\n"
        if clock is not None:
            text += f"gpujob_train_clock_timestamp_seconds{{{lab}}} {clock}\n"
        for p in ("forward", "checkpoint", "eval"):
            text += f'gpujob_train_current_phase{{{lab},phase="{p}"}} {int(p == phase)}\n'
        fr = frame_payload(text, t)
        assert repr(fr) == repr(frame(expfmt.parse(text, NEEDED), t))
        w.add(t, "p", "n", fr)
        w.end_round(t)

    # first sight: the heartbeat's age on the rank's own clock (here 4900 s ahead of the
    # operator's) is believed, never its value against the operator's clock
    scrape(100.0, 4940.0, "forward", clock=5000.0)
    s = w.ranks[("p", 0)]
    assert (s.beat, s.beat_since) == (4940.0, 40.0)
    assert s.rows[-1][R_CURRENT_PHASE] == contract.PHASES.index("forward")
    scrape(110.0, 4940.0, "checkpoint", clock=5010.0)  # unchanged: still since 40
    assert s.beat_since == 40.0 and s.rows[-1][R_CURRENT_PHASE] == contract.PHASES.index(
        "checkpoint"
    )
    scrape(120.0, 9e9, "eval")  # changed (whatever its value says): since this scrape
    assert (s.beat, s.beat_since) == (9e9, 120.0)
    scrape(130.0, None, "eval")  # not exported this time: nothing learnt, nothing forgotten
    assert (s.beat, s.beat_since) == (9e9, 120.0)
    assert math.isnan(s.rows[-1][R_HEARTBEAT]) and s.rows[-1][
        R_CURRENT_PHASE
    ] == contract.PHASES.index("eval")
    scrape(140.0, 150.0, "forward")
    assert s.beat_since == 140.0
    # without the rank's clock (an older trainer) a first value counts from now, whether
    # it reads behind or ahead of the operator's clock
    for beat in (40.0, 150.0):
        w2 = Window()
        text = f'gpujob_train_heartbeat_timestamp_seconds{{rank="0"}} {beat}\n'
        w2.add(140.0, "p", "n", frame_payload(text, 140.0))
        assert w2.ranks[("p", 0)].beat_since == 140.0


def _fleet_payloads(rounds: int) -> list[list[str]]:
    """Per round, the 8 ranks' payloads as a trainer writes them: every value moves each
    scrape (counters, timestamps, the current phase), the label sets stay the same."""
    number = re.compile(r"^([a-z_]+(?:\{[^}]*\})?) (\S+)$", re.MULTILINE)
    gpus = "".join(
        f'gpujob_gpu_utilization_ratio{{node_rank="0",gpu="{g}",UUID="GPU-{g}"}} 0.9\n'
        f'gpujob_gpu_memory_used_bytes{{node_rank="0",gpu="{g}",UUID="GPU-{g}"}} 1e9\n'
        for g in range(8)
    )
    out = []
    for i in range(rounds):
        texts = []
        for r in range(8):
            text = (PAYLOADS / f"healthy-scrape2-rank{r % 2}.prom").read_text()
            text = text.replace('rank="1"', f'rank="{r}"').replace('rank="0"', f'rank="{r}"')
            text = number.sub(lambda m, i=i: f"{m[1]} {float(m[2]) + 1.5 * i!r}", text)
            lab = f'local_rank="{r}",node_rank="0",rank="{r}"'
            text += f"gpujob_train_heartbeat_timestamp_seconds{{{lab}}} {1.8e9 + 15 * i}\n"
            for p in ("forward", "comm_wait"):
                on = int(p == ("forward", "comm_wait")[i % 2])
                text += f'gpujob_train_current_phase{{{lab},phase="{p}"}} {on}\n'
            texts.append(text + (gpus if r == 0 else ""))
        out.append(texts)
    return out


def test_memory_of_a_thousand_jobs_of_eight_ranks_is_bounded_and_steady() -> None:
    """Full windows (9 rows per series) of 1,000 jobs x 8 ranks through the scraper's own
    path (its series cache counted), and no growth once the windows are full: anything kept
    per scrape (rows, series, cache entries keyed on values) would show as growth."""
    import gpujob_operator.monitoring.scrape.frame as frame_module

    jobs, fill_rounds, more_rounds = 100, 9, 9
    payloads = _fleet_payloads(fill_rounds + more_rounds)
    frame_module._SERIES.clear()
    tracemalloc.start()
    windows = [Window(max_points=9, max_age=1e9) for _ in range(jobs)]

    def scrape_round(i: int) -> None:
        for j, w in enumerate(windows):
            pods = [f"job{j}-node-{r}" for r in range(8)]
            for pod, text in zip(pods, payloads[i], strict=True):
                w.add(float(i), pod, "node", frame_payload(text, float(i)))
            w.end_round(float(i), pods)

    for i in range(fill_rounds):
        scrape_round(i)
    full, _ = tracemalloc.get_traced_memory()
    for i in range(fill_rounds, fill_rounds + more_rounds):
        scrape_round(i)
    later, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    per_thousand = later * 1000 / jobs / 2**20
    growth = (later - full) / full
    print(
        f"windows of 1,000 jobs x 8 ranks: {per_thousand:.0f} MiB; "
        f"growth over {more_rounds} more scrapes: {100 * growth:+.2f}%",
        file=sys.stderr,
    )
    assert all(len(w.ranks) == 8 and len(w.gpus) == 8 for w in windows)
    assert all(len(s.rows) == 9 for w in windows for s in w.ranks.values())
    assert per_thousand < 150
    assert growth < 0.01, f"memory grows with scrapes: {full} -> {later} bytes"


# ---- one decoder of what a series gives a frame -----------------------------------------------


def test_each_series_is_decoded_once_into_fields_that_mean_one_thing() -> None:
    r = {"rank": "3", "local_rank": "1", "node_rank": "2"}
    steps = fm.decode(contract.STEPS.name, r)
    assert (steps.kind, steps.rank, steps.local_rank, steps.node_rank) == (fm.RANK_STEPS, 3, 1, 2)
    assert (steps.slot, steps.steps_local_rank) == (R_STEPS, "1")
    bucket = fm.decode(contract.STEP_DURATION.name + "_bucket", {**r, "le": "+Inf"})
    assert (bucket.kind, bucket.slot) == (fm.RANK_VALUE, R_BUCKET0 + N_BUCKETS - 1)
    cuda = fm.decode(contract.CUDA_MEMORY_RESERVED.name, {**r, "UUID": "GPU-a"})
    assert (cuda.kind, cuda.uuid) == (fm.RANK_CUDA, "GPU-a")
    phase = fm.decode(contract.CURRENT_PHASE.name, {**r, "phase": "forward"})
    assert (phase.kind, phase.phase) == (fm.RANK_PHASE, contract.PHASES.index("forward"))
    # a rank series the row keeps no slot for: the rank row appears, nothing is written
    assert fm.decode(contract.CURRENT_PHASE.name, {**r, "phase": "dancing"}).kind == fm.RANK_SEEN
    gpu = {"gpu": "5", "UUID": "GPU-b"}
    util = fm.decode(contract.GPU_UTILIZATION.name, gpu)
    assert (util.kind, util.gpu, util.slot, util.uuid) == (fm.GPU_VALUE, 5, G_UTIL, "GPU-b")
    slow = fm.decode(contract.GPU_CLOCK_EVENT.name, {**gpu, "reason": "hw_slowdown"})
    assert slow.kind == fm.GPU_CLOCK_EVENT and throttle_reasons(slow.throttle_bit) == [
        "hw_slowdown"
    ]
    unranked = fm.decode(contract.STEPS.name, {})
    assert (unranked.kind, unranked.steps_local_rank) == (fm.STEPS_UNRANKED, "?")
    # read by no analysis, or without the label it needs: ignored
    assert fm.decode(contract.GPU_POWER.name, gpu).kind == fm.IGNORED
    assert fm.decode(contract.LOSS.name, {"local_rank": "0"}).kind == fm.IGNORED


def test_both_paths_share_the_decoder_and_its_cache() -> None:
    """Parsed samples and payload text meet the same decoded series: what one path learnt
    (keyed by its own form of the series) the other decodes alike."""
    text = (PAYLOADS / "healthy-scrape2-rank0.prom").read_text()
    fm._SERIES.clear()
    general = frame(expfmt.parse(text, NEEDED), 1.0)
    after_general, _ = fm.series_cache_size()
    fast = frame_payload(text, 1.0)
    after_both, _ = fm.series_cache_size()
    assert repr(general) == repr(fast)
    assert after_general > 0 and after_both >= 2 * after_general  # each form its entry


# ---- the scraper's one-pass path equals parse + frame ----------------------------------------
# One decoder and one applier serve both; what these check is that the fast path's
# tokenizer (one regex check of the payload, one search for our lines) and expfmt's
# parser hand it the same series and values, and refuse the same payloads.


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


def test_parse_caches_stay_small_whatever_the_labels() -> None:
    """Unusual label values (long, changing every scrape) are not kept: five scrapes of 3 MB
    payloads, on the fast path and on the general parser's, retain almost nothing."""
    import random
    import tracemalloc

    from gpujob_operator.monitoring.scrape import expfmt as ef

    rng = random.Random(3)

    def scrape(n: int) -> None:
        lines = [
            f'gpujob_train_loss{{rank="0",junk="{n}-{i}-{rng.randbytes(600).hex()}"}} 1'
            for i in range(2500)
        ]
        text = "\n".join(lines) + "\n"
        frame_payload(text, 1.0)  # the canonical fast path
        frame_payload(text.replace("\n", "\r\n"), 1.0)  # the general parser

    tracemalloc.start()
    try:
        before = tracemalloc.take_snapshot()
        for n in range(5):
            scrape(n)
        after = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    retained = sum(s.size_diff for s in after.compare_to(before, "filename"))
    assert retained < 4 * 2**20, f"{retained / 2**20:.1f} MiB retained by the parse caches"
    assert ef.label_cache_size()[1] <= 8 * 2**20 + 3 * 512


_BUCKET_ROW = st.lists(st.floats(0, 1e6, allow_nan=False), min_size=N_BUCKETS, max_size=N_BUCKETS)
_RANK = st.tuples(
    st.lists(_BUCKET_ROW, max_size=6),  # each row's increments (a counter only grows)
    st.one_of(st.none(), st.integers(0, 5)),  # a restart before this row (counts from 0)
    st.one_of(st.none(), st.tuples(st.integers(0, 5), st.integers(0, N_BUCKETS - 1))),  # a gap
)


@settings(max_examples=300, deadline=None)
@given(st.lists(_RANK, max_size=4))
def test_window_counts_equal_each_buckets_increase_summed_over_ranks(
    ranks: list[tuple[list[list[float]], int | None, tuple[int, int] | None]],
) -> None:
    """The slice-by-slice path for ranks without a drop agrees with `increase` per bucket,
    and so does every rank with a restart or a missing value."""
    rank_rows = []
    for increments, restart, gap in ranks:
        rows_here, counts = [], [0.0] * N_BUCKETS
        for t, inc in enumerate(increments):
            if t == restart:
                counts = [0.0] * N_BUCKETS
            counts = [c + d for c, d in zip(counts, inc, strict=True)]
            row = array("d", [math.nan]) * R_WIDTH
            row[0] = float(t)
            row[R_BUCKET0 : R_BUCKET0 + N_BUCKETS] = array("d", counts)
            if gap is not None and gap[0] == t:
                row[R_BUCKET0 + gap[1]] = math.nan
            rows_here.append(row)
        rank_rows.append(rows_here)
    want = [0.0] * N_BUCKETS
    for rows_here in rank_rows:
        for i in range(N_BUCKETS):
            v = increase(rows_here, R_BUCKET0 + i)
            if not math.isnan(v) and v > 0:
                want[i] += v
    assert window_counts(rank_rows) == pytest.approx(want, rel=1e-9, abs=1e-6)
