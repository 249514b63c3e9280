"""The local DRA driver: its slices and device class, and which devices reach which container."""

from __future__ import annotations

from typing import Any

import pytest

from gpujob_localcluster import dra


def claim(name: str, results: list[tuple[str, str, str]] | None) -> dict[str, Any]:
    status: dict[str, Any] = {}
    if results is not None:
        status["allocation"] = {
            "devices": {
                "results": [
                    {"request": r, "driver": d, "pool": "gpu-node-0", "device": dev}
                    for r, d, dev in results
                ]
            }
        }
    return {"metadata": {"name": name}, "status": status}


def test_a_nodes_slice_has_one_device_per_gpu_with_stable_distinct_uuids() -> None:
    body = dra.resource_slice("gpu-node-1", 3)
    spec = body["spec"]
    assert spec["driver"] == dra.DRIVER and spec["nodeName"] == "gpu-node-1"
    assert spec["pool"]["name"] == "gpu-node-1"
    assert [d["name"] for d in spec["devices"]] == ["gpu-0", "gpu-1", "gpu-2"]
    uuids = [d["attributes"]["uuid"]["string"] for d in spec["devices"]]
    assert len(set(uuids)) == 3 and uuids[0] == dra.device_uuid("gpu-node-1", 0)
    assert dra.device_uuid("gpu-node-0", 0) != uuids[0]
    assert dra.DRIVER in dra.device_class()["spec"]["selectors"][0]["cel"]["expression"]


def test_claim_names_come_from_the_spec_or_the_status() -> None:
    pod = {
        "spec": {
            "resourceClaims": [
                {"name": "gpus", "resourceClaimTemplateName": "t"},
                {"name": "fixed", "resourceClaimName": "shared"},
                {"name": "later", "resourceClaimTemplateName": "t"},
            ]
        },
        "status": {"resourceClaimStatuses": [{"name": "gpus", "resourceClaimName": "p-gpus-x"}]},
    }
    assert dra.claim_names(pod) == {"gpus": "p-gpus-x", "fixed": "shared"}


def test_each_container_gets_the_devices_of_the_claims_and_requests_it_names() -> None:
    pod = {
        "spec": {
            "initContainers": [{"name": "warm", "resources": {"claims": [{"name": "gpus"}]}}],
            "containers": [
                {"name": "main", "resources": {"claims": [{"name": "gpus", "request": "a"}]}},
                {"name": "plain"},
            ],
        }
    }
    claims = {
        "gpus": claim(
            "c", [("a", dra.DRIVER, "gpu-1"), ("b/x", dra.DRIVER, "gpu-2"), ("a", "other", "n")]
        )
    }
    assert dra.container_devices(pod, claims) == {"warm": ["gpu-1", "gpu-2"], "main": ["gpu-1"]}


def test_an_unallocated_or_unknown_claim_holds_the_pod_back() -> None:
    pod = {"spec": {"containers": [{"name": "main", "resources": {"claims": [{"name": "g"}]}}]}}
    with pytest.raises(dra.ClaimNotReady, match="not allocated"):
        dra.container_devices(pod, {"g": claim("c", None)})
    with pytest.raises(dra.ClaimNotReady, match="not found"):
        dra.container_devices(pod, {})
