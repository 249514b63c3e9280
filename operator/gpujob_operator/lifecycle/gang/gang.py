"""Pure builders and readers for gang admission: Kubernetes Workload/PodGroup and Kueue.

Plain dicts in, plain dicts out (no client, no kopf), like
:mod:`~gpujob_operator.lifecycle.builders`.

Native (``spec.scheduling.gang: Native``): one ``scheduling.k8s.io`` Workload per job
(``<job>``, one pod group template ``workers`` with a gang policy ``minCount = nodes``) and
one PodGroup per gang attempt (``<job>-a<attempt>``), both owned by the job. Each pod names
its attempt's group in ``spec.schedulingGroup.podGroupName``, so kube-scheduler's
``GangScheduling`` plugin binds all ``nodes`` pods together or none of them. A fresh group
per attempt keeps a restarted gang's admission apart from the previous one's.

Kueue (``spec.scheduling.gang: Kueue``): the operator is the job's Kueue integration, the
way Kueue's own job controllers are: it creates one ``kueue.x-k8s.io`` Workload per job
(one pod set of ``nodes`` pods with their GPU requests, queued in the LocalQueue of the
job's ``kueue.x-k8s.io/queue-name`` label), creates no pod until Kueue admits it, gives the
pods the admitted flavors' node labels and tolerations, and on eviction deletes the pods and
hands the quota back (QuotaReserved=False, admission cleared) so the Workload is requeued.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from gpujob_operator import api
from gpujob_operator.api import children
from gpujob_operator.api import conditions as c

# ---- native: scheduling.k8s.io Workload / PodGroup -----------------------------------------

SCHEDULING_GROUP: Final = "scheduling.k8s.io"
SCHEDULING_VERSIONS: Final = ("v1beta1", "v1alpha3")
"""Served versions the operator can write, preferred first (kube-scheduler reads v1beta1)."""
POD_GROUP_TEMPLATE: Final = "workers"
POD_GROUP_SCHEDULED: Final = "PodGroupInitiallyScheduled"
POD_GROUP_DISRUPTION: Final = "DisruptionTarget"

# ---- Kueue ---------------------------------------------------------------------------------

KUEUE_GROUP: Final = "kueue.x-k8s.io"
KUEUE_VERSION: Final = "v1beta2"
KUEUE_API_VERSION: Final = f"{KUEUE_GROUP}/{KUEUE_VERSION}"
KUEUE_POD_SET: Final = "workers"
KUEUE_ADMITTED: Final = "Admitted"
KUEUE_QUOTA_RESERVED: Final = "QuotaReserved"
KUEUE_EVICTED: Final = "Evicted"
KUEUE_PREEMPTED: Final = "Preempted"
KUEUE_REQUEUED: Final = "Requeued"
KUEUE_FINISHED: Final = "Finished"
KUEUE_PODS_READY: Final = "PodsReady"
KUEUE_REQUEUING_REASONS: Final = frozenset({"Preempted", "NodeFailures"})
"""Eviction reasons after which Kueue's own job controllers mark the Workload Requeued=True."""

PLURALS: Final = {
    (SCHEDULING_GROUP, "Workload"): "workloads",
    (SCHEDULING_GROUP, "PodGroup"): "podgroups",
    (KUEUE_GROUP, "Workload"): "workloads",
    (KUEUE_GROUP, "ResourceFlavor"): "resourceflavors",
    (KUEUE_GROUP, "WorkloadPriorityClass"): "workloadpriorityclasses",
}


@dataclass(frozen=True)
class ObjectRef:
    """Enough to address a namespaced custom object: group, version, plural, name."""

    group: str
    version: str
    plural: str
    name: str


def ref_of(obj: Mapping[str, Any]) -> ObjectRef:
    """The address of an object built here (apiVersion + kind + metadata.name)."""
    group, _, version = str(obj["apiVersion"]).rpartition("/")
    return ObjectRef(group, version, PLURALS[(group, obj["kind"])], obj["metadata"]["name"])


def mechanism(job: Mapping[str, Any], spec: api.GPUTrainingJobSpec, default: str) -> str:
    """The gang mechanism in effect: the spec's, else Kueue when queue-labelled, else default.

    The rule is fixed and visible in ``status.gang.mechanism``, so a user can always tell
    which one applies: an explicit ``spec.scheduling.gang`` wins; a job carrying Kueue's
    queue-name label is Kueue's (the label is how Kueue users opt in everywhere); else the
    operator's default (``GPUJOB_DEFAULT_GANG``, None unless the platform set it). Once
    recorded in the status the choice sticks: a label added later or a new operator default
    never moves a running job to another mechanism.
    """
    recorded = ((job.get("status") or {}).get("gang") or {}).get("mechanism")
    if recorded in api.GANGS:
        return str(recorded)
    chosen = spec.scheduling.gang if spec.scheduling else None
    if chosen is not None:
        return chosen
    if queue_name(job):
        return api.GANG_KUEUE
    return default


def queue_name(job: Mapping[str, Any]) -> str | None:
    """The LocalQueue of the job's ``kueue.x-k8s.io/queue-name`` label, if any."""
    labels = (job.get("metadata") or {}).get("labels") or {}
    value = labels.get(api.KUEUE_QUEUE_LABEL)
    return str(value) if value else None


def _owned_meta(job: Mapping[str, Any], name: str) -> dict[str, Any]:
    job_name, namespace, _ = children.job_meta(job)
    return {
        "name": name,
        "namespace": namespace,
        "labels": {
            children.LABEL_JOB_NAME: job_name,
            children.LABEL_MANAGED_BY: children.MANAGED_BY,
        },
        "ownerReferences": [children.owner_reference(job)],
    }


def native_workload_name(job_name: str) -> str:
    return job_name


def pod_group_name(job_name: str, attempt: int) -> str:
    """The PodGroup of one gang attempt: a restart never reuses an admitted group."""
    return f"{job_name}-a{attempt}"


def build_native_workload(
    job: Mapping[str, Any], spec: api.GPUTrainingJobSpec, version: str
) -> dict[str, Any]:
    """The job's ``scheduling.k8s.io`` Workload: one gang template of ``nodes`` pods."""
    name, _, _ = children.job_meta(job)
    return {
        "apiVersion": f"{SCHEDULING_GROUP}/{version}",
        "kind": "Workload",
        "metadata": _owned_meta(job, native_workload_name(name)),
        "spec": {
            "controllerRef": {"apiGroup": api.GROUP, "kind": api.KIND, "name": name},
            "podGroupTemplates": [
                {
                    "name": POD_GROUP_TEMPLATE,
                    "schedulingPolicy": {"gang": {"minCount": spec.nodes}},
                }
            ],
        },
    }


def build_pod_group(
    job: Mapping[str, Any], spec: api.GPUTrainingJobSpec, attempt: int, version: str
) -> dict[str, Any]:
    """The PodGroup of gang attempt ``attempt`` (minCount = nodes), from the Workload's template."""
    name, _, _ = children.job_meta(job)
    meta = _owned_meta(job, pod_group_name(name, attempt))
    meta["labels"][children.LABEL_ATTEMPT] = str(attempt)
    pg_spec: dict[str, Any] = {
        "workloadRef": {
            "workloadName": native_workload_name(name),
            "templateName": POD_GROUP_TEMPLATE,
        },
        "schedulingPolicy": {"gang": {"minCount": spec.nodes}},
    }
    priority_class = spec.template.priority_class_name if spec.template else None
    if priority_class:
        pg_spec["priorityClassName"] = priority_class
    return {
        "apiVersion": f"{SCHEDULING_GROUP}/{version}",
        "kind": "PodGroup",
        "metadata": meta,
        "spec": pg_spec,
    }


def join_pod_group(pod: dict[str, Any], group: str) -> dict[str, Any]:
    """Make ``pod`` a member of PodGroup ``group`` (in place; returned for chaining)."""
    pod["spec"]["schedulingGroup"] = {"podGroupName": group}
    return pod


def pod_group_waiting(pod_group: Mapping[str, Any] | None) -> tuple[str, str] | None:
    """(reason, message) of a PodGroup the scheduler could not place yet, else None."""
    for cond in (pod_group or {}).get("status", {}).get("conditions") or []:
        if cond.get("type") == POD_GROUP_SCHEDULED and cond.get("status") == "False":
            return str(cond.get("reason") or "Unschedulable"), str(cond.get("message") or "")
    return None


# ---- Kueue ---------------------------------------------------------------------------------


def kueue_workload_name(job: Mapping[str, Any]) -> str:
    """``gpujob-<job>-<uid hash>``: a job re-created under the same name gets a new Workload."""
    name, _, uid = children.job_meta(job)
    digest = hashlib.sha256(uid.encode()).hexdigest()[:5]
    return f"gpujob-{name}-{digest}"


def _pod_set_template(pod: Mapping[str, Any]) -> dict[str, Any]:
    """What Kueue needs of a pod: containers with their requests, and placement constraints."""
    spec = pod["spec"]

    def slim(ctr: Mapping[str, Any]) -> dict[str, Any]:
        return {
            k: v for k, v in ctr.items() if k in ("name", "image", "resources", "restartPolicy")
        }

    out: dict[str, Any] = {"containers": [slim(c) for c in spec["containers"]]}
    if spec.get("initContainers"):
        # Kueue charges init containers and sidecars as the scheduler does.
        out["initContainers"] = [slim(c) for c in spec["initContainers"]]
    out["restartPolicy"] = "Never"
    keep = (
        "nodeSelector",
        "tolerations",
        "affinity",
        "priorityClassName",
        "schedulerName",
        "resources",
        "resourceClaims",
        "runtimeClassName",
    )
    out.update({k: spec[k] for k in keep if k in spec})
    return {"spec": out}


def priority_class(job: Mapping[str, Any]) -> str | None:
    """The WorkloadPriorityClass of the job's ``kueue.x-k8s.io/priority-class`` label."""
    labels = (job.get("metadata") or {}).get("labels") or {}
    value = labels.get(api.KUEUE_PRIORITY_LABEL)
    return str(value) if value else None


def build_kueue_workload(
    job: Mapping[str, Any],
    spec: api.GPUTrainingJobSpec,
    pod: Mapping[str, Any],
    queue: str,
    priority: int | None = None,
) -> dict[str, Any]:
    """The job's Kueue Workload: one pod set of ``nodes`` pods shaped like ``pod``.

    ``priority`` is the value of the job's WorkloadPriorityClass (label
    ``kueue.x-k8s.io/priority-class``): Kueue orders and preempts by it.
    """
    meta = _owned_meta(job, kueue_workload_name(job))
    wl_spec: dict[str, Any] = {
        "queueName": queue,
        "podSets": [
            {"name": KUEUE_POD_SET, "count": spec.nodes, "template": _pod_set_template(pod)}
        ],
    }
    pclass = priority_class(job)
    if pclass and priority is not None:
        meta["labels"][api.KUEUE_PRIORITY_LABEL] = pclass
        wl_spec["priorityClassRef"] = {
            "group": KUEUE_GROUP,
            "kind": "WorkloadPriorityClass",
            "name": pclass,
        }
        wl_spec["priority"] = priority
    return {"apiVersion": KUEUE_API_VERSION, "kind": "Workload", "metadata": meta, "spec": wl_spec}


def _cond(obj: Mapping[str, Any] | None, type_: str) -> Mapping[str, Any] | None:
    for cond in (obj or {}).get("status", {}).get("conditions") or []:
        if cond.get("type") == type_:
            return dict(cond)
    return None


def _true(obj: Mapping[str, Any] | None, type_: str) -> bool:
    cond = _cond(obj, type_)
    return cond is not None and cond.get("status") == "True"


KUEUE_WORDS_MAX: Final = 300
"""The most of a Kueue condition message quoted in the job's status: it is another
controller's text, of any length ("N more needed" for every resource and pod set)."""


def kueue_words(message: Any) -> str | None:
    """Kueue's own message made safe to quote: one line of printable text, at most
    :data:`KUEUE_WORDS_MAX` characters; None when it says nothing."""
    if not isinstance(message, str):
        return None
    text = " ".join("".join(ch if ch.isprintable() else " " for ch in message).split())
    return c.clip(text, KUEUE_WORDS_MAX) or None


def pending_words(workload: Mapping[str, Any] | None) -> str | None:
    """Why Kueue has not admitted the Workload, in Kueue's words: QuotaReserved=False's
    message ("couldn't assign flavors to pod set workers: insufficient unused quota ..."),
    or once quota is reserved, Admitted=False's (admission checks not ready yet). None where
    Kueue said nothing yet: the caller says it in its own words."""
    reserved = _cond(workload, KUEUE_QUOTA_RESERVED)
    if reserved is None:
        return None
    if reserved.get("status") == "True":
        admitted = _cond(workload, KUEUE_ADMITTED) or {}
        if admitted.get("status") == "False":
            return kueue_words(admitted.get("message"))
        return None
    return kueue_words(reserved.get("message"))


@dataclass(frozen=True)
class KueueState:
    """What the planner needs of the job's Kueue Workload."""

    exists: bool
    admitted: bool = False
    quota_reserved: bool = False
    evicted: bool = False
    evicted_reason: str | None = None
    evicted_message: str | None = None
    finished: bool = False
    pending_message: str | None = None
    """Why it is not admitted, in Kueue's words (:func:`pending_words`)."""
    cluster_queue: str | None = None
    flavors: dict[str, str] = field(default_factory=dict)
    pod_set_update: dict[str, Any] = field(default_factory=dict)


def kueue_state(workload: Mapping[str, Any] | None) -> KueueState:
    """Read a Kueue Workload as the API returns it (None: not created yet)."""
    if workload is None:
        return KueueState(exists=False)
    status = workload.get("status") or {}
    admission = status.get("admission") or {}
    assignment: Mapping[str, Any] = next(
        (a for a in admission.get("podSetAssignments") or [] if a.get("name") == KUEUE_POD_SET),
        {},
    )
    evicted = _cond(workload, KUEUE_EVICTED)
    update: dict[str, Any] = {}
    for check in status.get("admissionChecks") or []:
        for psu in check.get("podSetUpdates") or []:
            if psu.get("name") == KUEUE_POD_SET:
                for key in ("labels", "annotations", "nodeSelector"):
                    update.setdefault(key, {}).update(psu.get(key) or {})
                update.setdefault("tolerations", []).extend(psu.get("tolerations") or [])
    return KueueState(
        exists=True,
        admitted=_true(workload, KUEUE_ADMITTED),
        quota_reserved=_true(workload, KUEUE_QUOTA_RESERVED),
        evicted=evicted is not None and evicted.get("status") == "True",
        evicted_reason=(evicted or {}).get("reason"),
        evicted_message=kueue_words((evicted or {}).get("message")),
        finished=_true(workload, KUEUE_FINISHED),
        pending_message=pending_words(workload),
        cluster_queue=admission.get("clusterQueue"),
        flavors={str(k): str(v) for k, v in (assignment.get("flavors") or {}).items()},
        pod_set_update=update,
    )


def apply_admission(
    pod: dict[str, Any],
    state: KueueState,
    flavors: Mapping[str, Mapping[str, Any]],
) -> dict[str, Any]:
    """Give ``pod`` the admitted flavors' node labels and tolerations (in place).

    ``flavors`` maps ResourceFlavor names to their objects. The job's own nodeSelector
    keeps its values; flavor labels add to it, as Kueue's job controllers do.
    """
    spec = pod["spec"]
    selector: dict[str, str] = dict(spec.get("nodeSelector") or {})
    tolerations: list[dict[str, Any]] = list(spec.get("tolerations") or [])
    for name in sorted(set(state.flavors.values())):
        fspec = (flavors.get(name) or {}).get("spec") or {}
        for key, value in (fspec.get("nodeLabels") or {}).items():
            selector.setdefault(key, value)
        for tol in fspec.get("tolerations") or []:
            if tol not in tolerations:
                tolerations.append(dict(tol))
    upd = state.pod_set_update
    for key, value in (upd.get("nodeSelector") or {}).items():
        selector.setdefault(key, value)
    for tol in upd.get("tolerations") or []:
        if tol not in tolerations:
            tolerations.append(dict(tol))
    meta = pod["metadata"]
    for key in ("labels", "annotations"):
        if upd.get(key):
            meta[key] = {**upd[key], **(meta.get(key) or {})}
    if selector:
        spec["nodeSelector"] = selector
    if tolerations:
        spec["tolerations"] = tolerations
    return pod


def _condition(type_: str, status: str, reason: str, message: str, now: str) -> dict[str, Any]:
    return {
        "type": type_,
        "status": status,
        "reason": reason,
        "message": message[:32768],
        "lastTransitionTime": now,
    }


def _replace_conditions(
    old: Sequence[Mapping[str, Any]], new: Sequence[Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """The Workload's whole conditions list for a status patch: ``old`` without the types in
    ``new``, then ``new``, each keeping the old ``lastTransitionTime`` when its status did not
    change.

    Kept apart from :func:`~gpujob_operator.api.conditions.merge_conditions` (the job's own
    conditions), which updates an entry where it stands: here the entries set move to the end
    of the list. The two agree on content and differ only in order, so one for both would
    reorder the conditions of the Workload patches.
    """
    types = {c["type"] for c in new}
    kept = [dict(c) for c in old if c.get("type") not in types]
    out = []
    for cond in new:
        prev = next((c for c in old if c.get("type") == cond["type"]), None)
        cond = dict(cond)
        if prev is not None and prev.get("status") == cond["status"]:
            cond["lastTransitionTime"] = prev.get("lastTransitionTime", cond["lastTransitionTime"])
        out.append(cond)
    return kept + out


def _guarded(workload: Mapping[str, Any], status: dict[str, Any]) -> dict[str, Any]:
    """A status merge patch that applies only to the version it was computed from.

    A merge patch replaces the whole conditions list; the resourceVersion precondition makes
    the API server refuse it (409) if Kueue changed the Workload meanwhile, so a condition
    Kueue just set (Evicted) is never overwritten. The next pass re-reads and retries.
    """
    patch: dict[str, Any] = {"status": status}
    rv = (workload.get("metadata") or {}).get("resourceVersion")
    if rv:
        patch["metadata"] = {"resourceVersion": rv}
    return patch


def release_quota_patch(workload: Mapping[str, Any], now: str) -> dict[str, Any]:
    """Status patch that hands an evicted Workload's quota back so Kueue requeues it.

    What Kueue's job controllers do once the job's pods are gone: QuotaReserved=False
    (Pending), admission cleared, Admitted=False, Requeued=True after a preemption.
    """
    evicted = _cond(workload, KUEUE_EVICTED) or {}
    reason = str(evicted.get("reason") or "Evicted")
    message = str(evicted.get("message") or "evicted")
    new = [
        _condition(KUEUE_QUOTA_RESERVED, "False", "Pending", message, now),
        _condition(
            KUEUE_ADMITTED, "False", "NoReservation", "The workload has no reservation", now
        ),
        _condition(
            KUEUE_REQUEUED,
            "True" if reason in KUEUE_REQUEUING_REASONS else "False",
            reason,
            message,
            now,
        ),
    ]
    old = (workload.get("status") or {}).get("conditions") or []
    return _guarded(workload, {"admission": None, "conditions": _replace_conditions(old, new)})


def finish_patch(workload: Mapping[str, Any], succeeded: bool, message: str, now: str) -> dict:
    """Status patch marking the Workload Finished, so Kueue releases the job's quota."""
    reason = "Succeeded" if succeeded else "Failed"
    new = [_condition(KUEUE_FINISHED, "True", reason, message, now)]
    old = (workload.get("status") or {}).get("conditions") or []
    return _guarded(workload, {"conditions": _replace_conditions(old, new)})


def pods_ready_patch(workload: Mapping[str, Any], running: bool, now: str) -> dict[str, Any] | None:
    """Status patch for the Workload's PodsReady condition, or None when it is already right.

    Kueue's ``waitForPodsReady`` evicts an admitted Workload whose job never reports its
    pods ready; as the job's controller the operator reports it: True (Started, or
    Recovered after a restart) while every rank runs, else False (WaitForStart, or
    WaitForRecovery once it had started).
    """
    old = _cond(workload, KUEUE_PODS_READY)
    was_true = old is not None and old.get("status") == "True"
    started_before = old is not None and old.get("reason") in (
        "Started",
        "Recovered",
        "WaitForRecovery",
    )
    if running:
        status, reason = "True", "Recovered" if started_before and not was_true else "Started"
        if was_true:
            return None
        message = "All pods reached readiness and the workload is running"
    else:
        status = "False"
        reason = "WaitForRecovery" if started_before else "WaitForStart"
        if old is not None and old.get("status") == "False" and old.get("reason") == reason:
            return None
        message = "Not all pods are ready or succeeded"
    new = [_condition(KUEUE_PODS_READY, status, reason, message, now)]
    conds = (workload.get("status") or {}).get("conditions") or []
    return _guarded(workload, {"conditions": _replace_conditions(conds, new)})
