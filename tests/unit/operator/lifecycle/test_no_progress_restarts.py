"""Gang restarts and progress: the ETA paused while a gang restarts, the furthest step kept
across attempts, and runPolicy.maxRestartsWithoutProgress stopping a crash loop that never
passes the furthest step (scripted attempts through the planner's fake cluster)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from gpujob_operator.api import conditions as c
from tests.unit.operator.lifecycle.test_planner import Sim, cond, disrupt, running_sim


def state(status: dict[str, Any]) -> dict[str, Any]:
    """``status.operatorState``: the operator's bookkeeping (absent when it keeps none)."""
    return dict(status.get("operatorState") or {})


def scraped(
    sim: Sim,
    step: int,
    furthest: int | None = None,
    rate_since: dict[str, Any] | None = None,
    **more: Any,
) -> None:
    """What the metrics task wrote into status.progress during the running attempt (and
    the ETA's basis, into status.operatorState.rateSince)."""
    progress = {
        "step": step,
        "furthestStep": max(step, furthest or 0),
        "totalSteps": 1000,
        "percent": step / 10,
        **more,
    }
    sim.job["status"]["progress"] = progress
    if rate_since is not None:
        sim.job["status"].setdefault("operatorState", {})["rateSince"] = rate_since


def fail_and_restart(sim: Sim) -> None:
    """Rank 0 fails; the gang is deleted, created again as the next attempt and runs."""
    sim.now += timedelta(seconds=30)
    sim.fail("bert-node-0", code=1)
    sim.reconcile()
    if sim.status["phase"] == "Failed":
        return
    sim.gc()
    sim.reconcile()
    sim.run_all()
    sim.reconcile()
    assert sim.status["phase"] == "Running", sim.status["phase"]


def test_a_gang_restart_drops_the_eta_keeps_the_step_and_records_the_furthest() -> None:
    sim = running_sim(runPolicy={"backoffLimit": 10})
    scraped(
        sim,
        600,
        resumedFromStep=100,
        etaSeconds=400.0,
        estimatedCompletionTime="2026-03-01T12:10:00Z",
        rate_since={"time": "2026-03-01T11:50:00Z", "step": 120, "attempt": 0},
    )
    sim.fail("bert-node-1", code=1)
    sim.reconcile()
    st = sim.status
    assert st["phase"] == "Restarting" and st["gang"]["attempt"] == 1
    p = st["progress"]
    assert p["step"] == 600 and p["furthestStep"] == 600
    for gone in ("etaSeconds", "estimatedCompletionTime", "resumedFromStep"):
        assert gone not in p, gone
    assert "rateSince" not in state(st)
    assert p["etaUnavailable"].startswith("restarting: the gang restarts as attempt 1")
    assert st["display"]["eta"] == "restarting"
    assert st["operatorState"]["furthestStepAtAttemptStart"] == 600
    assert "attemptsWithoutProgress" not in state(st), "attempt 0 passed step 0: it made progress"
    sim.gc()
    sim.reconcile()
    sim.run_all()
    sim.reconcile()
    assert sim.status["phase"] == "Running"
    assert sim.status["operatorState"]["furthestStepAtAttemptStart"] == 600, (
        "kept through the attempt"
    )


def test_attempts_that_never_pass_the_furthest_step_fail_the_job() -> None:
    sim = running_sim(runPolicy={"backoffLimit": 10})  # maxRestartsWithoutProgress: 3
    scraped(sim, 600)
    fail_and_restart(sim)  # attempt 0 reached 600: progress
    for attempt, step in ((1, 550), (2, 600)):  # resumed from 500, crashed before 600
        assert sim.status["gang"]["attempt"] == attempt
        scraped(sim, step, furthest=600, resumedFromStep=500)
        fail_and_restart(sim)
        assert len(sim.status["operatorState"]["attemptsWithoutProgress"]) == attempt
        assert sim.status["operatorState"]["attemptsWithoutProgress"] == list(range(1, attempt + 1))
    scraped(sim, 580, furthest=600, resumedFromStep=500)
    fail_and_restart(sim)  # the third attempt in a row without passing 600
    st = sim.status
    assert st["phase"] == "Failed" and st["gang"]["restarts"] == 3, "backoffLimit 10 not spent"
    failed = cond(st, c.FAILED)
    assert failed["reason"] == c.NO_PROGRESS_ACROSS_RESTARTS
    assert "attempts 1, 2 and 3 ended without passing step 600" in failed["message"]
    assert "maxRestartsWithoutProgress 3" in failed["message"]
    assert "bert-node-0 (node rank 0) failed: exit code 1" in failed["message"]
    assert c.NO_PROGRESS_ACROSS_RESTARTS in sim.reasons()
    assert st["progress"]["furthestStep"] == 600
    assert "etaSeconds" not in st["progress"]


def test_an_attempt_that_passes_the_furthest_step_resets_the_count() -> None:
    sim = running_sim(runPolicy={"backoffLimit": 10, "maxRestartsWithoutProgress": 2})
    scraped(sim, 600)
    fail_and_restart(sim)
    scraped(sim, 590, furthest=600)
    fail_and_restart(sim)
    assert len(sim.status["operatorState"]["attemptsWithoutProgress"]) == 1
    scraped(sim, 650, furthest=600)  # attempt 2 passed 600
    fail_and_restart(sim)
    assert "attemptsWithoutProgress" not in state(sim.status)
    assert sim.status["operatorState"]["furthestStepAtAttemptStart"] == 650
    scraped(sim, 640, furthest=650)
    fail_and_restart(sim)
    assert (
        sim.status["phase"] == "Running"
        and len(sim.status["operatorState"]["attemptsWithoutProgress"]) == 1
    )


def test_disruptions_do_not_count_as_attempts_without_progress() -> None:
    sim = running_sim(runPolicy={"backoffLimit": 10, "maxRestartsWithoutProgress": 2})
    scraped(sim, 600)
    fail_and_restart(sim)
    scraped(sim, 590, furthest=600)
    fail_and_restart(sim)
    assert len(sim.status["operatorState"]["attemptsWithoutProgress"]) == 1
    for _ in range(3):  # preempted three times before passing 600: not the job's fault
        scraped(sim, 595, furthest=600)
        sim.now += timedelta(seconds=30)
        disrupt(sim, "bert-node-1", "PreemptionByScheduler")
        sim.reconcile()
        sim.gc()
        sim.reconcile()
        sim.run_all()
        sim.reconcile()
        assert sim.status["phase"] == "Running"
        assert len(sim.status["operatorState"]["attemptsWithoutProgress"]) == 1
    assert sim.status["gang"]["preemptions"] == 3
    scraped(sim, 599, furthest=600)
    fail_and_restart(sim)
    assert sim.status["phase"] == "Failed"
    assert cond(sim.status, c.FAILED)["reason"] == c.NO_PROGRESS_ACROSS_RESTARTS
    message = cond(sim.status, c.FAILED)["message"]  # attempts 2-4 were preempted
    assert "attempts 1 and 5 ended without passing step 600" in message


def test_a_job_whose_ranks_never_reported_a_step_is_judged_by_backoff_limit_alone() -> None:
    sim = running_sim(runPolicy={"backoffLimit": 4, "maxRestartsWithoutProgress": 1})
    for _ in range(5):
        fail_and_restart(sim)
    assert sim.status["phase"] == "Failed"
    assert cond(sim.status, c.FAILED)["reason"] == c.BACKOFF_LIMIT_EXCEEDED
    assert "attemptsWithoutProgress" not in state(sim.status)
