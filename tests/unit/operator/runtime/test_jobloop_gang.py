"""The job loop's gang I/O (runtime/jobloop.py): a refused admission object means no pod,
and a refusal the planner shows like a refused pod. The Kube stand-in
(tests/support/fakekube.py) records calls and refuses the gang object; the planner and gang
builders are the real ones."""

from __future__ import annotations

import asyncio

from gpujob_operator.api import conditions as c
from gpujob_operator.runtime import jobloop
from tests.support.fakekube import FakeKube, api_error
from tests.unit.operator.lifecycle.test_planner import make_job

FORBIDDEN = api_error(
    403,
    "Forbidden",
    'podgroups.scheduling.k8s.io is forbidden: User "system:serviceaccount:ml:op" cannot '
    'create resource "podgroups"',
)


def test_a_refused_workload_creates_no_pod_and_the_status_says_why() -> None:
    events: list[tuple[str, str, str]] = []
    job = make_job(nodes=2, gpusPerNode=4, scheduling={"gang": "Native"})
    kube = FakeKube(job, refuse={"create_object": FORBIDDEN})
    loop = jobloop.JobLoop(kube, lambda job, t, r, m: events.append((t, r, m)))  # type: ignore[arg-type]
    loop.body = job
    asyncio.run(loop.reconcile(job, []))
    assert kube.names("create-object") == ["bert"] and kube.names("create", "dry-run") == []
    assert loop.refused is not None and loop.refused.refusal.reason == c.OPERATOR_FORBIDDEN
    assert "Workload" in loop.refused.target
    job["status"] = kube.status
    asyncio.run(loop.reconcile(job, []))
    running = c.find(kube.status["conditions"], c.RUNNING) or {}
    assert running.get("reason") == c.OPERATOR_FORBIDDEN
    assert "cannot create resource" in str(running.get("message"))
    assert kube.names("create", "dry-run") == []
    assert ("Warning", c.OPERATOR_FORBIDDEN) in [(t, r) for t, r, _ in events]
