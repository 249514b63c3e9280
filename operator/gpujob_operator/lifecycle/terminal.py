"""Terminal states and what follows them: success, failure, cleanup, TTL and the deadline.

* every rank of the current attempt exiting 0 succeeds the job (AllRanksSucceeded); a
  policy that gives up (backoffLimit, a non-retryable exit code, a permanent refusal, the
  deadline) fails it through :func:`finish`.
* ``activeDeadlineSeconds`` counts from ``startTime``, which a resume resets, so suspension
  is excluded (as for batch/v1 Job); past it every active pod is deleted and the job fails
  (DeadlineExceeded).
* at the end ``cleanPodPolicy`` decides which pods go (stale pods always go), a Kueue job's
  Workload is marked Finished so its quota is handed back, and ``ttlSecondsAfterFinished``
  asks for the job's deletion (``Plan.delete_job``).
"""

from __future__ import annotations

from gpujob_operator import api
from gpujob_operator.api import conditions as c
from gpujob_operator.lifecycle.gang import gang
from gpujob_operator.lifecycle.planpass import PlanningPass


def finish(pp: PlanningPass, succeeded: bool, reason: str, message: str) -> None:
    """The job ends now: Succeeded or Failed, then cleanup, the quota and the TTL."""
    if len(pp.current) == pp.spec.nodes:
        pp.gang_exists()  # the whole gang may have run and ended between two passes
    if succeeded:
        pp.set(c.SUCCEEDED, c.TRUE, reason, message)
        pp.set(c.RUNNING, c.FALSE, c.JOB_SUCCEEDED, message)
        pp.event("Normal", reason, message)
    else:
        pp.set(c.FAILED, c.TRUE, reason, message)
        pp.set(c.RUNNING, c.FALSE, c.JOB_FAILED, message)
        pp.event("Warning", reason, message)
    done = c.JOB_SUCCEEDED if succeeded else c.JOB_FAILED
    pp.set_if_present(c.RESTARTING, c.FALSE, done, message)
    pp.completion_time = pp.completion_time or c.format_time(pp.now)
    cleanup(pp)
    release_kueue(pp, succeeded, message)
    ttl_after_finished(pp)


def cleanup(pp: PlanningPass) -> None:
    """cleanPodPolicy at the end; stale pods, and pods whose trainer exited while a further
    container keeps them running (holding their GPUs), go whatever the policy."""
    policy = pp.spec.run_policy.clean_pod_policy
    pp.delete(pp.stale)
    pp.delete([p for p in pp.pods if p.lingering])
    # A pod that restarts in place would start a run again (or wait at its barrier, holding
    # its GPUs): it goes whatever the policy. Its failure is kept in status.failure.
    pp.delete([p for p in pp.pods if p.in_place and not p.terminal])
    if policy == "All":
        pp.delete(pp.pods)
    elif policy == "Running":
        pp.delete([p for p in pp.pods if p.active])


def finished(pp: PlanningPass) -> None:
    """Already Succeeded/Failed: cleanup and TTL only."""
    if pp.completion_time is None:
        pp.completion_time = c.format_time(pp.now)
    cleanup(pp)
    release_kueue(pp, c.is_true(pp.conds, c.SUCCEEDED), "the job finished")
    ttl_after_finished(pp)


def release_kueue(pp: PlanningPass, succeeded: bool, message: str) -> None:
    """A finished job hands its Kueue quota back (Workload Finished=True)."""
    wl = pp.gang_obs.kueue_workload
    if pp.mechanism != api.GANG_KUEUE or wl is None or pp.kueue.finished:
        return
    now = c.format_time(pp.now)
    pp.patches.append((gang.ref_of(wl), gang.finish_patch(wl, succeeded, message, now)))
    pp.gang_status["admitted"] = False


def ttl_after_finished(pp: PlanningPass) -> None:
    """Ask for the job's deletion once ttlSecondsAfterFinished has passed."""
    ttl = pp.spec.run_policy.ttl_seconds_after_finished
    done_at = c.parse_time(pp.completion_time)
    if ttl is None or done_at is None:
        return
    left = ttl - (pp.now - done_at).total_seconds()
    if left > 0:
        pp.requeue.append(left)
        return
    pp.delete_job = True
    pp.event("Normal", c.TTL_EXPIRED, f"deleting the job {ttl}s after it finished")


def deadline_exceeded(pp: PlanningPass) -> bool:
    """Fail the job once it ran activeDeadlineSeconds (suspension excluded); True if it did."""
    limit = pp.spec.run_policy.active_deadline_seconds
    started = c.parse_time(pp.start_time)
    if limit is None or started is None or c.is_true(pp.conds, c.SUSPENDED):
        return False
    if pp.spec.run_policy.suspend:
        return False
    left = limit - (pp.now - started).total_seconds()
    if left > 0:
        pp.requeue.append(left)
        return False
    message = f"job ran longer than activeDeadlineSeconds={limit}"
    pp.failure = {"reason": c.DEADLINE_EXCEEDED, "message": message}
    # Stop every active pod whatever the policy; cleanup() handles the rest.
    pp.delete([p for p in pp.pods if p.active])
    finish(pp, False, c.DEADLINE_EXCEEDED, message)
    return True


def all_ranks_succeeded(pp: PlanningPass) -> bool:
    """Every rank of the current attempt exited 0: the job succeeds; True when it did."""
    current = pp.current
    if current and all(p.phase == "Succeeded" for p in current) and (len(current) == pp.spec.nodes):
        finish(
            pp,
            True,
            c.ALL_RANKS_SUCCEEDED,
            f"all {pp.spec.nodes} ranks exited 0 (attempt {pp.attempt})",
        )
        return True
    return False
