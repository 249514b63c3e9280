"""One planning pass: its state, the small helpers that record a decision, and the status.

:class:`PlanningPass` is the mutable scratchpad of one call of
:func:`~gpujob_operator.lifecycle.planner.plan`: what it read (the job, its pods, the shell's
observations), what it has decided so far (conditions, Events, pods to create and delete,
gang objects, requeue times), and at the end the complete new status it renders. The
policies (:mod:`.terminal`, :mod:`.restarts`, :mod:`.admission`, :mod:`.retries`,
:mod:`.converge`) are functions taking the pass as ``pp``; the decision chain that calls them
is :func:`~gpujob_operator.lifecycle.planner.run`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any, Final

from gpujob_operator import api
from gpujob_operator.api import children
from gpujob_operator.api import conditions as c
from gpujob_operator.api.conditions import parse_time
from gpujob_operator.api.display import render_display
from gpujob_operator.api.events import Event, EventType
from gpujob_operator.api.jsoncopy import json_copy
from gpujob_operator.api.status import furthest_step
from gpujob_operator.api.statusupgrade import upgrade, without_nulls
from gpujob_operator.lifecycle import backoff, blame, goodput
from gpujob_operator.lifecycle.apiserver.refusals import (
    Refused,
    backoff_record,
    denial_record,
    resume,
)
from gpujob_operator.lifecycle.gang import gang
from gpujob_operator.lifecycle.observations import (
    TERMINATED_PHASES,
    GangObservation,
    ObservedPod,
    int_or_none,
)

_STATUS_KEYS: Final = frozenset(
    f.alias or name for name, f in api.GPUTrainingJobStatus.model_fields.items()
)


MAX_NO_PROGRESS_LISTED: Final = 64
"""Attempts kept in status.operatorState.attemptsWithoutProgress (the CRD's maxItems)."""

VERDICT_CONDITIONS: Final = (c.STALLED, c.BOTTLENECK_DETECTED)
"""The analyzer's conditions about one attempt (MetricsAvailable is about the scrapes)."""


def retired(
    conds: Sequence[Mapping[str, Any]],
    reason: str,
    message: str,
    now: datetime,
    generation: int | None,
) -> list[dict[str, Any]]:
    """`conds` with every verdict condition False for `reason`; one already so is left as
    it is, so its message and time do not churn on every pass."""
    out = [dict(x) for x in conds]
    for type_ in VERDICT_CONDITIONS:
        cond = c.find(out, type_)
        if cond is not None and (cond.get("status"), cond.get("reason")) != (c.FALSE, reason):
            out = c.set_condition(out, type_, c.FALSE, reason, message, now, generation)
    return out


_OURS: Final = frozenset({"goodput", "display", "operatorState"})
"""The accounting's own keys (display and the bookkeeping are rendered after it, and compared
apart): the ledger is written when due, or with anything else."""

_GANG_OWN: Final = (
    "attempt",
    "restarts",
    "nextAttemptTime",
    "replicas",
    "avoidedNodes",
    "restartStrategy",
    "inPlaceRestarts",
)
"""``status.gang``'s keys the planner writes whole on every pass."""

_GANG_CARRIED: Final = ("gpus", "startForecast")
"""``status.gang``'s keys others write (the metrics task, the forecaster): carried over."""

_NO_RETRIES = (c.PHASE_SUCCEEDED, c.PHASE_FAILED, c.PHASE_SUSPENDED)
"""Phases that drop the refusal records (operatorState's createBackoff and admissionDenial):
a job that resumes, or is created again, starts its retries and its webhook window afresh."""


class PlanningPass:
    """Mutable scratchpad for one planning pass; ``planner.plan`` is its pure wrapper."""

    def __init__(
        self,
        body: Mapping[str, Any],
        pods: Sequence[ObservedPod],
        now: datetime,
        service_exists: bool,
        log_tails: Mapping[str, str],
        refused: Refused | None,
        restart_backoff: backoff.Policy,
        gang_grace_seconds: float,
        gang_obs: GangObservation | None,
        gone: Sequence[ObservedPod],
        resume_backoff: bool = True,
        nodes: blame.NodeView | None = None,
    ) -> None:
        self.body = body
        self.now = now
        self.name, self.namespace, _ = children.job_meta(body)
        self.spec = api.parse_spec(body["spec"])
        self.generation = int_or_none((body.get("metadata") or {}).get("generation"))
        # A status of the previous shape is read in this one's (its old fields as tombstones).
        self.old_status: dict[str, Any] = upgrade(body.get("status"))
        self.old_state: dict[str, Any] = dict(self.old_status.get("operatorState") or {})
        """``status.operatorState``: the operator's bookkeeping of the last pass."""
        old_gang: dict[str, Any] = dict(self.old_status.get("gang") or {})
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
        prev = api.parse_status(self.old_status).gang or api.GangStatus()
        self.prev_attempt = prev.attempt or 0
        self.attempt = max([self.prev_attempt, *(p.attempt for p in pods)])
        self.restarts = prev.restarts or 0
        self.start_time = self.old_status.get("startTime")
        self.completion_time = self.old_status.get("completionTime")
        self.failure: dict[str, Any] | None = self.old_status.get("failure")
        self.events: list[Event] = []
        self.deletes: list[str] = []
        self.creates: list[dict[str, Any]] = []
        self.more_pods = 0
        """Missing pods beyond ``creates`` (a batch): ``build_more`` builds them."""
        self.more_ranks: tuple[int, ...] = ()
        self.build_more: Callable[[int], dict[str, Any]] | None = None
        self.delete_job = False
        self.requeue: list[float] = []
        self.service: dict[str, Any] | None = None
        if refused is None and resume_backoff:
            # A shell that has not tried a create yet (an operator restart) goes on with the
            # backoff and the grace of the refusal in the status, not with an immediate try.
            refused = resume(self.old_state.get("createBackoff"))
        self.refused = refused
        """The refusal being retried; set to None once what it refused exists."""
        self.denial = denial_record(self.old_state.get("admissionDenial"), refused)
        """``operatorState.admissionDenial``: since when a webhook denies (None: none)."""
        self.restart_backoff = restart_backoff
        self.gang_grace_seconds = gang_grace_seconds
        self.next_attempt: str | None = old_gang.get("nextAttemptTime")
        self.gang_obs = gang_obs or GangObservation()
        self.mechanism = gang.mechanism(body, self.spec, self.gang_obs.default)
        self.kueue = gang.kueue_state(self.gang_obs.kueue_workload)
        self.ensure: list[dict[str, Any]] = []
        self.delete_refs: list[gang.ObjectRef] = []
        self.patches: list[tuple[gang.ObjectRef, dict[str, Any]]] = []
        self.pod_patches: list[tuple[str, str | None, dict[str, Any]]] = []
        """Pods an in-place restart moves to the next attempt, or releases (:mod:`.inplace`)."""
        self.in_place_run: dict[str, Any] | None = self.old_state.get("inPlace")
        """The in-place restart under way (``operatorState.inPlace``)."""
        self.in_place_unsupported: str | None = self.old_state.get("inPlaceUnsupported")
        self.strategy: dict[str, Any] | None = old_gang.get("restartStrategy")
        """``status.gang.restartStrategy``: how the current attempt's pods restart, and why."""
        self.in_place_restarts = int(old_gang.get("inPlaceRestarts") or 0)
        self.gang_carried = {k: old_gang[k] for k in _GANG_CARRIED if old_gang.get(k) is not None}
        """``status.gang``'s parts written by others, carried over."""
        self.gang_status: dict[str, Any] = {
            k: v for k, v in old_gang.items() if k not in (*_GANG_OWN, *_GANG_CARRIED)
        }
        """``status.gang``'s admission part: the mechanism and what admission reported."""
        self.no_progress: list[int] = [
            int(a) for a in self.old_state.get("attemptsWithoutProgress") or []
        ]
        """The consecutive failed attempts that never passed the furthest step before them."""
        self.nodes = nodes
        """The cluster's nodes, read by the shell while a new attempt's pods avoid some."""
        self.suspects: list[dict[str, Any]] = blame.suspects(
            self.old_status, self.prev_attempt, now
        )
        """Nodes the running attempt's published verdicts named (``operatorState``)."""
        self.avoided: list[dict[str, Any]] = blame.active(
            [a for a in old_gang.get("avoidedNodes") or [] if isinstance(a, Mapping)],
            now,
        )
        """``status.gang.avoidedNodes`` not yet expired (:mod:`.blame`)."""
        self._placement: blame.Placement | None = None
        self._placed = False

    # -- small helpers
    def set(self, type_: str, status: c.ConditionStatus, reason: str, message: str) -> None:
        """Set a condition of the job (its time moves only when its status does)."""
        self.conds = c.set_condition(
            self.conds, type_, status, reason, message, self.now, self.generation
        )

    def gang_exists(self) -> None:
        """Every pod of the attempt exists: Created is True and no create is retried. Said
        wherever the pass sees the whole gang, also by a pass that ends the job, so a gang
        that ran and exited between two passes is never left reading PodsCreating."""
        self.next_attempt = None
        self.denial = None  # every create went through: no denial is being retried any more
        self.refused = None  # nor any refusal (one resumed from the status, after a restart)
        n = self.spec.nodes
        self.set(c.CREATED, c.TRUE, c.PODS_CREATED, f"all {n} pods of attempt {self.attempt} exist")

    def set_if_present(
        self, type_: str, status: c.ConditionStatus, reason: str, message: str
    ) -> None:
        """Set a condition only if the job already has one of that type."""
        if c.find(self.conds, type_) is not None:
            self.set(type_, status, reason, message)

    def event(self, type_: EventType, reason: str, message: str) -> None:
        self.events.append(Event(type_, reason, message))

    def delete(self, pods: Sequence[ObservedPod]) -> None:
        """Ask for these pods' deletion: once each, and not while already terminating."""
        for p in pods:
            if not p.terminating and p.name not in self.deletes:
                self.deletes.append(p.name)

    @property
    def current(self) -> list[ObservedPod]:
        """The pods of the current attempt with a rank of the gang."""
        n = self.spec.nodes
        return [
            p
            for p in self.pods
            if p.attempt == self.attempt and p.node_rank is not None and 0 <= p.node_rank < n
        ]

    @property
    def stale(self) -> list[ObservedPod]:
        """Every other pod of the job: an earlier attempt's, or one without a rank of the gang."""
        current = {p.name for p in self.current}
        return [p for p in self.pods if p.name not in current or p.attempt != self.attempt]

    def place(self, pod: dict[str, Any]) -> dict[str, Any]:
        """``pod`` kept off the blamed nodes the gang can spare (decided once per pass, with
        the first pod built), and condition NodesAvoided saying where it stands."""
        if not self._placed:
            self._placed = True
            avoided = self.avoided if self.spec.run_policy.avoid_blamed_nodes else []
            self._placement = blame.placement(
                avoided, pod, self.spec.nodes, self.nodes, self.attempt
            )
            p = self._placement
            if p is None:
                self.set_if_present(
                    c.NODES_AVOIDED, c.FALSE, c.NO_BLAMED_NODES,
                    f"attempt {self.attempt} has no blamed node to avoid",
                )  # fmt: skip
            else:
                old = c.find(self.conds, c.NODES_AVOIDED) or {}
                if p.status == c.FALSE and (old.get("status"), old.get("reason")) != (
                    p.status,
                    p.reason,
                ):
                    self.event("Warning", p.reason, p.message)
                self.set(c.NODES_AVOIDED, p.status, p.reason, p.message)
        if self._placement is None:
            return pod
        return blame.exclude(pod, self._placement.excluded)

    # -- the present attempt's verdicts
    def verdicts_end(self) -> str | None:
        """Why the analyzer's verdicts (Stalled, BottleneckDetected, ``status.bottleneck``) no
        longer describe a running attempt, or None while they do.

        They are judged on one attempt's scrapes; once it ended (restart, eviction, a deleted
        Workload, suspension, the end of the job) nothing judges them again, so left as they
        are they would page on-call for a gang that no longer runs.
        """
        if c.is_true(self.conds, c.SUCCEEDED):
            return c.JOB_SUCCEEDED
        if c.is_true(self.conds, c.FAILED):
            return c.JOB_FAILED
        if c.is_true(self.conds, c.SUSPENDED):
            return c.SUSPENDED_REASON
        if self.attempt != self.prev_attempt or c.is_true(self.conds, c.RESTARTING):
            return c.GANG_RESTART
        return None

    def retire_verdicts(self) -> bool:
        """Set Stalled and BottleneckDetected False when their attempt is over; True if it is.

        One place for every way an attempt ends, so no path can leave a stale verdict.
        """
        reason = self.verdicts_end()
        if reason is None:
            return False
        what = {
            c.JOB_SUCCEEDED: "the job succeeded",
            c.JOB_FAILED: "the job failed",
            c.SUSPENDED_REASON: "the job is suspended",
        }.get(reason, f"gang restarted as attempt {self.attempt}")
        message = f"{what}; the verdict was about attempt {self.prev_attempt}"
        self.conds = retired(self.conds, reason, message, self.now, self.generation)
        return True

    # -- progress across attempts
    def attempt_baseline(self) -> int | None:
        """``operatorState.furthestStepAtAttemptStart``: the furthest step when this attempt
        began (taken when the attempt number moves on; an older status without one: None)."""
        if self.attempt != self.prev_attempt:
            return furthest_step(self.old_status)
        old = self.old_state.get("furthestStepAtAttemptStart")
        return int(old) if isinstance(old, int) else None

    def pause_eta(self, progress: dict[str, Any], state: dict[str, Any]) -> None:
        """No ETA while no attempt runs (a gang restart, suspension, failure): the old attempt's
        would count down a run that is not happening. The step and the furthest step stay;
        the rate's basis and the resume point belonged to the attempt that ended."""
        reason = self.verdicts_end()
        if reason in (None, c.JOB_SUCCEEDED):
            return
        why = {
            c.JOB_FAILED: "failed: the job failed",
            c.SUSPENDED_REASON: "suspended: the ETA returns after the job resumes",
        }.get(
            reason,
            f"restarting: the gang restarts as attempt {self.attempt}; the ETA returns after "
            "its first steps",
        )
        for key in ("etaSeconds", "estimatedCompletionTime"):
            progress.pop(key, None)
        if reason != c.JOB_FAILED:
            state.pop("rateSince", None)
            progress.pop("resumedFromStep", None)
        furthest = furthest_step({"progress": progress})
        if furthest is not None:
            progress["furthestStep"] = furthest
        progress["etaUnavailable"] = why

    # -- output
    def gang_block(self, replicas: dict[str, int]) -> dict[str, Any]:
        """``status.gang``: the attempt, restarts, pods and GPUs, and the admission part (the
        mechanism in effect and what admission reported); others' parts carried over."""
        if self.mechanism == api.GANG_NONE and not self.gang_status.get("preemptions"):
            admission: dict[str, Any] = {"mechanism": api.GANG_NONE}
        else:
            admission = dict(self.gang_status, mechanism=self.mechanism)
            if self.mechanism == api.GANG_NATIVE and self.gang_obs.native_version:
                admission["podGroup"] = gang.pod_group_name(self.name, self.attempt)
        gpus = {**(self.gang_carried.get("gpus") or {}), "requested": self.spec.total_gpus}
        out = {
            **admission,
            **self.gang_carried,
            "attempt": self.attempt,
            "restarts": self.restarts,
            "nextAttemptTime": self.next_attempt if not c.is_finished(self.conds) else None,
            "replicas": replicas,
            "gpus": gpus,
            "avoidedNodes": self.avoided or None,
            "restartStrategy": self.strategy,
            "inPlaceRestarts": self.in_place_restarts or None,
        }
        return {k: v for k, v in out.items() if v is not None}

    def backoff_record(self, phase: str) -> dict[str, Any] | None:
        """``operatorState.createBackoff``: the refusal being retried, while anything is
        created."""
        r = self.refused
        if r is None or r.refusal.permanent or phase in _NO_RETRIES:
            return None
        return backoff_record(r)

    def status(self) -> dict[str, Any]:
        """The complete new status; fields owned by others are carried over."""
        current = self.current
        # Only schema fields: anything else (e.g. kopf's status.kopf, the tombstones of a
        # status of the previous shape) is left out, so the patch deletes it.
        status = {k: v for k, v in json_copy(self.old_status).items() if k in _STATUS_KEYS}
        if self.retire_verdicts():
            # The verdict described an attempt that is over; the record of what ended it is
            # status.failure and status.hangEvidence, both tagged with their attempt.
            status.pop("bottleneck", None)
        phase = c.derive_phase(self.conds)
        replicas = {
            "desired": self.spec.nodes,
            "created": len(current),
            "pending": sum(1 for p in current if p.phase not in ("Running", *TERMINATED_PHASES)),
            "running": sum(1 for p in current if p.phase == "Running"),
            "succeeded": sum(1 for p in current if p.phase == "Succeeded"),
            "failed": sum(1 for p in current if p.phase == "Failed"),
        }
        state = dict(self.old_state)
        state.update(
            admissionDenial=self.denial if phase not in _NO_RETRIES else None,
            createBackoff=self.backoff_record(phase),
            attemptsWithoutProgress=self.no_progress[-MAX_NO_PROGRESS_LISTED:] or None,
            furthestStepAtAttemptStart=self.attempt_baseline(),
            suspects=[x for x in self.suspects if x.get("attempt") == self.attempt] or None,
            inPlace=self.in_place_run if not c.is_finished(self.conds) else None,
            inPlaceUnsupported=self.in_place_unsupported,
        )
        updates: dict[str, Any] = {
            "observedGeneration": self.generation,
            "conditions": self.conds,
            "phase": phase,
            "gang": self.gang_block(replicas),
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
            for key in ("etaSeconds", "estimatedCompletionTime", "etaUnavailable"):
                progress.pop(key, None)
            state.pop("rateSince", None)
            if progress.get("totalSteps"):
                progress["step"] = progress["totalSteps"]
            progress["furthestStep"] = max(
                int(progress.get("furthestStep") or 0), int(progress.get("step") or 0)
            )
        elif status.get("progress"):
            self.pause_eta(status["progress"], state)
        self.account(status, state)
        state = without_nulls(state)
        if state:
            status["operatorState"] = state
        else:
            status.pop("operatorState", None)
        display = render_display(status)
        if display:
            status["display"] = display
        else:
            status.pop("display", None)
        out: dict[str, Any] = without_nulls(status)
        return out

    def account(self, status: dict[str, Any], state: dict[str, Any]) -> None:
        """Advance the goodput ledger (``status.goodput`` and its cursor,
        ``operatorState.goodput``) to now.

        The ledger is written when its cause (or what it follows) changed, when it is
        :data:`goodput.REFRESH_SECONDS` old, or when the status is written anyway; else the
        old one stays and the next pass charges the same cause from its ``accountedUntil``.
        """
        old = goodput.from_status(self.old_status.get("goodput"), self.old_state.get("goodput"))
        job = self.goodput_state(status)
        created = parse_time((self.body.get("metadata") or {}).get("creationTimestamp"))
        new = goodput.advance(old, job, self.now, created)
        gpus = self.spec.total_gpus
        written = {k: v for k, v in status.items() if k not in _OURS}
        before = {k: v for k, v in self.old_status.items() if k in _STATUS_KEYS - _OURS}
        kept = without_nulls({k: v for k, v in state.items() if k != "goodput"})
        was = without_nulls({k: v for k, v in self.old_state.items() if k != "goodput"})
        if old is None or goodput.due(old, new) or written != before or kept != was:
            status["goodput"], state["goodput"] = goodput.to_status(new, gpus)

    def goodput_state(self, status: Mapping[str, Any]) -> goodput.JobState:
        """The job as the goodput ledger sees it: from the status being written, and the
        pods of the current attempt (placed: every rank bound to a node)."""
        progress = status.get("progress") or {}
        bottleneck = status.get("bottleneck") or {}
        current = self.current
        placed = len(current) >= self.spec.nodes and all(p.node_name for p in current)
        return goodput.JobState(
            phase=str(status.get("phase") or c.PHASE_PENDING),
            placed=placed,
            stalled=c.is_true(self.conds, c.STALLED),
            attempt=self.attempt,
            step=_int(progress.get("step")),
            furthest_step=_int(progress.get("furthestStep")),
            last_step_time=c.time_or_none(progress.get("lastStepTime")),
            checkpoint_ratio=_float(progress.get("checkpointRatio")),
            eval_ratio=_float(progress.get("evalRatio")),
            verdict=str(bottleneck["verdict"]) if bottleneck.get("verdict") else None,
            rank=_int(bottleneck.get("rank")),
            samples_per_second=_float(progress.get("samplesPerSecond")),
            tokens_per_second=_float(progress.get("tokensPerSecond")),
            completion_time=c.time_or_none(status.get("completionTime")),
            monitored=self.spec.monitoring.enabled,
            startup_timeout=float(self.spec.monitoring.startup_timeout_seconds),
        )


def _float(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, int | float):
        return None
    return float(v) if math.isfinite(v) else None


def _int(v: Any) -> int | None:
    f = _float(v)
    return int(f) if f is not None else None
