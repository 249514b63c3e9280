"""Ghost pods: the index holds a pod the API server no longer has (its DELETED was lost in
a watch re-list). The planner must not wait for it for ever, nor let it hide a lost rank.

The job loop is the real one, with the real planner; the Kube stand-in
(tests/support/fakekube.py) holds the API server's truth (which pods exist) while the index
handed to the loop is the stale one.
"""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import pytest

from gpujob_operator.api import conditions as c
from gpujob_operator.lifecycle import backoff
from gpujob_operator.observability.opmetrics import METRICS
from gpujob_operator.runtime import jobloop
from tests.support.fakekube import FakeKube
from tests.unit.operator.lifecycle.test_planner import Sim, make_job


def failed_gang() -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A 2-rank job whose rank 1 failed: the job, and its pods (attempt 0) as indexed."""
    sim = Sim(make_job(nodes=2, gpusPerNode=8))
    sim.reconcile()
    sim.run_all()
    sim.reconcile()
    sim.fail("bert-node-1")
    for i, pod in enumerate(sim.pods.values()):
        pod["metadata"]["uid"] = f"old-{i}"
    return sim.job, [copy.deepcopy(p) for p in sim.pods.values()]


def loop_over(kube: FakeKube, job: dict[str, Any], index: list[dict[str, Any]]) -> jobloop.JobLoop:
    loop = jobloop.JobLoop(kube, lambda *a: None, restart_backoff=backoff.Policy(0.0, 0.0))  # type: ignore[arg-type]
    loop.body, loop._pods = job, lambda: index
    return loop


def ghosts_seen(proof: str) -> float:
    return METRICS._ghost_pods.get(proof, 0.0)


def test_a_404_on_delete_proves_the_pod_gone_and_the_gang_is_created_again() -> None:
    job, index = failed_gang()
    kube = FakeKube(job)  # both pods are already gone from the API server
    loop = loop_over(kube, job, index)
    before = ghosts_seen("delete_404")
    asyncio.run(loop.reconcile(job, loop.pods()))
    assert sorted(kube.calls) == ["delete bert-node-0", "delete bert-node-1"]
    assert loop.pods() == [], "the index's ghosts are left out of planning"
    assert ghosts_seen("delete_404") - before == 2
    job["status"] = kube.status
    asyncio.run(loop.reconcile(job, loop.pods()))
    assert "create bert-node-0" in kube.calls and "create bert-node-1" in kube.calls


def test_a_wait_blocked_on_terminating_ghosts_plans_from_a_fresh_listing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The old pods were deleted (deletionTimestamp set) and their DELETED was lost: the
    planner waits for them without deleting again. Blocked past the threshold, the loop
    lists the job's pods, finds them gone, and the restart goes on."""
    # The index never shows the deletes here: the loop's wait for it ends at its bound.
    monkeypatch.setattr(jobloop, "INDEX_WAIT_SECONDS", 0.1)
    job, index = failed_gang()
    kube = FakeKube(job, index)
    loop = loop_over(kube, job, index)
    asyncio.run(loop.reconcile(job, loop.pods()))  # deletes both (the gang restart)
    for pod in index:
        pod["metadata"]["deletionTimestamp"] = "2026-03-01T12:00:00Z"
    job["status"] = kube.status
    kube.calls.clear()
    plan = asyncio.run(loop.reconcile(job, loop.pods()))
    assert c.find(plan.status["conditions"], c.RUNNING)["reason"] == c.WAITING_FOR_OLD_PODS
    assert "list" not in kube.calls, "not blocked for long yet: no listing"

    monkeypatch.setattr(jobloop, "AUDIT_BLOCKED_SECONDS", 0.0)
    monkeypatch.setattr(jobloop, "AUDIT_MIN_GAP_SECONDS", 0.0)
    before = ghosts_seen("listing")
    asyncio.run(loop.reconcile(job, loop.pods()))
    assert "list" in kube.calls
    assert loop.pods() == [] and ghosts_seen("listing") - before == 2
    job["status"] = kube.status
    asyncio.run(loop.reconcile(job, loop.pods()))
    assert "create bert-node-0" in kube.calls and "create bert-node-1" in kube.calls


def test_a_ghost_of_the_running_gang_is_found_by_the_periodic_listing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A rank's pod vanished and its DELETED was lost: the index still shows it Running, so
    nothing would ever restart the gang. The periodic listing proves it gone; the planner
    then sees the rank lost and restarts the gang."""
    sim = Sim(make_job(nodes=2, gpusPerNode=8))
    sim.reconcile()
    sim.run_all()
    sim.reconcile()
    index = [copy.deepcopy(p) for p in sim.pods.values()]
    for i, pod in enumerate(index):
        pod["metadata"]["uid"] = f"run-{i}"
    job = sim.job
    kube = FakeKube(job, index[:1])  # rank 1's pod is gone
    loop = loop_over(kube, job, index)
    plan = asyncio.run(loop.reconcile(job, loop.pods()))
    assert plan.phase == c.PHASE_RUNNING and "list" not in kube.calls

    monkeypatch.setattr(jobloop, "AUDIT_SECONDS", 0.0)
    monkeypatch.setattr(jobloop, "AUDIT_MIN_GAP_SECONDS", 0.0)
    asyncio.run(loop.reconcile(job, loop.pods()))
    assert [p["metadata"]["uid"] for p in loop.pods()] == ["run-0"]
    job["status"] = kube.status
    plan = asyncio.run(loop.reconcile(job, loop.pods()))
    assert plan.phase == c.PHASE_RESTARTING, plan.status


def test_a_gang_restart_deletes_each_pod_once_though_the_index_shows_the_deletes_late() -> None:
    """The watch delivers each delete a moment after the API server answered it: the loop
    waits for the index to show them, so the next pass does not delete the same pods again
    (each delete of a wide job's pod is a write of its whole body)."""
    job, index = failed_gang()

    class LateWatch(FakeKube):
        async def delete_pod(self, namespace: str, name: str) -> bool:
            existed = await super().delete_pod(namespace, name)

            def delivered() -> None:
                for pod in index:
                    if pod["metadata"]["name"] == name:
                        pod["metadata"]["deletionTimestamp"] = "2026-03-01T12:00:00Z"

            asyncio.get_running_loop().call_later(0.05, delivered)
            return existed

    kube = LateWatch(job, index)
    loop = loop_over(kube, job, index)
    asyncio.run(loop.reconcile(job, loop.pods()))  # the gang restart: both deleted
    assert sorted(kube.names("delete")) == ["bert-node-0", "bert-node-1"]
    assert all(p["metadata"].get("deletionTimestamp") for p in index), "planned on too soon"
    job["status"] = kube.status
    kube.calls.clear()
    asyncio.run(loop.reconcile(job, loop.pods()))
    assert kube.names("delete") == [], "the same pods deleted again"
