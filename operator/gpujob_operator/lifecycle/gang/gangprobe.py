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
from gpujob_operator.lifecycle.gang import podholds

_CONTAINER_LISTS: Final = ("containers", "initContainers")
_FIELDS: Final = ("requests", "limits")

Place = tuple[str, str | None, str | None]
"""Where a resource list is in a pod: (container list, container name, field), the pod-level
``resources`` as ("resources", None, field), ``spec.overhead`` as ("overhead", None, None)."""


def _places(spec: dict[str, Any]) -> list[tuple[dict[str, Any], str, Place]]:
    """Each resource list set in ``spec``: the dict that holds it, its key, its place."""
    out: list[tuple[dict[str, Any], str, Place]] = []
    for key in _CONTAINER_LISTS:
        for c in spec.get(key) or []:
            res = c.get("resources") or {}
            out += [(res, f, (key, c.get("name"), f)) for f in _FIELDS if res.get(f)]
    res = spec.get("resources") or {}
    out += [(res, f, ("resources", None, f)) for f in _FIELDS if res.get(f)]
    if spec.get("overhead"):
        out.append((spec, "overhead", ("overhead", None, None)))
    return out


def _list_at(pod: Mapping[str, Any], place: Place) -> Mapping[str, Any]:
    spec = pod.get("spec") or {}
    key, name, field = place
    if field is None:
        return spec.get(key) or {}
    if name is None:
        return (spec.get(key) or {}).get(field) or {}
    for c in spec.get(key) or []:
        if c.get("name") == name:
            return (c.get("resources") or {}).get(field) or {}
    return {}


def _sum(pods: Sequence[Mapping[str, Any]], place: Place) -> dict[str, str]:
    values: dict[str, list[Decimal]] = {}
    for pod in pods:
        for name, text in _list_at(pod, place).items():
            q = parse_quantity(text)
            if q is None:
                raise ValueError(f"not a quantity: {text!r}")
            values.setdefault(name, []).append(q)
    return {name: format_quantity(total(v)) for name, v in values.items()}


def probe_pod(pods: Sequence[Mapping[str, Any]], total: int = 0) -> dict[str, Any] | None:
    """The first pod with each container's requests and limits (and the pod's own, and its
    overhead) summed over ``pods``: it holds what the whole gang holds. ``total`` (more than
    ``len(pods)``: the pods are a batch of the gang) counts the rest as copies of the last.

    None when there is nothing to add up (fewer than two pods, or no resources at all), when
    a quantity cannot be read (the pods' own dry runs will say why), or when the probe would
    not hold what the gang holds as the quota counts it (:mod:`.podholds`): pods of
    different shapes (a sidecar on some only) do not add up container by container.
    """
    if total > len(pods) and pods:
        pods = [*pods, *[pods[-1]] * (total - len(pods))]
    if len(pods) < 2:
        return None
    probe = copy.deepcopy(dict(pods[0]))
    # Every container (init containers and sidecars count toward quota too), then the
    # pod-level resources (PodLevelResources) and overhead, each summed over the gang.
    places = _places(probe.get("spec") or {})
    if not places:
        return None
    try:
        for parent, key, place in places:
            parent[key] = _sum(pods, place)
    except ValueError:
        return None
    for holds in (podholds.requests, podholds.limits):
        if holds(probe) != podholds.summed(holds(p) for p in pods):
            return None
    return probe
