"""The operator's /metrics: job series from a status dict, health counters, bounded labels."""

from __future__ import annotations

import urllib.request
from typing import Any

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gpujob_operator.observability import opfamilies, opmetrics

STATUS: dict[str, Any] = {
    "phase": "Running",
    "startTime": "2026-05-01T10:00:00Z",
    "gang": {
        "restarts": 2,
        "replicas": {"desired": 2, "running": 2, "pending": 0, "succeeded": 0, "failed": 0},
        "gpus": {"requested": 16, "meanUtilizationRatio": 0.42},
    },
    "conditions": [
        {"type": "Running", "status": "True"},
        {"type": "MetricsAvailable", "status": "True"},
        {"type": "Stalled", "status": "False"},
    ],
    "progress": {
        "step": 413,
        "totalSteps": 1000,
        "percent": 41.3,
        "samplesPerSecond": 2840.5,
        "etaSeconds": 1100.0,
        "lastStepTime": "2026-05-01T10:12:00Z",
        "loss": 0.25,
    },
    "bottleneck": {"verdict": "InputBound", "severity": "Warning"},
}


def samples(m: opmetrics.JobMetrics) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    text = generate_latest(m.registry).decode()
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def get(s: dict, name: str, **labels: str) -> float | None:
    return s.get((name, frozenset(labels.items())))


def fresh() -> opmetrics.JobMetrics:
    return opmetrics.JobMetrics(process=False)


def test_a_status_becomes_job_series_labelled_by_namespace_and_job() -> None:
    m = fresh()
    m.update("team-a", "resnet", STATUS)
    s = samples(m)
    key = {"namespace": "team-a", "job_name": "resnet"}
    assert get(s, "gpujob_job_progress_ratio", **key) == 0.413
    assert get(s, "gpujob_job_eta_seconds", **key) == 1100.0
    assert get(s, "gpujob_job_samples_per_second", **key) == 2840.5
    assert (
        get(s, "gpujob_job_step", **key) == 413 and get(s, "gpujob_job_target_steps", **key) == 1000
    )
    assert get(s, "gpujob_job_restarts_total", **key) == 2
    assert (
        get(s, "gpujob_job_metrics_available", **key) == 1
        and get(s, "gpujob_job_stalled", **key) == 0
    )
    assert (
        get(s, "gpujob_job_gpus", **key) == 16
        and get(s, "gpujob_job_gpu_utilization_ratio", **key) == 0.42
    )
    assert get(s, "gpujob_job_last_step_timestamp_seconds", **key) == 1777630320.0
    assert get(s, "gpujob_job_replicas", **key, state="running") == 2
    phases = {p: get(s, "gpujob_job_phase", **key, phase=p) for p in opfamilies.PHASES}
    assert phases == {p: float(p == "Running") for p in opfamilies.PHASES}
    verdicts = {
        v: get(s, "gpujob_job_bottleneck_verdict", **key, verdict=v) for v in opfamilies.VERDICTS
    }
    assert verdicts == {v: float(v == "InputBound") for v in opfamilies.VERDICTS}


def test_a_status_of_the_previous_shape_gives_the_same_series() -> None:
    """A job the previous version wrote, not planned by this one yet (restarts, totalGPUs,
    replicas and gpus at the top of its status), is exported as it will be once moved."""
    legacy = {k: v for k, v in STATUS.items() if k != "gang"}
    gang = STATUS["gang"]
    legacy.update(restarts=2, totalGPUs=16, replicas=gang["replicas"], gpus=gang["gpus"])
    old, new = fresh(), fresh()
    old.update("ns", "j", legacy)
    new.update("ns", "j", STATUS)
    assert samples(old) == samples(new)
    assert get(samples(old), "gpujob_job_restarts_total", namespace="ns", job_name="j") == 2


def test_absent_values_are_absent_series_not_zeros() -> None:
    m = fresh()
    m.update("ns", "new", {"phase": "Pending"})
    names = {n for n, _ in samples(m)}
    assert "gpujob_job_phase" in names and "gpujob_job_restarts_total" in names
    for absent in (
        "gpujob_job_progress_ratio",
        "gpujob_job_eta_seconds",
        "gpujob_job_bottleneck_verdict",
        "gpujob_job_metrics_available",
        "gpujob_job_samples_per_second",
    ):
        assert absent not in names


def test_progress_from_steps_when_no_percent_and_clamped() -> None:
    m = fresh()
    m.update("ns", "a", {"progress": {"step": 50, "totalSteps": 200}})
    m.update("ns", "b", {"progress": {"percent": 140.0}})
    s = samples(m)
    assert get(s, "gpujob_job_progress_ratio", namespace="ns", job_name="a") == 0.25
    assert get(s, "gpujob_job_progress_ratio", namespace="ns", job_name="b") == 1.0


def test_unknown_verdict_and_phase_stay_bounded() -> None:
    m = fresh()
    m.update("ns", "j", {"phase": "Running", "bottleneck": {"verdict": "SomethingNew"}})
    m.update("ns", "k", {"phase": "Exploding"})
    s = samples(m)
    assert (
        get(s, "gpujob_job_bottleneck_verdict", namespace="ns", job_name="j", verdict="Other") == 1
    )
    assert not [k for k in s if k[0] == "gpujob_job_phase" and ("job_name", "k") in k[1]]


def test_forget_removes_every_series_of_the_job() -> None:
    m = fresh()
    m.update("ns", "gone", STATUS)
    m.update("ns", "kept", STATUS)
    m.forget("ns", "gone")
    m.forget("ns", "never-existed")
    jobs = {
        dict(labels).get("job_name")
        for name, labels in samples(m)
        if name.startswith("gpujob_job_")
    }
    assert jobs == {"kept"}
    assert get(samples(m), "gpujob_operator_jobs") == 1


GOODPUT = {
    "ratio": 0.75,
    "seconds": {
        "queued": 60.0,
        "startup": 30.0,
        "restart": 90.0,
        "stall": 0.0,
        "checkpoint": 15.0,
        "eval": 5.0,
        "productive": 600.0,
    },
}


def test_goodput_becomes_a_ratio_and_gpu_seconds_by_cause() -> None:
    m = fresh()
    m.update("team-a", "resnet", {**STATUS, "goodput": GOODPUT})
    m.update("team-b", "old", {"phase": "Running", "gang": {"gpus": {"requested": 8}}})
    s = samples(m)
    key = {"namespace": "team-a", "job_name": "resnet"}
    assert get(s, "gpujob_job_goodput_ratio", **key) == 0.75
    assert get(s, "gpujob_job_lost_gpu_seconds", **key, cause="restart") == 90.0 * 16
    assert get(s, "gpujob_job_lost_gpu_seconds", **key, cause="stall") == 0.0
    assert get(s, "gpujob_job_lost_gpu_seconds", **key, cause="productive") is None
    assert get(s, "gpujob_job_productive_gpu_seconds", **key) == 600.0 * 16
    causes = {dict(labels)["cause"] for name, labels in s if name == "gpujob_job_lost_gpu_seconds"}
    assert causes == {"queued", "startup", "restart", "stall", "checkpoint", "eval"}
    old = {"namespace": "team-b", "job_name": "old"}
    assert get(s, "gpujob_job_goodput_ratio", **old) is None, "no ledger: no series"
    assert not any(
        dict(labels).get("job_name") == "old" for name, labels in s if "gpu_seconds" in name
    )


def test_job_series_carry_no_labels_beyond_namespace_job_and_small_sets() -> None:
    m = fresh()
    m.update("ns", "j", {**STATUS, "goodput": GOODPUT})
    allowed = {"namespace", "job_name", "phase", "verdict", "state", "cause"}
    for name, labels in samples(m):
        if name.startswith("gpujob_job_"):
            assert {k for k, _ in labels} <= allowed, name


def test_reconcile_and_scrape_health() -> None:
    m = fresh()
    m.observe_reconcile(0.02)
    m.observe_reconcile(0.3, "api_403")
    m.observe_scrape(0.004, ok=True)
    m.observe_scrape(2.0, ok=False, reason="timeout")
    s = samples(m)
    assert get(s, "gpujob_operator_reconciles_total", result="ok") == 1
    assert get(s, "gpujob_operator_reconciles_total", result="error") == 1
    assert get(s, "gpujob_operator_reconcile_duration_seconds_count") == 2
    assert get(s, "gpujob_operator_reconcile_duration_seconds_bucket", le="0.025") == 1
    assert get(s, "gpujob_operator_reconcile_duration_seconds_sum") == 0.32
    assert get(s, "gpujob_operator_scrapes_total", result="error") == 1
    assert get(s, "gpujob_operator_scrape_duration_seconds_bucket", le="+Inf") == 2
    assert get(s, "gpujob_operator_errors_total", source="reconcile", reason="api_403") == 1
    assert get(s, "gpujob_operator_errors_total", source="scrape", reason="timeout") == 1


def test_error_reasons_are_sanitised_and_capped() -> None:
    m = fresh()
    for i in range(opmetrics.MAX_ERROR_REASONS + 10):
        m.observe_scrape(0.1, ok=False, reason=f"weird reason #{i}")
    reasons = {
        dict(labels)["reason"]
        for name, labels in samples(m)
        if name == "gpujob_operator_errors_total"
    }
    assert len(reasons) == opmetrics.MAX_ERROR_REASONS + 1 and opmetrics.REASON_OTHER in reasons
    assert "weird_reason_0" in reasons


def test_error_reason_of_exceptions() -> None:
    class ApiError(Exception):
        status = 409

    assert opmetrics.error_reason(ApiError()) == "api_409"
    assert opmetrics.error_reason(TimeoutError()) == "timeout"
    assert opmetrics.error_reason(ConnectionRefusedError()) == "connection"
    assert opmetrics.error_reason(KeyError("x")) == "KeyError"


def test_serve_over_http_without_created_series() -> None:
    m = opmetrics.JobMetrics()
    m.update("ns", "j", STATUS)
    port = m.serve(0, "127.0.0.1")
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            text = r.read().decode()
    finally:
        m.stop()
    assert 'gpujob_job_progress_ratio{job_name="j",namespace="ns"} 0.413' in text
    assert "process_cpu_seconds_total" in text and "gpujob_operator_build_info" in text
    assert "_created" not in text


def test_exported_names_cover_what_is_rendered() -> None:
    m = fresh()
    m.update("ns", "j", STATUS)
    m.observe_reconcile(0.1, "x")
    rendered = {name for name, _ in samples(m)}
    assert rendered <= opfamilies.exported_names()


def test_what_scrapes_refused_is_counted() -> None:
    m = fresh()
    before = samples(m)
    assert get(before, "gpujob_operator_scrape_dropped_series_total") == 0
    m.observe_dropped(3, 0, 0)
    m.observe_dropped(1, 2, 0)
    m.observe_dropped(0, 0, 4_194_305)
    s = samples(m)
    assert get(s, "gpujob_operator_scrape_dropped_series_total") == 4
    assert get(s, "gpujob_operator_scrape_dropped_values_total") == 2
    assert get(s, "gpujob_operator_scrape_dropped_bytes_total") == 4_194_305


def test_a_job_with_unobserved_time_is_left_out_of_the_fleet_goodput() -> None:
    """Its seconds are neither lost nor productive: only the unobserved GPU-seconds export."""
    m = fresh()
    seconds = {**GOODPUT["seconds"], "productive": 0.0, "unobserved": 500.0}  # type: ignore[dict-item]
    m.update("team-a", "blind", {**STATUS, "goodput": {"seconds": seconds, "gpuHours": 1.0}})
    s = samples(m)
    key = {"namespace": "team-a", "job_name": "blind"}
    assert get(s, "gpujob_job_unobserved_gpu_seconds", **key) == 500.0 * 16
    assert get(s, "gpujob_job_goodput_ratio", **key) is None
    assert get(s, "gpujob_job_productive_gpu_seconds", **key) is None
    assert not any(n == "gpujob_job_lost_gpu_seconds" for n, _ in s)
