"""Verdicts describe the present attempt: once it ends (restart, suspension, success, failure)
Stalled and BottleneckDetected turn False, status.bottleneck goes, the gauges read 0 and the
verdict alerts are gated on the running phase (issue 23, stale stall alerts)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from gpujob_operator.api import conditions as c
from gpujob_operator.observability import alerts, opfamilies, opmetrics
from gpujob_operator.observability.jobsample import JobSample
from tests.unit.operator.lifecycle.test_planner import T0, Sim, cond, running_sim

STALL_VERDICT = {"verdict": "Stalled", "severity": "Critical", "summary": "no step for 615s"}


def stall(sim: Sim) -> None:
    """The analyzer's view of a hung gang, as the metrics task writes it."""
    sim.status["conditions"] += [
        c.make(c.STALLED, "True", c.STALL_CONFIRMED, "no step for 615s (2 scrapes)", T0),
        c.make(c.BOTTLENECK_DETECTED, "True", "Stalled", "no step for 615s", T0),
    ]
    sim.status["bottleneck"] = dict(STALL_VERDICT)


def gauges(status: dict[str, Any]) -> tuple[float | None, list[str]]:
    """The job's gpujob_job_stalled value and the verdicts its verdict family exports."""
    m = opmetrics.JobMetrics(process=False)
    m.update("ml", "bert", status)
    stalled, verdicts = None, []
    for fam in m.registry.collect():
        for s in fam.samples:
            if s.name == opfamilies.JOB_STALLED.name:
                stalled = s.value
            if s.name == opfamilies.JOB_VERDICT.name and s.value == 1:
                verdicts.append(s.labels["verdict"])
    return stalled, verdicts


def assert_retired(status: dict[str, Any], reason: str) -> None:
    for type_ in (c.STALLED, c.BOTTLENECK_DETECTED):
        got = cond(status, type_)
        assert (got["status"], got["reason"]) == ("False", reason), got
    assert "bottleneck" not in status
    assert "bottleneck" not in status.get("display", {})
    assert gauges(status) == (0.0, [])


def test_a_running_stalled_job_keeps_its_verdict_and_pages() -> None:
    sim = running_sim()
    stall(sim)
    sim.reconcile()
    assert c.is_true(sim.status["conditions"], c.STALLED)
    assert sim.status["bottleneck"]["verdict"] == "Stalled"
    assert gauges(sim.status) == (1.0, ["Stalled"])


def test_a_gang_restart_retires_the_old_attempts_verdicts() -> None:
    sim = running_sim(runPolicy={"backoffLimit": 3})
    stall(sim)
    sim.fail("bert-node-1", code=134)  # the NCCL watchdog kills the hung rank
    sim.reconcile()
    assert sim.status["phase"] == "Restarting"
    assert_retired(sim.status, c.GANG_RESTART)
    assert "attempt 0" in cond(sim.status, c.BOTTLENECK_DETECTED)["message"]
    sim.gc()
    sim.reconcile()
    sim.run_all()
    sim.reconcile()
    assert sim.status["phase"] == "Running" and sim.status["gang"]["attempt"] == 1
    assert gauges(sim.status) == (0.0, []), "the new attempt is not judged by the old verdict"


def test_restart_on_stall_retires_the_stall_it_acted_on() -> None:
    sim = running_sim(runPolicy={"restartOnStall": True})
    stall(sim)
    sim.status["hangEvidence"] = {
        "stalledSince": cond(sim.status, c.STALLED)["lastTransitionTime"],
        "summary": "rank 1 is not in all_reduce #11",
        "attempt": 0,
    }
    sim.reconcile()
    assert sim.status["failure"]["reason"] == "Stalled"
    assert_retired(sim.status, c.GANG_RESTART)
    assert sim.status["hangEvidence"]["attempt"] == 0, "the finished attempt's record stays"


def test_suspension_retires_the_verdicts() -> None:
    sim = running_sim()
    stall(sim)
    sim.job["spec"]["runPolicy"] = {"suspend": True}
    sim.reconcile()
    assert sim.status["phase"] == "Suspended"
    assert_retired(sim.status, c.SUSPENDED_REASON)
    before = cond(sim.status, c.STALLED)
    sim.now += timedelta(minutes=5)
    sim.reconcile()
    assert cond(sim.status, c.STALLED) == before, "no churn while it stays suspended"


def test_success_retires_the_verdicts() -> None:
    sim = running_sim()
    stall(sim)
    sim.succeed_all()
    sim.reconcile()
    assert sim.status["phase"] == "Succeeded"
    assert_retired(sim.status, c.JOB_SUCCEEDED)


@pytest.mark.parametrize("restart_on_stall", [False, True])
def test_failure_retires_the_verdicts(restart_on_stall: bool) -> None:
    sim = running_sim(runPolicy={"backoffLimit": 0, "restartOnStall": restart_on_stall})
    stall(sim)
    if restart_on_stall:
        sim.now = T0 + timedelta(minutes=5)  # the evidence wait is over: the stall fails it
    else:
        sim.fail("bert-node-0", code=1)
    sim.reconcile()
    assert sim.status["phase"] == "Failed"
    assert cond(sim.status, c.FAILED)["reason"] == c.BACKOFF_LIMIT_EXCEEDED
    assert_retired(sim.status, c.JOB_FAILED)


def test_the_deadline_retires_the_verdicts() -> None:
    sim = running_sim(runPolicy={"activeDeadlineSeconds": 60})
    stall(sim)
    sim.now += timedelta(minutes=2)
    sim.reconcile()
    assert cond(sim.status, c.FAILED)["reason"] == c.DEADLINE_EXCEEDED
    assert_retired(sim.status, c.JOB_FAILED)


def test_a_job_that_ended_stalled_under_an_older_operator_is_cleaned_up() -> None:
    sim = running_sim()
    sim.succeed_all()
    sim.reconcile()
    stall(sim)  # what an operator without this fix left behind
    sim.status["conditions"] = c.set_condition(
        sim.status["conditions"], c.SUCCEEDED, "False", "x", "", T0
    )
    sim.status["conditions"] = c.set_condition(
        sim.status["conditions"], c.FAILED, "True", c.BACKOFF_LIMIT_EXCEEDED, "", T0
    )
    sim.reconcile()
    assert_retired(sim.status, c.JOB_FAILED)


def test_an_invalid_stored_spec_retires_the_verdicts() -> None:
    sim = running_sim()
    stall(sim)
    sim.job["spec"]["nodes"] = 0
    sim.reconcile()
    assert sim.status["phase"] == "Failed"
    assert_retired(sim.status, c.JOB_FAILED)


@pytest.mark.parametrize("phase", ["Pending", "Restarting", "Suspended", "Succeeded", "Failed"])
def test_the_gauges_ignore_a_stale_status_unless_running(phase: str) -> None:
    """Even a status that still says Stalled (an older operator's) pages only while Running."""
    status = {
        "phase": phase,
        "conditions": [c.make(c.STALLED, "True", c.STALL_CONFIRMED, "no step", T0)],
        "bottleneck": dict(STALL_VERDICT),
    }
    assert gauges(status) == (0.0, [])
    assert JobSample.from_status({**status, "phase": "Running"}).stalled == 1.0


def test_every_per_job_verdict_alert_is_gated_on_the_running_phase() -> None:
    verdict_families = (opfamilies.JOB_STALLED.name, opfamilies.JOB_VERDICT.name)
    gated = [a for a in alerts.JOB_ALERTS if any(f in a.expr for f in verdict_families)]
    assert {a.name for a in gated} >= {"GPUJobStalled", "GPUJobBottleneckPersisting"}
    for a in gated:
        assert a.expr.endswith(f"and {alerts.RUNNING}"), a.expr
