"""`promtool test rules`: each alert fires on the series it is about, and stays quiet on a healthy
job. Needs only promtool (no cluster): synthetic input series, Prometheus' own rule engine."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from gpujob_operator.observability import alerts
from tests.support.prometheus import REPO, promtool

JOB = {"namespace": "ml", "job_name": "bert"}
GPU = {**JOB, "node_rank": "1", "gpu": "3", "UUID": "GPU-abc"}


def series(name: str, labels: dict[str, str], values: str) -> dict[str, str]:
    body = ", ".join(f'{k}="{v}"' for k, v in labels.items())
    return {"series": f"{name}{{{body}}}", "values": values}


def expected_annotations(alert: str, labels: dict[str, str], value: str = "") -> dict[str, str]:
    """The rule's annotations with the template fields this suite uses expanded."""
    rule = next(r for g in alerts.groups()["groups"] for r in g["rules"] if r["alert"] == alert)
    out = {}
    for key, text in rule["annotations"].items():
        text = re.sub(r"\{\{ \$labels\.(\w+) \}\}", lambda m: labels.get(m.group(1), ""), text)
        out[key] = text.replace("{{ $value | humanizePercentage }}", value)
    return out


def expect(alert: str, labels: dict[str, str], severity: str, value: str = "") -> dict[str, Any]:
    return {
        "exp_labels": {**labels, "severity": severity},
        "exp_annotations": expected_annotations(alert, labels, value),
    }


RUNNING = series("gpujob_job_phase", {**JOB, "phase": "Running"}, "1x60")

CASES: list[dict[str, Any]] = [
    {
        "input_series": [RUNNING, series("gpujob_job_stalled", JOB, "0 0 1x10")],
        "alert_rule_test": [
            {"eval_time": "1m", "alertname": "GPUJobStalled", "exp_alerts": []},
            {
                "eval_time": "6m",
                "alertname": "GPUJobStalled",
                "exp_alerts": [expect("GPUJobStalled", JOB, "warning")],
            },
        ],
    },
    # A stale stalled series (an older operator's, or one scraped before the restart) never
    # pages for a job that is restarting or ended: the alert is gated on the running phase.
    *(
        {
            "input_series": [
                series("gpujob_job_phase", {**JOB, "phase": phase}, "1x60"),
                series("gpujob_job_phase", {**JOB, "phase": "Running"}, "0x60"),
                series("gpujob_job_stalled", JOB, "1x60"),
            ],
            "alert_rule_test": [
                {"eval_time": "30m", "alertname": "GPUJobStalled", "exp_alerts": []}
            ],
        }
        for phase in ("Restarting", "Suspended", "Succeeded", "Failed")
    ),
    {
        "input_series": [series("gpujob_job_phase", {**JOB, "phase": "Failed"}, "0 1x5")],
        "alert_rule_test": [
            {
                "eval_time": "2m",
                "alertname": "GPUJobFailed",
                "exp_alerts": [expect("GPUJobFailed", {**JOB, "phase": "Failed"}, "warning")],
            }
        ],
    },
    {
        "input_series": [
            RUNNING,
            series("gpujob_job_bottleneck_verdict", {**JOB, "verdict": "InputBound"}, "1x60"),
            series("gpujob_job_bottleneck_verdict", {**JOB, "verdict": "Healthy"}, "0x60"),
        ],
        "alert_rule_test": [
            {"eval_time": "20m", "alertname": "GPUJobBottleneckPersisting", "exp_alerts": []},
            {
                "eval_time": "40m",
                "alertname": "GPUJobBottleneckPersisting",
                "exp_alerts": [
                    expect("GPUJobBottleneckPersisting", {**JOB, "verdict": "InputBound"}, "info")
                ],
            },
        ],
    },
    {
        "input_series": [series("gpujob_gpu_utilization_ratio", GPU, "0.2x60")],
        "alert_rule_test": [
            {
                "eval_time": "40m",
                "alertname": "GPUJobGPUsUnderutilized",
                "exp_alerts": [expect("GPUJobGPUsUnderutilized", JOB, "warning", "20%")],
            }
        ],
    },
    {
        "input_series": [series("gpujob_gpu_utilization_ratio", GPU, "0.9x60")],
        "alert_rule_test": [
            {"eval_time": "40m", "alertname": "GPUJobGPUsUnderutilized", "exp_alerts": []}
        ],
    },
    {
        "input_series": [RUNNING, series("gpujob_job_metrics_available", JOB, "0x60")],
        "alert_rule_test": [
            {
                "eval_time": "15m",
                "alertname": "GPUJobMetricsUnavailable",
                "exp_alerts": [expect("GPUJobMetricsUnavailable", JOB, "warning")],
            }
        ],
    },
    {
        "input_series": [
            series("gpujob_job_phase", {**JOB, "phase": "Succeeded"}, "1x60"),
            series("gpujob_job_metrics_available", JOB, "0x60"),
        ],
        "alert_rule_test": [
            {"eval_time": "15m", "alertname": "GPUJobMetricsUnavailable", "exp_alerts": []}
        ],
    },
    {
        "input_series": [
            series("gpujob_gpu_xid_errors_total", GPU, "0 0 1 1 1"),
            series("gpujob_gpu_ecc_uncorrected_errors_total", GPU, "0 0 0 0 0"),
        ],
        "alert_rule_test": [
            {"eval_time": "1m", "alertname": "GPUJobHardwareFault", "exp_alerts": []},
            {
                "eval_time": "3m",
                "alertname": "GPUJobHardwareFault",
                "exp_alerts": [expect("GPUJobHardwareFault", GPU, "critical")],
            },
        ],
    },
    {
        "input_series": [series("up", {"job": "gpujob-operator", "instance": "op:8081"}, "0x10")],
        "alert_rule_test": [
            {
                "eval_time": "6m",
                "alertname": "GPUJobOperatorDown",
                "exp_alerts": [expect("GPUJobOperatorDown", {}, "critical")],
            }
        ],
    },
    {
        "input_series": [series("up", {"job": "gpujob-operator", "instance": "op:8081"}, "1x10")],
        "alert_rule_test": [
            {"eval_time": "6m", "alertname": "GPUJobOperatorDown", "exp_alerts": []}
        ],
    },
    {
        "input_series": [
            series(
                "gpujob_operator_errors_total",
                {"source": "reconcile", "reason": "api_403"},
                "0+1x40",
            ),
            series("gpujob_operator_reconciles_total", {"result": "ok"}, "0+1x40"),
            series("gpujob_operator_reconciles_total", {"result": "error"}, "0+1x40"),
        ],
        "alert_rule_test": [
            {
                "eval_time": "30m",
                "alertname": "GPUJobOperatorErrors",
                "exp_alerts": [expect("GPUJobOperatorErrors", {}, "warning")],
            }
        ],
    },
]


def test_each_alert_fires_on_its_signal_and_not_otherwise(tmp_path: Path) -> None:
    suite = {
        "rule_files": [str(REPO / alerts.RULES_FILE)],
        "evaluation_interval": "1m",
        "tests": [{"interval": "1m", **case} for case in CASES],
    }
    path = tmp_path / "gpujob.rules.test.yaml"
    path.write_text(yaml.safe_dump(suite, sort_keys=False))
    res = promtool("test", "rules", str(path))
    assert res.returncode == 0, res.stdout + res.stderr
    tested = {t["alertname"] for case in CASES for t in case["alert_rule_test"]}
    assert tested == {r["alert"] for g in alerts.groups()["groups"] for r in g["rules"]}
