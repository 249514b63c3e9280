"""The level-based heart of the operator: observed state in, actions and status out.

:func:`plan` is pure. It reads the job (spec + the status written last time) and a summary
of the job's pods, and returns what to create and delete, the complete new status, and
Events. The I/O shell applies a :class:`Plan` in this order: **status first, then deletes,
then creates** — so a crash between steps never forgets a restart it already counted (the
next plan re-derives the same actions from the persisted status and the pods' labels).

Gang semantics (torchrun's static rendezvous needs every rank):

* attempt ``A`` = max(``status.attempt``, highest ``gpujob.dev/attempt`` label seen); pods of
  older attempts are stale and deleted; a new attempt's pods are created only once *every*
  stale pod is gone (pod names are fixed, so this also rules out duplicates).
* a failed rank (or a pod lost after the gang was complete, or a stall with
  ``restartOnStall``) restarts the whole gang: attempt+1, restarts+1, all pods deleted.
  ``restarts`` lives in status and is never kept in memory, so it survives an operator
  restart. A stall restarts only once confirmed by two scrapes (reason ``StallConfirmed``),
  and every gang restart and suspension clears ``Stalled``. Beyond ``backoffLimit`` the job
  fails (BackoffLimitExceeded); a root-cause exit code outside ``retryableExitCodes`` (when
  set) fails it at once (NonRetryableExitCode).
* a gang restart backs off: the next attempt's pods are created no earlier than
  ``status.nextAttemptTime`` (10 s, 20 s, 40 s ... capped, like batch/v1 Job).
* a refused create (:class:`apierrors.Refused`, remembered by the shell) shows as the reason
  of Created/Running=False and a Warning Event, and is retried at its ``retry_at``; a
  permanent refusal fails the job. A gang is all or nothing: pods of an incomplete gang that
  is still refused after ``gang_grace_seconds`` are deleted, so a job waiting holds nothing.
* suspend deletes every pod and bumps the attempt; resume resets ``startTime`` (so the
  ``activeDeadlineSeconds`` clock excludes suspension, as for batch/v1 Job).
* at the end ``cleanPodPolicy`` decides which pods go; ``ttlSecondsAfterFinished`` asks for
  the job's deletion (``Plan.delete_job``).

Planning twice on the same input yields the same plan.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Final

from pydantic import ValidationError

from gpujob_operator import api
from gpujob_operator.api import children
from gpujob_operator.api import conditions as c
from gpujob_operator.api.children import controller_uid
from gpujob_operator.api.display import render_display
from gpujob_operator.api.events import Event, EventType
from gpujob_operator.lifecycle import backoff, builders, gang
from gpujob_operator.lifecycle.refusals import Refused

GANG_GRACE_SECONDS: Final = 10.0
"""How long pods of an incomplete, refused gang may hold resources before they are deleted."""
RESTART_BACKOFF: Final = backoff.Policy(backoff.RESTART_BASE_SECONDS, backoff.RESTART_MAX_SECONDS)
LOG_TAIL_MAX_CHARS: Final = 4096
MESSAGE_MAX_CHARS: Final = 1024

_PULL_ERRORS: Final = frozenset({"ErrImagePull", "ImagePullBackOff", "InvalidImageName"})
_CONFIG_ERRORS: Final = frozenset({"CreateContainerConfigError", "CreateContainerError"})
_TERMINATED_PHASES: Final = frozenset({"Succeeded", "Failed"})
_STATUS_KEYS: Final = frozenset(
    f.alias or name for name, f in api.GPUTrainingJobStatus.model_fields.items()
)


# ---- observed pods ---------------------------------------------------------------------


@dataclass(frozen=True)
class ObservedPod:
    """What the planner needs to know about one pod of the job.

    ``exit_code``/``reason``/``message`` describe the trainer container's termination
    when there is one, else the pod's own (e.g. reason Evicted, no exit code).
    """

    name: str
    node_rank: int | None
    attempt: int
    phase: str = "Pending"
    terminating: bool = False
    container: str | None = None
    exit_code: int | None = None
    reason: str | None = None
    message: str | None = None
    finished_at: datetime | None = None
    start_time: datetime | None = None
    scheduled_reason: str | None = None
    scheduled_message: str | None = None
    waiting_reason: str | None = None
    waiting_message: str | None = None
    node_name: str | None = None
    controller_uid: str | None = None
    """The UID of the pod's controller: the pod is a job's only when it is the job's UID."""
    disruption: str | None = None
    """The reason of a true `DisruptionTarget` condition: the cluster is taking the pod away
    (PreemptionByScheduler, EvictionByEvictionAPI, DeletionByTaintManager, ...)."""
    disruption_message: str | None = None

    @property
    def unschedulable(self) -> bool:
        """The scheduler could not place it (e.g. not enough nvidia.com/gpu)."""
        return self.scheduled_reason == c.UNSCHEDULABLE

    @property
    def active(self) -> bool:
        """Not yet terminated (Pending, Running or Unknown)."""
        return self.phase not in _TERMINATED_PHASES


def _int_or_none(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


DISRUPTION_TARGET: Final = "DisruptionTarget"
"""The pod condition Kubernetes sets before it takes a pod away (scheduler preemption, an
eviction by `kubectl drain`, the taint manager, the kubelet under node pressure, pod GC)."""
PREEMPTION_BY_SCHEDULER: Final = "PreemptionByScheduler"


def observe_pod(pod: Mapping[str, Any]) -> ObservedPod:
    """Summarize a pod as the API returns it (raw camelCase JSON, e.g. kopf's body)."""
    meta = pod.get("metadata") or {}
    labels = meta.get("labels") or {}
    status = pod.get("status") or {}
    name = str(meta.get("name", ""))
    node_rank = _int_or_none(labels.get(children.LABEL_NODE_RANK))
    if node_rank is None and "-node-" in name:
        node_rank = _int_or_none(name.rsplit("-node-", 1)[1])
    attempt = _int_or_none(labels.get(children.LABEL_ATTEMPT)) or 0

    statuses = list(status.get("containerStatuses") or [])
    main = next((s for s in statuses if s.get("name") == builders.CONTAINER_NAME), None)
    if main is None and statuses:
        main = statuses[0]
    # A failed init container explains a Failed pod whose main container never ran.
    candidates = [main] if main else []
    candidates += [
        s
        for s in status.get("initContainerStatuses") or []
        if ((s.get("state") or {}).get("terminated") or {}).get("exitCode") not in (None, 0)
    ]
    container = exit_code = reason = message = finished_at = None
    waiting_reason = waiting_message = None
    for cs in candidates:
        state = cs.get("state") or {}
        term = state.get("terminated")
        if term:
            container = cs.get("name")
            exit_code = _int_or_none(term.get("exitCode"))
            reason = term.get("reason")
            message = term.get("message")
            finished_at = c.parse_time(term.get("finishedAt"))
            if exit_code not in (None, 0) or cs is not main:
                break
        elif state.get("waiting") and cs is main:
            waiting_reason = state["waiting"].get("reason")
            waiting_message = state["waiting"].get("message")
    if reason is None and status.get("reason"):
        reason = status.get("reason")
        message = message or status.get("message")

    sched_reason = sched_message = disruption = disruption_message = None
    for cond in status.get("conditions") or []:
        if cond.get("type") == "PodScheduled" and cond.get("status") != "True":
            sched_reason = cond.get("reason")
            sched_message = cond.get("message")
        elif cond.get("type") == DISRUPTION_TARGET and cond.get("status") == "True":
            disruption = str(cond.get("reason") or DISRUPTION_TARGET)
            disruption_message = cond.get("message")
    return ObservedPod(
        name=name,
        node_rank=node_rank,
        attempt=attempt,
        phase=str(status.get("phase") or "Pending"),
        terminating=bool(meta.get("deletionTimestamp")),
        container=container,
        exit_code=exit_code,
        reason=reason,
        message=message,
        finished_at=finished_at,
        start_time=c.parse_time(status.get("startTime")),
        scheduled_reason=sched_reason,
        scheduled_message=sched_message,
        waiting_reason=waiting_reason,
        waiting_message=waiting_message,
        node_name=(pod.get("spec") or {}).get("nodeName"),
        controller_uid=controller_uid(pod),
        disruption=disruption,
        disruption_message=disruption_message,
    )


# ---- plan ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    """Actions for the I/O shell; apply status, then deletes, then creates.

    ``status`` is the complete new status (camelCase, JSON-ready); fields owned by others
    (progress, bottleneck, gpus, Stalled/MetricsAvailable/BottleneckDetected conditions)
    are carried over from the input. Use :func:`~gpujob_operator.api.patches.minimal_patch` to patch only what changed.
    ``requeue_after`` is the number of seconds until a time-based transition (deadline,
    TTL) is due, or None.
    """

    status: dict[str, Any]
    create_service: dict[str, Any] | None = None
    create_pods: list[dict[str, Any]] = field(default_factory=list)
    delete_pods: list[str] = field(default_factory=list)
    delete_job: bool = False
    events: list[Event] = field(default_factory=list)
    requeue_after: float | None = None
    ensure_objects: list[dict[str, Any]] = field(default_factory=list)
    """Gang objects (Workload, PodGroup) to create if absent, before any pod."""
    delete_objects: list[gang.ObjectRef] = field(default_factory=list)
    status_patches: list[tuple[gang.ObjectRef, dict[str, Any]]] = field(default_factory=list)
    """Merge patches of other objects' status subresource (the Kueue Workload's)."""

    @property
    def phase(self) -> str:
        """The new display phase."""
        return str(self.status.get("phase", c.PHASE_PENDING))


def is_retryable(exit_code: int | None, retryable_exit_codes: Sequence[int] | None) -> bool:
    """Whether a failure may restart the gang (see ``RunPolicy.retryable_exit_codes``).

    No exit code (evicted, node lost, stalled) is always retryable; with the list unset
    every exit code is; with it set, only the codes it holds.
    """
    if exit_code is None or retryable_exit_codes is None:
        return True
    return exit_code in retryable_exit_codes


def _rank_key(pod: ObservedPod) -> int:
    return pod.node_rank if pod.node_rank is not None else 1 << 30


def root_cause(pods: Sequence[ObservedPod]) -> ObservedPod | None:
    """The failed pod that failed first (then lowest rank): the others usually died of it.

    When one rank dies its peers fail in the collective a little later, so the earliest
    ``finishedAt`` names the culprit. The I/O shell calls this before :func:`plan` to know
    which pod's log tail to fetch.
    """
    failed = [p for p in pods if p.phase == "Failed"]
    if not failed:
        return None
    far = datetime.max.replace(tzinfo=UTC)
    return min(
        failed,
        key=lambda p: (p.finished_at or far, _rank_key(p)),
    )


def _truncate(text: str | None, limit: int, tail: bool = False) -> str | None:
    if text is None:
        return None
    if len(text) <= limit:
        return text
    return text[-limit:] if tail else text[: limit - 3] + "..."


def _failure_of(pod: ObservedPod, log_tails: Mapping[str, str]) -> dict[str, Any]:
    reason = pod.reason or ("Error" if pod.exit_code not in (None, 0) else "Failed")
    message = pod.message
    log_tail = log_tails.get(pod.name)
    if log_tail is None and message and pod.container and pod.exit_code not in (None, 0):
        # FallbackToLogsOnError put the log's last lines into the termination message.
        log_tail, message = message, None
    if message is None:
        code = f" with exit code {pod.exit_code}" if pod.exit_code is not None else ""
        message = f"pod {pod.name} (node rank {pod.node_rank}) failed{code}: {reason}"
    out = {
        "pod": pod.name,
        "container": pod.container,
        "nodeRank": pod.node_rank,
        "attempt": pod.attempt,
        "exitCode": pod.exit_code,
        "reason": reason,
        "message": _truncate(message, MESSAGE_MAX_CHARS),
        "logTail": _truncate(log_tail, LOG_TAIL_MAX_CHARS, tail=True),
        "time": c.format_time(pod.finished_at) if pod.finished_at else None,
    }
    return {k: v for k, v in out.items() if v is not None}


def _describe_failure(failure: Mapping[str, Any]) -> str:
    code = failure.get("exitCode")
    what = (
        f"exit code {code} ({failure.get('reason')})" if code is not None else failure.get("reason")
    )
    who = failure.get("pod") or "the job"
    rank = failure.get("nodeRank")
    where = f"{who} (node rank {rank})" if rank is not None else who
    return f"{where} failed: {what}"


@dataclass(frozen=True)
class GangObservation:
    """What the shell observed of the gang's admission objects (see :mod:`gang`).

    ``default`` is the operator's ``GPUJOB_DEFAULT_GANG``; ``native_version`` the served
    ``scheduling.k8s.io`` version for Workload/PodGroup (None: not served);
    ``pod_group`` the current attempt's PodGroup; ``kueue_workload`` the job's Kueue
    Workload; ``flavors`` the ResourceFlavors its admission names.
    """

    default: str = api.GANG_NONE
    native_version: str | None = None
    pod_group: Mapping[str, Any] | None = None
    kueue_workload: Mapping[str, Any] | None = None
    flavors: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    kueue_priority: int | None = None
    """Value of the job's WorkloadPriorityClass (None: no label, or the class is missing)."""
    error: str | None = None
    """Why the gang's objects could not be read (e.g. 403: the operator lacks the RBAC)."""


class _Builder:
    """Mutable scratchpad for one planning pass; :func:`plan` is its pure wrapper."""

    def __init__(
        self,
        body: Mapping[str, Any],
        pods: Sequence[ObservedPod],
        now: datetime,
        service_exists: bool,
        log_tails: Mapping[str, str],
        refused: Refused | None = None,
        restart_backoff: backoff.Policy = RESTART_BACKOFF,
        gang_grace_seconds: float = GANG_GRACE_SECONDS,
        gang_obs: GangObservation | None = None,
        gone: Sequence[ObservedPod] = (),
    ) -> None:
        self.body = body
        self.now = now
        self.name, self.namespace, _ = children.job_meta(body)
        self.spec = api.parse_spec(body["spec"])
        self.generation = _int_or_none((body.get("metadata") or {}).get("generation"))
        self.old_status: dict[str, Any] = copy.deepcopy(dict(body.get("status") or {}))
        self.old_conds: list[dict[str, Any]] = list(self.old_status.get("conditions") or [])
        self.conds: list[dict[str, Any]] = [dict(x) for x in self.old_conds]
        uid = children.job_meta(body)[2]
        # Only pods this job controls are its own; others (an earlier job of the same name,
        # orphans) are never counted, deleted or adopted, only waited for if in the way.
        mine = [p for p in pods if (p.controller_uid or "") == uid]
        self.foreign = sorted(
            (p for p in pods if (p.controller_uid or "") != uid), key=lambda p: p.name
        )
        pods = mine
        self.gone = [p for p in gone if (p.controller_uid or "") == uid and p.disruption]
        self.pods = sorted(pods, key=lambda p: (p.attempt, p.node_rank or 0, p.name))
        self.service_exists = service_exists
        self.log_tails = log_tails
        prev = api.parse_status(self.old_status)
        self.prev_attempt = prev.attempt or 0
        self.attempt = max([self.prev_attempt, *(p.attempt for p in pods)])
        self.restarts = prev.restarts or 0
        self.start_time = self.old_status.get("startTime")
        self.completion_time = self.old_status.get("completionTime")
        self.failure: dict[str, Any] | None = self.old_status.get("failure")
        self.events: list[Event] = []
        self.deletes: list[str] = []
        self.creates: list[dict[str, Any]] = []
        self.delete_job = False
        self.requeue: list[float] = []
        self.service: dict[str, Any] | None = None
        self.refused = refused
        self.restart_backoff = restart_backoff
        self.gang_grace_seconds = gang_grace_seconds
        self.next_attempt: str | None = self.old_status.get("nextAttemptTime")
        self.gang_obs = gang_obs or GangObservation()
        self.mechanism = gang.mechanism(body, self.spec, self.gang_obs.default)
        self.kueue = gang.kueue_state(self.gang_obs.kueue_workload)
        self.ensure: list[dict[str, Any]] = []
        self.delete_refs: list[gang.ObjectRef] = []
        self.patches: list[tuple[gang.ObjectRef, dict[str, Any]]] = []
        self.gang_status: dict[str, Any] = dict(self.old_status.get("gang") or {})

    # -- small helpers
    def set(self, type_: str, status: c.ConditionStatus, reason: str, message: str) -> None:
        self.conds = c.set_condition(
            self.conds, type_, status, reason, message, self.now, self.generation
        )

    def set_if_present(
        self, type_: str, status: c.ConditionStatus, reason: str, message: str
    ) -> None:
        if c.find(self.conds, type_) is not None:
            self.set(type_, status, reason, message)

    def event(self, type_: EventType, reason: str, message: str) -> None:
        self.events.append(Event(type_, reason, message))

    def delete(self, pods: Sequence[ObservedPod]) -> None:
        for p in pods:
            if not p.terminating and p.name not in self.deletes:
                self.deletes.append(p.name)

    @property
    def current(self) -> list[ObservedPod]:
        n = self.spec.nodes
        return [
            p
            for p in self.pods
            if p.attempt == self.attempt and p.node_rank is not None and 0 <= p.node_rank < n
        ]

    @property
    def stale(self) -> list[ObservedPod]:
        current = {p.name for p in self.current}
        return [p for p in self.pods if p.name not in current or p.attempt != self.attempt]

    # -- terminal transitions
    def finish(self, succeeded: bool, reason: str, message: str) -> None:
        if succeeded:
            self.set(c.SUCCEEDED, c.TRUE, reason, message)
            self.set(c.RUNNING, c.FALSE, c.JOB_SUCCEEDED, message)
            self.event("Normal", reason, message)
        else:
            self.set(c.FAILED, c.TRUE, reason, message)
            self.set(c.RUNNING, c.FALSE, c.JOB_FAILED, message)
            self.event("Warning", reason, message)
        done = c.JOB_SUCCEEDED if succeeded else c.JOB_FAILED
        self.set_if_present(c.RESTARTING, c.FALSE, done, message)
        self.completion_time = self.completion_time or c.format_time(self.now)
        self.cleanup()
        self.release_kueue(succeeded, message)
        self.ttl()

    def cleanup(self) -> None:
        """cleanPodPolicy at the end; stale pods go whatever the policy."""
        policy = self.spec.run_policy.clean_pod_policy
        self.delete(self.stale)
        if policy == "All":
            self.delete(self.pods)
        elif policy == "Running":
            self.delete([p for p in self.pods if p.active])

    def finished(self) -> None:
        """Already Succeeded/Failed: cleanup and TTL only."""
        if self.completion_time is None:
            self.completion_time = c.format_time(self.now)
        self.cleanup()
        self.release_kueue(c.is_true(self.conds, c.SUCCEEDED), "the job finished")
        self.ttl()

    def release_kueue(self, succeeded: bool, message: str) -> None:
        """A finished job hands its Kueue quota back (Workload Finished=True)."""
        wl = self.gang_obs.kueue_workload
        if self.mechanism != api.GANG_KUEUE or wl is None or self.kueue.finished:
            return
        now = c.format_time(self.now)
        self.patches.append((gang.ref_of(wl), gang.finish_patch(wl, succeeded, message, now)))
        self.gang_status["admitted"] = False

    def ttl(self) -> None:
        """Ask for the job's deletion once ttlSecondsAfterFinished has passed."""
        ttl = self.spec.run_policy.ttl_seconds_after_finished
        done_at = c.parse_time(self.completion_time)
        if ttl is None or done_at is None:
            return
        left = ttl - (self.now - done_at).total_seconds()
        if left > 0:
            self.requeue.append(left)
            return
        self.delete_job = True
        self.event("Normal", c.TTL_EXPIRED, f"deleting the job {ttl}s after it finished")

    # -- the pass
    def run(self) -> None:
        if c.is_finished(self.conds):
            self.finished()
            return
        if self.deadline_exceeded():
            return
        if self.spec.run_policy.suspend:
            self.suspend()
            return
        if c.is_true(self.conds, c.SUSPENDED):
            self.set(c.SUSPENDED, c.FALSE, c.RESUMED, "job resumed; creating pods")
            self.event("Normal", c.RESUMED, "job resumed")
            self.start_time = c.format_time(self.now)
        if not self.service_exists and not self.retry_pending():
            self.service = builders.build_service(self.body, self.spec)
        if not self.gang_admitted():
            return
        if self.restart_needed():
            return
        current = self.current
        if (
            current
            and all(p.phase == "Succeeded" for p in current)
            and (len(current) == self.spec.nodes)
        ):
            self.finish(
                True,
                c.ALL_RANKS_SUCCEEDED,
                f"all {self.spec.nodes} ranks exited 0 (attempt {self.attempt})",
            )
            return
        self.converge()

    def deadline_exceeded(self) -> bool:
        limit = self.spec.run_policy.active_deadline_seconds
        started = c.parse_time(self.start_time)
        if limit is None or started is None or c.is_true(self.conds, c.SUSPENDED):
            return False
        if self.spec.run_policy.suspend:
            return False
        left = limit - (self.now - started).total_seconds()
        if left > 0:
            self.requeue.append(left)
            return False
        message = f"job ran longer than activeDeadlineSeconds={limit}"
        self.failure = {"reason": c.DEADLINE_EXCEEDED, "message": message}
        # Stop every active pod whatever the policy; cleanup() handles the rest.
        self.delete([p for p in self.pods if p.active])
        self.finish(False, c.DEADLINE_EXCEEDED, message)
        return True

    def suspend(self) -> None:
        if not c.is_true(self.conds, c.SUSPENDED):
            if self.current:
                self.attempt += 1  # whatever is left of the old gang is now stale
            self.event("Normal", c.SUSPENDED_REASON, "job suspended; deleting its pods")
        message = "job is suspended (spec.runPolicy.suspend); its pods are deleted"
        self.set(c.SUSPENDED, c.TRUE, c.SUSPENDED_REASON, message)
        self.set(c.RUNNING, c.FALSE, c.SUSPENDED_REASON, message)
        self.set_if_present(c.CREATED, c.FALSE, c.SUSPENDED_REASON, message)
        self.set_if_present(c.RESTARTING, c.FALSE, c.SUSPENDED_REASON, message)
        self.set_if_present(c.STALLED, c.FALSE, c.SUSPENDED_REASON, message)
        self.delete(self.pods)
        if self.mechanism == api.GANG_KUEUE and self.gang_obs.kueue_workload is not None:
            # A suspended job gives its quota back; on resume it queues again at the back.
            self.delete_refs.append(gang.ref_of(self.gang_obs.kueue_workload))

    def restart_needed(self) -> bool:
        """Handle a failed, lost or stalled rank; True when the pass is over."""
        current = self.current
        failed = root_cause(current)
        failure: dict[str, Any] | None = None
        cause = c.RANK_FAILED
        if failed is not None:
            failure = _failure_of(failed, self.log_tails)
        else:
            lost = self.lost_rank(current)
            if lost is not None:
                cause = c.POD_LOST
                lost_name = children.pod_name(self.name, lost)
                failure = {
                    "pod": lost_name,
                    "attempt": self.attempt,
                    "nodeRank": lost,
                    "reason": c.POD_LOST,
                    "message": f"pod {lost_name} vanished or is being deleted while the gang ran",
                }
            elif self.spec.run_policy.restart_on_stall and self.stall_confirmed():
                stalled = c.find(self.conds, c.STALLED) or {}
                cause = c.STALL_DETECTED
                failure = {
                    "attempt": self.attempt,
                    "reason": "Stalled",
                    "message": str(stalled.get("message") or "no training step for too long"),
                }
        if failure is None:
            return False
        present = {p.name for p in current}
        candidates = [
            *current,
            *(g for g in self.gone if g.attempt == self.attempt and g.name not in present),
        ]
        disrupted = next((p for p in sorted(candidates, key=_rank_key) if p.disruption), None)
        if disrupted is not None:
            # The cluster took a pod away; the other ranks' errors are its consequence.
            self.disruption_restart(disrupted)
            return True
        self.failure = failure
        what = _describe_failure(failure)
        if not is_retryable(failure.get("exitCode"), self.spec.run_policy.retryable_exit_codes):
            codes = self.spec.run_policy.retryable_exit_codes
            self.finish(
                False,
                c.NON_RETRYABLE_EXIT_CODE,
                f"{what}; exit code {failure.get('exitCode')} is not in retryableExitCodes {codes}",
            )
            return True
        limit = self.spec.run_policy.backoff_limit
        if self.restarts >= limit:
            self.finish(
                False,
                c.BACKOFF_LIMIT_EXCEEDED,
                f"{what}; backoffLimit {limit} reached after {self.restarts} restarts",
            )
            return True
        self.restarts += 1
        self.attempt += 1
        # Whatever the cause, the new gang starts unstalled: a Stalled left over from this
        # incident must not restart the next attempt too (one incident, one restart).
        self.set_if_present(
            c.STALLED, c.FALSE, c.GANG_RESTART, f"gang restarted as attempt {self.attempt}"
        )
        delay = self.restart_backoff.delay(self.restarts)
        self.next_attempt = c.format_time(self.now + timedelta(seconds=delay))
        message = (
            f"{what}; restarting all {self.spec.nodes} pods as attempt {self.attempt} "
            f"(restart {self.restarts}/{limit}) at {self.next_attempt}, after a {delay:g}s backoff"
        )
        self.set(c.RESTARTING, c.TRUE, c.GANG_RESTART, message)
        self.set(c.RUNNING, c.FALSE, cause, message)
        self.set(c.CREATED, c.FALSE, c.GANG_RESTART, message)
        self.event("Warning", c.GANG_RESTART, message)
        self.delete(self.pods)
        return True

    def disruption_restart(self, pod: ObservedPod) -> None:
        """Restart the gang after a preemption or eviction: not a failure of the job.

        Like a batch/v1 Job whose podFailurePolicy ignores DisruptionTarget: no restart is
        counted against backoffLimit, the exit codes do not matter (a SIGTERM'd rank), and
        the new gang is created at once (the scheduler holds it Pending until capacity
        returns). status.gang.preemptions counts these.
        """
        reason = c.PREEMPTED if pod.disruption == PREEMPTION_BY_SCHEDULER else c.EVICTED
        detail = f": {pod.disruption_message}" if pod.disruption_message else ""
        what = (
            f"pod {pod.name} (node rank {pod.node_rank}) was taken away by the cluster "
            f"({pod.disruption}{detail})"
        )
        self.attempt += 1
        self.gang_status["preemptions"] = int(self.gang_status.get("preemptions") or 0) + 1
        self.set_if_present(
            c.STALLED, c.FALSE, c.GANG_RESTART, f"gang restarted as attempt {self.attempt}"
        )
        limit = self.spec.run_policy.backoff_limit
        message = (
            f"{what}; a disruption, not a failure: restarting all {self.spec.nodes} pods as "
            f"attempt {self.attempt}, not counted against backoffLimit "
            f"({self.restarts}/{limit} restarts used)"
        )
        self.set(c.RESTARTING, c.TRUE, reason, message)
        self.set(c.RUNNING, c.FALSE, reason, message)
        self.set(c.CREATED, c.FALSE, reason, message)
        self.event("Warning", reason, message)
        self.delete(self.pods)

    # -- gang admission (gang.py)
    def hold(self, reason: str, message: str, warn: bool = False) -> None:
        """The gang may not run now: no pod of it exists, Running=False says why."""
        old = c.find(self.old_conds, c.RUNNING) or {}
        self.delete(self.pods)
        self.set(c.RUNNING, c.FALSE, reason, message)
        self.set_if_present(c.CREATED, c.FALSE, reason, message)
        if old.get("reason") != reason:
            self.event("Warning" if warn else "Normal", reason, message)

    def gang_admitted(self) -> bool:
        """Whether the gang may have pods now; when not, the status says why it waits."""
        self.gang_status = {
            k: v for k, v in self.gang_status.items() if k in ("preemptions", "mechanism")
        }
        self.gang_status["mechanism"] = self.mechanism
        if self.gang_obs.error and self.mechanism != api.GANG_NONE:
            self.hold(
                c.GANG_SCHEDULING_UNAVAILABLE,
                f"gang scheduling is {self.mechanism} but the operator cannot read the job's "
                f"admission objects ({self.gang_obs.error}); is the API installed and the "
                f"operator allowed to use it (chart: gang.native/gang.kueue.enabled)? No pod "
                "is created until it can",
                warn=True,
            )
            return False
        if self.mechanism == api.GANG_NATIVE:
            if self.gang_obs.native_version is None:
                self.hold(
                    c.GANG_SCHEDULING_UNAVAILABLE,
                    "gang scheduling is Native but the cluster serves no scheduling.k8s.io "
                    "Workload/PodGroup API (kube-apiserver, kube-scheduler and "
                    "kube-controller-manager need --feature-gates=GenericWorkload=true and the "
                    "API needs --runtime-config=scheduling.k8s.io/v1beta1=true); no pod is "
                    "created until it does",
                    warn=True,
                )
                return False
            self.gang_status["workload"] = gang.native_workload_name(self.name)
            return True
        if self.mechanism == api.GANG_KUEUE:
            return self.kueue_admitted()
        return True

    def kueue_admitted(self) -> bool:
        queue = gang.queue_name(self.body)
        st = self.kueue
        wl = self.gang_obs.kueue_workload
        self.gang_status.update(
            {
                "queue": queue,
                "workload": gang.kueue_workload_name(self.body),
                "admitted": st.admitted and not st.evicted,
                "clusterQueue": st.cluster_queue if st.admitted else None,
                "flavors": st.flavors if st.admitted and st.flavors else None,
            }
        )
        if queue is None:
            self.hold(
                c.QUEUE_NAME_MISSING,
                f"gang scheduling is Kueue but the job has no {api.KUEUE_QUEUE_LABEL} label "
                "naming its LocalQueue; no pod is created",
                warn=True,
            )
            return False
        if wl is None:
            pclass = gang.priority_class(self.body)
            if pclass and self.gang_obs.kueue_priority is None:
                self.hold(
                    c.PRIORITY_CLASS_NOT_FOUND,
                    f"the job's {api.KUEUE_PRIORITY_LABEL} label names WorkloadPriorityClass "
                    f"{pclass}, which does not exist; no pod is created",
                    warn=True,
                )
                return False
            refused = self.refused
            if refused is not None and refused.refusal.permanent:
                self.fail_refused(refused, self.current)
                return False
            if refused is not None and refused.retry_at > self.now:
                self.requeue.append((refused.retry_at - self.now).total_seconds())
            else:
                template = builders.build_pod(self.body, 0, self.attempt, self.spec)
                self.ensure.append(
                    gang.build_kueue_workload(
                        self.body, self.spec, template, queue, self.gang_obs.kueue_priority
                    )
                )
            if refused is not None:
                self.hold(refused.refusal.reason, self.refused_message(refused), warn=True)
            else:
                self.hold(c.QUEUED, f"queued in LocalQueue {queue}: creating its Kueue Workload")
            return False
        if self.current and (st.evicted or not st.admitted):
            # The gang loses its admission: whatever is left of it is stale from now on.
            self.attempt += 1
            if st.evicted:
                self.gang_status["preemptions"] = int(self.gang_status.get("preemptions") or 0) + 1
        if st.evicted and (st.quota_reserved or st.admitted):
            reason = c.PREEMPTED if st.evicted_reason == gang.KUEUE_PREEMPTED else c.EVICTED
            message = (
                f"Kueue evicted the job ({st.evicted_reason}: {st.evicted_message}); its pods "
                f"are deleted and it waits in LocalQueue {queue} to be admitted again"
            )
            self.hold(reason, message)
            if not any(p.active for p in self.pods):
                now = c.format_time(self.now)
                self.patches.append((gang.ref_of(wl), gang.release_quota_patch(wl, now)))
            return False
        if not st.admitted:
            old = c.find(self.old_conds, c.RUNNING) or {}
            detail = f": {st.pending_message}" if st.pending_message else ""
            message = f"queued in LocalQueue {queue}, waiting for Kueue to admit it{detail}"
            if old.get("reason") in (c.PREEMPTED, c.EVICTED):
                self.set(c.RUNNING, c.FALSE, str(old["reason"]), message)
                self.delete(self.pods)
                return False
            self.hold(c.QUEUED, message)
            return False
        return True

    def sync_pods_ready(self) -> None:
        """Kueue: report the admitted gang's readiness on its Workload (waitForPodsReady)."""
        wl = self.gang_obs.kueue_workload
        st = self.kueue
        if self.mechanism != api.GANG_KUEUE or wl is None or not st.admitted or st.evicted:
            return
        if st.finished or c.is_finished(self.conds) or self.patches:
            return
        running = c.is_true(self.conds, c.RUNNING)
        patch = gang.pods_ready_patch(wl, running, c.format_time(self.now))
        if patch is not None:
            self.patches.append((gang.ref_of(wl), patch))

    def build_pod(self, rank: int) -> dict[str, Any]:
        """Pod ``rank`` of the current attempt, joined to its gang's admission."""
        pod = builders.build_pod(self.body, rank, self.attempt, self.spec)
        if self.mechanism == api.GANG_NATIVE and self.gang_obs.native_version:
            version = self.gang_obs.native_version
            if not self.ensure:
                self.ensure += [
                    gang.build_native_workload(self.body, self.spec, version),
                    gang.build_pod_group(self.body, self.spec, self.attempt, version),
                ]
                if self.attempt > 0:
                    prev = gang.build_pod_group(self.body, self.spec, self.attempt - 1, version)
                    self.delete_refs.append(gang.ref_of(prev))
            gang.join_pod_group(pod, gang.pod_group_name(self.name, self.attempt))
        elif self.mechanism == api.GANG_KUEUE:
            gang.apply_admission(pod, self.kueue, self.gang_obs.flavors)
        return pod

    def gang_waiting(self, current: Sequence[ObservedPod]) -> tuple[str, str] | None:
        """WaitingForGang once the scheduler has held the whole gang back, with its reason.

        The scheduler's word is the PodGroup's PodGroupInitiallyScheduled=False condition,
        else a member pod's PodScheduled=False; pods just created (no word yet) are only
        PodsPending.
        """
        unbound = [p for p in current if not p.node_name and p.active]
        if not unbound or len(current) < self.spec.nodes:
            return None
        why = gang.pod_group_waiting(self.gang_obs.pod_group)
        detail = why[1] if why else None
        if detail is None:
            detail = next((p.scheduled_message for p in unbound if p.scheduled_reason), None)
            if detail is None:
                return None
        group = gang.pod_group_name(self.name, self.attempt)
        message = (
            f"gang {group} waits for room for all {self.spec.nodes} pods at once "
            f"({len(current) - len(unbound)}/{self.spec.nodes} bound)"
        )
        return c.WAITING_FOR_GANG, f"{message}: {detail}" if detail else message

    def stall_confirmed(self) -> bool:
        """Stalled held for consecutive scrapes of the current attempt (StallConfirmed)."""
        cond = c.find(self.conds, c.STALLED) or {}
        return cond.get("status") == c.TRUE and cond.get("reason") == c.STALL_CONFIRMED

    def lost_rank(self, current: Sequence[ObservedPod]) -> int | None:
        """A pod that vanished (or is being deleted) after the whole gang existed."""
        if self.attempt != self.prev_attempt or not c.is_true(self.conds, c.CREATED):
            return None
        by_rank = {p.node_rank: p for p in current}
        for rank in range(self.spec.nodes):
            pod = by_rank.get(rank)
            if pod is None or (pod.terminating and pod.active):
                return rank
        return None

    # -- retries: the restart backoff and refused creates
    def due_at(self) -> datetime | None:
        """When pods may be created next: a refused create's retry, else the restart backoff."""
        if self.refused is not None and not self.refused.refusal.permanent:
            return self.refused.retry_at
        return c.parse_time(self.next_attempt)

    def retry_pending(self) -> bool:
        due = self.due_at()
        return due is not None and due > self.now

    def refused_message(self, refused: Refused) -> str:
        r = refused.refusal
        code = f" ({r.code})" if r.code is not None else ""
        text = f"creating {refused.target} was refused{code}: {r.message}"
        if r.permanent:
            return text
        return f"{text}; try {refused.tries}, retrying at {c.format_time(refused.retry_at)}"

    def fail_refused(self, refused: Refused, current: Sequence[ObservedPod]) -> None:
        """A permanent refusal: the job fails with its reason, and no part of the gang stays."""
        message = self.refused_message(refused)
        kind, _, name = refused.target.partition(" ")
        self.failure = {
            "reason": refused.refusal.reason,
            "message": _truncate(message, MESSAGE_MAX_CHARS),
            "attempt": self.attempt,
        }
        if kind == "pod":
            self.failure["pod"] = name
        self.delete(current)
        self.set(c.CREATED, c.FALSE, refused.refusal.reason, message)
        self.finish(False, refused.refusal.reason, message)

    def release_partial_gang(self, refused: Refused, current: Sequence[ObservedPod]) -> bool:
        """Delete the pods of a gang still refused after the grace (all or nothing); True
        when it does."""
        live = [p for p in current if not p.terminating]
        if not live or c.is_true(self.old_conds, c.CREATED):
            return False
        left = self.gang_grace_seconds - (self.now - refused.since).total_seconds()
        if left > 0:
            self.requeue.append(left)
            return False
        self.delete(live)
        names = ", ".join(p.name for p in live)
        self.event(
            "Warning",
            c.GANG_RELEASED,
            f"deleting {names}: the rest of the gang was refused for {self.gang_grace_seconds:g}s "
            f"({refused.refusal.reason}); no pod is kept until the whole gang can be created",
        )
        return True

    def converge(self) -> None:
        """Delete stale pods, create missing ones, and report how far the gang is."""
        n = self.spec.nodes
        stale = self.stale
        self.delete(stale)
        current = self.current
        have = {p.node_rank for p in current}
        missing = [r for r in range(n) if r not in have]
        taken = self.names_taken(missing)
        refused = self.refused if missing else None
        if refused is not None and refused.refusal.permanent:
            self.fail_refused(refused, current)
            return
        # Pods of this attempt being deleted (a released gang) go before any is created again.
        released = refused is not None and self.release_partial_gang(refused, current)
        terminating = released or any(p.terminating for p in current)
        due = self.due_at()
        blocked = bool(stale) or terminating or bool(taken)
        if missing and not blocked and due is not None and due > self.now:
            self.requeue.append((due - self.now).total_seconds())
        elif missing and not blocked:
            self.creates = [self.build_pod(r) for r in missing]
            self.start_time = self.start_time or c.format_time(self.now)
            names = ", ".join(children.pod_name(self.name, r) for r in missing)
            self.event("Normal", c.PODS_CREATING, f"creating {names} (attempt {self.attempt})")
            if refused is None:
                self.next_attempt = None
        if refused is not None:
            self.next_attempt = c.format_time(refused.retry_at)

        if len(current) == n:
            self.next_attempt = None
            self.set(
                c.CREATED, c.TRUE, c.PODS_CREATED, f"all {n} pods of attempt {self.attempt} exist"
            )
        elif refused is not None:
            message = self.refused_message(refused)
            old = c.find(self.old_conds, c.CREATED) or {}
            self.set(c.CREATED, c.FALSE, refused.refusal.reason, message)
            self.set(c.RUNNING, c.FALSE, refused.refusal.reason, message)
            if (old.get("reason"), old.get("message")) != (refused.refusal.reason, message):
                self.event("Warning", refused.refusal.reason, message)
            return
        else:
            self.set(
                c.CREATED,
                c.FALSE,
                c.PODS_CREATING,
                f"{len(current)}/{n} pods of attempt {self.attempt} exist",
            )

        running = [p for p in current if p.phase == "Running"]
        done = [p for p in current if p.phase == "Succeeded"]
        restarting = c.is_true(self.conds, c.RESTARTING)
        if running and len(running) + len(done) == n:
            was_running = c.is_true(self.old_conds, c.RUNNING)
            message = f"all {n} ranks running (attempt {self.attempt})"
            self.set(c.RUNNING, c.TRUE, c.ALL_RANKS_RUNNING, message)
            self.set_if_present(c.RESTARTING, c.FALSE, c.ALL_RANKS_RUNNING, message)
            if not was_running:
                self.event("Normal", c.ALL_RANKS_RUNNING, message)
            return

        reason, message = self.waiting_reason(current, running, stale)
        if taken and reason in (c.PODS_PENDING, c.PODS_CREATING, c.WAITING_FOR_OLD_PODS):
            reason, message = c.POD_NAME_TAKEN, self.taken_message(taken)
        if restarting and reason in (c.PODS_PENDING, c.PODS_CREATING):
            reason = c.GANG_RESTART
        old = c.find(self.old_conds, c.RUNNING) or {}
        self.set(c.RUNNING, c.FALSE, reason, message)
        if reason in (
            c.UNSCHEDULABLE,
            c.IMAGE_PULL_FAILED,
            c.CONTAINER_CONFIG_ERROR,
            c.POD_NAME_TAKEN,
        ) and (old.get("reason") != reason):
            self.event("Warning", reason, message)
        elif reason == c.WAITING_FOR_GANG and old.get("reason") != reason:
            self.event("Normal", reason, message)

    def names_taken(self, ranks: Sequence[int]) -> list[ObservedPod]:
        """Pods not this job's that hold the names its missing ranks need."""
        wanted = {children.pod_name(self.name, r) for r in ranks}
        return [p for p in self.foreign if p.name in wanted]

    def taken_message(self, taken: Sequence[ObservedPod]) -> str:
        parts = []
        for p in taken:
            if p.controller_uid:
                whose = f"controlled by another object (uid {p.controller_uid}), e.g. an "
                whose += "earlier job of this name being garbage-collected"
            else:
                whose = "with no controller (orphaned, e.g. by kubectl delete --cascade=orphan)"
            parts.append(f"pod {p.name} exists {whose}")
        return (
            "; ".join(parts)
            + "; this job never adopts pods it did not create and creates its pods once the "
            + "name is free (delete the pod to free it)"
        )

    def waiting_reason(
        self,
        current: Sequence[ObservedPod],
        running: Sequence[ObservedPod],
        stale: Sequence[ObservedPod],
    ) -> tuple[str, str]:
        n = self.spec.nodes
        if self.mechanism == api.GANG_NATIVE:
            waiting = self.gang_waiting(current)
            if waiting is not None:
                return waiting
        for p in current:
            if p.unschedulable:
                return c.UNSCHEDULABLE, f"pod {p.name} is unschedulable: {p.scheduled_message}"
        for p in current:
            if p.waiting_reason in _PULL_ERRORS:
                return c.IMAGE_PULL_FAILED, (
                    f"pod {p.name} cannot pull {self.spec.image}: {p.waiting_reason}: "
                    f"{p.waiting_message or ''}".rstrip(": ")
                )
            if p.waiting_reason in _CONFIG_ERRORS:
                return c.CONTAINER_CONFIG_ERROR, (
                    f"pod {p.name}: {p.waiting_reason}: {p.waiting_message or ''}".rstrip(": ")
                )
        if stale:
            return c.WAITING_FOR_OLD_PODS, (
                f"waiting for {len(stale)} pod(s) of an earlier attempt to terminate"
            )
        terminating = [p for p in current if p.terminating]
        if terminating and len(current) < n:
            return c.WAITING_FOR_OLD_PODS, (
                f"waiting for {len(terminating)} deleted pod(s) to terminate before the gang "
                "is created again"
            )
        due = c.parse_time(self.next_attempt)
        if len(current) < n and due is not None and due > self.now:
            return c.GANG_RESTART, (
                f"restart backoff: the pods of attempt {self.attempt} are created at "
                f"{self.next_attempt}"
            )
        if len(current) < n:
            return c.PODS_CREATING, f"{len(current)}/{n} pods of attempt {self.attempt} exist"
        return c.PODS_PENDING, f"{len(running)}/{n} ranks running (attempt {self.attempt})"

    # -- output
    def gang_block(self) -> dict[str, Any] | None:
        if self.mechanism == api.GANG_NONE and not self.gang_status.get("preemptions"):
            return {"mechanism": api.GANG_NONE}
        out = dict(self.gang_status, mechanism=self.mechanism)
        if self.mechanism == api.GANG_NATIVE and self.gang_obs.native_version:
            out["podGroup"] = gang.pod_group_name(self.name, self.attempt)
        return {k: v for k, v in out.items() if v is not None}

    def status(self) -> dict[str, Any]:
        current = self.current
        # Only schema fields: anything else (e.g. kopf's status.kopf) is pruned by the server.
        status = {k: v for k, v in copy.deepcopy(self.old_status).items() if k in _STATUS_KEYS}
        phase = c.derive_phase(self.conds)
        replicas = {
            "desired": self.spec.nodes,
            "created": len(current),
            "pending": sum(1 for p in current if p.phase not in ("Running", *_TERMINATED_PHASES)),
            "running": sum(1 for p in current if p.phase == "Running"),
            "succeeded": sum(1 for p in current if p.phase == "Succeeded"),
            "failed": sum(1 for p in current if p.phase == "Failed"),
        }
        updates: dict[str, Any] = {
            "observedGeneration": self.generation,
            "conditions": self.conds,
            "phase": phase,
            "attempt": self.attempt,
            "restarts": self.restarts,
            "replicas": replicas,
            "totalGPUs": self.spec.total_gpus,
            "startTime": self.start_time,
            "completionTime": self.completion_time,
            "nextAttemptTime": self.next_attempt if not c.is_finished(self.conds) else None,
            "failure": self.failure,
            "gang": self.gang_block(),
        }
        for key, value in updates.items():
            if value is None:
                status.pop(key, None)
            else:
                status[key] = value
        if phase == c.PHASE_SUCCEEDED and status.get("progress"):
            # Every rank exited 0: the run is complete even if the last scrape came earlier.
            progress = status["progress"]
            progress["percent"] = 100.0
            progress.pop("etaSeconds", None)
            progress.pop("estimatedCompletionTime", None)
            if progress.get("totalSteps"):
                progress["step"] = progress["totalSteps"]
        display = render_display(status)
        if display:
            status["display"] = display
        else:
            status.pop("display", None)
        return status


def invalid_spec(body: Mapping[str, Any], now: datetime, problems: str) -> Plan:
    """The plan for a stored job the model refuses: Failed with InvalidSpec, nothing else.

    Admission refuses such specs today; one can still be stored from before a rule existed
    or under an older CRD. Nothing can be built from it, so no pod is touched (the user
    fixes or deletes the job); the Event is posted once, when the condition first appears.
    """
    status = copy.deepcopy(dict(body.get("status") or {}))
    old = list(status.get("conditions") or [])
    gen = _int_or_none((body.get("metadata") or {}).get("generation"))
    message = (
        f"the stored spec does not pass validation (it was created before a rule existed, or "
        f"under an older CRD): {problems}; fix the spec (kubectl apply shows the same "
        f"refusal) or delete the job"
    )
    conds = c.set_condition(old, c.FAILED, c.TRUE, c.INVALID_SPEC, message, now, gen)
    status["conditions"] = conds
    status["phase"] = c.derive_phase(conds)
    if gen is not None:
        status["observedGeneration"] = gen
    status.setdefault("completionTime", c.format_time(now))
    first = (c.find(old, c.FAILED) or {}).get("reason") != c.INVALID_SPEC
    events = [Event("Warning", c.INVALID_SPEC, message)] if first else []
    return Plan(status=status, events=events)


def plan(
    job: Mapping[str, Any] | api.GPUTrainingJob,
    pods: Sequence[ObservedPod],
    now: datetime,
    *,
    service_exists: bool,
    log_tails: Mapping[str, str] | None = None,
    refused: Refused | None = None,
    restart_backoff: backoff.Policy = RESTART_BACKOFF,
    gang_grace_seconds: float = GANG_GRACE_SECONDS,
    gang_obs: GangObservation | None = None,
    gone: Sequence[ObservedPod] = (),
) -> Plan:
    """Decide what to do for ``job`` given its pods (all attempts) at ``now``.

    ``job`` is the raw object (camelCase dict with metadata name/namespace/uid/generation,
    spec, and the status written last time) or the model. ``pods`` are the summaries
    (:func:`observe_pod`) of every pod labelled ``gpujob.dev/job-name=<job>``.
    ``log_tails`` maps pod names to their logs' last lines, fetched by the shell for
    :func:`root_cause`'s pod; without it the termination message is used.
    ``refused`` is the job's latest refused create, remembered by the shell (None once a
    create succeeded); ``restart_backoff`` spaces gang restarts; ``gang_grace_seconds`` is
    how long an incomplete, refused gang may keep its pods. ``gone`` are the last states of
    pods that Kubernetes marked for disruption (``DisruptionTarget``) and that vanished before
    a pass saw them terminating: the shell remembers them from the pod watch, so a rank that
    exits at once on SIGTERM still reads as preempted or evicted, not lost.
    """
    body: Mapping[str, Any]
    if isinstance(job, api.GPUTrainingJob):
        body = job.model_dump(mode="json", by_alias=True, exclude_none=True)
    else:
        body = job
    try:
        api.parse_spec(body["spec"])
    except ValidationError as e:
        return invalid_spec(body, now, api.spec_problems(e))
    b = _Builder(
        body, pods, now, service_exists, log_tails or {}, refused, restart_backoff,
        gang_grace_seconds, gang_obs, gone,
    )  # fmt: skip
    b.run()
    b.sync_pods_ready()
    return Plan(
        status=b.status(),
        create_service=b.service,
        create_pods=b.creates,
        delete_pods=b.deletes,
        delete_job=b.delete_job,
        events=b.events,
        requeue_after=min(b.requeue) if b.requeue else None,
        ensure_objects=b.ensure,
        delete_objects=b.delete_refs,
        status_patches=b.patches,
    )
