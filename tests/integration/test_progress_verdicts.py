"""Real trainer jobs through the operator: progress climbs to 100%, verdicts reach status.

Sizing: on this 2-core machine the example needs a model big enough that compute, not
gloo's all-reduce latency, dominates a healthy step (see tests/trainer/test_diagnose_runs.py).
"""

from __future__ import annotations

import re
from typing import Any

from gpujob_operator.api.conditions import parse_time
from tests.integration.conftest import delete_job, job_status
from tests.support.events import wait_event
from tests.support.jobs import example_job
from tests.support.kube import GET_COLUMNS, Kube
from tests.support.operator import OperatorProcess
from tests.support.waiting import wait_until

SIZE = ["--hidden", "512", "--layers", "4", "--batch-size", "1024"]
HEADER = list(GET_COLUMNS)


def trainer_job(name: str, steps: int, *switches: str, **monitoring: Any) -> dict[str, Any]:
    return example_job(
        name,
        ["--steps", str(steps), *SIZE, *switches],
        steps,
        training={"rdzvTimeoutSeconds": 120},
        monitoring=monitoring,
    )


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


def test_healthy_job_climbs_to_100_percent_without_a_warning(
    kube: Kube, operator: OperatorProcess
) -> None:
    # The diagnose tests' healthy size (tests/trainer/test_diagnose_runs.py HEALTHY): ~0.4 s
    # of compute a step, so gloo's all-reduce stays far below CommunicationBound's 15% even
    # with the operator and the control plane busy on the same two cores.
    kube.apply(trainer_job("healthy", 120, "--batch-size", "4096"))
    rows = watch(kube, "healthy", timeout=420)
    running = [r for r in rows if r["STATUS"] == "Running" and r["PROGRESS"]]
    assert running, rows
    assert any(
        re.fullmatch(r"\d+\.\d%", r["PROGRESS"]) and r["THROUGHPUT"].endswith("samples/s")
        for r in running
    )
    assert any(r["ETA"] for r in running), "an ETA was shown while running"
    # its steps are nearly all compute: ComputeBound (Info) is as right as Healthy
    assert all(r["BOTTLENECK"] in ("", "Healthy", "ComputeBound") for r in rows), (
        f"a healthy run got a verdict: {rows}"
    )
    final = rows[-1]
    assert final["STATUS"] == "Succeeded" and final["PROGRESS"] == "100.0%"
    assert "hangEvidence" not in job_status(kube, "healthy"), "a healthy run captures nothing"
    status = job_status(kube, "healthy")
    assert status["progress"]["step"] == 120 and status["progress"]["totalSteps"] == 120
    metrics = next(c for c in status["conditions"] if c["type"] == "MetricsAvailable")
    assert metrics["status"] == "True", metrics  # ranks exiting at the end are no fault
    # A finished job keeps its story: the goodput ledger, closed, with what the run was like.
    goodput, cursor = status["goodput"], status["operatorState"]["goodput"]
    assert 0 < goodput["ratio"] <= 1 and "cause" not in cursor, cursor
    assert goodput["seconds"]["productive"] > 0 and cursor["stage"] == "Stepped", cursor
    assert parse_time(status["completionTime"]) > parse_time(goodput["since"]), goodput
    assert goodput.get("meanSamplesPerSecond", 0) > 0, goodput
    assert all(v["verdict"] in ("Healthy", "ComputeBound") for v in goodput.get("verdicts", []))


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
    wait_event(kube, "starved", "BottleneckChanged")
    delete_job(kube, "starved")  # a run to 100% is the healthy job's test


def job_events(kube: Kube, name: str) -> list[dict[str, Any]]:
    """The job's Events, oldest first.

    Core Events carry second-resolution timestamps and a list comes back in name order
    (random suffixes), so two Events of the same second are ordered by the resourceVersion
    their creation was given: the operator posts them one at a time, in order."""
    items = [
        e
        for e in kube.list("events")
        if e["involvedObject"].get("name") == name
        and e["involvedObject"].get("kind") == "GPUTrainingJob"
    ]

    def when(e: dict[str, Any]) -> tuple[str, int]:
        stamp = e.get("firstTimestamp") or e.get("eventTime") or e.get("lastTimestamp") or ""
        return stamp, int(e["metadata"].get("resourceVersion") or 0)

    return sorted(items, key=when)


def test_long_first_step_checkpoints_and_evaluations_are_not_stalled(
    kube: Kube, operator: OperatorProcess
) -> None:
    # Each busy period lasts 25 s, 2.5x the stall timeout, and no step ends meanwhile: a
    # first step (compilation), an evaluation loop mid-run (step 40) and a checkpoint after
    # the last step (as the README's loop saves its final checkpoint). One of each kind is the
    # proof; an evaluation at the end too (every 30) only made the test 25 s longer.
    body = trainer_job(
        "busy",
        60,
        "--startup-seconds", "25",
        "--checkpoint-every", "60", "--checkpoint-seconds", "25",
        "--eval-every", "40", "--eval-seconds", "25",
        stallTimeoutSeconds=10,
    )  # fmt: skip
    body["spec"]["runPolicy"] = {"backoffLimit": 0, "restartOnStall": True}
    kube.apply(body)
    reasons: set[str] = set()

    def finished() -> dict[str, Any] | None:
        status = job_status(kube, "busy")
        stalled = next((c for c in status.get("conditions", []) if c["type"] == "Stalled"), None)
        if stalled is not None:
            assert stalled["status"] == "False", stalled
            reasons.add(stalled["reason"])
        return status if status.get("phase") in ("Succeeded", "Failed") else None

    status = wait_until(finished, 600, "the busy job to finish", interval=0.5)
    assert status["phase"] == "Succeeded" and status["gang"]["restarts"] == 0, status
    # the rules were exercised, not dodged: start-up, busy ranks and the end were all seen
    assert {"StartingUp", "RanksBusy", "RanksFinished"} <= reasons, reasons
    names = [e["reason"] for e in job_events(kube, "busy")]
    assert "StallDetected" not in names and "GangRestart" not in names, names


def test_hung_rank_is_stalled_and_restart_on_stall_restarts_the_gang(
    kube: Kube, operator: OperatorProcess
) -> None:
    body = trainer_job(
        "hung", 400, "--hang-rank", "1", "--hang-after", "15", stallTimeoutSeconds=10
    )
    body["spec"]["runPolicy"] = {"backoffLimit": 1, "restartOnStall": True}
    body["spec"]["template"] = {"terminationGracePeriodSeconds": 5}
    kube.apply(body)

    def restarted() -> dict[str, Any] | None:
        status = job_status(kube, "hung")
        return status if status.get("gang", {}).get("restarts", 0) >= 1 else None

    status = wait_until(restarted, 300, "a gang restart", interval=0.5)
    # Caused by the stall, and only once two scrapes confirmed it: the planner copies the
    # StallConfirmed condition's message into status.failure when it restarts for it.
    assert status["gang"]["restarts"] == 1
    assert status["failure"]["reason"] == "Stalled", status["failure"]
    message = status["failure"]["message"]
    assert "no rank finished a step" in message and "consecutive scrapes" in message, message
    events = wait_until(  # the restart's Event is posted after its status write
        lambda: (lambda ev: ev if any(e["reason"] == "GangRestart" for e in ev) else None)(
            job_events(kube, "hung")
        ),
        30,
        "the GangRestart Event",
    )
    gang = [e for e in events if e["reason"] == "GangRestart"]
    assert len(gang) == 1 and "failed: Stalled" in gang[0]["message"], gang
    assert "StallDetected" in [e["reason"] for e in events]

    final = wait_until(
        lambda: (s := job_status(kube, "hung")).get("phase") == "Failed" and s,
        300,
        "the job to fail",
    )
    assert final["gang"]["restarts"] == 1, "one stall per attempt, each counted once"
    failed = next(c for c in final["conditions"] if c["type"] == "Failed")
    assert failed["reason"] == "BackoffLimitExceeded", failed
    assert final["failure"]["reason"] == "Stalled" and final["failure"]["attempt"] == 1
