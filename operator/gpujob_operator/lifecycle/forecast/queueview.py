"""The cluster as the start-time forecast sees it, read from plain API objects.

Two views, one per way a gang waits (:mod:`.simulation` does the arithmetic):

* **Nodes** (native gang scheduling, or none): a pool per schedulable node with
  ``nvidia.com/gpu`` allocatable; the holders are the bound, unfinished pods that request
  GPUs, one holder per gpujob job (its ETA) and one per other pod (no ETA); a waiting job's
  slots are the nodes its pod may land on (node selector, required node affinity,
  tolerations of the node's NoSchedule/NoExecute taints, cordoned nodes excluded).
* **Kueue quota**: a pool per ClusterQueue and GPU flavor (nominal quota, plus what it may
  borrow in its cohort) and one per cohort and flavor; the holders are the admitted
  Workloads, the waiters the pending ones in priority, then creation, order, each in its
  ClusterQueue's ``queueingStrategy`` (StrictFIFO; else Kueue's default, BestEffortFIFO). A
  waiting Workload of another framework keeps its place in the queue without a forecast.

kube-scheduler places each waiting pod on its own, so node waiters are best effort: one that
fits starts, whoever waits ahead of it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from decimal import Decimal
from typing import Any, Final

from gpujob_operator import api
from gpujob_operator.api import children
from gpujob_operator.api import conditions as c
from gpujob_operator.api.quantity import parse_quantity
from gpujob_operator.lifecycle import builders
from gpujob_operator.lifecycle.forecast.simulation import Holder, Waiter
from gpujob_operator.lifecycle.gang import gang, podholds

GPU = api.GPU_RESOURCE
Obj = Mapping[str, Any]


@dataclass
class View:
    """Pools, holders and waiters (in queue order), ready for :func:`simulation.forecast_all`."""

    capacity: dict[str, int] = field(default_factory=dict)
    holders: list[Holder] = field(default_factory=list)
    waiters: list[Waiter] = field(default_factory=list)
    unplaceable: dict[str, str] = field(default_factory=dict)
    """Waiting jobs (by ``ns/name``) no pool can be found for, with why (no LocalQueue...)."""

    def extend(self, other: View) -> None:
        self.capacity.update(other.capacity)
        self.holders.extend(other.holders)
        self.waiters.extend(other.waiters)
        self.unplaceable.update(other.unplaceable)


@dataclass(frozen=True)
class World:
    """What the runtime read for one forecast pass; an error string where a read failed."""

    nodes: Sequence[Obj] = ()
    pods: Sequence[Obj] = ()
    cluster_queues: Sequence[Obj] = ()
    local_queues: Sequence[Obj] = ()
    workloads: Sequence[Obj] = ()
    nodes_error: str | None = None
    kueue_error: str | None = None


def split_waiting(jobs: Sequence[Obj], default_gang: str) -> tuple[list[Obj], list[Obj]]:
    """The jobs waiting for GPUs: those that wait for nodes (native gangs, none), and those
    that wait in Kueue. Which kind waits decides what the runtime reads."""
    native: list[Obj] = []
    kueue: list[Obj] = []
    for job in jobs:
        mech = mechanism_of(job, default_gang)
        if mech is not None and is_waiting(job, mech):
            (kueue if mech == api.GANG_KUEUE else native).append(job)
    return native, kueue


def key(obj: Obj) -> str:
    meta = obj.get("metadata") or {}
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


BAD_VALUE = (ArithmeticError, TypeError, ValueError, OverflowError)
"""What reading one odd field may raise; it makes that field absent, never the pass fail."""
MAX_GPUS = 1 << 20
"""More GPUs than any pool has: a quantity beyond it is nonsense and counts as none."""


def _whole_gpus(q: Decimal | None) -> int:
    return int(q) if q is not None and 0 < q <= MAX_GPUS else 0


def _gpus(value: Any) -> int:
    """A GPU quantity as an int; absent, negative, beyond any pool or unparsable is 0."""
    return _whole_gpus(parse_quantity(value))


def holder_projection(pod: Obj) -> dict[str, Any]:
    """What :func:`node_view` reads of a pod that may hold GPUs: its names and controller,
    its node and phase, and every resource the scheduler counts (containers, native
    sidecars, pod-level, overhead). The forecast keeps this per listed pod, never the body."""
    meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
    owners = [
        {"uid": r.get("uid"), "controller": True}
        for r in meta.get("ownerReferences") or ()
        if isinstance(r, Mapping) and r.get("controller")
    ]
    out_spec: dict[str, Any] = {
        k: spec[k] for k in ("nodeName", "resources", "overhead") if k in spec
    }
    for key in ("containers", "initContainers"):
        out_spec[key] = [
            {k: c[k] for k in ("name", "resources", "restartPolicy") if k in c}
            for c in spec.get(key) or ()
            if isinstance(c, Mapping)
        ]
    return {
        "metadata": {k: meta[k] for k in ("name", "namespace") if k in meta}
        | ({"ownerReferences": owners} if owners else {}),
        "spec": out_spec,
        "status": {"phase": (pod.get("status") or {}).get("phase")},
    }


def pod_gpus(pod: Obj) -> int:
    """GPUs a pod holds on its node, as the scheduler counts them
    (:mod:`~gpujob_operator.lifecycle.gang.podholds`: native sidecars included)."""
    return _whole_gpus(podholds.requests(pod).get(GPU))


def job_end(job: Obj, now: float) -> float | None:
    """When a running job releases its GPUs: its estimatedCompletionTime, never before now."""
    progress = (job.get("status") or {}).get("progress") or {}
    try:
        when = c.parse_time(progress.get("estimatedCompletionTime"))
        return max(when.timestamp(), now) if when is not None else None
    except BAD_VALUE:
        return None


def job_duration(job: Obj) -> float | None:
    """How long a waiting job runs once started: its last ETA (a requeued job measured it)."""
    eta = ((job.get("status") or {}).get("progress") or {}).get("etaSeconds")
    try:
        value = float(eta) if eta is not None else None
    except BAD_VALUE:
        return None
    return value if value is not None and math.isfinite(value) and value >= 0 else None


def created(obj: Obj) -> str:
    return str((obj.get("metadata") or {}).get("creationTimestamp") or "")


def is_waiting(job: Obj, mechanism: str) -> bool:
    """A job waiting for GPUs: Pending (not Kueue), or Kueue and not admitted yet."""
    status = job.get("status") or {}
    if ((job.get("spec") or {}).get("runPolicy") or {}).get("suspend"):
        return False
    if mechanism == api.GANG_KUEUE:
        gang_status = status.get("gang") or {}
        return not gang_status.get("admitted") and status.get("phase") in (
            None,
            c.PHASE_PENDING,
            c.PHASE_RESTARTING,
        )
    return status.get("phase") in (None, c.PHASE_PENDING)


def mechanism_of(job: Obj, default_gang: str) -> str | None:
    try:
        return gang.mechanism(job, api.parse_spec(job["spec"]), default_gang)
    except (ValueError, KeyError):
        return None


# ---- nodes --------------------------------------------------------------------------------


def _tolerates(tolerations: Sequence[Obj], taint: Obj) -> bool:
    for t in tolerations:
        if t.get("effect") and t.get("effect") != taint.get("effect"):
            continue
        if t.get("operator") == "Exists":
            if not t.get("key") or t.get("key") == taint.get("key"):
                return True
        elif t.get("key") == taint.get("key") and (t.get("value") or "") == (
            taint.get("value") or ""
        ):
            return True
    return False


def _matches(expr: Obj, labels: Mapping[str, str]) -> bool:
    op, values = expr.get("operator"), list(expr.get("values") or [])
    have = labels.get(str(expr.get("key")))
    if op == "In":
        return have in values
    if op == "NotIn":
        return have not in values
    if op == "Exists":
        return have is not None
    if op == "DoesNotExist":
        return have is None
    if op in ("Gt", "Lt") and have is not None and values:
        try:
            a, b = int(have), int(values[0])
        except ValueError:
            return False
        return a > b if op == "Gt" else a < b
    return False


def fits_node(pod_spec: Obj, node: Obj) -> bool:
    """Whether kube-scheduler's placement filters would let the pod onto the node."""
    meta, spec = node.get("metadata") or {}, node.get("spec") or {}
    labels = meta.get("labels") or {}
    if spec.get("unschedulable"):
        return False
    for k, v in (pod_spec.get("nodeSelector") or {}).items():
        if labels.get(k) != v:
            return False
    tolerations = pod_spec.get("tolerations") or []
    for taint in spec.get("taints") or []:
        hard = taint.get("effect") in ("NoSchedule", "NoExecute")
        if hard and not _tolerates(tolerations, taint):
            return False
    affinity = ((pod_spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    )
    if affinity:
        fields = {"metadata.name": str(meta.get("name") or "")}
        for term in affinity.get("nodeSelectorTerms") or []:
            if all(_matches(e, labels) for e in term.get("matchExpressions") or []) and all(
                _matches(e, fields) for e in term.get("matchFields") or []
            ):
                break
        else:
            return False
    return True


def node_view(
    now: float, jobs: Sequence[Obj], nodes: Sequence[Obj], pods: Sequence[Obj], default_gang: str
) -> View:
    """Pools per GPU node, holders per job or foreign pod, waiting non-Kueue jobs in order."""
    view = View()
    gpu_nodes = []
    for node in nodes:
        alloc = _gpus(((node.get("status") or {}).get("allocatable") or {}).get(GPU))
        if alloc > 0:
            name = str(node["metadata"]["name"])
            view.capacity[f"node:{name}"] = alloc
            gpu_nodes.append(node)
    by_uid = {str(j["metadata"].get("uid")): j for j in jobs}
    waiting, _ = split_waiting(jobs, default_gang)
    waiting_uids = {str(j["metadata"].get("uid")) for j in waiting}
    usage: dict[str, dict[str, int]] = {}
    ends: dict[str, float | None] = {}
    for pod in pods:
        spec, status = pod.get("spec") or {}, pod.get("status") or {}
        gpus = pod_gpus(pod)
        if not spec.get("nodeName") or gpus == 0 or status.get("phase") in ("Succeeded", "Failed"):
            continue
        owner = children.controller_uid(pod)
        if owner in waiting_uids:
            continue  # a waiting gang's own bound pods: it will start on them, not wait for them
        job = by_uid.get(owner or "")
        name = f"job {key(job)}" if job is not None else f"pod {key(pod)}"
        pool = f"node:{spec['nodeName']}"
        held = usage.setdefault(name, {})
        held[pool] = held.get(pool, 0) + gpus
        ends[name] = job_end(job, now) if job is not None else None
    view.holders = [Holder(n, u, ends[n]) for n, u in usage.items()]
    placements: dict[str, tuple[tuple[str, ...], ...]] = {}
    for job in sorted(waiting, key=lambda j: (created(j), key(j))):
        waiter = _node_waiter(job, gpu_nodes, placements)
        if waiter is not None:
            view.waiters.append(waiter)
    return view


PLACEMENT_FIELDS = ("nodeSelector", "tolerations", "affinity")


def _node_waiter(
    job: Obj, nodes: Sequence[Obj], placements: dict[str, tuple[tuple[str, ...], ...]]
) -> Waiter | None:
    """The job's gang on the nodes its pod may land on; ``placements`` caches the eligible
    nodes per distinct placement (most jobs of a fleet share a few)."""
    try:
        spec = api.parse_spec(job["spec"])
        pod = builders.build_pod(job, 0, 0, spec)
    except (ValueError, KeyError):
        return None
    if spec.gpus_per_node == 0 or spec.gpus_from != "DevicePlugin":
        # No GPUs, or GPUs from DRA claims: the pools here are nvidia.com/gpu allocatable.
        return None
    wanted = {k: pod["spec"].get(k) for k in PLACEMENT_FIELDS}
    sig = json.dumps(wanted, sort_keys=True)
    slots = placements.get(sig)
    if slots is None:
        slots = placements[sig] = tuple(
            (f"node:{n['metadata']['name']}",) for n in nodes if fits_node(pod["spec"], n)
        )
    return Waiter(f"job {key(job)}", slots, spec.nodes, spec.gpus_per_node, job_duration(job))


# ---- Kueue --------------------------------------------------------------------------------


def _cq_pools(cqs: Sequence[Obj]) -> tuple[dict[str, int], dict[str, list[tuple[str, ...]]]]:
    """Capacity of every quota pool, and each ClusterQueue's slots (one per GPU flavor)."""
    nominal: dict[tuple[str, str], int] = {}
    borrow: dict[tuple[str, str], int | None] = {}
    cohort_of: dict[str, str] = {}
    for obj in cqs:
        name = str(obj["metadata"]["name"])
        spec = obj.get("spec") or {}
        cohort = spec.get("cohortName") or spec.get("cohort")
        if cohort:
            cohort_of[name] = str(cohort)
        for group in spec.get("resourceGroups") or []:
            for flavor in group.get("flavors") or []:
                for res in flavor.get("resources") or []:
                    if res.get("name") == GPU:
                        k = (name, str(flavor.get("name")))
                        nominal[k] = _gpus(res.get("nominalQuota"))
                        limit = res.get("borrowingLimit")
                        borrow[k] = _gpus(limit) if limit is not None else None
    cohort_total: dict[tuple[str, str], int] = {}
    for (cq, flavor), n in nominal.items():
        if cq in cohort_of:
            ck = (cohort_of[cq], flavor)
            cohort_total[ck] = cohort_total.get(ck, 0) + n
    capacity: dict[str, int] = {}
    slots: dict[str, list[tuple[str, ...]]] = {}
    for (cq, flavor), n in nominal.items():
        pool = f"cq:{cq}/{flavor}"
        if cq in cohort_of:
            cpool = f"cohort:{cohort_of[cq]}/{flavor}"
            total = cohort_total[(cohort_of[cq], flavor)]
            limit = borrow[(cq, flavor)]
            capacity[pool] = total if limit is None else min(total, n + limit)
            capacity[cpool] = total
            slots.setdefault(cq, []).append((pool, cpool))
        else:
            capacity[pool] = n
            slots.setdefault(cq, []).append((pool,))
    return capacity, slots


def _workload_gpus(wl: Obj) -> int:
    total = 0
    for ps in (wl.get("spec") or {}).get("podSets") or []:
        total += int(ps.get("count") or 0) * pod_gpus(ps.get("template") or {})
    return total


def _finished(wl: Obj) -> bool:
    return any(
        x.get("type") == gang.KUEUE_FINISHED and x.get("status") == "True"
        for x in (wl.get("status") or {}).get("conditions") or []
    )


STRICT_FIFO: Final = "StrictFIFO"
"""``spec.queueingStrategy`` under which a ClusterQueue's head that does not fit holds back
the rest of it; Kueue's default, BestEffortFIFO, lets those behind it that fit start."""
PREEMPTING: Final = frozenset({"LowerPriority", "LowerOrNewerEqualPriority"})
"""``spec.preemption.withinClusterQueue`` values under which a queue's head may evict."""


@dataclass(frozen=True)
class _Entry:
    """A Workload as the Kueue view orders and preempts: where it queues, how it ranks."""

    holder: Holder | None
    waiter: Waiter | None
    cq: str
    priority: int
    created: str


def _priority(wl: Obj) -> int:
    try:
        return int((wl.get("spec") or {}).get("priority") or 0)
    except (TypeError, ValueError):
        return 0


def kueue_view(
    now: float,
    jobs: Sequence[Obj],
    cqs: Sequence[Obj],
    local_queues: Sequence[Obj],
    workloads: Sequence[Obj],
) -> View:
    """Quota pools per ClusterQueue flavor, admitted Workloads holding them, pending ones in
    Kueue's order (priority, then creation); a preempting queue's head evicts what it must."""
    view = View()
    view.capacity, cq_slots = _cq_pools(cqs)
    cohort_pool = {
        cq: {slot[0]: slot[1] for slot in slots if len(slot) > 1} for cq, slots in cq_slots.items()
    }
    lq_to_cq = {
        key(lq): str((lq.get("spec") or {}).get("clusterQueue") or "") for lq in local_queues
    }
    strict = {
        str(q["metadata"]["name"])
        for q in cqs
        if (q.get("spec") or {}).get("queueingStrategy") == STRICT_FIFO
    }
    jobs_by_key = {key(j): j for j in jobs}
    admitted: list[_Entry] = []
    pending: list[_Entry] = []
    for wl in workloads:
        if _finished(wl):
            continue
        job_name = ((wl.get("metadata") or {}).get("labels") or {}).get(children.LABEL_JOB_NAME)
        ns = (wl.get("metadata") or {}).get("namespace", "")
        job = jobs_by_key.get(f"{ns}/{job_name}") if job_name else None
        name = f"job {key(job)}" if job is not None else f"workload {key(wl)}"
        admission = (wl.get("status") or {}).get("admission")
        if admission:
            cq = str(admission.get("clusterQueue") or "")
            usage: dict[str, int] = {}
            for psa in admission.get("podSetAssignments") or []:
                flavor = (psa.get("flavors") or {}).get(GPU)
                gpus = _gpus((psa.get("resourceUsage") or {}).get(GPU))
                if flavor and gpus:
                    pool = f"cq:{cq}/{flavor}"
                    usage[pool] = usage.get(pool, 0) + gpus
                    if pool in cohort_pool.get(cq, {}):
                        cpool = cohort_pool[cq][pool]
                        usage[cpool] = usage.get(cpool, 0) + gpus
            if usage:
                holder = Holder(name, usage, job_end(job, now) if job else None)
                admitted.append(_Entry(holder, None, cq, _priority(wl), created(wl)))
            continue
        lq = f"{ns}/{(wl.get('spec') or {}).get('queueName') or ''}"
        queue = lq_to_cq.get(lq)
        target = job is not None and is_waiting(job, api.GANG_KUEUE)
        if not queue or queue not in cq_slots:
            if job is not None and target:
                why = (
                    f"LocalQueue {lq} not found"
                    if not queue
                    else f"ClusterQueue {queue} has no {GPU} quota"
                )
                view.unplaceable[key(job)] = why
            continue
        gpus = _workload_gpus(wl)
        if gpus == 0:
            continue
        duration = job_duration(job) if job is not None else None
        waiter = Waiter(
            name, tuple(cq_slots[queue]), 1, gpus, duration, target,
            queue=queue, strict=queue in strict,
        )  # fmt: skip
        pending.append(_Entry(None, waiter, queue, _priority(wl), created(wl)))
    policies = {
        str(q["metadata"]["name"]): str(
            ((q.get("spec") or {}).get("preemption") or {}).get("withinClusterQueue") or "Never"
        )
        for q in cqs
    }
    admitted, pending = _preempt(now, view.capacity, admitted, pending, policies)
    pending.sort(key=_queue_order)
    view.holders = [e.holder for e in admitted if e.holder is not None]
    view.waiters = [e.waiter for e in pending if e.waiter is not None]
    return view


def _queue_order(e: _Entry) -> tuple[int, str, str]:
    """Kueue's order within a queue: priority, then age (then name, for a stable tie)."""
    return (-e.priority, e.created, e.waiter.name if e.waiter else "")


def _lower(e: _Entry, head: _Entry, policy: str) -> bool:
    """Whether the queue's head may preempt ``e`` under the queue's policy."""
    if policy == "LowerOrNewerEqualPriority" and e.priority == head.priority:
        return e.created > head.created
    return e.priority < head.priority


def _preempt(
    now: float,
    capacity: Mapping[str, int],
    admitted: list[_Entry],
    pending: list[_Entry],
    policies: Mapping[str, str],
) -> tuple[list[_Entry], list[_Entry]]:
    """Kueue's classic preemption within a ClusterQueue, as its head would do it now: where
    the head does not fit and its queue preempts, the fewest lower-priority Workloads
    (lowest priority, newest first) that make room end now and queue again, with what was
    left of their run as their duration."""
    order = sorted(pending, key=_queue_order)
    for cq, policy in policies.items():
        head = next((e for e in order if e.cq == cq and e.waiter is not None), None)
        if policy not in PREEMPTING or head is None or head.waiter is None:
            continue
        w = head.waiter
        used: dict[str, int] = {}
        for e in admitted:
            if e.holder is None or (e.holder.ends_at is not None and e.holder.ends_at <= now):
                continue  # ends now (preempted, or past its ETA): its GPUs are free already
            for pool, gpus in e.holder.usage.items():
                used[pool] = used.get(pool, 0) + gpus
        room = {slot: min(capacity.get(p, 0) - used.get(p, 0) for p in slot) for slot in w.slots}
        if not room or max(room.values()) >= w.per:
            continue
        best = max(room, key=lambda sl: room[sl])
        pool = best[0]  # the queue's own flavor pool: what preemption within it frees
        need = w.per - room[best]
        victims = [
            e
            for e in admitted
            if e.cq == cq
            and e.holder
            and pool in e.holder.usage
            and (e.holder.ends_at is None or e.holder.ends_at > now)
            and _lower(e, head, policy)
        ]
        victims.sort(key=lambda e: e.created, reverse=True)  # newest first ...
        victims.sort(key=lambda e: e.priority)  # ... within the lowest priority first
        chosen: list[_Entry] = []
        for e in victims:
            if need <= 0:
                break
            chosen.append(e)
            need -= e.holder.usage[pool] if e.holder else 0
        if need > 0:
            continue  # even every lower-priority Workload would not make room: no preemption
        head_index = pending.index(head)
        names = tuple(e.holder.name for e in chosen if e.holder is not None)
        pending[head_index] = replace(head, waiter=replace(w, preempts=names))
        for e in chosen:
            assert e.holder is not None
            admitted.remove(e)
            h = e.holder
            left = max(h.ends_at - now, 0.0) if h.ends_at is not None else None
            again = replace(
                w, name=f"{h.name} (preempted)", per=h.usage[pool], duration=left,
                target=False, preempts=(),
            )  # fmt: skip
            admitted.append(_Entry(Holder(h.name, h.usage, now), None, cq, e.priority, e.created))
            pending.append(_Entry(None, again, cq, e.priority, e.created))
    return admitted, pending
