"""Which objects belong to which job: only the controller ownerReference says (pure).

Labels and names are not proof: a job deleted and re-created under the same name finds the
old job's pods still carrying its labels (until the garbage collector removes them, or for
good after `kubectl delete --cascade=orphan`). Counting them would mark the new job
Succeeded with no pod of its own, or restart it for a pod it never had. So the planner,
the monitor and the reconciler look only at pods whose controller is the job's UID.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any


def controller_uid(obj: Mapping[str, Any]) -> str | None:
    """The UID of the object's controller (the ownerReference with controller: true)."""
    for ref in (obj.get("metadata") or {}).get("ownerReferences") or ():
        if isinstance(ref, Mapping) and ref.get("controller"):
            uid = ref.get("uid")
            return str(uid) if uid else None
    return None


def job_uid(job: Mapping[str, Any]) -> str:
    """The job's own UID ("" when the body carries none)."""
    return str((job.get("metadata") or {}).get("uid") or "")


def owned(pods: Iterable[Mapping[str, Any]], uid: str) -> list[Mapping[str, Any]]:
    """The pods whose controller is the object with `uid`."""
    return [p for p in pods if controller_uid(p) == uid]
