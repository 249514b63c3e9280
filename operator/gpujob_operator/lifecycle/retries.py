"""Refused creates and the restart backoff: when the next pods may be created, and what a
refusal does to the gang.

* a refused create (:class:`~gpujob_operator.lifecycle.refusals.Refused`, remembered by the
  shell) shows as the reason of Created/Running=False and a Warning Event, and is retried at
  its ``retry_at``; a permanent refusal fails the job.
* a gang is all or nothing: pods of an incomplete gang that is still refused after
  ``gang_grace_seconds`` are deleted, so a job waiting holds nothing.
* no pod is created before a transient refusal's retry, else before the restart backoff's
  ``status.nextAttemptTime``.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from gpujob_operator.api import conditions as c
from gpujob_operator.lifecycle import terminal
from gpujob_operator.lifecycle.observations import MESSAGE_MAX_CHARS, ObservedPod, truncate
from gpujob_operator.lifecycle.planpass import PlanningPass
from gpujob_operator.lifecycle.refusals import Refused


def due_at(pp: PlanningPass) -> datetime | None:
    """When pods may be created next: a refused create's retry, else the restart backoff."""
    if pp.refused is not None and not pp.refused.refusal.permanent:
        return pp.refused.retry_at
    return c.parse_time(pp.next_attempt)


def retry_pending(pp: PlanningPass) -> bool:
    """Whether creates wait for a retry or the restart backoff now."""
    due = due_at(pp)
    return due is not None and due > pp.now


def refused_message(refused: Refused) -> str:
    """What was refused, why, and (when transient) when it is tried again."""
    r = refused.refusal
    code = f" ({r.code})" if r.code is not None else ""
    text = f"creating {refused.target} was refused{code}: {r.message}"
    if r.permanent:
        return text
    return f"{text}; try {refused.tries}, retrying at {c.format_time(refused.retry_at)}"


def fail_refused(pp: PlanningPass, refused: Refused, current: Sequence[ObservedPod]) -> None:
    """A permanent refusal: the job fails with its reason, and no part of the gang stays."""
    message = refused_message(refused)
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
