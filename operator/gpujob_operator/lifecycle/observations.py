"""What the planner knows of a job: its pods as observed, and the failure facts read from them.

The I/O shell summarizes each pod of the job with :func:`observe_pod` and what it read of the
gang's admission objects as a :class:`GangObservation`; :func:`root_cause` names the pod
whose failure explains the others (the shell fetches its log tail before planning), and
:func:`failure_of` turns it into ``status.failure``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final

from gpujob_operator import api
from gpujob_operator.api import children
from gpujob_operator.api import conditions as c
from gpujob_operator.api.children import controller_uid
from gpujob_operator.lifecycle import builders
from gpujob_trainer import contract

LOG_TAIL_MAX_CHARS: Final = 4096
MESSAGE_MAX_CHARS: Final = 1024
TERMINATED_PHASES: Final = frozenset({"Succeeded", "Failed"})


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
    lingering: bool = False
    """The trainer has exited but a further container of ``spec.template.containers`` keeps
    the pod running: ``phase`` is the trainer's outcome, and the pod goes at the end."""
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
    uid: str | None = None
    in_place: bool = False
    """The trainer restarts the pod in place (``restartPolicyRules`` RestartAllContainers):
    the run of its attempt ends with a container restart, not with a Failed pod."""
    restarts: int = 0
    """The trainer container's ``restartCount``."""
    restarts_base: int = 0
    """Its ``restartCount`` when the pod joined its attempt (annotation
    :data:`RESTARTS_BASE`): a count above it means the attempt's run ended in place."""
    released: int | None = None
    """The attempt the operator released the pod's supervisor for (in-place restarts)."""
    restarting_all: bool = False
    """Condition AllContainersRestarting is True: the kubelet is restarting the pod now."""
    terminal: bool = False
    """The pod itself is Succeeded or Failed (``phase`` may say Failed of a pod that lives
    on: its attempt's run ended in place)."""
    hold: bool = False
    """Created during an in-place restart: its first run waits for the release too."""
    requested: bool = False
    """It restarted in place because its supervisor was asked to (exit 87): no failure."""

    @property
    def ended_in_place(self) -> bool:
        """The run of the pod's attempt ended and the pod restarts (or restarted) in place."""
        return self.in_place and self.restarts > self.restarts_base

    @property
    def at_barrier(self) -> bool:
        """An in-place pod moved to its attempt whose run has not been released yet: its old
        run is being stopped, or its supervisor waits for the whole gang to restart."""
        return (
            self.in_place
            and (self.restarts_base > 0 or self.hold)
            and self.released != self.attempt
        )

    @property
    def unschedulable(self) -> bool:
        """The scheduler could not place it (e.g. not enough nvidia.com/gpu)."""
        return self.scheduled_reason == c.UNSCHEDULABLE

    @property
    def active(self) -> bool:
        """Not yet terminated (Pending, Running or Unknown), or lingering: still on its
        node, holding its GPUs, though its trainer has exited. An in-place pod is active until
        the pod itself ends (its attempt's run may have ended while it restarts)."""
        if self.in_place:
            return self.lingering or not self.terminal
        return self.lingering or self.phase not in TERMINATED_PHASES


def int_or_none(value: Any) -> int | None:
    """``value`` as an int (a label, a generation), None when it is not one."""
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


RESTARTS_BASE: Final = contract.ANNOTATION_RESTARTS_BASE
"""Pod annotation: the trainer's ``restartCount`` when the pod joined its current attempt in
place (absent: 0, the pod was created for it)."""
ALL_CONTAINERS_RESTARTING: Final = "AllContainersRestarting"
"""The pod condition the kubelet holds True while it restarts every container in place."""
RESTART_ALL: Final = "RestartAllContainers"
_NOT_RESTARTED: Final = frozenset({None, 0, contract.PREFLIGHT_EXIT_CODE})
"""Trainer exits the in-place restart rule leaves alone: the pod ends (or lingers) instead."""


def restarts_in_place(pod: Mapping[str, Any]) -> bool:
    """Whether the pod's trainer container restarts the whole pod in place on a failure."""
    for ctr in (pod.get("spec") or {}).get("containers") or ():
        if ctr.get("name") == builders.CONTAINER_NAME:
            return any(r.get("action") == RESTART_ALL for r in ctr.get("restartPolicyRules") or ())
    return False


DISRUPTION_TARGET: Final = "DisruptionTarget"
"""The pod condition Kubernetes sets before it takes a pod away (scheduler preemption, an
eviction by `kubectl drain`, the taint manager, the kubelet under node pressure, pod GC)."""
PREEMPTION_BY_SCHEDULER: Final = "PreemptionByScheduler"


def _has_helpers(pod: Mapping[str, Any]) -> bool:
    """Regular containers beside the trainer (native sidecars are stopped by the kubelet)."""
    return len((pod.get("spec") or {}).get("containers") or ()) > 1


_KEPT_METADATA: Final = ("name", "namespace", "uid", "deletionTimestamp", "creationTimestamp")
_KEPT_ANNOTATIONS: Final = (
    RESTARTS_BASE,
    contract.ANNOTATION_RELEASED,
    contract.ANNOTATION_HOLD,
)
_KEPT_SPEC: Final = ("nodeName", "hostNetwork")


def shows_patch(projected: Mapping[str, Any], patch: Mapping[str, Any]) -> bool:
    """Whether a projected pod carries a metadata merge patch, as far as the projection keeps
    the patch's keys (the operator's own labels and annotations; a null deletes the key)."""
    meta = patch.get("metadata") or {}
    have = projected.get("metadata") or {}
    for kind, kept in (("labels", _kept_label), ("annotations", _kept_annotation)):
        mine = have.get(kind) or {}
        for k, v in (meta.get(kind) or {}).items():
            if kept(k) and mine.get(k) != v:
                return False
    return True


def _kept_label(key: str) -> bool:
    return str(key).startswith(children.LABEL_PREFIX)


def _kept_annotation(key: str) -> bool:
    return key in _KEPT_ANNOTATIONS


def project_pod(pod: Mapping[str, Any]) -> dict[str, Any]:
    """What the operator reads of one of its pods, in dicts of its own (never the body's).

    The pod index keeps this instead of the body: a job's pods repeat its template, and at
    2,048 pods a 400 KB template would be most of a gigabyte. Kept: the names, the uid, the
    controller reference, the operator's labels and annotations, where the pod runs, each
    container's name, ports and restart rules, and the status (which the kubelet bounds).
    :func:`observe_pod`, ``monitor.scrape_targets`` and ``monitor.exited_ranks`` read the same
    from a projection as from the body (tests hold them to it).
    """
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    labels = meta.get("labels") or {}
    annotations = meta.get("annotations") or {}
    out_meta: dict[str, Any] = {k: meta[k] for k in _KEPT_METADATA if k in meta}
    out_meta["labels"] = {k: v for k, v in labels.items() if _kept_label(k)}
    kept = {k: annotations[k] for k in _KEPT_ANNOTATIONS if k in annotations}
    if kept:
        out_meta["annotations"] = kept
    owners = [
        {k: ref.get(k) for k in ("apiVersion", "kind", "name", "uid", "controller")}
        for ref in meta.get("ownerReferences") or ()
        if isinstance(ref, Mapping) and ref.get("controller")
    ]
    if owners:
        out_meta["ownerReferences"] = owners
    out_spec: dict[str, Any] = {k: spec[k] for k in _KEPT_SPEC if k in spec}
    out_spec["containers"] = [
        {
            "name": ctr.get("name"),
            **(
                {"ports": [
                    {"name": p.get("name"), "containerPort": p.get("containerPort")}
                    for p in ctr.get("ports") or () if isinstance(p, Mapping)
                ]}
                if ctr.get("ports")
                else {}
            ),
            **(
                {"restartPolicyRules": list(ctr["restartPolicyRules"])}
                if ctr.get("restartPolicyRules")
                else {}
            ),
        }
        for ctr in spec.get("containers") or ()
        if isinstance(ctr, Mapping)
    ]  # fmt: skip
    return {"metadata": out_meta, "spec": out_spec, "status": pod.get("status") or {}}


def observe_pod(pod: Mapping[str, Any]) -> ObservedPod:
    """Summarize a pod as the API returns it (raw camelCase JSON, e.g. kopf's body)."""
    meta = pod.get("metadata") or {}
    labels = meta.get("labels") or {}
    status = pod.get("status") or {}
    name = str(meta.get("name", ""))
    node_rank = int_or_none(labels.get(children.LABEL_NODE_RANK))
    if node_rank is None and "-node-" in name:
        node_rank = int_or_none(name.rsplit("-node-", 1)[1])
    attempt = int_or_none(labels.get(children.LABEL_ATTEMPT)) or 0

    statuses = list(status.get("containerStatuses") or [])
    main = next((s for s in statuses if s.get("name") == builders.CONTAINER_NAME), None)
    if main is None and statuses:
        main = statuses[0]
    in_place = restarts_in_place(pod)
    annotations = meta.get("annotations") or {}
    restarts = int_or_none((main or {}).get("restartCount")) or 0
    base = int_or_none(annotations.get(RESTARTS_BASE)) or 0
    if (
        in_place
        and main is not None
        and restarts > base
        and (main.get("lastState") or {}).get("terminated")
    ):
        # The attempt's run ended in place: its outcome is the last termination.
        main = {**main, "state": {"terminated": main["lastState"]["terminated"]}}
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
            exit_code = int_or_none(term.get("exitCode"))
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
    restarting_all = False
    for cond in status.get("conditions") or []:
        if cond.get("type") == ALL_CONTAINERS_RESTARTING and cond.get("status") == "True":
            restarting_all = True
        if cond.get("type") == "PodScheduled" and cond.get("status") != "True":
            sched_reason = cond.get("reason")
            sched_message = cond.get("message")
        elif cond.get("type") == DISRUPTION_TARGET and cond.get("status") == "True":
            disruption = str(cond.get("reason") or DISRUPTION_TARGET)
            disruption_message = cond.get("message")
    phase = str(status.get("phase") or "Pending")
    terminal = phase in TERMINATED_PHASES
    released = int_or_none(annotations.get(contract.ANNOTATION_RELEASED))
    hold = annotations.get(contract.ANNOTATION_HOLD) == "true"
    requested = False
    if in_place and not terminal:
        restarted = exit_code not in _NOT_RESTARTED and container == builders.CONTAINER_NAME
        if (restarts > base or (restarts == base and restarted)) and (
            exit_code == contract.RESTART_EXIT_CODE
        ):
            requested = True  # the supervisor's own restart, which the operator asked for
            phase = "Pending"
        elif restarts > base or (restarts == base and restarted):
            phase = "Failed"  # the run ended; the pod lives on and restarts in place
        elif (base > 0 or hold) and released != attempt:
            phase = "Pending"  # the old run is stopped, or the supervisor waits to be released
    lingering = False
    trainer_done = (main or {}).get("name") == builders.CONTAINER_NAME and (
        (main or {}).get("state") or {}
    ).get("terminated")
    if (
        trainer_done
        and (not in_place or int_or_none(trainer_done.get("exitCode")) in _NOT_RESTARTED)
        and _has_helpers(pod)
        and not meta.get("deletionTimestamp")
        and not disruption
        and not status.get("reason")
    ):
        # With helper containers the trainer's exit is the rank's outcome: under
        # restartPolicy Never a helper would keep the pod Running after it (hiding a crash
        # and the job's end), and a helper's own failure would fail a rank that trained.
        # Not for a pod being deleted, disrupted or evicted: that is a lost rank.
        lingering = phase not in TERMINATED_PHASES
        phase = "Succeeded" if int_or_none(trainer_done.get("exitCode")) == 0 else "Failed"
    return ObservedPod(
        name=name,
        node_rank=node_rank,
        attempt=attempt,
        phase=phase,
        lingering=lingering,
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
        uid=meta.get("uid"),
        in_place=in_place,
        restarts=restarts,
        restarts_base=base,
        released=released,
        restarting_all=restarting_all,
        terminal=terminal,
        hold=hold,
        requested=requested,
    )


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


def rank_key(pod: ObservedPod) -> int:
    """Sort key: by node rank, pods without one last."""
    return pod.node_rank if pod.node_rank is not None else 1 << 30


def root_cause(pods: Sequence[ObservedPod]) -> ObservedPod | None:
    """The failed pod that failed first (then lowest rank): the others usually died of it.

    When one rank dies its peers fail in the collective a little later, so the earliest
    ``finishedAt`` names the culprit. The I/O shell calls this before planning
    (:func:`~gpujob_operator.lifecycle.planner.plan`) to know which pod's log tail to fetch.
    """
    failed = [p for p in pods if p.phase == "Failed"]
    if not failed:
        return None
    far = datetime.max.replace(tzinfo=UTC)
    return min(
        failed,
        key=lambda p: (p.finished_at or far, rank_key(p)),
    )


def truncate(text: str | None, limit: int, tail: bool = False) -> str | None:
    """``text`` cut to ``limit`` characters: its head with "...", or its tail."""
    if text is None:
        return None
    if len(text) <= limit:
        return text
    return text[-limit:] if tail else text[: limit - 3] + "..."


def failure_of(pod: ObservedPod, log_tails: Mapping[str, str]) -> dict[str, Any]:
    """``status.failure`` for a failed pod: what exited how, with its log's last lines."""
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
        "message": truncate(message, MESSAGE_MAX_CHARS),
        "logTail": truncate(log_tail, LOG_TAIL_MAX_CHARS, tail=True),
        "time": c.format_time(pod.finished_at) if pod.finished_at else None,
    }
    return {k: v for k, v in out.items() if v is not None}


def describe_failure(failure: Mapping[str, Any]) -> str:
    """One line naming who failed how, from a ``status.failure``."""
    code = failure.get("exitCode")
    what = (
        f"exit code {code} ({failure.get('reason')})" if code is not None else failure.get("reason")
    )
    who = failure.get("pod") or "the job"
    rank = failure.get("nodeRank")
    where = f"{who} (node rank {rank})" if rank is not None else who
    return f"{where} failed: {what}"
