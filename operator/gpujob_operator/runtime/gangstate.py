"""Read the state of a job's gang admission objects for the planner (I/O).

Native gangs: the served ``scheduling.k8s.io`` version (API discovery, cached for the
process) and, while the gang is not running, its PodGroup (the scheduler's reason). Kueue:
the job's Workload (from the Workload watch's cache where it holds it:
:mod:`.watched`), the ResourceFlavors its admission names and, before Kueue made a
Workload, the job's WorkloadPriorityClass (those two cluster-scoped kinds are cached for
every job for 30 s). A 403 or 404 becomes the observation's error
(the planner shows it, and keeps any pods the gang has) instead of failing the pass; a
Workload that is not there (``get_object`` answers None) is gone, which the planner counts
like an eviction while the gang has pods.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Mapping
from typing import Any

from kubernetes.client.rest import ApiException

from gpujob_operator import api
from gpujob_operator.api import conditions as c
from gpujob_operator.api.status import attempt_of
from gpujob_operator.lifecycle import observations
from gpujob_operator.lifecycle.gang import gang
from gpujob_operator.observability.opmetrics import METRICS
from gpujob_operator.runtime.kube import Kube, api_reason
from gpujob_operator.runtime.watched import WatchedObjects

DISCOVERY_RECHECK_SECONDS = 60.0
"""How long "this API is not served" is trusted before discovery is asked again."""


async def observe(
    kube: Kube,
    job: Mapping[str, Any],
    default_gang: str,
    workloads: WatchedObjects | None = None,
) -> observations.GangObservation:
    """Read what the planner needs of the job's gang admission objects.

    Native: the served scheduling.k8s.io version (discovery, cached) and, while the gang
    is not running, its PodGroup (the scheduler's reason). Kueue: the job's Workload (from
    ``workloads``, the watch's cache, when it holds it; else a GET) and the ResourceFlavors
    its admission names.
    """
    try:
        spec = api.parse_spec(job["spec"])
    except ValueError:
        return observations.GangObservation(default=default_gang)
    mech = gang.mechanism(job, spec, default_gang)
    try:
        return await _observe(kube, job, mech, default_gang, workloads)
    except ApiException as e:
        if e.status not in (403, 404):
            raise
        return observations.GangObservation(default_gang, error=f"{e.status} {api_reason(e)}")


async def _observe(
    kube: Kube,
    job: Mapping[str, Any],
    mech: str,
    default_gang: str,
    workloads: WatchedObjects | None,
) -> observations.GangObservation:
    meta, status = job["metadata"], job.get("status") or {}
    ns, name = meta["namespace"], meta["name"]
    if mech == api.GANG_NATIVE:
        version = await served_version(kube)
        pod_group = None
        if version and status.get("phase") in (None, c.PHASE_PENDING, c.PHASE_RESTARTING):
            attempt = attempt_of(status)
            ref = gang.ObjectRef(
                gang.SCHEDULING_GROUP, version, "podgroups", gang.pod_group_name(name, attempt)
            )
            pod_group = await kube.get_object(ns, ref)
        return observations.GangObservation(default_gang, version, pod_group)
    if mech == api.GANG_KUEUE:
        ref = gang.ObjectRef(
            gang.KUEUE_GROUP, gang.KUEUE_VERSION, "workloads", gang.kueue_workload_name(job)
        )
        workload = workloads.get(ns, ref.name) if workloads is not None else None
        METRICS.observe_workload_read("api" if workload is None else "watch")
        if workload is None:
            workload = await kube.get_object(ns, ref)
            if workloads is not None:
                workloads.read(ns, ref.name, workload)
        flavors: dict[str, Mapping[str, Any]] = {}
        for flavor in sorted(set(gang.kueue_state(workload).flavors.values())):
            fref = gang.ObjectRef(gang.KUEUE_GROUP, gang.KUEUE_VERSION, "resourceflavors", flavor)
            found = await cluster_object(kube, fref)
            if found is not None:
                flavors[flavor] = found
        priority = None
        pclass = gang.priority_class(job)
        if workload is None and pclass:
            pref = gang.ObjectRef(
                gang.KUEUE_GROUP, gang.KUEUE_VERSION, "workloadpriorityclasses", pclass
            )
            wpc = await cluster_object(kube, pref)
            priority = int(wpc["value"]) if wpc and "value" in wpc else None
        return observations.GangObservation(
            default_gang, kueue_workload=workload, flavors=flavors, kueue_priority=priority
        )
    return observations.GangObservation(default_gang)


CLUSTER_OBJECT_SECONDS = 30.0
"""How long a ResourceFlavor or WorkloadPriorityClass read for one job serves every job."""
CLUSTER_OBJECTS_KEPT = 256
_CLUSTER_OBJECTS: dict[tuple[str, str], tuple[Mapping[str, Any], float]] = {}


async def cluster_object(kube: Kube, ref: gang.ObjectRef) -> Mapping[str, Any] | None:
    """A Kueue cluster-scoped object (ResourceFlavor, WorkloadPriorityClass), read at most
    once per :data:`CLUSTER_OBJECT_SECONDS` for all jobs: a thousand Kueue jobs' passes
    used to GET the same flavors each time. One not found is asked again next time."""
    key, now = (ref.plural, ref.name), time.monotonic()
    hit = _CLUSTER_OBJECTS.get(key)
    if hit is not None and now - hit[1] < CLUSTER_OBJECT_SECONDS:
        return copy.deepcopy(dict(hit[0]))  # a copy each: no job can change another's
    found = await kube.get_cluster_object(ref)
    if found is None:
        _CLUSTER_OBJECTS.pop(key, None)
        return None
    if len(_CLUSTER_OBJECTS) >= CLUSTER_OBJECTS_KEPT:
        _CLUSTER_OBJECTS.clear()
    _CLUSTER_OBJECTS[key] = (copy.deepcopy(dict(found)), now)
    return found


_SERVED: dict[str, tuple[str | None, float]] = {}


async def served_version(kube: Kube) -> str | None:
    """The scheduling.k8s.io version serving PodGroups, preferred first; None if none.

    Cached for the process: a served API stays served; "not served" is asked again after
    :data:`DISCOVERY_RECHECK_SECONDS` so that enabling the API needs no operator restart.
    """
    cached = _SERVED.get(gang.SCHEDULING_GROUP)
    if cached is not None and (
        cached[0] is not None or time.monotonic() - cached[1] < DISCOVERY_RECHECK_SECONDS
    ):
        return cached[0]
    found = None
    for version in gang.SCHEDULING_VERSIONS:
        if await kube.serves(gang.SCHEDULING_GROUP, version, "podgroups"):
            found = version
            break
    _SERVED[gang.SCHEDULING_GROUP] = (found, time.monotonic())
    return found
