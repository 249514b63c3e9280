"""Converge the gang: delete stale pods, create the missing ranks, report how far it is.

The last step of the decision chain, once no policy ended the pass. Pods of older attempts
are stale and deleted; a new attempt's pods are created only once *every* stale pod is gone
(pod names are fixed, so this also rules out duplicates), no foreign pod holds one of their
names, and no refusal's retry or restart backoff is due later. Created and Running say how
far the gang is, and while it is not running, why it waits (unschedulable, image pull,
container config, old pods, a name taken, the backoff, the gang's admission).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence
from typing import Any, Final

from gpujob_operator import api
from gpujob_operator.api import children
from gpujob_operator.api import conditions as c
from gpujob_operator.lifecycle import admission, builders, inplace, retries
from gpujob_operator.lifecycle.observations import ObservedPod
from gpujob_operator.lifecycle.planpass import PlanningPass

_PULL_ERRORS: Final = frozenset({"ErrImagePull", "ImagePullBackOff", "InvalidImageName"})
_CONFIG_ERRORS: Final = frozenset({"CreateContainerConfigError", "CreateContainerError"})


CREATE_BATCH_BYTES: Final = 16 * 1024 * 1024
"""The most pod JSON a plan builds: a 400 KB template makes batches of 40 pods. The gang's
other pods are built by the I/O shell as it sends them (:func:`build_later`), so a 2,048-pod
gang never sits in the operator's memory at once."""
CREATE_BATCH_MAX: Final = 128
"""The most pods one pass creates, however small they are."""
NEXT_BATCH_SECONDS: Final = 0.5
"""When the next batch is planned at the latest (the new pods' events usually wake it first)."""
NAMES_LISTED: Final = 8


def create_batch(first: Mapping[str, Any], missing: int) -> int:
    """How many of ``missing`` pods shaped like ``first`` one pass builds and creates."""
    size = len(json.dumps(first, separators=(",", ":")))
    return max(1, min(missing, CREATE_BATCH_MAX, CREATE_BATCH_BYTES // max(size, 1)))


def build_later(pp: PlanningPass, in_place: bool, rank: int) -> dict[str, Any]:
    """Pod ``rank`` of this pass's gang, beyond its first batch: built by the I/O shell
    when it creates it, so only the pods in flight are in memory (a 2,048-pod gang of a
    400 KB template would be 800 MB), and the gang is created in one pass rather than one
    pass per batch, each with a status write and a wait for the index. The pass's
    decisions (placement, the gang's objects, the hold) were made with its first pod."""
    pod = admission.build_pod(pp, rank, in_place)
    inplace.hold(pp, [pod])
    return pod


def names_listed(names: Sequence[str]) -> str:
    """Pod names for a message or a log line: all of a few, else the first and last and
    how many (a 2,048-pod gang's names would fill it)."""
    if len(names) <= NAMES_LISTED:
        return ", ".join(names)
    return f"{len(names)} pods, {names[0]} .. {names[-1]}"


def pod_names(job: str, ranks: Sequence[int]) -> str:
    """The pods of ``ranks``, as :func:`names_listed` lists them."""
    return names_listed([children.pod_name(job, r) for r in ranks])


def converge(pp: PlanningPass) -> None:
    """Delete stale pods, create missing ones, and report how far the gang is."""
    n = pp.spec.nodes
    stale = pp.stale
    pp.delete(inplace.rejoin_stale(pp, stale))
    inplace.converge(pp)
    current = pp.current
    have = {p.node_rank for p in current}
    missing = [r for r in range(n) if r not in have]
    taken = names_taken(pp, missing)
    refused = pp.refused if missing else None
    if refused is not None and retries.gives_up(pp, refused):
        retries.fail_refused(pp, refused, current)
        return
    # Pods of this attempt being deleted (a released gang) go before any is created again.
    released = refused is not None and retries.release_partial_gang(pp, refused, current)
    terminating = released or any(p.terminating for p in current)
    due = retries.due_at(pp)
    blocked = bool(stale) or terminating or bool(taken)
    if missing and not blocked and due is not None and due > pp.now:
        pp.requeue.append((due - pp.now).total_seconds())
    elif missing and not blocked:
        first = builders.build_pod(pp.body, missing[0], pp.attempt, pp.spec)
        in_place = inplace.use_in_place(pp, first)
        batch = missing[: create_batch(first, len(missing))]
        pp.creates = [admission.build_pod(pp, r, in_place) for r in batch]
        pp.more_pods = len(missing) - len(batch)
        if pp.more_pods:
            pp.more_ranks = tuple(missing[len(batch) :])
            pp.build_more = functools.partial(build_later, pp, in_place)
            pp.requeue.append(NEXT_BATCH_SECONDS)
        inplace.hold(pp, pp.creates)
        pp.start_time = pp.start_time or c.format_time(pp.now)
        if len(missing) == n or not pp.more_pods:
            names = pod_names(pp.name, missing)
            pp.event("Normal", c.PODS_CREATING, f"creating {names} (attempt {pp.attempt})")
        if refused is None:
            pp.next_attempt = None
    if refused is not None:
        pp.next_attempt = c.format_time(refused.retry_at)

    if len(current) == n:
        pp.gang_exists()
    elif refused is not None:
        message = retries.refused_message(pp, refused)
        old = c.find(pp.old_conds, c.CREATED) or {}
        pp.set(c.CREATED, c.FALSE, refused.refusal.reason, message)
        pp.set(c.RUNNING, c.FALSE, refused.refusal.reason, message)
        if (old.get("reason"), old.get("message")) != (refused.refusal.reason, message):
            pp.event("Warning", refused.refusal.reason, message)
        return
    else:
        pp.set(
            c.CREATED,
            c.FALSE,
            c.PODS_CREATING,
            f"{len(current)}/{n} pods of attempt {pp.attempt} exist",
        )

    running = [p for p in current if p.phase == "Running"]
    done = [p for p in current if p.phase == "Succeeded"]
    restarting = c.is_true(pp.conds, c.RESTARTING)
    if running and len(running) + len(done) == n:
        was_running = c.is_true(pp.old_conds, c.RUNNING)
        message = f"all {n} ranks running (attempt {pp.attempt})"
        pp.set(c.RUNNING, c.TRUE, c.ALL_RANKS_RUNNING, message)
        pp.set_if_present(c.RESTARTING, c.FALSE, c.ALL_RANKS_RUNNING, message)
        if not was_running:
            pp.event("Normal", c.ALL_RANKS_RUNNING, message)
        return

    reason, message = waiting_reason(pp, current, running, stale)
    if taken and reason in (c.PODS_PENDING, c.PODS_CREATING, c.WAITING_FOR_OLD_PODS):
        reason, message = c.POD_NAME_TAKEN, taken_message(taken)
    if restarting and reason in (c.PODS_PENDING, c.PODS_CREATING):
        reason = c.GANG_RESTART
    old = c.find(pp.old_conds, c.RUNNING) or {}
    pp.set(c.RUNNING, c.FALSE, reason, message)
    if reason in (
        c.UNSCHEDULABLE,
        c.IMAGE_PULL_FAILED,
        c.CONTAINER_CONFIG_ERROR,
        c.POD_NAME_TAKEN,
    ) and (old.get("reason") != reason):
        pp.event("Warning", reason, message)
    elif reason == c.WAITING_FOR_GANG and old.get("reason") != reason:
        pp.event("Normal", reason, message)


def names_taken(pp: PlanningPass, ranks: Sequence[int]) -> list[ObservedPod]:
    """Pods not this job's that hold the names its missing ranks need."""
    wanted = {children.pod_name(pp.name, r) for r in ranks}
    return [p for p in pp.foreign if p.name in wanted]


def taken_message(taken: Sequence[ObservedPod]) -> str:
    """Whose pods hold the job's names, and what frees them."""
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
    pp: PlanningPass,
    current: Sequence[ObservedPod],
    running: Sequence[ObservedPod],
    stale: Sequence[ObservedPod],
) -> tuple[str, str]:
    """(reason, message) of Running=False while not every rank runs: the first that applies."""
    n = pp.spec.nodes
    if pp.mechanism == api.GANG_NATIVE:
        waiting = admission.gang_waiting(pp, current)
        if waiting is not None:
            return waiting
    for p in current:
        if p.unschedulable:
            return c.UNSCHEDULABLE, f"pod {p.name} is unschedulable: {p.scheduled_message}"
    for p in current:
        if p.waiting_reason in _PULL_ERRORS:
            return c.IMAGE_PULL_FAILED, (
                f"pod {p.name} cannot pull {pp.spec.image}: {p.waiting_reason}: "
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
    due = c.parse_time(pp.next_attempt)
    if len(current) < n and due is not None and due > pp.now:
        return c.GANG_RESTART, (
            f"restart backoff: the pods of attempt {pp.attempt} are created at {pp.next_attempt}"
        )
    if len(current) < n:
        return c.PODS_CREATING, f"{len(current)}/{n} pods of attempt {pp.attempt} exist"
    return c.PODS_PENDING, f"{len(running)}/{n} ranks running (attempt {pp.attempt})"
