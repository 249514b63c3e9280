"""The job's children: their names, their labels, and which ones are the job's (pure).

Pods are ``<job>-node-<rank>`` (a stable DNS name; the attempt is a label), the headless
Service is ``<job>``, and every child carries the job's labels and a controller
ownerReference to it.

Ownership: only the controller ownerReference says which objects belong to which job.

Labels and names are not proof: a job deleted and re-created under the same name finds the
old job's pods still carrying its labels (until the garbage collector removes them, or for
good after `kubectl delete --cascade=orphan`). Counting them would mark the new job
Succeeded with no pod of its own, or restart it for a pod it never had. So the planner,
the monitor and the job loop look only at pods whose controller is the job's UID.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Final

from gpujob_operator.api.job import API_VERSION, KIND
from gpujob_trainer import contract

LABEL_PREFIX: Final = "gpujob.dev/"
LABEL_JOB_NAME: Final = "gpujob.dev/job-name"
LABEL_NODE_RANK: Final = "gpujob.dev/node-rank"
LABEL_ATTEMPT: Final = contract.LABEL_ATTEMPT  # the supervisor reads it too
LABEL_MANAGED_BY: Final = "app.kubernetes.io/managed-by"
MANAGED_BY: Final = "gpujob-operator"


def pod_name(job_name: str, node_rank: int) -> str:
    """Deterministic pod name (also its hostname) of a node rank."""
    return f"{job_name}-node-{node_rank}"


def master_addr(job_name: str) -> str:
    """DNS name of rank 0 through the headless Service: ``<job>-node-0.<job>``."""
    return f"{pod_name(job_name, 0)}.{job_name}"


def job_meta(job: Mapping[str, Any]) -> tuple[str, str, str]:
    """(name, namespace, uid) of a job body."""
    meta = job.get("metadata") or {}
    return str(meta["name"]), str(meta.get("namespace") or "default"), str(meta.get("uid") or "")


def owner_reference(job: Mapping[str, Any]) -> dict[str, Any]:
    """Controller owner reference to the job, so children are garbage-collected with it."""
    name, _, uid = job_meta(job)
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "name": name,
        "uid": uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def selector_labels(job_name: str) -> dict[str, str]:
    """Labels selecting every pod of the job, whatever the attempt."""
    return {LABEL_JOB_NAME: job_name}


def controller_uid(obj: Mapping[str, Any]) -> str | None:
    """The UID of the object's controller (the ownerReference with controller: true)."""
    for ref in (obj.get("metadata") or {}).get("ownerReferences") or ():
        if isinstance(ref, Mapping) and ref.get("controller"):
            uid = ref.get("uid")
            return str(uid) if uid else None
    return None


def uid_of(obj: Mapping[str, Any]) -> str:
    """An object's own UID ("" when the body carries none)."""
    return str((obj.get("metadata") or {}).get("uid") or "")


def job_uid(job: Mapping[str, Any]) -> str:
    """The job's own UID ("" when the body carries none)."""
    return uid_of(job)


def owned(pods: Iterable[Mapping[str, Any]], uid: str) -> list[Mapping[str, Any]]:
    """The pods whose controller is the object with `uid`."""
    return [p for p in pods if controller_uid(p) == uid]


def hang_configmap_name(job_name: str, attempt: int) -> str:
    """The ConfigMap holding attempt ``attempt``'s hang evidence (one per attempt)."""
    return f"{job_name}-hang-{attempt}"


def hang_configmap(job: Mapping[str, Any], attempt: int, data: Mapping[str, str]) -> dict[str, Any]:
    """Every rank's stacks and collectives, owned by the job (gone with it)."""
    name = job_meta(job)[0]
    return _owned_configmap(
        job, hang_configmap_name(name, attempt), ("gpujob.dev/evidence", "hang"), data
    )


def _owned_configmap(
    job: Mapping[str, Any], cm_name: str, label: tuple[str, str], data: Mapping[str, str]
) -> dict[str, Any]:
    """A ConfigMap of the job's (its selector labels and ``label``), owned by it."""
    name, namespace, _ = job_meta(job)
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": cm_name,
            "namespace": namespace,
            "labels": {**selector_labels(name), label[0]: label[1]},
            "ownerReferences": [owner_reference(job)],
        },
        "data": dict(data),
    }


PROFILE_LABEL: Final = "gpujob.dev/profile"


def profile_configmap_name(job_name: str, attempt: int) -> str:
    """The ConfigMap holding the attempt's latest profile (its comparison and summaries):
    ``<job>-profile-<attempt>``. One per attempt, each capture replacing the one before, so
    a job asked for many profiles keeps a bounded number of ConfigMaps (as its hang
    evidence does)."""
    return f"{job_name}-profile-{attempt}"


def profile_configmap(
    job: Mapping[str, Any], attempt: int, data: Mapping[str, str]
) -> dict[str, Any]:
    """A profile's comparison and every rank's summary, owned by the job (gone with it)."""
    name = job_meta(job)[0]
    return _owned_configmap(
        job, profile_configmap_name(name, attempt), (PROFILE_LABEL, "summaries"), data
    )
