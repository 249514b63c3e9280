"""What an API server refusal means for a job: a pure classifier of status code and Status body.

The API server refuses a pod or the Service for many reasons the CRD never saw: a
ResourceQuota, PodSecurity admission, a LimitRange, an admission webhook or policy, a field
core/v1 rejects, throttling, an overloaded or restarting server. Each refusal becomes one
:class:`Refusal`: a condition reason (from :mod:`conditions`), whether waiting can ever help
(``permanent``), the server's own message, and the server's hint of when to retry.

Permanent means "this pod, as built, can never be admitted under the namespace's current
policy": a field core/v1 rejects, PodSecurity, a LimitRange, a ResourceQuota that requires
what the pod does not set (``failed quota: q: must specify limits.cpu``), an admission
policy's explicit denial. An admission webhook's denial is ``bounded``: budget or capacity
webhooks deny "for now", so it is retried, but only for the job's
``spec.runPolicy.admissionRetrySeconds``. Everything else (a full quota, throttling, 5xx, a
webhook that is down, RBAC that an admin may still fix, anything unknown) is retried with
backoff: an unknown refusal must never fail a job for good.

Quota refusals are recognised by the ResourceQuota admission plugin's own phrases after the
API server's ``is forbidden:`` (``exceeded quota:``, ``failed quota:``, ...), never by the
word "quota" alone: a namespace or ServiceAccount may be named ``quota-team``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Final

from gpujob_operator.api import conditions as c

MESSAGE_MAX_CHARS: Final = 1024
ENDPOINT_GUARD: Final = "endpoint guard"
"""The ``kind`` of a job's NetworkPolicy or token Secret: the API server refusing one as
invalid means the operator's settings are wrong (the chart's ``jobEndpoints`` values), which
an administrator fixes while the job waits; never the job's own mistake."""
GUARD_ADVICE: Final = (
    "the operator's jobEndpoints settings (GPUJOB_JOB_NETWORK_POLICY) build a NetworkPolicy "
    "the API server refuses: fix the chart's jobEndpoints values; the job waits and retries"
)

_LIMIT_RANGE: Final = re.compile(
    r"(maximum|minimum) \S+ usage per (Container|Pod) is|limit to request ratio per", re.I
)
_RBAC: Final = re.compile(r"\bcannot \w+ resource\b")
# kube-apiserver's ResourceQuota admission (plugin/resourcequota/controller.go), wrapped by
# admission.NewForbidden as '<resource> "<name>" is forbidden: <error>' (or 'forbidden: ...').
_FORBIDDEN: Final = r"(?:^|\bis )forbidden: "
_QUOTA_FAILED: Final = re.compile(_FORBIDDEN + r"failed quota: (?P<quota>[^:\s]+): (?P<why>.*)$")
_QUOTA_TRANSIENT: Final = re.compile(
    _FORBIDDEN + r"(?:exceeded quota: |status unknown for quota: |insufficient quota to "
    r"(?:consume|match these scopes): )"
)
_MUST_SPECIFY: Final = "must specify "
# The Priority admission plugin: a pod's priority or preemptionPolicy that contradicts its
# PriorityClass can never be admitted with that class.
_PRIORITY_CONFLICT: Final = re.compile(r"must not be provided in pod spec; priority admission")
_WEBHOOK_DOWN: Final = re.compile(r"failed calling webhook|failed to call webhook", re.I)
_WEBHOOK_DENIED: Final = re.compile(r"admission webhook .* denied the request", re.I)
_POLICY_DENIED: Final = re.compile(r"ValidatingAdmissionPolicy .* denied request", re.I)


@dataclass(frozen=True)
class Refusal:
    """One classified API error."""

    reason: str
    """A condition reason (``QuotaExceeded``, ``APIThrottled``, ...); also the metric label."""
    permanent: bool
    """True when retrying the same request can never succeed (the job fails)."""
    message: str
    """The API server's message (or the client's error), truncated."""
    code: int | None = None
    """HTTP status code, None when no response came back."""
    retry_after: float | None = None
    """Seconds the server asked us to wait (Retry-After / details.retryAfterSeconds)."""
    bounded: bool = False
    """Retried, but only for the job's ``spec.runPolicy.admissionRetrySeconds`` (an admission
    webhook's denial: budget and capacity webhooks deny "for now")."""
    advice: str | None = None
    """What the user can do about it, when the message alone does not say."""

    @property
    def expected(self) -> bool:
        """An answer of the server, or no answer at all (logged as one line, no traceback);
        False for anything else a client call raised, which is a bug."""
        return self.reason != c.API_ERROR or self.code is not None


def status_body(body: Any) -> Mapping[str, Any]:
    """The metav1.Status the server sent, or {} when the body is not one."""
    if isinstance(body, bytes):
        body = body.decode("utf-8", "replace")
    if isinstance(body, str):
        try:
            body = json.loads(body)
        except ValueError:
            return {"message": body.strip()} if body.strip() else {}
    return body if isinstance(body, Mapping) else {}


def _retry_after(status: Mapping[str, Any], headers: Mapping[str, str] | None) -> float | None:
    for key, value in (headers or {}).items():
        if key.lower() == "retry-after":
            try:
                return max(float(value), 0.0)
            except ValueError:
                return None
    seconds = (status.get("details") or {}).get("retryAfterSeconds")
    if isinstance(seconds, int | float) and not isinstance(seconds, bool):
        return max(float(seconds), 0.0)
    return None


def _truncate(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= MESSAGE_MAX_CHARS else text[: MESSAGE_MAX_CHARS - 3] + "..."


def classify(
    code: int | None,
    body: Any = None,
    headers: Mapping[str, str] | None = None,
    *,
    kind: str = "pod",
) -> Refusal:
    """Classify an API error from its HTTP status code and body (a metav1.Status).

    ``kind`` is what was being written (``pod``, ``service``, ...): a 422 on a pod is the
    user's template (InvalidPodTemplate), on anything else the operator's own object.
    """
    status = status_body(body)
    message = _truncate(str(status.get("message") or f"HTTP {code}"))
    reason = str(status.get("reason") or "")
    hint = _retry_after(status, headers)

    def out(r: str, permanent: bool, bounded: bool = False, advice: str | None = None) -> Refusal:
        return Refusal(r, permanent, message, code, hint, bounded, advice)

    if code is None:
        return out(c.API_UNREACHABLE, False)
    # Admission webhooks and policies first: they answer with whatever code they chose.
    if _WEBHOOK_DOWN.search(message):
        return out(c.ADMISSION_WEBHOOK_UNAVAILABLE, False)
    if _WEBHOOK_DENIED.search(message):
        return out(c.ADMISSION_WEBHOOK_DENIED, False, bounded=True)
    if _POLICY_DENIED.search(message):
        return out(c.ADMISSION_POLICY_DENIED, True)
    if code == 429 or reason == "TooManyRequests":
        return out(c.API_THROTTLED, False)
    if code >= 500:
        return out(c.API_SERVER_ERROR, False)
    if code == 422 or reason == "Invalid":
        if kind == ENDPOINT_GUARD:  # built from the operator's settings, not from the job
            return out(c.CREATE_REFUSED, False, advice=GUARD_ADVICE)
        return out(c.INVALID_POD_TEMPLATE if kind == "pod" else c.INVALID_OBJECT, True)
    if code == 403:
        if "violates PodSecurity" in message:
            return out(c.POD_SECURITY_VIOLATION, True)
        if _RBAC.search(message):
            return out(c.OPERATOR_FORBIDDEN, False)
        failed = _QUOTA_FAILED.search(message)
        if failed:
            return out(
                c.QUOTA_REQUIREMENTS_UNMET,
                True,
                advice=quota_advice(failed["quota"], failed["why"]),
            )
        if _QUOTA_TRANSIENT.search(message):
            return out(c.QUOTA_EXCEEDED, False)
        if _LIMIT_RANGE.search(message):
            return out(c.LIMIT_RANGE_VIOLATION, True)
        if _PRIORITY_CONFLICT.search(message) and kind == "pod":
            return out(c.INVALID_POD_TEMPLATE, True)
        return out(c.CREATE_REFUSED, False)
    if code == 409:
        return out(c.API_CONFLICT, False)
    if code == 401:
        return out(c.API_UNAUTHORIZED, False)
    if code == 400:
        # Strict field validation (a field core/v1 does not know, from a pass-through), or a
        # value the server cannot even decode into a Pod (a quantity that is not one).
        if kind == "pod" and undecodable(message):
            return out(c.INVALID_POD_TEMPLATE, True)
        return out(c.CREATE_REFUSED, True)
    return out(c.API_ERROR, False)


STRICT_DECODING: Final = "strict decoding error"
CANNOT_DECODE: Final = re.compile(r"cannot be handled as an? \w+")
"""The API server's 400 for a body it cannot decode into the kind at all: a value of the
wrong type or format (``emptyDir.sizeLimit: lots``), before any validation ran."""


def undecodable(message: str) -> bool:
    """Whether a 400's message says the object as sent can never be decoded by the server."""
    return STRICT_DECODING in message or CANNOT_DECODE.search(message) is not None


def quota_advice(quota: str, why: str) -> str:
    """What to set for a quota's ``must specify`` (else its other complaint), in spec terms.

    The plugin lists the missing resources as ``limits.cpu,requests.memory`` (newer servers:
    ``limits.cpu for: trainer; requests.memory for: trainer``); a bare ``cpu`` is a request.
    """
    if not why.startswith(_MUST_SPECIFY):
        return (
            f"ResourceQuota {quota} refuses the pod's resources as written; fix "
            "spec.resources and create the job again"
        )
    names: list[str] = []
    for part in why[len(_MUST_SPECIFY) :].split("; "):
        for name in part.split(" for: ")[0].split(","):
            name = name.strip()
            if name and name not in names:
                names.append(name)
    fields = ", ".join(
        f"spec.resources.{n}"
        if n.startswith(("limits.", "requests."))
        else f"spec.resources.requests.{n}"
        for n in names
    )
    return (
        f"ResourceQuota {quota} requires every container to set {', '.join(names)}, which the "
        f"job's pods do not: set {fields} and create the job again"
    )


def classify_exception(exc: BaseException, *, kind: str = "pod") -> Refusal:
    """Classify what a client call raised: an ApiException (status/body/headers), a network
    error (no response: APIUnreachable), or anything else (APIError, unexpected)."""
    code = getattr(exc, "status", None)
    if isinstance(code, int) and not isinstance(code, bool) and code > 0:
        headers = getattr(exc, "headers", None)
        return classify(
            code,
            getattr(exc, "body", None) or getattr(exc, "reason", None),
            dict(headers) if headers else None,
            kind=kind,
        )
    if isinstance(exc, OSError | TimeoutError) or type(exc).__name__ in _NETWORK_ERRORS:
        return Refusal(c.API_UNREACHABLE, False, _truncate(f"{type(exc).__name__}: {exc}"))
    return Refusal(c.API_ERROR, False, _truncate(f"{type(exc).__name__}: {exc}"))


_NETWORK_ERRORS: Final = frozenset(
    {"MaxRetryError", "ProtocolError", "NewConnectionError", "ReadTimeoutError", "SSLError"}
)
"""urllib3's errors, by name so that this module needs no HTTP library."""


@dataclass(frozen=True)
class Refused:
    """The job's latest refused create, as the job loop remembers it, handed to the planner.

    ``since`` is when this run of refusals began (the gang's grace counts from it),
    ``retry_at`` when the next try is due, ``tries`` how many in a row were refused.
    """

    refusal: Refusal
    target: str
    since: datetime
    retry_at: datetime
    tries: int = 1


def _kind(target: object) -> str:
    """The kind part of a Refused target (``pod``, ``service``, ``Workload``, ...)."""
    return str(target or "").partition(" ")[0]


def denial_record(old: Mapping[str, Any] | None, refused: Refused | None) -> dict[str, str] | None:
    """``operatorState.admissionDenial`` after this pass's refusal: since when a webhook denies.

    The shell forgets its refusals on restart; this record does not, so the bounded retry of
    a webhook's denial (``spec.runPolicy.admissionRetrySeconds``) counts from the first
    denial, not from the restart. It is kept while no refusal is known (the shell restarted,
    or a retry is in flight), continued by a denial of the same kind of object, and dropped
    by any other refusal; the planner drops it too once the creates are seen to succeed.
    """
    if refused is None:
        return dict(old) if old else None
    if not refused.refusal.bounded:
        return None
    since = refused.since
    prev = c.parse_time((old or {}).get("since"))
    if (
        prev is not None
        and prev < since
        and _kind((old or {}).get("target")) == _kind(refused.target)
    ):
        since = prev
    return {"since": c.format_time(since), "target": refused.target}


def backoff_record(refused: Refused) -> dict[str, Any]:
    """``operatorState.createBackoff`` for a refusal being retried: what :func:`resume` needs."""
    r = refused.refusal
    record: dict[str, Any] = {
        "tries": max(refused.tries, 1),
        "since": c.format_time(refused.since),
        "retryAt": c.format_time(refused.retry_at),
        "reason": r.reason[:128],
        "message": r.message[:MESSAGE_MAX_CHARS],
        "target": refused.target[:512],
    }
    if r.code is not None:
        record["code"] = r.code
    return record


def resume(record: Mapping[str, Any] | None) -> Refused | None:
    """The refusal a ``operatorState.createBackoff`` record describes, for a shell that forgot it
    (an operator restart): the same tries, grace start and next try. None if unreadable."""
    if not record:
        return None
    try:
        since = c.parse_time(record.get("since"))
        retry_at = c.parse_time(record.get("retryAt"))
    except (TypeError, ValueError, AttributeError):
        return None  # a damaged record: retry as a fresh loop always did
    reason = record.get("reason")
    tries = record.get("tries")
    if since is None or retry_at is None or not isinstance(reason, str) or not reason:
        return None
    if not isinstance(tries, int) or isinstance(tries, bool) or tries < 1:
        return None
    code = record.get("code")
    refusal = Refusal(
        reason,
        False,  # a permanent refusal fails the job: it is never retried, so never recorded
        str(record.get("message") or ""),
        code if isinstance(code, int) and not isinstance(code, bool) else None,
        bounded=reason == c.ADMISSION_WEBHOOK_DENIED,
    )
    return Refused(refusal, str(record.get("target") or ""), since, retry_at, tries)


def next_refused(
    prev: Refused | None, target: str, refusal: Refusal, now: datetime, delay: float
) -> Refused:
    """The refusal after ``prev`` (None: the first in a row): one more try, retried after
    ``delay``; the run (and the gang's grace) goes on while the reason stays the same."""
    same = prev is not None and prev.refusal.reason == refusal.reason
    return Refused(
        refusal,
        target,
        since=prev.since if same and prev is not None else now,
        retry_at=now + timedelta(seconds=delay),
        tries=(prev.tries if prev is not None else 0) + 1,
    )
