"""One pod that asks for the whole gang's resources, so a dry run checks the gang's quota.

A server-side dry run of each pod checks each pod alone: a ResourceQuota with 2 GPUs left
admits every 2-GPU pod of a 2 x 2-GPU gang, and the real creates then stop half way. Dry
runs do not add up, so the job loop also dry-runs this probe: the first pod of the gang
with every container's requests and limits summed over all the pods being created. The
quota plugin then judges the gang's total and answers with its own message (``exceeded
quota: gpu, requested: requests.nvidia.com/gpu=4, ...``), scopes (priority class,
terminating, best effort) included. Only a quota refusal of the probe counts; anything else
(a LimitRange's per-pod maximum, say) is the single pods' dry runs to judge. A quota on the
number of pods (``pods``, ``count/pods``) sees one pod, not the gang: there, as when another
job takes the quota between the dry runs and the creates, the planner deletes the pods of a
gang that stays incomplete after a grace.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from decimal import Decimal
from typing import Any, Final

from gpujob_operator.api.quantity import format_quantity, parse_quantity, total

_CONTAINER_LISTS: Final = ("containers", "initContainers")


def _resources_of(pod: Mapping[str, Any], where: tuple[str, str | None]) -> Mapping[str, Any]:
    """``resources`` of one container (list key, name) or, with no list, of the pod itself."""
    spec = pod.get("spec") or {}
    key, name = where
    if name is None:
        return spec.get("resources") or {}
    for c in spec.get(key) or []:
        if c.get("name") == name:
            return c.get("resources") or {}
    return {}


def _sum(
    pods: Sequence[Mapping[str, Any]], where: tuple[str, str | None], field: str
) -> dict[str, str]:
    values: dict[str, list[Decimal]] = {}
    for pod in pods:
        for name, text in (_resources_of(pod, where).get(field) or {}).items():
            q = parse_quantity(text)
            if q is None:
                raise ValueError(f"not a quantity: {text!r}")
            values.setdefault(name, []).append(q)
    return {name: format_quantity(total(v)) for name, v in values.items()}


def probe_pod(pods: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """The first pod with each container's requests and limits summed over ``pods``.

    None when there is nothing to add up (fewer than two pods, or no resources at all), or
    when a quantity cannot be read (the pods' own dry runs will say why).
    """
    if len(pods) < 2:
        return None
    probe = copy.deepcopy(dict(pods[0]))
    spec = probe.get("spec") or {}
    # Every container (init containers and sidecars count toward quota too), then the
    # pod-level resources (PodLevelResources), each summed over the gang.
    places: list[tuple[dict[str, Any], tuple[str, str | None]]] = [
        (c.get("resources") or {}, (key, c.get("name")))
        for key in _CONTAINER_LISTS
        for c in spec.get(key) or []
    ]
    if spec.get("resources"):
        places.append((spec["resources"], ("resources", None)))
    try:
        found = False
        for res, where in places:
            for field in ("requests", "limits"):
                if res.get(field):
                    res[field] = _sum(pods, where, field)
                    found = True
    except ValueError:
        return None
    return probe if found else None
