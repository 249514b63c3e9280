"""The gang probe pod: the gang's summed resources in one pod, quantities exact."""

from __future__ import annotations

from typing import Any

from gpujob_operator.api import parse_spec
from gpujob_operator.lifecycle import builders
from gpujob_operator.lifecycle.gang import gangprobe, podholds


def gang(nodes: int, **resources: Any) -> list[dict[str, Any]]:
    job = {
        "metadata": {"name": "j", "namespace": "ns", "uid": "u"},
        "spec": {
            "image": "x",
            "command": ["true"],
            "nodes": nodes,
            "gpusPerNode": 2,
            **({"resources": resources} if resources else {}),
        },
    }
    spec = parse_spec(job["spec"])
    return [builders.build_pod(job, r, 0, spec) for r in range(nodes)]


def test_probe_asks_for_the_whole_gang() -> None:
    pods = gang(3, requests={"cpu": "500m", "memory": "1Gi"}, limits={"memory": "1Gi"})
    probe = gangprobe.probe_pod(pods)
    assert probe is not None and probe["metadata"]["name"] == pods[0]["metadata"]["name"]
    res = probe["spec"]["containers"][0]["resources"]
    assert res["requests"]["cpu"] == "1500m"
    assert res["requests"]["memory"] == str(3 * 2**30)
    assert res["limits"]["nvidia.com/gpu"] == "6" and res["requests"]["nvidia.com/gpu"] == "6"
    # the pods themselves are untouched
    assert pods[0]["spec"]["containers"][0]["resources"]["requests"]["cpu"] == "500m"


def test_a_batch_of_the_gang_asks_for_the_whole_gang() -> None:
    pods = gang(5, requests={"cpu": "500m"})
    batch = gangprobe.probe_pod(pods[:2], total=5)
    assert batch is not None and batch == gangprobe.probe_pod(pods)
    assert batch["spec"]["containers"][0]["resources"]["requests"]["cpu"] == "2500m"
    one = gangprobe.probe_pod(pods[:1], total=5)  # the last batch may hold a single pod
    assert (
        one is not None
        and one["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "10"
    )


def test_no_probe_for_one_pod_or_no_resources() -> None:
    assert gangprobe.probe_pod(gang(1)) is None
    pods = gang(2)
    for p in pods:
        p["spec"]["containers"][0].pop("resources", None)
    assert gangprobe.probe_pod(pods) is None


def test_probe_counts_init_containers_sidecars_and_pod_level_resources() -> None:
    pods = gang(2)
    for p in pods:
        p["spec"]["initContainers"] = [
            {"name": "fetch", "image": "x", "resources": {"requests": {"cpu": "1"}}},
            {
                "name": "log",
                "image": "x",
                "restartPolicy": "Always",
                "resources": {"requests": {"memory": "64Mi"}},
            },
        ]
        p["spec"]["resources"] = {"requests": {"cpu": "3"}}
    probe = gangprobe.probe_pod(pods)
    assert probe is not None
    init = {c["name"]: c["resources"]["requests"] for c in probe["spec"]["initContainers"]}
    assert init == {"fetch": {"cpu": "2"}, "log": {"memory": str(128 * 2**20)}}
    assert probe["spec"]["resources"]["requests"] == {"cpu": "6"}


def test_probe_with_pod_level_resources_only() -> None:
    pods = gang(2)
    for p in pods:
        p["spec"]["containers"][0].pop("resources", None)
        p["spec"]["resources"] = {"limits": {"memory": "1Gi"}}
    probe = gangprobe.probe_pod(pods)
    assert probe is not None and probe["spec"]["resources"]["limits"] == {"memory": str(2 * 2**30)}


def test_the_probe_holds_what_the_gang_holds_as_the_quota_counts_it() -> None:
    """Native sidecars and init containers add up pod by pod (lifecycle/gang/podholds.py); pods
    of different shapes do not add up container by container, so they get no probe."""
    pods = gang(3, requests={"cpu": "1"})
    for p in pods:
        p["spec"]["initContainers"] = [
            {"name": "log", "restartPolicy": "Always", "resources": {"requests": {"cpu": "1"}}},
            {"name": "prep", "resources": {"requests": {"cpu": "4"}}},
        ]
    probe = gangprobe.probe_pod(pods)
    assert probe is not None
    assert podholds.requests(probe)["cpu"] == 3 * 5  # max(1 + 1, 4 + 1) per pod
    assert podholds.requests(probe) == podholds.summed(podholds.requests(p) for p in pods)
    pods[2]["spec"]["initContainers"].append(
        {"name": "extra", "restartPolicy": "Always", "resources": {"requests": {"cpu": "8"}}}
    )  # that pod holds 1 + 1 + 8: the gang 20, a probe shaped like the first pod 15
    assert gangprobe.probe_pod(pods) is None


def test_the_probe_adds_up_the_pods_overhead() -> None:
    pods = gang(2)
    for p in pods:
        p["spec"]["overhead"] = {"cpu": "250m"}
    probe = gangprobe.probe_pod(pods)
    assert probe is not None and probe["spec"]["overhead"] == {"cpu": "500m"}
