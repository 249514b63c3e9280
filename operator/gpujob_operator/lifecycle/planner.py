"""The level-based heart of the operator: observed state in, actions and status out.

:func:`plan` is pure. It reads the job (spec + the status written last time) and a summary
of the job's pods, and returns what to create and delete, the complete new status, and
Events. The I/O shell applies a :class:`Plan` in this order: **status first, then deletes,
then creates** — so a crash between steps never forgets a restart it already counted (the
next plan re-derives the same actions from the persisted status and the pods' labels).

Gang semantics (torchrun's static rendezvous needs every rank): attempt ``A`` =
max(``status.gang.attempt``, highest ``gpujob.dev/attempt`` label seen); pods of older attempts
are stale and deleted; a new attempt's pods are created only once *every* stale pod is gone
(pod names are fixed, so this also rules out duplicates).

One pass is one short decision chain, :func:`run`; each policy lives in its own module
(like JobSet's controllers) and its docstring states its rules:

* :mod:`.terminal`: a finished job (cleanPodPolicy, the Kueue quota handed back,
  ``ttlSecondsAfterFinished``), ``activeDeadlineSeconds``, every rank exiting 0.
* :mod:`.restarts`: suspend and resume; a failed, lost or stalled rank restarts the whole
  gang (``backoffLimit``, ``retryableExitCodes``, the restart backoff); a disruption
  restarts it without counting.
* :mod:`.admission`: whether the gang may have pods now (Native, Kueue).
* :mod:`.converge`: delete stale pods, create the missing ranks, say why the gang waits;
  :mod:`.retries`: when pods may be created again (a refused create's retry, the restart
  backoff) and what a refusal does to the gang (all or nothing).

:mod:`.observations` holds the pods as observed and their failure facts; :mod:`.planpass`
the pass's state, the helpers that record a decision, and the status it renders.

Planning twice on the same input yields the same plan.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final

from pydantic import ValidationError

from gpujob_operator import api
from gpujob_operator.api import conditions as c
from gpujob_operator.api import podbytes
from gpujob_operator.api.events import Event
from gpujob_operator.api.status import attempt_of
from gpujob_operator.lifecycle import (
    admission,
    backoff,
    blame,
    builders,
    converge,
    inplace,
    restarts,
    retries,
    terminal,
)
from gpujob_operator.lifecycle.apiserver.refusals import Refused
from gpujob_operator.lifecycle.gang import gang
from gpujob_operator.lifecycle.observations import GangObservation, ObservedPod, int_or_none
from gpujob_operator.lifecycle.planpass import PlanningPass, retired

GANG_GRACE_SECONDS: Final = 10.0
"""How long pods of an incomplete, refused gang may hold resources before they are deleted."""


@dataclass(frozen=True)
class Plan:
    """Actions for the I/O shell; apply status, then deletes, then creates.

    ``status`` is the complete new status (camelCase, JSON-ready); fields owned by others
    (progress, bottleneck, gpus, Stalled/MetricsAvailable/BottleneckDetected conditions)
    are carried over from the input while the attempt they describe goes on; once it ends
    (restart, eviction, suspension, the job's end) Stalled and BottleneckDetected turn False
    and ``bottleneck`` is dropped (:meth:`.PlanningPass.retire_verdicts`). Use
    :func:`~gpujob_operator.api.patches.minimal_patch` to patch only what changed.
    ``requeue_after`` is the number of seconds until a time-based transition (deadline,
    TTL) is due, or None.
    """

    status: dict[str, Any]
    create_service: dict[str, Any] | None = None
    create_pods: list[dict[str, Any]] = field(default_factory=list)
    more_pods: int = 0
    """Pods of the gang still missing beyond ``create_pods``, a batch bounded in bytes
    (:func:`.converge.create_batch`). The gang's dry run counts them too."""
    more_ranks: tuple[int, ...] = ()
    """The ranks of ``more_pods``."""
    build_more: Callable[[int], dict[str, Any]] | None = field(
        default=None, compare=False, repr=False
    )
    """Builds the pod of one of ``more_ranks`` (:func:`.converge.build_later`): the I/O
    shell creates them in the same pass, each built as it is sent, so that only the pods
    in flight are held; a later pass creates whatever it did not. Not compared: planning
    twice still gives equal plans."""
    delete_pods: list[str] = field(default_factory=list)
    delete_job: bool = False
    events: list[Event] = field(default_factory=list)
    requeue_after: float | None = None
    ensure_objects: list[dict[str, Any]] = field(default_factory=list)
    """Gang objects (Workload, PodGroup) to create if absent, before any pod."""
    delete_objects: list[gang.ObjectRef] = field(default_factory=list)
    status_patches: list[tuple[gang.ObjectRef, dict[str, Any]]] = field(default_factory=list)
    """Merge patches of other objects' status subresource (the Kueue Workload's)."""
    patch_pods: list[tuple[str, str | None, dict[str, Any]]] = field(default_factory=list)
    """(name, uid, merge patch) of pods an in-place restart moves to the next attempt or
    releases (:mod:`.inplace`); applied after the deletes, only to the pod of that uid."""

    @property
    def phase(self) -> str:
        """The new display phase."""
        return str(self.status.get("phase", c.PHASE_PENDING))


def run(pp: PlanningPass) -> None:
    """The decision chain: each step either ends the pass or hands on to the next."""
    if c.is_finished(pp.conds):
        terminal.finished(pp)
        return
    if terminal.deadline_exceeded(pp):
        return
    if pp.spec.run_policy.suspend:
        restarts.suspend(pp)
        return
    if c.is_true(pp.conds, c.SUSPENDED):
        restarts.resume(pp)
    if not pp.service_exists and not retries.retry_pending(pp):
        pp.service = builders.build_service(pp.body, pp.spec)
    if not admission.gang_admitted(pp):
        return
    if restarts.restart_needed(pp):
        return
    if terminal.all_ranks_succeeded(pp):
        return
    converge.converge(pp)


def needs_nodes(job: Mapping[str, Any], pods: Sequence[ObservedPod], now: datetime) -> bool:
    """Whether this pass may create pods that avoid blamed nodes or restart in place: the
    shell reads the nodes for it then, and only then (a list of every node is not for every
    pass). Not while the job is suspended, its restart backs off, an older attempt's pods are
    still going, or Kueue has not admitted it."""
    status = job.get("status") or {}
    gang_status = status.get("gang") or {}
    spec = job.get("spec") or {}
    run_policy = spec.get("runPolicy") or {}
    avoiding = (
        bool(gang_status.get("avoidedNodes")) and run_policy.get("avoidBlamedNodes") is not False
    )
    # In place where the nodes declare it (inplace.decide): an attempt's first pods ask.
    in_place = (
        run_policy.get("restartStrategy") != inplace.RECREATE
        and bool(spec.get("command"))
        and not (status.get("operatorState") or {}).get("inPlaceUnsupported")
    )
    if not (avoiding or in_place) or c.is_finished(status.get("conditions") or []):
        return False
    if run_policy.get("suspend"):
        return False
    if gang_status.get("mechanism") == api.GANG_KUEUE and not gang_status.get("admitted"):
        return False
    due = c.time_or_none(gang_status.get("nextAttemptTime"))
    if due is not None and due > now:
        return False
    attempt = max([attempt_of(status), *(p.attempt for p in pods)])
    if any(p.attempt < attempt for p in pods):
        return False  # the old gang must be gone first
    have = {p.node_rank for p in pods if p.attempt == attempt}
    return len(have) < int(spec.get("nodes") or 0)


def invalid_spec(body: Mapping[str, Any], now: datetime, problems: str) -> Plan:
    """The plan for a stored job the model refuses: Failed with InvalidSpec, nothing else.

    Admission refuses such specs today; one can still be stored from before a rule existed
    or under an older CRD. Nothing can be built from it, so no pod is touched (the user
    fixes or deletes the job); the Event is posted once, when the condition first appears.
    """
    message = (
        f"the stored spec does not pass validation (it was created before a rule existed, or "
        f"under an older CRD): {problems}; fix the spec (kubectl apply shows the same "
        f"refusal) or delete the job"
    )
    return refused_spec(body, now, c.INVALID_SPEC, message)


def refused_spec(body: Mapping[str, Any], now: datetime, reason: str, message: str) -> Plan:
    """Failed with `reason`, nothing else: a spec nothing may be built from (the Event once,
    when the condition first appears)."""
    status = copy.deepcopy(dict(body.get("status") or {}))
    old = list(status.get("conditions") or [])
    gen = int_or_none((body.get("metadata") or {}).get("generation"))
    conds = c.set_condition(old, c.FAILED, c.TRUE, reason, message, now, gen)
    conds = retired(
        conds, c.JOB_FAILED, "the job failed; the verdict was about its last attempt", now, gen
    )
    status["conditions"] = conds
    status.pop("bottleneck", None)
    status["phase"] = c.derive_phase(conds)
    if gen is not None:
        status["observedGeneration"] = gen
    status.setdefault("completionTime", c.format_time(now))
    first = (c.find(old, c.FAILED) or {}).get("reason") != reason
    events = [Event("Warning", reason, message)] if first else []
    return Plan(status=status, events=events)


def plan(
    job: Mapping[str, Any] | api.GPUTrainingJob,
    pods: Sequence[ObservedPod],
    now: datetime,
    *,
    service_exists: bool,
    log_tails: Mapping[str, str] | None = None,
    refused: Refused | None = None,
    restart_backoff: backoff.Policy = backoff.RESTART,
    gang_grace_seconds: float = GANG_GRACE_SECONDS,
    gang_obs: GangObservation | None = None,
    gone: Sequence[ObservedPod] = (),
    resume_backoff: bool = True,
    nodes: blame.NodeView | None = None,
    max_pod_bytes: int = 0,
) -> Plan:
    """Decide what to do for ``job`` given its pods (all attempts) at ``now``.

    ``job`` is the raw object (camelCase dict with metadata name/namespace/uid/generation,
    spec, and the status written last time) or the model. ``pods`` are the summaries
    (:func:`.observations.observe_pod`) of every pod labelled ``gpujob.dev/job-name=<job>``.
    ``log_tails`` maps pod names to their logs' last lines, fetched by the shell for
    :func:`.observations.root_cause`'s pod; without it the termination message is used.
    ``refused`` is the job's latest refused create, remembered by the shell (None once a
    create succeeded); ``restart_backoff`` spaces gang restarts; ``gang_grace_seconds`` is
    how long an incomplete, refused gang may keep its pods. ``gone`` are the last states of
    pods that Kubernetes marked for disruption (``DisruptionTarget``) and that vanished before
    a pass saw them terminating: the shell remembers them from the pod watch, so a rank that
    exits at once on SIGTERM still reads as preempted or evicted, not lost.
    ``resume_backoff``: with no ``refused``, resume the one in ``operatorState.createBackoff`` (a
    shell that has not tried a create since it started); False once the shell has tried.
    ``nodes``: the cluster's nodes (or why they could not be read) when the job avoids blamed
    nodes and its attempt lacks pods (:func:`needs_nodes`); the fit of the gang without them
    is checked against these (:mod:`.blame`). ``max_pod_bytes``: the most bytes of pods a job
    may ask for (``api/podbytes.py``; 0: no bound); a job over it that has no pod yet fails
    with PodsTooLarge before any is created.
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
    status = body.get("status") or {}
    ended = status.get("phase") in (c.PHASE_SUCCEEDED, c.PHASE_FAILED)
    # Only a job that never created a pod: one that ran (suspended, between two attempts)
    # is never failed by a bound lowered since; once failed, the ended job's passes (its
    # TTL, its Workload) are the planner's as for any other.
    if not pods and not ended and status.get("startTime") is None:
        too_large = podbytes.refusal(body["spec"], max_pod_bytes)
        if too_large is not None:
            return refused_spec(body, now, c.PODS_TOO_LARGE, too_large)
    pp = PlanningPass(
        body, pods, now, service_exists, log_tails or {}, refused, restart_backoff,
        gang_grace_seconds, gang_obs, gone, resume_backoff, nodes,
    )  # fmt: skip
    run(pp)
    admission.sync_pods_ready(pp)
    return Plan(
        status=pp.status(),
        create_service=pp.service,
        create_pods=pp.creates,
        more_pods=pp.more_pods,
        more_ranks=pp.more_ranks,
        build_more=pp.build_more,
        delete_pods=pp.deletes,
        delete_job=pp.delete_job,
        events=pp.events,
        requeue_after=min(pp.requeue) if pp.requeue else None,
        ensure_objects=pp.ensure,
        delete_objects=pp.delete_refs,
        status_patches=pp.patches,
        patch_pods=pp.pod_patches,
    )
