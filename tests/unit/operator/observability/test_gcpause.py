"""Collector pauses by generation: what the stall watch and the health dashboard read."""

from __future__ import annotations

import gc

from prometheus_client import generate_latest

from gpujob_operator.observability import opmetrics
from gpujob_operator.observability.gcpause import GC_PAUSES, GcPauses


def test_pauses_fall_into_their_generation_s_buckets_and_the_last_full_one_is_kept() -> None:
    pauses = GcPauses(clock=lambda: 0.0)
    pauses.observe(0, 0.0005, ended=1.0)
    pauses.observe(2, 0.3, ended=5.0)
    pauses.observe(2, 1.7, ended=9.0)
    assert pauses.buckets(0)[0] == ("0.001", 1.0)
    full = dict(pauses.buckets(2))
    assert (full["0.25"], full["0.5"], full["1.0"], full["2.5"], full["+Inf"]) == (0, 1, 1, 2, 2)
    assert pauses.sums[2] == 2.0 and pauses.longest == 1.7
    assert pauses.full_within(8.0, 10.0) == pauses.last_full
    assert pauses.last_full is not None and pauses.last_full.seconds == 1.7
    assert pauses.full_within(9.5, 12.0) is None
    pauses.observe(7, 1.0, ended=10.0)  # no such generation: ignored, not a KeyError
    assert pauses.longest == 1.7


def test_the_callback_hears_real_collections_and_goes_away_on_uninstall() -> None:
    pauses = GcPauses().install().install()
    try:
        assert gc.callbacks.count(pauses.callback) == 1
        gc.collect()
        assert pauses.buckets(2)[-1][1] >= 1 and pauses.last_full is not None
    finally:
        pauses.uninstall()
    assert pauses.callback not in gc.callbacks
    seen = pauses.buckets(2)[-1][1]
    gc.collect()
    assert pauses.buckets(2)[-1][1] == seen


def test_a_stop_without_its_start_is_not_a_pause() -> None:
    """Installed while a collection runs, the callback hears only its stop."""
    pauses = GcPauses(clock=lambda: 5_000_000.0)  # the clock's zero is long ago
    pauses.callback("stop", {"generation": 2})
    assert pauses.last_full is None and pauses.sums[2] == 0.0
    pauses.callback("start", {"generation": 2})
    pauses.callback("stop", {"generation": 2})
    assert pauses.last_full is not None and pauses.last_full.seconds == 0.0


def test_the_operator_s_metrics_render_the_pauses_by_generation() -> None:
    was_installed = GC_PAUSES.callback in gc.callbacks
    GC_PAUSES.install()
    gc.collect()
    if not was_installed:
        GC_PAUSES.uninstall()
    text = generate_latest(opmetrics.JobMetrics().registry).decode()
    assert 'gpujob_operator_gc_pause_seconds_count{generation="2"}' in text, text[-2000:]
    bare = generate_latest(opmetrics.JobMetrics(process=False).registry).decode()
    assert "gpujob_operator_gc_pause_seconds" not in bare
