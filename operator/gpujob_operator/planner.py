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
  restart. Beyond ``backoffLimit`` the job fails (BackoffLimitExceeded); a root-cause exit
  code outside ``retryableExitCodes`` (when set) fails it at once (NonRetryableExitCode).
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
from datetime import UTC, datetime
from typing import Any, Final, Literal

from gpujob_operator import api, builders
from gpujob_operator import conditions as c
from gpujob_operator.display import render_display

LOG_TAIL_MAX_CHARS: Final = 4096
MESSAGE_MAX_CHARS: Final = 1024

EventType = Literal["Normal", "Warning"]
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


def observe_pod(pod: Mapping[str, Any]) -> ObservedPod:
    """Summarize a pod as the API returns it (raw camelCase JSON, e.g. kopf's body)."""
    meta = pod.get("metadata") or {}
    labels = meta.get("labels") or {}
    status = pod.get("status") or {}
    name = str(meta.get("name", ""))
    node_rank = _int_or_none(labels.get(builders.LABEL_NODE_RANK))
    if node_rank is None and "-node-" in name:
        node_rank = _int_or_none(name.rsplit("-node-", 1)[1])
    attempt = _int_or_none(labels.get(builders.LABEL_ATTEMPT)) or 0

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

    sched_reason = sched_message = None
    for cond in status.get("conditions") or []:
        if cond.get("type") == "PodScheduled" and cond.get("status") != "True":
            sched_reason = cond.get("reason")
            sched_message = cond.get("message")
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
    )


# ---- plan ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Event:
    """A Kubernetes Event to emit on the job."""

    type: EventType
    reason: str
    message: str


@dataclass(frozen=True)
class Plan:
    """Actions for the I/O shell; apply status, then deletes, then creates.

    ``status`` is the complete new status (camelCase, JSON-ready); fields owned by others
    (progress, bottleneck, gpus, Stalled/MetricsAvailable/BottleneckDetected conditions)
    are carried over from the input. Use :func:`merge_patch` to patch only what changed.
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
        key=lambda p: (p.finished_at or far, p.node_rank if p.node_rank is not None else 1 << 30),
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


class _Builder:
    """Mutable scratchpad for one planning pass; :func:`plan` is its pure wrapper."""

    def __init__(
        self,
        body: Mapping[str, Any],
        pods: Sequence[ObservedPod],
        now: datetime,
        service_exists: bool,
        log_tails: Mapping[str, str],
    ) -> None:
        self.body = body
        self.now = now
        self.name, self.namespace, _ = builders.job_meta(body)
        self.spec = api.parse_spec(body["spec"])
        self.generation = _int_or_none((body.get("metadata") or {}).get("generation"))
        self.old_status: dict[str, Any] = copy.deepcopy(dict(body.get("status") or {}))
        self.old_conds: list[dict[str, Any]] = list(self.old_status.get("conditions") or [])
        self.conds: list[dict[str, Any]] = [dict(x) for x in self.old_conds]
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
        self.ttl()

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
        if not self.service_exists:
            self.service = builders.build_service(self.body, self.spec)
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
        self.delete(self.pods)

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
                lost_name = builders.pod_name(self.name, lost)
                failure = {
                    "pod": lost_name,
                    "attempt": self.attempt,
                    "nodeRank": lost,
                    "reason": c.POD_LOST,
                    "message": f"pod {lost_name} vanished or is being deleted while the gang ran",
                }
            elif self.spec.run_policy.restart_on_stall and c.is_true(self.conds, c.STALLED):
                stalled = c.find(self.conds, c.STALLED) or {}
                cause = c.STALL_DETECTED
                failure = {
                    "attempt": self.attempt,
                    "reason": "Stalled",
                    "message": str(stalled.get("message") or "no training step for too long"),
                }
                self.set(c.STALLED, c.FALSE, c.GANG_RESTART, "gang restarted after a stall")
        if failure is None:
            return False
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
        message = (
            f"{what}; restarting all {self.spec.nodes} pods as attempt {self.attempt} "
            f"(restart {self.restarts}/{limit})"
        )
        self.set(c.RESTARTING, c.TRUE, c.GANG_RESTART, message)
        self.set(c.RUNNING, c.FALSE, cause, message)
        self.set(c.CREATED, c.FALSE, c.GANG_RESTART, message)
        self.event("Warning", c.GANG_RESTART, message)
        self.delete(self.pods)
        return True

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

    def converge(self) -> None:
        """Delete stale pods, create missing ones, and report how far the gang is."""
        n = self.spec.nodes
        stale = self.stale
        self.delete(stale)
        current = self.current
        have = {p.node_rank for p in current}
        missing = [r for r in range(n) if r not in have]
        if missing and not stale:
            self.creates = [
                builders.build_pod(self.body, r, self.attempt, self.spec) for r in missing
            ]
            self.start_time = self.start_time or c.format_time(self.now)
            names = ", ".join(builders.pod_name(self.name, r) for r in missing)
            self.event("Normal", c.PODS_CREATING, f"creating {names} (attempt {self.attempt})")

        if len(current) == n:
            self.set(
                c.CREATED, c.TRUE, c.PODS_CREATED, f"all {n} pods of attempt {self.attempt} exist"
            )
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
        if restarting and reason in (c.PODS_PENDING, c.PODS_CREATING):
            reason = c.GANG_RESTART
        old = c.find(self.old_conds, c.RUNNING) or {}
        self.set(c.RUNNING, c.FALSE, reason, message)
        if reason in (c.UNSCHEDULABLE, c.IMAGE_PULL_FAILED, c.CONTAINER_CONFIG_ERROR) and (
            old.get("reason") != reason
        ):
            self.event("Warning", reason, message)

    def waiting_reason(
        self,
        current: Sequence[ObservedPod],
        running: Sequence[ObservedPod],
        stale: Sequence[ObservedPod],
    ) -> tuple[str, str]:
        n = self.spec.nodes
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
        if len(current) < n:
            return c.PODS_CREATING, f"{len(current)}/{n} pods of attempt {self.attempt} exist"
        return c.PODS_PENDING, f"{len(running)}/{n} ranks running (attempt {self.attempt})"

    # -- output
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
            "failure": self.failure,
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


def plan(
    job: Mapping[str, Any] | api.GPUTrainingJob,
    pods: Sequence[ObservedPod],
    now: datetime,
    *,
    service_exists: bool,
    log_tails: Mapping[str, str] | None = None,
) -> Plan:
    """Decide what to do for ``job`` given its pods (all attempts) at ``now``.

    ``job`` is the raw object (camelCase dict with metadata name/namespace/uid/generation,
    spec, and the status written last time) or the model. ``pods`` are the summaries
    (:func:`observe_pod`) of every pod labelled ``gpujob.dev/job-name=<job>``.
    ``log_tails`` maps pod names to their logs' last lines, fetched by the shell for
    :func:`root_cause`'s pod; without it the termination message is used.
    """
    body: Mapping[str, Any]
    if isinstance(job, api.GPUTrainingJob):
        body = job.model_dump(mode="json", by_alias=True, exclude_none=True)
    else:
        body = job
    b = _Builder(body, pods, now, service_exists, log_tails or {})
    b.run()
    return Plan(
        status=b.status(),
        create_service=b.service,
        create_pods=b.creates,
        delete_pods=b.deletes,
        delete_job=b.delete_job,
        events=b.events,
        requeue_after=min(b.requeue) if b.requeue else None,
    )


def merge_patch(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    """RFC 7386 merge patch turning ``old`` into ``new`` (nulls delete; lists replace)."""
    patch: dict[str, Any] = {}
    for key in old:
        if key not in new:
            patch[key] = None
    for key, value in new.items():
        before = old.get(key)
        if isinstance(value, Mapping) and isinstance(before, Mapping):
            sub = merge_patch(before, value)
            if sub:
                patch[key] = sub
        elif key not in old or before != value:
            patch[key] = copy.deepcopy(value)
    return patch
