"""Ghost pods: the index holds a pod the API server no longer has (its DELETED was lost in
a watch re-list). The planner must not wait for it for ever, nor let it hide a lost rank.

The job loop is the real one, with the real planner; the Kube stand-in holds the API
server's truth (which pods exist) while the index handed to the loop is the stale one.
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
from tests.unit.operator.lifecycle.test_planner import Sim, apply_merge_patch, make_job


class TruthKube:
    """The API server's side: the pods that really exist; every call recorded."""

    def __init__(self, pods: dict[str, dict[str, Any]]) -> None:
        self.pods = pods
        self.calls: list[str] = []
        self.status: dict[str, Any] = {}

    async def service_exists(self, ns: str, name: str) -> bool:
        return True

    async def serves(self, group: str, version: str, plural: str) -> bool:
        return True

    async def patch_status(self, ns: str, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        self.status = apply_merge_patch(self.status, copy.deepcopy(patch))
        return {"metadata": {"uid": "u1", "resourceVersion": "9"}, "status": self.status}

    async def create_pod(self, ns: str, body: dict[str, Any], dry_run: bool = False) -> bool:
        if not dry_run:
            self.calls.append(f"create {body['metadata']['name']}")
            pod = copy.deepcopy(body)
            pod["metadata"]["uid"] = f"new-{body['metadata']['name']}"
            self.pods[body["metadata"]["name"]] = pod
        return True

    async def delete_pod(self, ns: str, name: str) -> bool:
        self.calls.append(f"delete {name}")
        return self.pods.pop(name, None) is not None

    async def pod_uids(self, ns: str, selector: str) -> set[str]:
        self.calls.append("list")
        return {p["metadata"]["uid"] for p in self.pods.values()}


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


def loop_over(kube: TruthKube, job: dict[str, Any], index: list[dict[str, Any]]) -> jobloop.JobLoop:
    loop = jobloop.JobLoop(kube, lambda *a: None, restart_backoff=backoff.Policy(0.0, 0.0))  # type: ignore[arg-type]
    loop.body, loop._pods = job, lambda: index
    kube.status = copy.deepcopy(job.get("status") or {})
    return loop


def ghosts_seen(proof: str) -> float:
    return METRICS._ghost_pods.get(proof, 0.0)


def test_a_404_on_delete_proves_the_pod_gone_and_the_gang_is_created_again() -> None:
    job, index = failed_gang()
    kube = TruthKube({})  # both pods are already gone from the API server
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
    job, index = failed_gang()
    kube = TruthKube({p["metadata"]["name"]: p for p in copy.deepcopy(index)})
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
    kube = TruthKube({index[0]["metadata"]["name"]: index[0]})  # rank 1's pod is gone
    job = sim.job
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
