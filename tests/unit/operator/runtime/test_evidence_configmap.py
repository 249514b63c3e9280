"""The hang evidence's ConfigMap: a name someone else holds is reported, never overwritten.

The evidence ConfigMap's name is predictable (``<job>-hang-<attempt>``): anyone in the
namespace may create one first. Before, the 409 path replaced that ConfigMap's data with the
job's evidence without looking whose it was.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from gpujob_operator.api.children import hang_configmap, hang_configmap_name
from gpujob_operator.monitoring.scrape.result import ScrapeTarget
from gpujob_operator.runtime import hangcapture
from gpujob_operator.runtime.kube import Kube, NameTaken
from tests.support.fakekube import FakeKube

JOB: dict[str, Any] = {
    "apiVersion": "gpujob.dev/v1alpha1",
    "kind": "GPUTrainingJob",
    "metadata": {"name": "bert", "namespace": "ml", "uid": "job-uid"},
    "status": {"gang": {"attempt": 0}},
}


class FakeCore:
    """CoreV1Api's ConfigMap calls: one ConfigMap already stored under the name; a JSON
    patch is applied as the API server applies it (a failed ``test`` is a 422)."""

    def __init__(self, stored: dict[str, Any]) -> None:
        self.api_client = client.ApiClient()
        self.stored = stored
        self.patches: list[Any] = []

    def create_namespaced_config_map(self, namespace: str, body: Any, **_: Any) -> None:
        raise ApiException(status=409, reason="Conflict")

    def patch_namespaced_config_map(self, name: str, namespace: str, body: Any, **_: Any) -> None:
        self.patches.append(body)
        for op in body:
            if op["op"] == "test":
                refs = self.stored["metadata"].get("ownerReferences") or [{}]
                if (
                    op["path"] != "/metadata/ownerReferences/0/uid"
                    or refs[0].get("uid") != op["value"]
                ):
                    raise ApiException(status=422, reason="Unprocessable Entity")
            elif op["op"] == "replace" and op["path"] == "/data":
                self.stored["data"] = op["value"]


def stored(owner_uid: str | None) -> dict[str, Any]:
    refs = [{"apiVersion": "v1", "kind": "Pod", "name": "x", "uid": owner_uid}]
    meta: dict[str, Any] = {"name": "bert-hang-0", "namespace": "ml", "resourceVersion": "42"}
    if owner_uid is not None:
        meta["ownerReferences"] = refs
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": {"theirs": "1"}}


def kube_with(core: FakeCore) -> Kube:
    kube = Kube(client.ApiClient(), may_write=lambda: True)
    kube.core = core  # type: ignore[assignment]
    return kube


@pytest.mark.parametrize("owner", [None, "someone-else"], ids=["no-owner", "other-owner"])
def test_a_configmap_of_the_name_that_is_not_the_jobs_is_not_overwritten(
    owner: str | None,
) -> None:
    core = FakeCore(stored(owner))
    body = hang_configmap(JOB, 0, {"summary": "ours"})
    with pytest.raises(NameTaken) as err:
        asyncio.run(kube_with(core).put_configmap("ml", body))
    assert core.stored["data"] == {"theirs": "1"}, "nothing was written"
    assert "bert-hang-0" in str(err.value)


def test_the_jobs_own_configmap_is_replaced_on_condition_that_the_job_owns_it() -> None:
    """Its own (an earlier capture of the same attempt): replaced, checked by the API server
    (the operator may not read ConfigMaps: the patch tests the owner itself)."""
    core = FakeCore(stored("job-uid"))
    body = hang_configmap(JOB, 0, {"summary": "ours"})
    asyncio.run(kube_with(core).put_configmap("ml", body))
    (patch,) = core.patches
    assert patch[0] == {"op": "test", "path": "/metadata/ownerReferences/0/uid", "value": "job-uid"}
    assert core.stored["data"] == {"summary": "ours"}


class NoAnswers:
    """A scraper whose ranks all fail to answer /debug/evidence."""

    async def fetch_all(
        self, targets: Sequence[ScrapeTarget], max_bytes: int, digest: Any = None
    ) -> list[tuple[bytes | None, str | None, str]]:
        return [(None, "refused", "connection refused") for _ in targets]


def test_a_taken_name_leaves_the_evidence_unstored_with_a_note_saying_why() -> None:
    """The record (which lets restartOnStall go) says where the evidence could not be stored
    and why; the other owner's ConfigMap keeps its data."""
    kube = FakeKube(JOB)
    name = hang_configmap_name("bert", 0)
    theirs = stored("someone-else")
    kube.configmaps[name] = theirs
    targets = [ScrapeTarget(url="http://10.0.0.1:9400/metrics", pod="bert-0", rank=0)]
    record, _ = asyncio.run(
        hangcapture.capture(kube, NoAnswers(), JOB, targets, "2026-03-01T12:00:00Z")  # type: ignore[arg-type]
    )
    assert record["configMap"] is None
    assert f"ConfigMap {name} exists and is not this job's" in record["note"]
    assert kube.configmaps[name]["data"] == {"theirs": "1"}
    assert len(record["note"]) <= 1024
