"""The pod index keeps a projection of each pod: everything that reads indexed pods must see the
same in it as in the body, and it must not grow with the template."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from gpujob_operator.lifecycle import builders
from gpujob_operator.lifecycle.observations import observe_pod, project_pod
from gpujob_operator.monitoring.monitor import exited_ranks, scrape_targets
from gpujob_trainer import contract
from tests.unit.operator.lifecycle.test_planner import make_job

BIG = "x" * 4096


def heavy_job(host_network: bool = False) -> dict[str, Any]:
    """A job whose pods are about 400 KB each: env, a sidecar's args, volumes."""
    template: dict[str, Any] = {
        "containers": [{"name": "sidecar", "image": "s:1", "args": [BIG] * 40}],
        "volumes": [{"name": f"v{i}", "emptyDir": {}} for i in range(8)],
    }
    if host_network:
        template["hostNetwork"] = True
    return make_job(
        nodes=4,
        gpusPerNode=8,
        env=[{"name": f"V{i}", "value": BIG} for i in range(50)],
        template=template,
    )


def with_status(pod: dict[str, Any], phase: str, **status: Any) -> dict[str, Any]:
    pod = copy.deepcopy(pod)
    meta = pod["metadata"]
    meta.update(uid=f"uid-{meta['name']}", namespace="ml")
    meta["managedFields"] = [{"manager": "kubectl", "fieldsV1": {"f:spec": {BIG: {}}}}] * 10
    meta.setdefault("annotations", {})[contract.ANNOTATION_RESTARTS_BASE] = "2"
    pod["spec"]["nodeName"] = "n7"
    pod["status"] = {"phase": phase, "podIP": "10.0.0.7", **status}
    return pod


def cases() -> list[dict[str, Any]]:
    job = heavy_job()
    host = heavy_job(host_network=True)
    running = with_status(
        builders.build_pod(job, 1, 3), "Running", startTime="2026-12-07T00:00:00Z"
    )
    failed = with_status(
        builders.build_pod(job, 2, 3, in_place=True),
        "Running",
        containerStatuses=[
            {"name": "trainer", "restartCount": 3, "lastState": {"terminated": {"exitCode": 1, "reason": "Error", "message": "boom", "finishedAt": "2026-12-07T00:01:00Z"}}, "state": {"running": {}}},
            {"name": "sidecar", "restartCount": 0, "state": {"running": {}}},
        ],
        conditions=[{"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI", "message": "drain"}],
    )  # fmt: skip
    done = with_status(
        builders.build_pod(job, 0, 3),
        "Succeeded",
        containerStatuses=[{"name": "trainer", "state": {"terminated": {"exitCode": 0}}}],
    )
    gone = with_status(builders.build_pod(job, 3, 3), "Running")
    gone["metadata"]["deletionTimestamp"] = "2026-12-07T00:02:00Z"
    on_host = with_status(builders.build_pod(host, 1, 3), "Running")
    return [running, failed, done, gone, on_host]


@pytest.mark.parametrize("index", range(5))
def test_what_the_operator_reads_of_a_pod_is_the_same_in_its_projection(index: int) -> None:
    pod = cases()[index]
    small = project_pod(pod)
    assert observe_pod(small) == observe_pod(pod)
    spec = heavy_job(host_network=index == 4)["spec"]
    for uid in (None, "u1", "someone-else"):
        assert scrape_targets(spec, [small], uid) == scrape_targets(spec, [pod], uid)
        assert exited_ranks([small], uid) == exited_ranks([pod], uid)
    assert len(json.dumps(pod)) > 300_000
    assert len(json.dumps(small)) < 3_000, json.dumps(small)[:500]


def test_the_projection_shares_no_dict_with_the_body_but_its_status() -> None:
    pod = cases()[1]
    small = project_pod(pod)
    small["metadata"]["labels"]["x"] = "y"
    small["spec"]["containers"][0]["name"] = "changed"
    assert "x" not in pod["metadata"]["labels"]
    assert pod["spec"]["containers"][0]["name"] == "trainer"
    assert "managedFields" not in small["metadata"]
