"""Condition types, reasons and pure helpers for ``status.conditions``.

One module owns every type and reason string (the Kubebuilder memcached sample's
habit), so handlers, planner, analyzer and tests never spell them twice.

Conditions are plain dicts in the wire format of ``metav1.Condition``:
``{"type", "status", "reason", "message", "lastTransitionTime", "observedGeneration"}``.
The display ``phase`` is *derived* from them, never stored independently.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Final, Literal

ConditionStatus = Literal["True", "False", "Unknown"]
TRUE: Final = "True"
FALSE: Final = "False"
UNKNOWN: Final = "Unknown"

# ---- condition types -------------------------------------------------------------------
# Lifecycle (owned by the planner).
CREATED: Final = "Created"
RUNNING: Final = "Running"
RESTARTING: Final = "Restarting"
SUSPENDED: Final = "Suspended"
SUCCEEDED: Final = "Succeeded"
FAILED: Final = "Failed"
# Observability (owned by the scraper/analyzer; the planner preserves them, and resets
# Stalled when it restarts the gang because of a stall).
STALLED: Final = "Stalled"
METRICS_AVAILABLE: Final = "MetricsAvailable"
BOTTLENECK_DETECTED: Final = "BottleneckDetected"

# Placement (owned by the planner): whether the gang's pods are kept off blamed nodes.
NODES_AVOIDED: Final = "NodesAvoided"

LIFECYCLE_TYPES: Final = (CREATED, RUNNING, RESTARTING, SUSPENDED, SUCCEEDED, FAILED)
ALL_TYPES: Final = (
    *LIFECYCLE_TYPES,
    STALLED,
    METRICS_AVAILABLE,
    BOTTLENECK_DETECTED,
    NODES_AVOIDED,
)

MESSAGE_MAX_LENGTH: Final = 32768
"""The CRD's maxLength of a condition's message: the API server refuses a whole status patch
with a longer one, so every message is clipped to it (`make`)."""

# ---- reasons ---------------------------------------------------------------------------
# CamelCase, matching metav1.Condition's reason pattern.
PODS_CREATING: Final = "PodsCreating"
PODS_CREATED: Final = "PodsCreated"
PODS_PENDING: Final = "PodsPending"
UNSCHEDULABLE: Final = "Unschedulable"
IMAGE_PULL_FAILED: Final = "ImagePullFailed"
CONTAINER_CONFIG_ERROR: Final = "ContainerConfigError"
ALL_RANKS_RUNNING: Final = "AllRanksRunning"
ALL_RANKS_SUCCEEDED: Final = "AllRanksSucceeded"
RANK_FAILED: Final = "RankFailed"
POD_LOST: Final = "PodLost"
GANG_RESTART: Final = "GangRestart"
WAITING_FOR_OLD_PODS: Final = "WaitingForOldPods"
# Gang admission (gang.py): the whole gang waits, no pod holds a GPU.
WAITING_FOR_GANG: Final = "WaitingForGang"
GANG_SCHEDULING_UNAVAILABLE: Final = "GangSchedulingUnavailable"
QUEUED: Final = "Queued"
QUEUE_NAME_MISSING: Final = "QueueNameMissing"
PRIORITY_CLASS_NOT_FOUND: Final = "PriorityClassNotFound"
PREEMPTED: Final = "Preempted"
EVICTED: Final = "Evicted"
WORKLOAD_DELETED: Final = "WorkloadDeleted"
"""The job's Kueue Workload vanished while its gang ran: counted like an eviction."""
START_FORECAST: Final = "StartForecast"
"""Event: a waiting job's start forecast was first made or changed confidence, or it started
(and how far that was from the forecast)."""
POD_NAME_TAKEN: Final = "PodNameTaken"
"""A pod this job did not create holds one of its pod names (an old job's, an orphan)."""
BACKOFF_LIMIT_EXCEEDED: Final = "BackoffLimitExceeded"
NON_RETRYABLE_EXIT_CODE: Final = "NonRetryableExitCode"
NO_PROGRESS_ACROSS_RESTARTS: Final = "NoProgressAcrossRestarts"
"""runPolicy.maxRestartsWithoutProgress consecutive failed attempts never passed the furthest
step reached before them."""
DEADLINE_EXCEEDED: Final = "DeadlineExceeded"
OOM_KILLED: Final = "OOMKilled"
SUSPENDED_REASON: Final = "Suspended"
RESUMED: Final = "Resumed"
JOB_SUCCEEDED: Final = "JobSucceeded"
JOB_FAILED: Final = "JobFailed"
NOT_STARTED: Final = "NotStarted"
STALL_DETECTED: Final = "StallDetected"
STALL_CONFIRMED: Final = "StallConfirmed"
"""Stalled held for two consecutive scrapes: only now may restartOnStall act."""
# NodesAvoided: the next attempt kept off the nodes an ended attempt blamed.
NODE_BLAMED: Final = "NodeBlamed"
BLAMED_NODES_AVOIDED: Final = "BlamedNodesAvoided"
TOO_FEW_NODES: Final = "TooFewNodes"
NODES_UNKNOWN: Final = "NodesUnknown"
IN_PLACE_FALLBACK: Final = "InPlaceFallback"
"""Event: an in-place gang restart recreates some or all pods (a pod gone, on a blamed node,
or not restarted in time), or a job asking for InPlace runs with Recreate."""
RESTARTED_IN_PLACE: Final = "RestartedInPlace"
"""Event: every pod of the gang restarted in place and was released for the new attempt."""
NO_BLAMED_NODES: Final = "NoBlamedNodes"
HANG_EVIDENCE: Final = "HangEvidence"
"""Event: every rank's place when a stall was detected, compared (status.hangEvidence)."""
PROFILE_REQUESTED: Final = "ProfileRequested"
"""Event: a profile request was accepted; its ranks capture their next steps (status.profile)."""
PROFILE_REFUSED: Final = "ProfileRefused"
"""Event (Warning): a profile request was refused, with the reason (status.profile)."""
PROFILE_CAPTURED: Final = "ProfileCaptured"
"""Event: a profile was captured and compared; the answer and its ConfigMap (status.profile)."""
PROFILE_FAILED: Final = "ProfileFailed"
"""Event (Warning): a capture ended without any rank's summary, with why (status.profile)."""
STARTING_UP: Final = "StartingUp"
RANKS_BUSY: Final = "RanksBusy"
TTL_EXPIRED: Final = "TTLExpired"
# Observability reasons (monitor.py). BottleneckDetected=True uses the verdict name itself
# (InputBound, Straggler, ...) as its reason.
ALL_RANKS_SCRAPED: Final = "AllRanksScraped"
SCRAPE_FAILED: Final = "ScrapeFailed"
NO_RANKS_TO_SCRAPE: Final = "NoRanksToScrape"
SCRAPE_INTERVAL_STRETCHED: Final = "ScrapeIntervalStretched"
"""MetricsAvailable=True (and a Warning Event when it starts): every rank was read, but the
job's rounds cost more operator CPU than its share of the scrape budget, so it is scraped
less often than scrapeIntervalSeconds asks (monitoring/scrape/budget.py)."""
HOST_PORTS_NOT_ALLOWED: Final = "HostPortsNotAllowed"
"""MetricsAvailable=False (and a Warning Event): a host-network job's metrics ports lie
outside the node ports the operator may scrape (api/hostports.py)."""
PROGRESSING: Final = "Progressing"
WARMING_UP: Final = "WarmingUp"
NO_BOTTLENECK: Final = "NoBottleneck"
METRICS_RECOVERED: Final = "MetricsRecovered"
STALL_CLEARED: Final = "StallCleared"
BOTTLENECK_CHANGED: Final = "BottleneckChanged"

METRICS_REJECTED: Final = "MetricsRejected"
"""Event: a payload carried series or values the operator refused (monitoring/scrape/guard.py)."""
# Refusals by the API server (lifecycle/apiserver/refusals.py): the reason of
# Created/Running=False while a transient one is retried, of Failed=True for a permanent one.
QUOTA_EXCEEDED: Final = "QuotaExceeded"
QUOTA_REQUIREMENTS_UNMET: Final = "QuotaRequirementsUnmet"
"""A ResourceQuota requires what the pod does not set (``failed quota: q: must specify
limits.cpu``): the pod as written can never be admitted, so the job fails."""
POD_SECURITY_VIOLATION: Final = "PodSecurityViolation"
INVALID_POD_TEMPLATE: Final = "InvalidPodTemplate"
INVALID_SPEC: Final = "InvalidSpec"
"""A stored job no longer passes the model (created before a rule existed, or under an older
CRD): the operator cannot plan it and says so instead of retrying."""
PODS_TOO_LARGE: Final = "PodsTooLarge"
"""Failed (and a Warning Event): the job's pods add up to more bytes than the operator may
hold (``api/podbytes.py``, GPUJOB_MAX_JOB_POD_BYTES); no pod was created."""
INVALID_OBJECT: Final = "InvalidObject"
LIMIT_RANGE_VIOLATION: Final = "LimitRangeViolation"
ADMISSION_WEBHOOK_DENIED: Final = "AdmissionWebhookDenied"
ADMISSION_POLICY_DENIED: Final = "AdmissionPolicyDenied"
ADMISSION_WEBHOOK_UNAVAILABLE: Final = "AdmissionWebhookUnavailable"
API_THROTTLED: Final = "APIThrottled"
API_SERVER_ERROR: Final = "APIServerError"
API_UNREACHABLE: Final = "APIUnreachable"
API_CONFLICT: Final = "APIConflict"
API_UNAUTHORIZED: Final = "APIUnauthorized"
OPERATOR_FORBIDDEN: Final = "OperatorForbidden"
CREATE_REFUSED: Final = "PodCreateRefused"
API_ERROR: Final = "APIError"
PERMANENT_REFUSALS: Final = (
    INVALID_POD_TEMPLATE,
    INVALID_OBJECT,
    POD_SECURITY_VIOLATION,
    LIMIT_RANGE_VIOLATION,
    QUOTA_REQUIREMENTS_UNMET,
    ADMISSION_POLICY_DENIED,
)
BOUNDED_REFUSALS: Final = (ADMISSION_WEBHOOK_DENIED,)
"""Retried for ``spec.runPolicy.admissionRetrySeconds``, then the job fails."""
TRANSIENT_REFUSALS: Final = (
    QUOTA_EXCEEDED,
    ADMISSION_WEBHOOK_UNAVAILABLE,
    API_THROTTLED,
    API_SERVER_ERROR,
    API_UNREACHABLE,
    API_CONFLICT,
    API_UNAUTHORIZED,
    OPERATOR_FORBIDDEN,
    CREATE_REFUSED,
    API_ERROR,
)
REFUSAL_REASONS: Final = (*PERMANENT_REFUSALS, *BOUNDED_REFUSALS, *TRANSIENT_REFUSALS)
"""PodCreateRefused is permanent for a 400 Bad Request, transient for an unknown 403."""
GANG_RELEASED: Final = "GangReleased"
"""Event: the pods of a gang that could not be completed were deleted, so it holds nothing."""

WAITING_FOR_RANKS: Final = "WaitingForRanks"
RANKS_FINISHED: Final = "RanksFinished"

# ---- display phases ----------------------------------------------------------------------
PHASE_PENDING: Final = "Pending"
PHASE_RUNNING: Final = "Running"
PHASE_RESTARTING: Final = "Restarting"
PHASE_SUSPENDED: Final = "Suspended"
PHASE_SUCCEEDED: Final = "Succeeded"
PHASE_FAILED: Final = "Failed"
PHASES: Final = (
    PHASE_PENDING,
    PHASE_RUNNING,
    PHASE_RESTARTING,
    PHASE_SUSPENDED,
    PHASE_SUCCEEDED,
    PHASE_FAILED,
)

Condition = dict[str, Any]


def format_time(when: datetime) -> str:
    """RFC 3339 in UTC with a ``Z`` and whole seconds, as Kubernetes writes times."""
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(value: str | datetime | None) -> datetime | None:
    """Parse a Kubernetes timestamp (``...Z`` or with an offset) into an aware datetime."""
    if value is None or value == "":
        return None
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=UTC)
    text = value.strip()
    if text.endswith(("Z", "z")):
        text = text[:-1] + "+00:00"
    parsed = datetime.fromisoformat(text)
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def find(conditions: Iterable[Mapping[str, Any]] | None, type_: str) -> Mapping[str, Any] | None:
    """The condition of ``type_``, or None."""
    for cond in conditions or ():
        if cond.get("type") == type_:
            return cond
    return None


def is_true(conditions: Iterable[Mapping[str, Any]] | None, type_: str) -> bool:
    """Whether the condition of ``type_`` exists with status True."""
    cond = find(conditions, type_)
    return cond is not None and cond.get("status") == TRUE


def make(
    type_: str,
    status: ConditionStatus,
    reason: str,
    message: str,
    now: datetime,
    observed_generation: int | None = None,
) -> Condition:
    """A new condition dict in wire format, its message clipped to `MESSAGE_MAX_LENGTH`."""
    cond: Condition = {
        "type": type_,
        "status": status,
        "reason": reason,
        "message": clip(message, MESSAGE_MAX_LENGTH),
        "lastTransitionTime": format_time(now),
    }
    if observed_generation is not None:
        cond["observedGeneration"] = observed_generation
    return cond


def time_or_none(value: object) -> datetime | None:
    """A timestamp read leniently: None for anything that is no readable time (a status an
    older or broken writer left must not stop a pass)."""
    if not isinstance(value, str | datetime):
        return None
    try:
        return parse_time(value)
    except ValueError:
        return None


def clip(text: str, limit: int) -> str:
    """`text` cut to at most `limit` characters, ending in "..." when cut: untrusted or
    unbounded words then never make a status write fail."""
    if len(text) <= limit:
        return text
    return text[: max(limit - 3, 0)] + "..."[: max(limit, 0)]


def set_condition(
    conditions: Sequence[Mapping[str, Any]] | None,
    type_: str,
    status: ConditionStatus,
    reason: str,
    message: str,
    now: datetime,
    observed_generation: int | None = None,
) -> list[Condition]:
    """Return a new list with ``type_`` set; the input is not modified.

    ``lastTransitionTime`` moves only when ``status`` changes (API conventions), so a
    condition whose reason or message is refreshed keeps the time it became what it is.
    The list keeps its order; a new type is appended.
    """
    new = make(type_, status, reason, message, now, observed_generation)
    out: list[Condition] = []
    found = False
    for cond in conditions or ():
        if cond.get("type") != type_:
            out.append(dict(cond))
            continue
        found = True
        if cond.get("status") == status and cond.get("lastTransitionTime"):
            new["lastTransitionTime"] = cond["lastTransitionTime"]
        out.append(new)
    if not found:
        out.append(new)
    return out


def merge_conditions(
    base: Sequence[Mapping[str, Any]] | None,
    updates: Iterable[Mapping[str, Any]],
    now: datetime,
) -> list[Condition]:
    """Apply several condition dicts (as from :func:`make`) with :func:`set_condition`.

    Like metav1's ``SetStatusCondition``: each keeps its place in the list (a new type is
    appended) and the old ``lastTransitionTime`` when its status did not change; an update
    without a time takes ``now``.
    """
    out: list[Condition] = [dict(c) for c in base or ()]
    for upd in updates:
        out = set_condition(
            out,
            upd["type"],
            upd["status"],
            upd.get("reason", ""),
            upd.get("message", ""),
            parse_time(upd.get("lastTransitionTime")) or now,
            upd.get("observedGeneration"),
        )
    return out


def remove_condition(conditions: Sequence[Mapping[str, Any]] | None, type_: str) -> list[Condition]:
    """Return a new list without ``type_``."""
    return [dict(c) for c in conditions or () if c.get("type") != type_]


def derive_phase(conditions: Iterable[Mapping[str, Any]] | None) -> str:
    """The display phase: terminal states first, then suspension, restart, running.

    Failed > Succeeded > Suspended > Restarting > Running > Pending.
    """
    conds = list(conditions or ())
    for type_, phase in (
        (FAILED, PHASE_FAILED),
        (SUCCEEDED, PHASE_SUCCEEDED),
        (SUSPENDED, PHASE_SUSPENDED),
        (RESTARTING, PHASE_RESTARTING),
        (RUNNING, PHASE_RUNNING),
    ):
        if is_true(conds, type_):
            return phase
    return PHASE_PENDING


def is_finished(conditions: Iterable[Mapping[str, Any]] | None) -> bool:
    """Whether the job reached a terminal state (Succeeded or Failed)."""
    conds = list(conditions or ())
    return is_true(conds, SUCCEEDED) or is_true(conds, FAILED)
