"""Gang restarts: a failed, lost or stalled rank restarts the whole gang; suspension stops it.

torchrun's static rendezvous needs every rank, so one rank's end is the gang's:

* a failed rank (or a pod lost after the gang was complete, or a stall with
  ``restartOnStall``) restarts the whole gang: attempt+1, restarts+1, all pods deleted.
  ``restarts`` lives in status and is never kept in memory, so it survives an operator
  restart. A stall restarts only once confirmed by two scrapes (reason ``StallConfirmed``),
  and every gang restart and suspension clears ``Stalled`` (the pass's status does, for
  every way an attempt ends: one incident, one restart). Beyond ``backoffLimit`` the job
  fails (BackoffLimitExceeded); a root-cause exit code outside ``retryableExitCodes`` (when
  set) fails it at once (NonRetryableExitCode).
* a gang restart backs off: the next attempt's pods are created no earlier than
  ``status.gang.nextAttemptTime`` (10 s, 20 s, 40 s ... capped, like batch/v1 Job).
* a pod the cluster takes away (``DisruptionTarget``: preemption, eviction) restarts the gang
  without counting against ``backoffLimit``, as a batch/v1 Job's podFailurePolicy may.
* a crash loop that makes no progress stops early: at
  ``maxRestartsWithoutProgress`` consecutive failed attempts that never passed the furthest
  step reached before them (``status.operatorState.furthestStepAtAttemptStart``, against
  ``status.progress.furthestStep``), the job fails (NoProgressAcrossRestarts) before
  ``backoffLimit`` is spent. Disruptions neither count nor break the run of such attempts; an
  attempt that passes that step, failed or disrupted, resets it. A job whose ranks never
  reported a step is not judged (its progress is unknown, not absent).
* suspend deletes every pod and bumps the attempt; resume resets ``startTime`` (so the
  ``activeDeadlineSeconds`` clock excludes suspension, as for batch/v1 Job).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import Any, Final

from gpujob_operator import api
from gpujob_operator.api import children
from gpujob_operator.api import conditions as c
from gpujob_operator.api.display import EVIDENCE_MARK, format_hang
from gpujob_operator.api.status import furthest_step, stall_evidence
from gpujob_operator.lifecycle import blame, inplace, terminal
from gpujob_operator.lifecycle.gang import gang
from gpujob_operator.lifecycle.observations import (
    PREEMPTION_BY_SCHEDULER,
    ObservedPod,
    describe_failure,
    failure_of,
    rank_key,
    root_cause,
)
from gpujob_operator.lifecycle.planpass import PlanningPass
from gpujob_trainer import contract


def suspend(pp: PlanningPass) -> None:
    """spec.runPolicy.suspend: delete every pod (the gang's attempt is over) and say so."""
    if not c.is_true(pp.conds, c.SUSPENDED):
        if pp.current:
            pp.attempt += 1  # whatever is left of the old gang is now stale
        pp.event("Normal", c.SUSPENDED_REASON, "job suspended; deleting its pods")
    message = "job is suspended (spec.runPolicy.suspend); its pods are deleted"
    pp.set(c.SUSPENDED, c.TRUE, c.SUSPENDED_REASON, message)
    pp.set(c.RUNNING, c.FALSE, c.SUSPENDED_REASON, message)
    pp.set_if_present(c.CREATED, c.FALSE, c.SUSPENDED_REASON, message)
    pp.set_if_present(c.RESTARTING, c.FALSE, c.SUSPENDED_REASON, message)
    pp.delete(pp.pods)
    if pp.mechanism == api.GANG_KUEUE and pp.gang_obs.kueue_workload is not None:
        # A suspended job gives its quota back; on resume it queues again at the back.
        pp.delete_refs.append(gang.ref_of(pp.gang_obs.kueue_workload))


def resume(pp: PlanningPass) -> None:
    """Suspended no more: the pods are created again and the deadline's clock restarts."""
    pp.set(c.SUSPENDED, c.FALSE, c.RESUMED, "job resumed; creating pods")
    pp.event("Normal", c.RESUMED, "job resumed")
    pp.start_time = c.format_time(pp.now)


def is_retryable(exit_code: int | None, retryable_exit_codes: Sequence[int] | None) -> bool:
    """Whether a failure may restart the gang (see ``RunPolicy.retryable_exit_codes``).

    No exit code (evicted, node lost, stalled) is always retryable; with the list unset
    every exit code is; with it set, only the codes it holds.
    """
    if exit_code is None or retryable_exit_codes is None:
        return True
    return exit_code in retryable_exit_codes


def restart_needed(pp: PlanningPass) -> bool:
    """Handle a failed, lost or stalled rank; True when the pass is over."""
    current = pp.current
    failed = root_cause(current)
    failure: dict[str, Any] | None = None
    cause = c.RANK_FAILED
    if failed is not None:
        failure = failure_of(failed, pp.log_tails)
    else:
        lost = lost_rank(pp, current)
        if lost is not None:
            cause = c.POD_LOST
            lost_name = children.pod_name(pp.name, lost)
            failure = {
                "pod": lost_name,
                "attempt": pp.attempt,
                "nodeRank": lost,
                "reason": c.POD_LOST,
                "message": f"pod {lost_name} vanished or is being deleted while the gang ran",
            }
        elif pp.spec.run_policy.restart_on_stall and stall_confirmed(pp):
            stalled = c.find(pp.conds, c.STALLED) or {}
            cause = c.STALL_DETECTED
            failure = {
                "attempt": pp.attempt,
                "reason": "Stalled",
                "message": with_evidence(pp, str(stalled.get("message") or "no step for too long")),
            }
    if failure is None:
        return False
    present = {p.name for p in current}
    candidates = [
        *current,
        *(g for g in pp.gone if g.attempt == pp.attempt and g.name not in present),
    ]
    disrupted = next((p for p in sorted(candidates, key=rank_key) if p.disruption), None)
    if disrupted is not None:
        # The cluster took a pod away; the other ranks' errors are its consequence.
        disruption_restart(pp, disrupted)
        return True
    pp.failure = failure
    what = describe_failure(failure)
    if inplace.supervisor_missing(pp, failed):
        # The operator chose InPlace for an image that cannot do it: not the job's failure.
        pp.attempt += 1
        message = (
            f"{what}; the image cannot run the in-place restart supervisor: recreating all "
            f"{pp.spec.nodes} pods as attempt {pp.attempt} without it, not counted against "
            "backoffLimit"
        )
        pp.set(c.RESTARTING, c.TRUE, c.IN_PLACE_FALLBACK, message)
        pp.set(c.RUNNING, c.FALSE, c.IN_PLACE_FALLBACK, message)
        pp.set(c.CREATED, c.FALSE, c.IN_PLACE_FALLBACK, message)
        pp.event("Warning", c.IN_PLACE_FALLBACK, message)
        pp.delete(pp.pods)
        return True
    # A node failing its pre-flight check is the node's fault, not the job's: retried (on
    # another node) whatever retryableExitCodes says.
    checked = pp.spec.run_policy.preflight.enabled and blame.preflight_line(
        failure.get("exitCode"), blame.failure_text(failure)
    )
    codes = pp.spec.run_policy.retryable_exit_codes
    if not checked and not is_retryable(failure.get("exitCode"), codes):
        terminal.finish(
            pp,
            False,
            c.NON_RETRYABLE_EXIT_CODE,
            f"{what}; exit code {failure.get('exitCode')} is not in retryableExitCodes {codes}",
        )
        return True
    if no_progress_exceeded(pp, what):
        return True
    limit = pp.spec.run_policy.backoff_limit
    if pp.restarts >= limit:
        terminal.finish(
            pp,
            False,
            c.BACKOFF_LIMIT_EXCEEDED,
            f"{what}; backoffLimit {limit} reached after {pp.restarts} restarts",
        )
        return True
    avoiding = blame_ending(pp, failure=failure, failed=failed, stalled=cause == c.STALL_DETECTED)
    ended = pp.current
    pp.restarts += 1
    pp.attempt += 1  # the pass's status then sets Stalled False: one incident, one restart
    delay = pp.restart_backoff.delay(pp.restarts)
    pp.next_attempt = c.format_time(pp.now + timedelta(seconds=delay))
    how = inplace.restart(pp, ended)
    when = (
        f" at {pp.next_attempt}, after a {delay:g}s backoff" if pp.next_attempt is not None else ""
    )
    message = (
        f"{what}; restarting all {pp.spec.nodes} pods as attempt {pp.attempt} "
        f"(restart {pp.restarts}/{limit}){when}{avoiding}{how}"
    )
    pp.set(c.RESTARTING, c.TRUE, c.GANG_RESTART, message)
    pp.set(c.RUNNING, c.FALSE, cause, message)
    pp.set(c.CREATED, c.FALSE, c.GANG_RESTART, message)
    pp.event("Warning", c.GANG_RESTART, message)
    return True


def blame_ending(
    pp: PlanningPass,
    *,
    failure: Mapping[str, Any] | None = None,
    failed: ObservedPod | None = None,
    disrupted: ObservedPod | None = None,
    stalled: bool = False,
) -> str:
    """Record the nodes the attempt ending now blames (``status.gang.avoidedNodes``, a Warning
    Event each; :mod:`.blame`) and return a clause for the restart's message."""
    if not pp.spec.run_policy.avoid_blamed_nodes:
        return ""
    evidence = stall_evidence({**pp.old_status, "conditions": pp.conds}) if stalled else None
    found = blame.blamed(
        blame.Ending(
            suspects=pp.suspects,
            window_seconds=float(pp.spec.monitoring.window.duration_seconds),
            after_windows=pp.spec.run_policy.avoid_after_windows,
            evidence=evidence,
            failure=failure,
            failed=failed,
            disrupted=disrupted,
            now=pp.now,
            preflights=[p for p in pp.current if p.exit_code == contract.PREFLIGHT_EXIT_CODE],
        )
    )
    if not found:
        return ""
    seconds = pp.spec.run_policy.avoid_seconds
    pp.avoided = blame.record(pp.avoided, found, pp.attempt, pp.now, seconds)
    until = c.format_time(pp.now + timedelta(seconds=seconds))
    for node, reason, message in found:
        pp.event(
            "Warning",
            c.NODE_BLAMED,
            f"attempt {pp.attempt} blames node {node} ({reason}: {message}); the next "
            f"attempts avoid it until {until}",
        )
    return "; avoiding " + ", ".join(f"{n} ({r})" for n, r, _ in found)


def disruption_restart(pp: PlanningPass, pod: ObservedPod) -> None:
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
    if attempt_progressed(pp):
        pp.no_progress = []
    avoiding = blame_ending(pp, disrupted=pod)
    ended = pp.current
    pp.attempt += 1
    pp.gang_status["preemptions"] = int(pp.gang_status.get("preemptions") or 0) + 1
    limit = pp.spec.run_policy.backoff_limit
    how = inplace.restart(pp, ended)
    message = (
        f"{what}; a disruption, not a failure: restarting all {pp.spec.nodes} pods as "
        f"attempt {pp.attempt}, not counted against backoffLimit "
        f"({pp.restarts}/{limit} restarts used){avoiding}{how}"
    )
    pp.set(c.RESTARTING, c.TRUE, reason, message)
    pp.set(c.RUNNING, c.FALSE, reason, message)
    pp.set(c.CREATED, c.FALSE, reason, message)
    pp.event("Warning", reason, message)


def attempt_progressed(pp: PlanningPass) -> bool | None:
    """Whether the attempt now ending passed the furthest step any attempt had reached when
    it began; None while no rank ever reported a step (progress unknown: not judged)."""
    furthest = furthest_step(pp.old_status)
    if furthest is None:
        return None
    baseline = pp.old_state.get("furthestStepAtAttemptStart")
    return furthest > (int(baseline) if isinstance(baseline, int) else 0)


def no_progress_exceeded(pp: PlanningPass, what: str) -> bool:
    """Count a failed attempt that made no progress; fail the job (NoProgressAcrossRestarts)
    once ``maxRestartsWithoutProgress`` such attempts ran in a row. True when it failed."""
    progressed = attempt_progressed(pp)
    if progressed:
        pp.no_progress = []
        return False
    if progressed is None:
        return False
    if pp.attempt not in pp.no_progress:
        pp.no_progress = [*pp.no_progress, pp.attempt]
    limit = pp.spec.run_policy.max_restarts_without_progress
    if len(pp.no_progress) < limit:
        return False
    attempts = pp.no_progress[-limit:]
    named = ", ".join(str(a) for a in attempts[:-1]) + f" and {attempts[-1]}"
    named = named if len(attempts) > 1 else str(attempts[-1])
    step = furthest_step(pp.old_status)
    terminal.finish(
        pp,
        False,
        c.NO_PROGRESS_ACROSS_RESTARTS,
        f"{what}; attempt{'s' if len(attempts) > 1 else ''} {named} ended without passing "
        f"step {step}, the furthest any attempt reached (maxRestartsWithoutProgress {limit}, "
        f"{pp.restarts} of backoffLimit {pp.spec.run_policy.backoff_limit} restarts used)",
    )
    return True


EVIDENCE_WAIT_SECONDS: Final = 60.0
"""restartOnStall waits at most this long after the stall began for its hang evidence (taken
within one scrape timeout when the operator is well); a stuck capture never blocks the
restart for longer."""


def stall_confirmed(pp: PlanningPass) -> bool:
    """Stalled held for consecutive scrapes of the current attempt (StallConfirmed), and
    its hang evidence is taken (or :data:`EVIDENCE_WAIT_SECONDS` went by without it)."""
    cond = c.find(pp.conds, c.STALLED) or {}
    if cond.get("status") != c.TRUE or cond.get("reason") != c.STALL_CONFIRMED:
        return False
    if stall_evidence({**pp.old_status, "conditions": pp.conds}) is not None:
        return True
    try:
        began = c.parse_time(cond.get("lastTransitionTime"))
    except (TypeError, ValueError):
        began = None
    left = EVIDENCE_WAIT_SECONDS - (pp.now - began).total_seconds() if began else 0.0
    if left > 0:
        pp.requeue.append(left)
        return False
    return True


def with_evidence(pp: PlanningPass, message: str) -> str:
    """The restart's failure message, carrying the hang evidence or saying why none."""
    ev = stall_evidence({**pp.old_status, "conditions": pp.conds})
    if ev is not None:
        return message if EVIDENCE_MARK in message else message + format_hang(ev)
    return f"{message}; no hang evidence was recorded in time"


def lost_rank(pp: PlanningPass, current: Sequence[ObservedPod]) -> int | None:
    """A pod that vanished (or is being deleted) after the whole gang existed."""
    if pp.attempt != pp.prev_attempt or not c.is_true(pp.conds, c.CREATED):
        return None
    run = pp.in_place_run
    if run is not None and run.get("attempt") == pp.attempt:
        return None  # an in-place restart under way recreates the pods it deletes

    by_rank = {p.node_rank: p for p in current}
    for rank in range(pp.spec.nodes):
        pod = by_rank.get(rank)
        if pod is None or (pod.terminating and pod.active):
            return rank
    return None
