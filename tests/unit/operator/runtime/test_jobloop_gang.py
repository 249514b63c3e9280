"""The job loop's gang I/O (runtime/jobloop.py): a refused admission object means no pod,
and a refusal the planner shows like a refused pod. The Kube stand-in records calls; the
planner and gang builders are the real ones."""

from __future__ import annotations

import asyncio
import copy
from typing import Any

from kubernetes.client.rest import ApiException

from gpujob_operator.api import conditions as c
from gpujob_operator.lifecycle.gang import ObjectRef
from gpujob_operator.runtime import jobloop
from tests.unit.operator.lifecycle.test_planner import make_job

FORBIDDEN = (
    '{"kind": "Status", "reason": "Forbidden", "message": "podgroups.scheduling.k8s.io is '
    'forbidden: User \\"system:serviceaccount:ml:op\\" cannot create resource \\"podgroups\\""}'
)


class RefusingKube:
    """Serves scheduling.k8s.io; refuses to create gang objects with a 403."""

    def __init__(self) -> None:
        self.created_pods: list[str] = []
        self.created_objects: list[str] = []
        self.status: dict[str, Any] = {}

    async def service_exists(self, ns: str, name: str) -> bool:
        return True

    async def serves(self, group: str, version: str, plural: str) -> bool:
        return True

    async def get_object(self, ns: str, ref: ObjectRef) -> dict[str, Any] | None:
        return None

    async def patch_status(self, ns: str, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        self.status = copy.deepcopy(patch)
        return {"metadata": {"resourceVersion": "2"}, "status": copy.deepcopy(patch)}

    async def create_object(self, ns: str, body: dict[str, Any]) -> bool:
        self.created_objects.append(body["metadata"]["name"])
        e = ApiException(status=403, reason="Forbidden")
        e.body = FORBIDDEN
        raise e

    async def create_pod(self, ns: str, body: dict[str, Any], dry_run: bool = False) -> bool:
        self.created_pods.append(body["metadata"]["name"])
        return True

    async def delete_object(self, ns: str, ref: ObjectRef) -> None:
        return None

    async def delete_pod(self, ns: str, name: str) -> bool:
        return True


def test_a_refused_workload_creates_no_pod_and_the_status_says_why() -> None:
    kube = RefusingKube()
    events: list[tuple[str, str, str]] = []
    loop = jobloop.JobLoop(kube, lambda job, t, r, m: events.append((t, r, m)))  # type: ignore[arg-type]
    job = make_job(nodes=2, gpusPerNode=4, scheduling={"gang": "Native"})
    asyncio.run(loop.reconcile(job, []))
    assert kube.created_objects == ["bert"] and kube.created_pods == []
    assert loop.refused is not None and loop.refused.refusal.reason == c.OPERATOR_FORBIDDEN
    assert "Workload" in loop.refused.target
    job["status"] = kube.status
    asyncio.run(loop.reconcile(job, []))
    running = c.find(kube.status["conditions"], c.RUNNING) or {}
    assert running.get("reason") == c.OPERATOR_FORBIDDEN
    assert "cannot create resource" in str(running.get("message"))
    assert kube.created_pods == []
    assert ("Warning", c.OPERATOR_FORBIDDEN) in [(t, r) for t, r, _ in events]
