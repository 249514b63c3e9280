"""Which admission reviews the webhook answers with a dry run, and the AdmissionReview reply.

The webhook's port can be reached by more than the API server: any pod in the cluster, if no
NetworkPolicy stops it. A review it is sent is untrusted input. Only the API server's own
reviews are worth a dry run, and the API server always sends a review of a GPUTrainingJob,
for a CREATE or an UPDATE, in the namespace of the object it carries, in a namespace this
operator watches (the webhook configuration's namespaceSelector says so). Anything else is
answered at once, allowed (the webhook never denies for a reason of its own) with a fixed
warning, and no dry run: where the operator watches some namespaces (``rbac.mode:
namespaced``), a crafted review for ``kube-system`` learns nothing about that namespace's
service accounts, PodSecurity level or quota, and costs one JSON parse. An operator that
watches the whole cluster cannot tell a crafted review for a namespace from the API
server's, as nothing authenticates the caller: there, only a NetworkPolicy on the webhook
port (the chart's ``webhook.networkPolicy``) keeps other pods from asking.

Pure: plain data in and out; :mod:`gpujob_operator.runtime.webhook` does the HTTP.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from gpujob_operator import api

MAX_REVIEW_BYTES: Final = 5 * 1024 * 1024
"""The largest review the webhook reads. The API server takes request bodies up to 3 MiB
and etcd stores objects up to 1.5 MiB, so an UPDATE's review (the new object and the old,
in JSON) stays under 4.5 MiB; anything larger is not the API server's and is answered with
an explicit denial, never by the HTTP layer's silent 413 (which ``failurePolicy: Ignore``
would turn into an admission)."""
UID_SCAN_BYTES: Final = 4096
"""How much of an oversized review is read to find its uid (the API server writes
``request.uid`` first), so the denial still names the request it answers."""
_UID: Final = re.compile(rb'"uid"\s*:\s*"([^"\\]{1,128})"')
OPERATIONS: Final = frozenset({"CREATE", "UPDATE"})


@dataclass(frozen=True)
class Request:
    """One review the webhook will dry-run: the job as submitted (and before, on an UPDATE)."""

    uid: str
    operation: str
    job: Mapping[str, Any]
    old: Mapping[str, Any] | None


@dataclass(frozen=True)
class Skipped:
    """A review answered without a dry run; ``why`` is a fixed phrase, never echoed input."""

    uid: str
    why: str


def uid_of_prefix(prefix: bytes) -> str:
    """The review's uid, read from the start of a body too large to parse ("" if absent)."""
    m = _UID.search(prefix)
    return m[1].decode("ascii", "replace") if m else ""


def screen(review: Any, watched: Sequence[str]) -> Request | Skipped:
    """What to do with a parsed AdmissionReview: dry-run it, or answer it at once.

    ``watched`` are the operator's namespaces (kopf globs allowed; empty: every namespace).
    """
    req = review.get("request") if isinstance(review, Mapping) else None
    if not isinstance(req, Mapping):
        return Skipped("", "not an AdmissionReview request")
    uid = str(req.get("uid") or "")[:128]
    kind = req.get("kind")
    resource = req.get("resource")
    if not (
        isinstance(kind, Mapping)
        and kind.get("group") == api.GROUP
        and kind.get("kind") == api.KIND
        and isinstance(resource, Mapping)
        and resource.get("resource") == api.PLURAL
    ):
        return Skipped(uid, "not a GPUTrainingJob")
    operation = req.get("operation")
    if operation not in OPERATIONS:
        return Skipped(uid, "not a create or an update")
    job = req.get("object")
    old = req.get("oldObject") if operation == "UPDATE" else None
    if not isinstance(job, Mapping) or (operation == "UPDATE" and not isinstance(old, Mapping)):
        return Skipped(uid, "the review carries no job")
    namespace = req.get("namespace")
    meta = job.get("metadata")
    object_namespace = meta.get("namespace") if isinstance(meta, Mapping) else None
    if not isinstance(namespace, str) or not namespace:
        return Skipped(uid, "the review names no namespace")
    if object_namespace not in (None, namespace):
        return Skipped(uid, "the job's namespace is not the review's")
    if watched and not any(fnmatch.fnmatchcase(namespace, pattern) for pattern in watched):
        return Skipped(uid, "a namespace this operator does not watch")
    if object_namespace is None:  # a CREATE whose manifest named none: the request's
        job = {
            **job,
            "metadata": {**(meta if isinstance(meta, Mapping) else {}), "namespace": namespace},
        }
    return Request(uid, str(operation), job, old if isinstance(old, Mapping) else None)


def response(
    uid: str,
    allowed: bool,
    message: str = "",
    code: int = 422,
    warnings: Sequence[str] = (),
) -> dict[str, Any]:
    """The AdmissionReview (admission.k8s.io/v1) the API server expects back."""
    answer: dict[str, Any] = {"uid": uid, "allowed": allowed}
    if not allowed:
        answer["status"] = {"code": code, "message": message, "reason": "Invalid"}
    if warnings:
        answer["warnings"] = list(warnings)
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": answer}


def too_large(uid: str) -> dict[str, Any]:
    """The explicit answer to a review over :data:`MAX_REVIEW_BYTES`: denied, with the bound."""
    return response(
        uid,
        False,
        f"the admission review is more than the {MAX_REVIEW_BYTES // 2**20} MiB the gpujob "
        "webhook reads: larger than any review of a job the API server can store",
        code=413,
    )
