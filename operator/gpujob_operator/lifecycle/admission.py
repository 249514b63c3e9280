"""Gang admission in the plan: whether the gang may have pods now, and joining pods to it.

The mechanism in effect (``status.gang.mechanism``, see :func:`.gang.gang.mechanism`) decides:

* Native: the cluster must serve ``scheduling.k8s.io`` Workload/PodGroup. The Workload and
  the attempt's PodGroup are ensured before its first pod (the previous attempt's group is
  deleted) and every pod names its group, so kube-scheduler binds the whole gang or none of
  it; while it holds the gang back, Running=False says WaitingForGang.
* Kueue: no pod exists until Kueue admits the job's Workload (created here, queued in the
  LocalQueue of the job's queue-name label, at its WorkloadPriorityClass). Admitted pods get
  the admitted flavors' node labels and tolerations; on eviction the pods are deleted and,
  once none is active, the quota is handed back so the Workload is requeued; the admitted
  gang's readiness is reported on the Workload (PodsReady, for ``waitForPodsReady``). A
  Workload that vanishes while the gang has pods (deleted by hand) is counted like an
  eviction: a Warning, a new attempt, the pods deleted, and a new Workload once they are gone.
* a failed read of the gang's objects never deletes pods: while the job has pods, they are
  kept with the last known admission, nothing is created, and the read is retried.
* while the gang may not run, :func:`hold` deletes its pods and Running=False says why
  (GangSchedulingUnavailable, QueueNameMissing, PriorityClassNotFound, Queued, Preempted,
  Evicted).

The gang objects themselves are built and read in :mod:`.gang.gang`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

from gpujob_operator import api
from gpujob_operator.api import conditions as c
from gpujob_operator.lifecycle import builders, retries
from gpujob_operator.lifecycle.gang import gang
from gpujob_operator.lifecycle.observations import MESSAGE_MAX_CHARS, ObservedPod, truncate
from gpujob_operator.lifecycle.planpass import PlanningPass

READ_RETRY_SECONDS: Final = 10.0
"""How soon a failed read of the gang's objects is tried again while the gang keeps its pods."""


def hold(pp: PlanningPass, reason: str, message: str, warn: bool = False) -> None:
    """The gang may not run now: no pod of it exists, Running=False says why."""
    old = c.find(pp.old_conds, c.RUNNING) or {}
    pp.delete(pp.pods)
    pp.set(c.RUNNING, c.FALSE, reason, message)
    pp.set_if_present(c.CREATED, c.FALSE, reason, message)
    if old.get("reason") != reason:
        pp.event("Warning" if warn else "Normal", reason, message)


def gang_admitted(pp: PlanningPass) -> bool:
    """Whether the gang may have pods now; when not, the status says why it waits."""
    pp.gang_status = {k: v for k, v in pp.gang_status.items() if k in ("preemptions", "mechanism")}
    pp.gang_status["mechanism"] = pp.mechanism
    if pp.gang_obs.error and pp.mechanism != api.GANG_NONE:
        if any(p.active for p in pp.pods):
            keep_admission(pp, pp.gang_obs.error)
            return False
        hold(
            pp,
            c.GANG_SCHEDULING_UNAVAILABLE,
            f"gang scheduling is {pp.mechanism} but the operator cannot read the job's "
            f"admission objects ({pp.gang_obs.error}); is the API installed and the "
            f"operator allowed to use it (chart: gang.native/gang.kueue.enabled)? No pod "
            "is created until it can",
            warn=True,
        )
        return False
    if pp.mechanism == api.GANG_NATIVE:
        if pp.gang_obs.native_version is None:
            hold(
                pp,
                c.GANG_SCHEDULING_UNAVAILABLE,
                "gang scheduling is Native but the cluster serves no scheduling.k8s.io "
                "Workload/PodGroup API (kube-apiserver, kube-scheduler and "
                "kube-controller-manager need --feature-gates=GenericWorkload=true and the "
                "API needs --runtime-config=scheduling.k8s.io/v1beta1=true); no pod is "
                "created until it does",
                warn=True,
            )
            return False
        pp.gang_status["workload"] = gang.native_workload_name(pp.name)
        return True
    if pp.mechanism == api.GANG_KUEUE:
        return kueue_admitted(pp)
    return True


def keep_admission(pp: PlanningPass, error: str) -> None:
    """The gang's objects could not be read but it has pods: a read that failed says nothing
    about the admission, so keep the pods and the last known admission, create nothing, warn
    once, and read again soon."""
    old = dict(pp.old_status.get("gang") or {})
    pp.gang_status = {**old, "mechanism": pp.mechanism, "readError": truncate(error, 1024)}
    if not old.get("readError"):
        pods = sum(1 for p in pp.pods if p.active)
        message = (
            f"cannot read the job's {pp.mechanism} admission objects ({error}); its {pods} "
            "pod(s) are kept with the last known admission and nothing is created until a "
            f"read succeeds (retried every {READ_RETRY_SECONDS:g}s)"
        )
        pp.event(
            "Warning", c.GANG_SCHEDULING_UNAVAILABLE, truncate(message, MESSAGE_MAX_CHARS) or ""
        )
    pp.requeue.append(READ_RETRY_SECONDS)


def workload_lost(pp: PlanningPass, queue: str) -> bool:
    """Kueue: the job's Workload is gone while its gang has pods, or was found gone and its
    pods are still going; True while the new Workload must wait.

    Gone while pods of the current attempt exist means someone deleted it (a 404 is the
    server's word, not a failed read): like an eviction, the attempt ends (a new one, so the
    monitor never mixes two gangs' windows), ``preemptions`` counts it, a Warning says so and
    the pods are deleted; the new Workload is created once none is active, so the quota is
    never asked for twice.
    """
    old = c.find(pp.old_conds, c.RUNNING) or {}
    name = gang.kueue_workload_name(pp.body)
    if pp.current:
        ended = pp.attempt
        pp.attempt += 1
        pp.gang_status["preemptions"] = int(pp.gang_status.get("preemptions") or 0) + 1
        message = (
            f"the job's Kueue Workload {name} is gone (deleted) while attempt {ended} ran; "
            f"its pods are deleted and, once they are gone, a new Workload queues the job in "
            f"LocalQueue {queue} again (attempt {pp.attempt})"
        )
        hold(pp, c.WORKLOAD_DELETED, message, warn=True)
        return True
    if old.get("reason") != c.WORKLOAD_DELETED:
        return False
    if any(p.active for p in pp.pods):
        pp.set(c.RUNNING, c.FALSE, c.WORKLOAD_DELETED, str(old.get("message") or ""))
        pp.delete(pp.pods)
        return True
    return False


def kueue_admitted(pp: PlanningPass) -> bool:
    """Kueue: whether the job's Workload is admitted; until then it is created and waited for."""
    queue = gang.queue_name(pp.body)
    st = pp.kueue
    wl = pp.gang_obs.kueue_workload
    pp.gang_status.update(
        {
            "queue": queue,
            "workload": gang.kueue_workload_name(pp.body),
            "admitted": st.admitted and not st.evicted,
            "clusterQueue": st.cluster_queue if st.admitted else None,
            "flavors": st.flavors if st.admitted and st.flavors else None,
        }
    )
    if queue is None:
        hold(
            pp,
            c.QUEUE_NAME_MISSING,
            f"gang scheduling is Kueue but the job has no {api.KUEUE_QUEUE_LABEL} label "
            "naming its LocalQueue; no pod is created",
            warn=True,
        )
        return False
    if wl is None and workload_lost(pp, queue):
        return False
    if wl is not None and str((pp.denial or {}).get("target", "")).startswith("Workload "):
        pp.denial = None  # the Workload's create went through
    if wl is not None and pp.refused is not None and pp.refused.target.startswith("Workload "):
        pp.refused = None  # the Workload exists: its refusal (resumed after a restart) is over
    if wl is None:
        pclass = gang.priority_class(pp.body)
        if pclass and pp.gang_obs.kueue_priority is None:
            hold(
                pp,
                c.PRIORITY_CLASS_NOT_FOUND,
                f"the job's {api.KUEUE_PRIORITY_LABEL} label names WorkloadPriorityClass "
                f"{pclass}, which does not exist; no pod is created",
                warn=True,
            )
            return False
        refused = pp.refused
        if refused is not None and retries.gives_up(pp, refused):
            retries.fail_refused(pp, refused, pp.current)
            return False
        if refused is not None and refused.retry_at > pp.now:
            pp.requeue.append((refused.retry_at - pp.now).total_seconds())
        else:
            template = builders.build_pod(pp.body, 0, pp.attempt, pp.spec)
            pp.ensure.append(
                gang.build_kueue_workload(
                    pp.body, pp.spec, template, queue, pp.gang_obs.kueue_priority
                )
            )
        if refused is not None:
            hold(pp, refused.refusal.reason, retries.refused_message(pp, refused), warn=True)
        elif (c.find(pp.old_conds, c.RUNNING) or {}).get("reason") == c.WORKLOAD_DELETED:
            message = f"queued in LocalQueue {queue}: creating its Kueue Workload again"
            pp.set(c.RUNNING, c.FALSE, c.WORKLOAD_DELETED, message)
        else:
            hold(pp, c.QUEUED, f"queued in LocalQueue {queue}: creating its Kueue Workload")
        return False
    if pp.current and (st.evicted or not st.admitted):
        # The gang loses its admission: whatever is left of it is stale from now on.
        pp.attempt += 1
        if st.evicted:
            pp.gang_status["preemptions"] = int(pp.gang_status.get("preemptions") or 0) + 1
    if st.evicted and (st.quota_reserved or st.admitted):
        reason = c.PREEMPTED if st.evicted_reason == gang.KUEUE_PREEMPTED else c.EVICTED
        message = (
            f"Kueue evicted the job ({st.evicted_reason}: {st.evicted_message}); its pods "
            f"are deleted and it waits in LocalQueue {queue} to be admitted again"
        )
        hold(pp, reason, message)
        if not any(p.active for p in pp.pods):
            now = c.format_time(pp.now)
            pp.patches.append((gang.ref_of(wl), gang.release_quota_patch(wl, now)))
        return False
    if not st.admitted:
        old = c.find(pp.old_conds, c.RUNNING) or {}
        detail = f": {st.pending_message}" if st.pending_message else ""
        message = f"queued in LocalQueue {queue}, waiting for Kueue to admit it{detail}"
        if old.get("reason") in (c.PREEMPTED, c.EVICTED, c.WORKLOAD_DELETED):
            pp.set(c.RUNNING, c.FALSE, str(old["reason"]), message)
            pp.delete(pp.pods)
            return False
        hold(pp, c.QUEUED, message)
        return False
    return True


def sync_pods_ready(pp: PlanningPass) -> None:
    """Kueue: report the admitted gang's readiness on its Workload (waitForPodsReady)."""
    wl = pp.gang_obs.kueue_workload
    st = pp.kueue
    if pp.mechanism != api.GANG_KUEUE or wl is None or not st.admitted or st.evicted:
        return
    if st.finished or c.is_finished(pp.conds) or pp.patches:
        return
    running = c.is_true(pp.conds, c.RUNNING)
    patch = gang.pods_ready_patch(wl, running, c.format_time(pp.now))
    if patch is not None:
        pp.patches.append((gang.ref_of(wl), patch))


def build_pod(pp: PlanningPass, rank: int, in_place: bool = False) -> dict[str, Any]:
    """Pod ``rank`` of the current attempt, joined to its gang's admission (restarting in
    place, or not)."""
    pod = pp.place(builders.build_pod(pp.body, rank, pp.attempt, pp.spec, in_place))
    if pp.mechanism == api.GANG_NATIVE and pp.gang_obs.native_version:
        version = pp.gang_obs.native_version
        if not pp.ensure:
            pp.ensure += [
                gang.build_native_workload(pp.body, pp.spec, version),
                gang.build_pod_group(pp.body, pp.spec, pp.attempt, version),
            ]
            if pp.attempt > 0:
                prev = gang.build_pod_group(pp.body, pp.spec, pp.attempt - 1, version)
                pp.delete_refs.append(gang.ref_of(prev))
        gang.join_pod_group(pod, gang.pod_group_name(pp.name, pp.attempt))
    elif pp.mechanism == api.GANG_KUEUE:
        gang.apply_admission(pod, pp.kueue, pp.gang_obs.flavors)
    return pod


def gang_waiting(pp: PlanningPass, current: Sequence[ObservedPod]) -> tuple[str, str] | None:
    """WaitingForGang once the scheduler has held the whole gang back, with its reason.

    The scheduler's word is the PodGroup's PodGroupInitiallyScheduled=False condition,
    else a member pod's PodScheduled=False; pods just created (no word yet) are only
    PodsPending.
    """
    unbound = [p for p in current if not p.node_name and p.active]
    if not unbound or len(current) < pp.spec.nodes:
        return None
    why = gang.pod_group_waiting(pp.gang_obs.pod_group)
    detail = why[1] if why else None
    if detail is None:
        detail = next((p.scheduled_message for p in unbound if p.scheduled_reason), None)
        if detail is None:
            return None
    group = gang.pod_group_name(pp.name, pp.attempt)
    message = (
        f"gang {group} waits for room for all {pp.spec.nodes} pods at once "
        f"({len(current) - len(unbound)}/{pp.spec.nodes} bound)"
    )
    return c.WAITING_FOR_GANG, f"{message}: {detail}" if detail else message
