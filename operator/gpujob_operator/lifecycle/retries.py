"""Refused creates and the restart backoff: when the next pods may be created, and what a
refusal does to the gang.

* a refused create (:class:`~gpujob_operator.lifecycle.apiserver.refusals.Refused`,
  remembered by the shell) shows as the reason of Created/Running=False and a Warning Event,
  and is retried at its ``retry_at``; a permanent refusal fails the job, and so does an
  admission webhook's denial once it was retried for
  ``spec.runPolicy.admissionRetrySeconds`` (counted from the first denial in a row,
  ``operatorState.admissionDenial``, so an operator restart does not reset it). The tries,
  the run's start and the next try are kept in ``operatorState.createBackoff``: a shell that
  forgot its refusal (an operator restart) goes on with it
  (:func:`.apiserver.refusals.resume`).
* a gang is all or nothing: pods of an incomplete gang that is still refused after
  ``gang_grace_seconds`` are deleted, so a job waiting holds nothing.
* no pod is created before a transient refusal's retry, else before the restart backoff's
  ``status.gang.nextAttemptTime``.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

from gpujob_operator.api import conditions as c
from gpujob_operator.lifecycle import terminal
from gpujob_operator.lifecycle.apiserver.refusals import Refused
from gpujob_operator.lifecycle.observations import MESSAGE_MAX_CHARS, ObservedPod, truncate
from gpujob_operator.lifecycle.planpass import PlanningPass


def due_at(pp: PlanningPass) -> datetime | None:
    """When pods may be created next: a refused create's retry, else the restart backoff."""
    if pp.refused is not None and not pp.refused.refusal.permanent:
        return pp.refused.retry_at
    return c.parse_time(pp.next_attempt)


def retry_pending(pp: PlanningPass) -> bool:
    """Whether creates wait for a retry or the restart backoff now."""
    due = due_at(pp)
    return due is not None and due > pp.now


def give_up_at(pp: PlanningPass, refused: Refused) -> datetime | None:
    """When a bounded refusal (a webhook's denial) stops being retried: its first denial
    plus ``spec.runPolicy.admissionRetrySeconds``; None for any other refusal."""
    if not refused.refusal.bounded:
        return None
    since = c.parse_time((pp.denial or {}).get("since")) or refused.since
    return since + timedelta(seconds=pp.spec.run_policy.admission_retry_seconds)


def gives_up(pp: PlanningPass, refused: Refused) -> bool:
    """Whether the job fails of this refusal now: a permanent one, or a webhook's denial that
    was retried for its whole window (until then, a pass is due when the window ends)."""
    if refused.refusal.permanent:
        return True
    until = give_up_at(pp, refused)
    if until is None:
        return False
    if until <= pp.now:
        return True
    pp.requeue.append((until - pp.now).total_seconds())
    return False


def refused_message(pp: PlanningPass, refused: Refused) -> str:
    """What was refused, why, what to do, and whether and until when it is tried again."""
    r = refused.refusal
    code = f" ({r.code})" if r.code is not None else ""
    text = f"creating {refused.target} was refused{code}: {r.message}"
    if r.advice:
        text = f"{text}; {r.advice}"
    if r.permanent:
        return text
    until = give_up_at(pp, refused)
    if until is not None:
        window = pp.spec.run_policy.admission_retry_seconds
        since = until - timedelta(seconds=window)
        setting = f"spec.runPolicy.admissionRetrySeconds: {window}"
        if window == 0:
            return f"{text}; not retried ({setting})"
        if until <= pp.now:
            waited = (pp.now - since).total_seconds()
            return (
                f"{text}; denied since {c.format_time(since)} and retried for {waited:.0f}s "
                f"({setting}): giving up"
            )
        text = (
            f"{text}; an admission webhook may deny only for now: retried until "
            f"{c.format_time(until)} ({setting}; denied since {c.format_time(since)})"
        )
    return f"{text}; try {refused.tries}, retrying at {c.format_time(refused.retry_at)}"


def fail_refused(pp: PlanningPass, refused: Refused, current: Sequence[ObservedPod]) -> None:
    """A permanent refusal (or a denial retried long enough): the job fails with its reason,
    and no part of the gang stays."""
    message = refused_message(pp, refused)
    kind, _, name = refused.target.partition(" ")
    pp.failure = {
        "reason": refused.refusal.reason,
        "message": truncate(message, MESSAGE_MAX_CHARS),
        "attempt": pp.attempt,
    }
    if kind == "pod":
        pp.failure["pod"] = name
    pp.delete(current)
    pp.set(c.CREATED, c.FALSE, refused.refusal.reason, message)
    terminal.finish(pp, False, refused.refusal.reason, message)


def release_partial_gang(
    pp: PlanningPass, refused: Refused, current: Sequence[ObservedPod]
) -> bool:
    """Delete the pods of a gang still refused after the grace (all or nothing); True
    when it does."""
    live = [p for p in current if not p.terminating]
    if not live or c.is_true(pp.old_conds, c.CREATED):
        return False
    left = pp.gang_grace_seconds - (pp.now - refused.since).total_seconds()
    if left > 0:
        pp.requeue.append(left)
        return False
    pp.delete(live)
    names = ", ".join(p.name for p in live)
    pp.event(
        "Warning",
        c.GANG_RELEASED,
        f"deleting {names}: the rest of the gang was refused for {pp.gang_grace_seconds:g}s "
        f"({refused.refusal.reason}); no pod is kept until the whole gang can be created",
    )
    return True
