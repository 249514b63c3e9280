"""Real trainer jobs through the operator: progress climbs to 100%, verdicts reach status.

Sizing: on this 2-core machine the example needs a model big enough that compute, not
gloo's all-reduce latency, dominates a healthy step (see tests/trainer/test_diagnose_runs.py).
"""

from __future__ import annotations

import re
from typing import Any

from tests.integration.conftest import job_status
from tests.support.kube import GET_COLUMNS, Kube
from tests.support.operator import OperatorProcess
from tests.support.waiting import wait_until

SIZE = ["--hidden", "512", "--layers", "4", "--batch-size", "1024"]
HEADER = list(GET_COLUMNS)


def trainer_job(name: str, steps: int, *switches: str, **monitoring: Any) -> dict[str, Any]:
    return {
        "apiVersion": "gpujob.dev/v1alpha1",
        "kind": "GPUTrainingJob",
        "metadata": {"name": name},
        "spec": {
            "image": "gpujob-trainer:0.1.0",
            "command": ["python", "-m", "gpujob_trainer.example"],
            "args": ["--steps", str(steps), *SIZE, *switches],
            "nodes": 2,
            "training": {"procsPerNode": 1, "totalSteps": steps, "rdzvTimeoutSeconds": 120},
            "monitoring": {"scrapeIntervalSeconds": 2, **monitoring},
            "runPolicy": {"backoffLimit": 0},
        },
    }


def get_row(kube: Kube, name: str) -> dict[str, str]:
    """`kubectl get gputrainingjobs` parsed by column position (empty cells stay empty)."""
    lines = kube.run("get", "gputrainingjobs", check=True).stdout.splitlines()
    header = lines[0]
    assert header.split() == HEADER
    starts = [header.index(h) for h in HEADER] + [10_000]
    for line in lines[1:]:
        cells = {h: line[starts[i] : starts[i + 1]].strip() for i, h in enumerate(HEADER)}
        if cells["NAME"] == name:
            return cells
    raise AssertionError(f"{name} not listed: {lines}")


def watch(kube: Kube, name: str, timeout: float) -> list[dict[str, str]]:
    """Every distinct row `kubectl get` showed until the job finished."""
    rows: list[dict[str, str]] = []

    def finished() -> bool:
        row = get_row(kube, name)
        if not rows or {k: v for k, v in row.items() if k != "AGE"} != {
            k: v for k, v in rows[-1].items() if k != "AGE"
        }:
            rows.append(row)
        return row["STATUS"] in ("Succeeded", "Failed")

    wait_until(finished, timeout, f"job {name} to finish", interval=1.0)
    return rows


def test_healthy_job_climbs_to_100_percent_without_a_verdict(
    kube: Kube, operator: OperatorProcess
) -> None:
    kube.apply(trainer_job("healthy", 150))
    rows = watch(kube, "healthy", timeout=420)
    running = [r for r in rows if r["STATUS"] == "Running" and r["PROGRESS"]]
    assert running, rows
    assert any(
        re.fullmatch(r"\d+\.\d%", r["PROGRESS"]) and r["THROUGHPUT"].endswith("samples/s")
        for r in running
    )
    assert any(r["ETA"] for r in running), "an ETA was shown while running"
    assert all(r["BOTTLENECK"] in ("", "Healthy") for r in rows), (
        f"a healthy run got a verdict: {rows}"
    )
    final = rows[-1]
    assert final["STATUS"] == "Succeeded" and final["PROGRESS"] == "100.0%"
    status = job_status(kube, "healthy")
    assert status["progress"]["step"] == 150 and status["progress"]["totalSteps"] == 150
    metrics = next(c for c in status["conditions"] if c["type"] == "MetricsAvailable")
    assert metrics["status"] == "True", metrics  # ranks exiting at the end are no fault


def test_slow_input_is_published_as_input_bound_with_its_evidence(
    kube: Kube, operator: OperatorProcess
) -> None:
    kube.apply(trainer_job("starved", 60, "--slow-input", "0.4", warmupSteps=3))
    seen: dict[str, Any] = {}

    def verdict() -> dict[str, Any] | None:
        status = job_status(kube, "starved")
        bottleneck = status.get("bottleneck") or {}
        if bottleneck.get("verdict") == "InputBound":
            seen["row"] = get_row(kube, "starved")
            return bottleneck
        assert status.get("phase") != "Succeeded", f"finished without InputBound: {status}"
        return None

    bottleneck = wait_until(verdict, 300, "the InputBound verdict", interval=1.0)
    assert seen["row"]["BOTTLENECK"] == "InputBound"
    assert bottleneck["severity"] in ("Warning", "Critical")
    assert "data" in bottleneck["summary"] and bottleneck["advice"]
    assert any("wait" in k.lower() or "ratio" in k.lower() for k in bottleneck["evidence"])
    events = [
        e["reason"]
        for e in kube.list("events")
        if e["involvedObject"].get("name") == "starved"
        and e["involvedObject"].get("kind") == "GPUTrainingJob"
    ]
    assert "BottleneckChanged" in events
    final = watch(kube, "starved", timeout=300)[-1]
    assert final["STATUS"] == "Succeeded" and final["PROGRESS"] == "100.0%"


def test_hung_rank_is_stalled_and_restart_on_stall_restarts_the_gang(
    kube: Kube, operator: OperatorProcess
) -> None:
    body = trainer_job(
        "hung", 400, "--hang-rank", "1", "--hang-after", "15", stallTimeoutSeconds=10
    )
    body["spec"]["runPolicy"] = {"backoffLimit": 1, "restartOnStall": True}
    body["spec"]["template"] = {"terminationGracePeriodSeconds": 5}
    kube.apply(body)

    def stalled_once() -> dict[str, Any] | None:
        status = job_status(kube, "hung")
        return status if status.get("restarts", 0) >= 1 else None

    status = wait_until(stalled_once, 300, "a gang restart caused by the stall", interval=1.0)
    assert status["restarts"] == 1
    final = wait_until(
        lambda: (s := job_status(kube, "hung")).get("phase") == "Failed" and s,
        300,
        "the job to fail",
    )
    assert final["restarts"] == 1
    failed = next(c for c in final["conditions"] if c["type"] == "Failed")
    assert failed["reason"] == "BackoffLimitExceeded", failed
    reasons = [
        e["reason"]
        for e in kube.list("events")
        if e["involvedObject"].get("name") == "hung"
        and e["involvedObject"].get("kind") == "GPUTrainingJob"
    ]
    assert "StallDetected" in reasons and "GangRestart" in reasons, reasons
