"""Dynamic Resource Allocation (resource.k8s.io/v1) as a local DRA driver does it (pure).

The node agent plays the GPU driver ``gpu.gpujob.dev``: it publishes one ResourceSlice
per node with one device per GPU the node advertises (:func:`resource_slice`) and the
DeviceClass that selects them (:func:`device_class`). The control plane does the rest as
on a real cluster: the resourceclaim controller makes each pod's claims from its
ResourceClaimTemplates and the scheduler allocates devices and picks the node. Where a
real driver's NodePrepareResources would hand the devices to the containers (CDI), the
agent sets ``GPUJOB_DRA_DEVICES`` (the allocated device names, comma-separated) in each
container that names the claim in ``resources.claims`` (:func:`container_devices`).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

DRIVER = "gpu.gpujob.dev"
DEVICE_CLASS = "gpu.gpujob.dev"
ENV = "GPUJOB_DRA_DEVICES"


class ClaimNotReady(RuntimeError):
    """A pod's ResourceClaim is not known or not allocated yet (the kubelet waits too)."""


def device_name(index: int) -> str:
    return f"gpu-{index}"


def device_uuid(node: str, index: int) -> str:
    """A stable, unique fake GPU UUID for a node's device (``GPU-<uuid>`` like NVML's)."""
    return f"GPU-{uuid.uuid5(uuid.NAMESPACE_URL, f'gpujob-local/{node}/{index}')}"


def slice_name(node: str) -> str:
    return f"{node}-{DRIVER}"


def resource_slice(node: str, gpus: int) -> dict[str, Any]:
    """The node's ResourceSlice: one pool named after the node, one device per GPU."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": slice_name(node)},
        "spec": {
            "driver": DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": [
                {
                    "name": device_name(i),
                    "attributes": {
                        "index": {"int": i},
                        "uuid": {"string": device_uuid(node, i)},
                    },
                }
                for i in range(gpus)
            ],
        },
    }


def device_class() -> dict[str, Any]:
    """The DeviceClass that selects this driver's devices (claims name it)."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": DEVICE_CLASS},
        "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]},
    }


def claim_names(pod: Mapping[str, Any]) -> dict[str, str]:
    """The pod's claims: its name for each (``spec.resourceClaims[].name``) -> the
    ResourceClaim object's name (given, or generated from a template and reported in
    ``status.resourceClaimStatuses``). A template's claim not reported yet is missing."""
    generated = {
        s["name"]: s.get("resourceClaimName")
        for s in pod.get("status", {}).get("resourceClaimStatuses") or []
    }
    out: dict[str, str] = {}
    for ref in pod.get("spec", {}).get("resourceClaims") or []:
        name = ref.get("resourceClaimName") or generated.get(ref["name"])
        if name:
            out[ref["name"]] = str(name)
    return out


def allocated_devices(claim: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(request, device) of every device of this driver allocated to a ResourceClaim."""
    allocation = claim.get("status", {}).get("allocation")
    if not allocation:
        raise ClaimNotReady(f"ResourceClaim {claim['metadata']['name']} is not allocated yet")
    return [
        (str(r["request"]), str(r["device"]))
        for r in allocation.get("devices", {}).get("results") or []
        if r.get("driver") == DRIVER
    ]


def container_devices(
    pod: Mapping[str, Any], claims: Mapping[str, Mapping[str, Any]]
) -> dict[str, list[str]]:
    """Container name -> the devices of the claims it names in ``resources.claims`` (only
    those of its ``request``, when it names one), in allocation order. ``claims`` maps the
    pod's claim names to their ResourceClaim objects."""
    spec = pod.get("spec", {})
    out: dict[str, list[str]] = {}
    for c in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]:
        devices: list[str] = []
        for ref in (c.get("resources") or {}).get("claims") or []:
            claim = claims.get(ref["name"])
            if claim is None:
                raise ClaimNotReady(f"claim {ref['name']!r} of container {c['name']} not found")
            wanted = ref.get("request")
            for request, device in allocated_devices(claim):
                if not wanted or request == wanted or request.startswith(f"{wanted}/"):
                    devices.append(device)
        if devices:
            out[c["name"]] = devices
    return out
