"""What a pod holds on its node, as kube-scheduler and the ResourceQuota plugin count it.

The start forecast (how many GPUs a bound pod or a Kueue pod set takes) and the gang probe
(whether its one pod asks for the whole gang) must count a pod the same way, and the way
Kubernetes does (``component-helpers/resource.PodRequests``/``PodLimits``): the app
containers and native sidecars (init containers with ``restartPolicy: Always``) add up; each
other init container runs alone beside the sidecars started before it; the pod holds the
larger of the two. Pod-level resources (cpu, memory, hugepages) replace the containers'
sum where set, and the pod's overhead comes on top. A missing request defaults to its
limit, as the API server defaults it, so built pods and templates count like stored pods.
Plain dicts in, quantities out; a value the server would refuse counts as absent.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from decimal import Decimal
from typing import Any, Final, Literal

from gpujob_operator.api.quantity import add, parse_quantity

Resources = dict[str, Decimal]
Field = Literal["requests", "limits"]

_POD_LEVEL: Final = frozenset({"cpu", "memory"})
"""Resources pod-level ``spec.resources`` may set (and every ``hugepages-<size>``)."""


def requests(pod: Mapping[str, Any]) -> Resources:
    """The pod's effective requests: what the scheduler fits on a node and quota charges."""
    return _holds(pod, "requests")


def limits(pod: Mapping[str, Any]) -> Resources:
    """The pod's effective limits (what ``limits.*`` quotas charge; overhead only on a set
    non-zero limit)."""
    return _holds(pod, "limits")


def summed(held: Iterable[Resources]) -> Resources:
    """Several pods' holdings added up (a gang's)."""
    out: Resources = {}
    for one in held:
        _add(out, one)
    return out


def _pod_level(name: str) -> bool:
    return name in _POD_LEVEL or name.startswith("hugepages-")


def _read(values: Any) -> Resources:
    out: Resources = {}
    if isinstance(values, Mapping):
        for name, value in values.items():
            q = parse_quantity(value)
            if q is not None and q >= 0:
                out[str(name)] = q
    return out


def _of(resources: Any, field: Field) -> Resources:
    """One requests or limits list of ``resources`` (a request defaults to its limit)."""
    if not isinstance(resources, Mapping):
        return {}
    got = _read(resources.get(field))
    if field == "requests":
        for name, q in _read(resources.get("limits")).items():
            got.setdefault(name, q)
    return got


def _add(into: Resources, more: Resources) -> None:
    for name, q in more.items():
        into[name] = add(into[name], q) if name in into else q


def _max(into: Resources, more: Resources) -> None:
    for name, q in more.items():
        if name not in into or q > into[name]:
            into[name] = q


def _containers(spec: Mapping[str, Any], field: Field) -> Resources:
    held: Resources = {}
    for c in spec.get("containers") or ():
        _add(held, _of(c.get("resources"), field))
    sidecars: Resources = {}
    init_peak: Resources = {}
    for c in spec.get("initContainers") or ():
        own = _of(c.get("resources"), field)
        if c.get("restartPolicy") == "Always":
            _add(held, own)
            _add(sidecars, own)
            _max(init_peak, sidecars)
        else:
            _add(own, sidecars)
            _max(init_peak, own)
    _max(held, init_peak)
    return held


def _holds(pod: Mapping[str, Any], field: Field) -> Resources:
    spec = pod.get("spec") or {}
    held = _containers(spec, field)
    pod_level = spec.get("resources")
    if not isinstance(pod_level, Mapping):
        pod_level = {}
    own = {k: q for k, q in _read(pod_level.get(field)).items() if _pod_level(k)}
    if field == "requests":
        # The server defaults a pod-level request to its limit unless a container asks.
        for k, q in _read(pod_level.get("limits")).items():
            if _pod_level(k) and k not in own and k not in held:
                own[k] = q
    held.update(own)
    for k, q in _read(spec.get("overhead")).items():
        if field == "requests":
            _add(held, {k: q})
        elif held.get(k):
            held[k] = add(held[k], q)
    return held
