"""In-place gang restarts (``spec.runPolicy.restartStrategy``): the pods stay, the runs restart.

A Recreate restart deletes every pod and creates the gang again: scheduling, image and volume
setup, and maybe the node that failed. An InPlace attempt's pods carry the trainer restart
rule ``RestartAllContainers`` (KEP-5307/5532): the kubelet restarts every container of a pod
whose trainer failed, keeping the pod's UID, IP, volumes, devices and node. The operator then:

1. **moves** every pod of the ended attempt that can stay (alive, not evicted, not on a
   blamed node) to the next attempt: its attempt label, and the trainer's restart count the
   new run starts at (annotation ``gpujob.dev/restarts-base``). For a rank still running the
   old run, the move is the request to stop: its supervisor sees the label change, stops the
   run and exits (``contract.RESTART_EXIT_CODE``), and the rule restarts the pod in place.
   A pod that cannot stay is deleted and created again (Recreate for that pod; with a Native
   gang, whose PodGroup is per attempt, the whole gang is recreated instead).
2. **releases** the gang once no pod runs the old attempt any more (every moved pod
   restarted since its move, none restarting now, every rank present): annotation
   ``gpujob.dev/released-attempt``; each restarted supervisor waits for it, so no restarted
   rank meets a rank of the old attempt.
3. **falls back** for a pod that did not restart within ``inPlaceTimeoutSeconds`` of the last
   pass that moved pods (a wide gang's moves take several passes), or that
   ended (Succeeded or Failed) before it restarted: it is deleted and created again (Event
   ``InPlaceFallback``).

A successor operator finishes a move its predecessor began (``operatorState.inPlace``): an
old attempt's pod that can stay is moved, not deleted. The strategy of an attempt is decided
when its pods are created (:func:`decide`): InPlace where enough nodes that fit the pod declare
the ``RestartAllContainersOnContainerExits`` feature (the scheduler places such pods only
there) and the job has a command for the supervisor to run; else Recreate, with the reason in
``status.gang.restartStrategy``. Attempts, backoffLimit, goodput and the no-progress rule
count an in-place attempt as they count a recreated one; the kubelet's crash-loop back-off,
not the operator's restart back-off, spaces in-place restarts.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import Any, Final

from gpujob_operator import api
from gpujob_operator.api import children
from gpujob_operator.api import conditions as c
from gpujob_operator.lifecycle import blame, builders
from gpujob_operator.lifecycle.observations import RESTARTS_BASE, ObservedPod
from gpujob_operator.lifecycle.planpass import PlanningPass
from gpujob_trainer import contract

FEATURE: Final = "RestartAllContainersOnContainerExits"
"""The node feature (``status.declaredFeatures``) an in-place pod needs of its node."""
INPLACE: Final = "InPlace"
RECREATE: Final = "Recreate"
SUPERVISOR_MISSING: Final = ("No module named", "gpujob_trainer")
"""Words of a failure that says the image lacks the supervisor: later attempts recreate."""


def declares(node: Mapping[str, Any]) -> bool:
    """Whether the node declares the in-place restart feature."""
    features = (node.get("status") or {}).get("declaredFeatures") or ()
    return FEATURE in features


def _strategy(strategy: str, reason: str, message: str) -> dict[str, Any]:
    return {"strategy": strategy, "reason": reason, "message": c.clip(message, 1024)}


def decide(pp: PlanningPass, pod: Mapping[str, Any]) -> dict[str, Any]:
    """How the attempt whose first pod is ``pod`` restarts, and why (``restartStrategy``)."""
    rp = pp.spec.run_policy
    asked = rp.restart_strategy == INPLACE
    if rp.restart_strategy == RECREATE:
        return _strategy(RECREATE, "Requested", "spec.runPolicy.restartStrategy is Recreate")
    if pp.in_place_unsupported:
        return _strategy(RECREATE, "SupervisorMissing", pp.in_place_unsupported)
    if pp.mechanism == api.GANG_NATIVE:
        return _strategy(
            RECREATE,
            "NativeGang",
            "a Native gang's PodGroup belongs to one attempt: its pods are placed anew",
        )
    if not pp.spec.command:
        return _strategy(
            RECREATE,
            "NoCommand",
            "the job has no spec.command for the restart supervisor to run (an image's own "
            "entrypoint cannot be wrapped)",
        )
    if not asked and not builders.runs_python(pp.spec):
        return _strategy(
            RECREATE,
            "NoPython",
            f"spec.command[0] ({pp.spec.command[0]}) is not a Python interpreter, so the one "
            "that would run the restart supervisor is a guess; set restartStrategy InPlace to "
            "run it with python3",
        )
    view = pp.nodes
    if view is None or view.error is not None:
        why = view.error if view is not None and view.error else "the operator reads no nodes"
        return _strategy(
            RECREATE,
            c.NODES_UNKNOWN,
            f"whether the nodes declare {FEATURE} is unknown ({why})",
        )
    declaring = [n for n in view.nodes if declares(n)]
    needed = pp.spec.nodes
    held = min(sum(blame.holds(pod, declaring, needed).values()), needed)
    if held < needed:
        return _strategy(
            RECREATE,
            "FeatureNotDeclared",
            f"{len(declaring)} of {len(view.nodes)} nodes declare {FEATURE} and they hold "
            f"{held} of the gang's {needed} pods",
        )
    return _strategy(
        INPLACE,
        "Requested" if asked else "NodesDeclareIt",
        f"the gang's pods restart in place ({len(declaring)} nodes declare {FEATURE})",
    )


def use_in_place(pp: PlanningPass, first_pod: Mapping[str, Any]) -> bool:
    """Whether the pods the pass creates restart in place: as the attempt's pods that exist
    do, else as :func:`decide` says. Records the strategy, with a Warning when InPlace was
    asked for and cannot be had."""
    existing = pp.current
    if existing:
        in_place = any(p.in_place for p in existing)
        if pp.strategy is None or (pp.strategy.get("strategy") == INPLACE) != in_place:
            pp.strategy = _strategy(
                INPLACE if in_place else RECREATE, "Requested", "as the attempt's other pods"
            )
        return in_place
    new = decide(pp, first_pod)
    old = pp.strategy or {}
    if (
        pp.spec.run_policy.restart_strategy == INPLACE
        and new["strategy"] == RECREATE
        and (old.get("strategy"), old.get("reason")) != (RECREATE, new["reason"])
    ):
        pp.event(
            "Warning",
            c.IN_PLACE_FALLBACK,
            f"restartStrategy InPlace cannot be had: {new['message']}; attempt {pp.attempt} "
            "restarts by Recreate",
        )
    pp.strategy = new
    return bool(new["strategy"] == INPLACE)


def can_stay(pp: PlanningPass, pod: ObservedPod) -> bool:
    """Whether ``pod`` may restart in place for the next attempt."""
    avoided = (
        {str(a.get("node")) for a in pp.avoided} if pp.spec.run_policy.avoid_blamed_nodes else set()
    )
    return (
        pod.in_place
        and not pod.terminal
        and not pod.lingering
        and not pod.terminating
        and not pod.disruption
        and pod.node_rank is not None
        and 0 <= pod.node_rank < pp.spec.nodes
        and pod.node_name not in avoided
    )


def mark(
    pp: PlanningPass,
    pod: ObservedPod,
    annotations: Mapping[str, str],
    labels: Mapping[str, str] | None = None,
) -> None:
    """Patch ``pod``'s metadata (only while it is that pod: its uid)."""
    meta: dict[str, Any] = {"annotations": dict(annotations)}
    if labels:
        meta["labels"] = dict(labels)
    pp.pod_patches.append((pod.name, pod.uid, {"metadata": meta}))


def move(pp: PlanningPass, pod: ObservedPod) -> None:
    """Move ``pod`` to the current attempt: the restart count its new run starts at is the
    present one if the old run already ended, else the next one (the move stops the run)."""
    base = pod.restarts if pod.ended_in_place else pod.restarts + 1
    mark(pp, pod, {RESTARTS_BASE: str(base)}, {contract.LABEL_ATTEMPT: str(pp.attempt)})


def restart(pp: PlanningPass, ended: Sequence[ObservedPod]) -> str:
    """The pods of the attempt that just ended (``pp.attempt`` is already the next one):
    moved in place where they can be, deleted otherwise. Returns a clause for the restart's
    message."""
    stay = [p for p in ended if can_stay(pp, p)]
    if not stay:
        pp.delete(pp.pods)
        return ""
    go = [p for p in pp.pods if p not in stay]
    for p in stay:
        move(pp, p)
    pp.delete(go)
    kept = {p.node_rank for p in stay} | {p.node_rank for p in go if p in ended}
    gone = [
        f"{children.pod_name(pp.name, r)} (gone)" for r in range(pp.spec.nodes) if r not in kept
    ]
    pp.next_attempt = None  # the kubelet's back-off spaces in-place restarts
    pp.in_place_run = {"attempt": pp.attempt, "since": c.format_time(pp.now)}
    pp.in_place_restarts += 1
    clause = f"; in place: {len(stay)} pod(s) keep their nodes"
    recreated = [why_not(pp, p) for p in go if p in ended] + gone
    if recreated:
        clause += f", recreating {', '.join(r.split(' (')[0] for r in recreated)}"
        pp.event(
            "Warning",
            c.IN_PLACE_FALLBACK,
            f"attempt {pp.attempt}: recreating {', '.join(recreated)}; the others restart in place",
        )
    return clause


def why_not(pp: PlanningPass, pod: ObservedPod) -> str:
    """``pod`` and why it cannot restart in place."""
    if pod.terminating or pod.disruption:
        why = "being deleted or evicted"
    elif pod.terminal:
        why = f"its pod ended ({pod.phase})"
    elif not pod.in_place:
        why = "not an in-place pod"
    else:
        why = f"on blamed node {pod.node_name}"
    return f"{pod.name} ({why})"


_START_FAILURES: Final = frozenset({"StartError", "ContainerCannotRun"})
"""Container reasons of a command that could not start at all (no such interpreter)."""


def supervisor_missing(pp: PlanningPass, failed: ObservedPod | None) -> bool:
    """Whether the in-place pod ``failed`` failed because its image cannot run the supervisor
    (no ``gpujob_trainer``, no such interpreter); recorded, so that later attempts recreate."""
    if failed is None or not failed.in_place:
        return False
    failure = pp.failure or {}
    text = blame.failure_text(failure)
    no_module = all(w in text for w in SUPERVISOR_MISSING)
    no_start = failed.reason in _START_FAILURES or (
        failed.exit_code in (126, 127) and "gpujob supervisor" not in text
    )
    if not (no_module or no_start):
        return False
    pp.in_place_unsupported = c.clip(
        f"the image cannot run {contract.SUPERVISOR_MODULE} with "
        f"{builders.job_python(pp.spec)} ({failure.get('pod')}: {failure.get('message')}); "
        "install gpujob_trainer in the image for in-place restarts",
        1024,
    )
    pp.strategy = _strategy(RECREATE, "SupervisorMissing", pp.in_place_unsupported)
    return True


def hold(pp: PlanningPass, pods: Sequence[dict[str, Any]]) -> None:
    """Pods created while an in-place restart is under way wait for its release too (their
    peers may still be stopping their old runs)."""
    run = pp.in_place_run
    if run is None or run.get("attempt") != pp.attempt:
        return
    for pod in pods:
        pod["metadata"].setdefault("annotations", {})[contract.ANNOTATION_HOLD] = "true"


def rejoin_stale(pp: PlanningPass, stale: Sequence[ObservedPod]) -> list[ObservedPod]:
    """The stale pods to delete, less those an in-place restart under way moves (a move its
    predecessor began and did not finish, e.g. an operator restarted in between)."""
    run = pp.in_place_run
    if run is None or run.get("attempt") != pp.attempt:
        return list(stale)
    have = {p.node_rank for p in pp.current}
    out = []
    moved = False
    for p in stale:
        if p.attempt < pp.attempt and can_stay(pp, p) and p.node_rank not in have:
            move(pp, p)
            have.add(p.node_rank)
            moved = True
        else:
            out.append(p)
    if moved:
        # A wide gang's moves take several passes (512 pods: about a minute of patches on
        # a busy API server): a pod's inPlaceTimeoutSeconds counts from its move, not from
        # the restart's first pass, or the last pods moved get a fraction of it.
        pp.in_place_run = {**run, "since": c.format_time(pp.now)}
    return out


def converge(pp: PlanningPass) -> None:
    """The in-place restart under way: pods not restarted in time fall back to Recreate,
    and the gang is released once no pod runs the old attempt."""
    current = pp.current
    run = pp.in_place_run
    if run is not None and run.get("attempt") != pp.attempt:
        pp.in_place_run = run = None
    for p in current:
        if p.requested and p.restarts > p.restarts_base:
            # Restarted at its supervisor's word more often than the move counted on (the
            # operator's view of it lagged): its new run begins at the present count.
            mark(pp, p, {RESTARTS_BASE: str(p.restarts)})
    waiting = [
        p for p in current if p.in_place and p.restarts < p.restarts_base and not p.terminating
    ]
    ended = [p for p in waiting if p.terminal]
    if run is not None and ended:
        # Its old run ended on its own (its last steps, its own exit) before the move could
        # stop it: a pod that ended never restarts, so there is nothing to wait out.
        pp.event(
            "Warning",
            c.IN_PLACE_FALLBACK,
            f"{', '.join(f'{p.name} ({p.phase})' for p in ended)} ended before restarting "
            f"in place; recreating {'it' if len(ended) == 1 else 'them'} for attempt {pp.attempt}",
        )
        pp.delete(ended)
        return
    if run is not None and waiting:
        since = c.time_or_none(run.get("since")) or pp.now
        timeout = pp.spec.run_policy.in_place_timeout_seconds
        left = (since + timedelta(seconds=timeout) - pp.now).total_seconds()
        if left > 0:
            pp.requeue.append(left)
        else:
            names = ", ".join(p.name for p in waiting)
            pp.event(
                "Warning",
                c.IN_PLACE_FALLBACK,
                f"{names} did not restart in place within inPlaceTimeoutSeconds={timeout}; "
                f"recreating them for attempt {pp.attempt}",
            )
            pp.delete(waiting)
            return
    held = [p for p in current if p.at_barrier]
    moving = bool(pp.pod_patches)
    whole = len(current) == pp.spec.nodes
    if not held:
        if whole and not waiting and not moving:
            pp.in_place_run = None  # every pod runs the attempt: the restart is over
        return
    if not whole or waiting or moving or any(p.restarting_all or p.terminating for p in current):
        return
    for p in held:
        mark(pp, p, {contract.ANNOTATION_RELEASED: str(pp.attempt)})
    if run is not None:
        pp.event(
            "Normal",
            c.RESTARTED_IN_PLACE,
            f"all {pp.spec.nodes} pods of attempt {pp.attempt} restarted ({len(held)} in "
            "place); the gang is released",
        )
    pp.in_place_run = None
