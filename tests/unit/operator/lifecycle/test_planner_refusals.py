"""The planner's side of refusals and backoff: what a refused create and a gang restart look like.

The shell (the job loop) remembers the latest refused create (:class:`refusals.Refused`) and
hands it to the pure planner; these tests play that shell with the planner tests' ``Sim``.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from gpujob_operator import api
from gpujob_operator.api import conditions as c
from gpujob_operator.lifecycle import backoff
from gpujob_operator.lifecycle.apiserver import refusals
from tests.unit.operator.lifecycle.test_planner import T0, Sim, cond, make_job

QUOTA = refusals.Refusal(
    c.QUOTA_EXCEEDED,
    False,
    'pods "bert-node-1" is forbidden: exceeded quota: gpu, requested: requests.nvidia.com/gpu=8, '
    "used: requests.nvidia.com/gpu=8, limited: requests.nvidia.com/gpu=8",
    403,
)
INVALID = refusals.Refusal(
    c.INVALID_POD_TEMPLATE,
    True,
    'Pod "bert-node-0" is invalid: metadata.annotations: Too long: may not be more than 262144 bytes',
    422,
)


def state(status: dict[str, Any]) -> dict[str, Any]:
    """``status.operatorState``: the operator's bookkeeping (absent when it keeps none)."""
    return dict(status.get("operatorState") or {})


def refused(
    r: refusals.Refusal, target: str, since_s: float, retry_s: float, tries: int = 1
) -> refusals.Refused:
    return refusals.Refused(
        r, target, T0 + timedelta(seconds=since_s), T0 + timedelta(seconds=retry_s), tries
    )


def refused_whole_gang(sim: Sim, r: refusals.Refusal, retry_s: float = 2.0) -> None:
    """The first pass planned the gang; the dry run refused it, so nothing exists."""
    p = sim.reconcile()
    assert len(p.create_pods) == 2
    sim.pods.clear()
    sim.refused = refused(r, "pod bert-node-1", 0, retry_s)


def test_a_transient_refusal_shows_its_reason_and_message_and_waits_for_the_retry() -> None:
    sim = Sim(make_job(nodes=2, gpusPerNode=8))
    refused_whole_gang(sim, QUOTA)
    p = sim.reconcile()
    assert not p.create_pods and p.requeue_after == 2.0
    st = sim.status
    for type_ in (c.CREATED, c.RUNNING):
        assert cond(st, type_)["reason"] == c.QUOTA_EXCEEDED
        assert "exceeded quota: gpu" in cond(st, type_)["message"]
    assert st["phase"] == "Pending" and st["gang"]["nextAttemptTime"] == "2026-03-01T12:00:02Z"
    warning = [e for e in sim.events if e.reason == c.QUOTA_EXCEEDED]
    assert len(warning) == 1 and warning[0].type == "Warning"
    assert "creating pod bert-node-1 was refused (403): pods" in warning[0].message
    # Planning again before the retry is due changes nothing and warns no more.
    sim.now += timedelta(seconds=1)
    assert not sim.reconcile().create_pods
    assert [e.reason for e in sim.events].count(c.QUOTA_EXCEEDED) == 1
    api.parse_status(sim.status)  # the model accepts the new field


def test_when_the_retry_is_due_the_whole_gang_is_planned_and_success_clears_it() -> None:
    sim = Sim(make_job(nodes=2, gpusPerNode=8))
    refused_whole_gang(sim, QUOTA)
    sim.reconcile()
    sim.now += timedelta(seconds=2)
    p = sim.reconcile()
    assert [x["metadata"]["name"] for x in p.create_pods] == ["bert-node-0", "bert-node-1"]
    # The refusal stays visible while the retry is in flight ...
    assert cond(sim.status, c.CREATED)["reason"] == c.QUOTA_EXCEEDED
    # ... and the shell forgets it once every create succeeded: the condition is cleared.
    sim.refused = None
    sim.reconcile()
    assert cond(sim.status, c.CREATED)["reason"] == c.PODS_CREATED
    assert cond(sim.status, c.RUNNING)["reason"] == c.PODS_PENDING
    assert "nextAttemptTime" not in sim.status["gang"]
    sim.run_all()
    sim.reconcile()
    assert sim.status["phase"] == "Running"


def test_a_partial_gang_is_deleted_after_the_grace_so_a_waiting_job_holds_nothing() -> None:
    sim = Sim(make_job(nodes=2, gpusPerNode=8))
    sim.reconcile()
    del sim.pods["bert-node-1"]  # pod 0 was created, pod 1 refused by the quota
    sim.refused = refused(QUOTA, "pod bert-node-1", 0, 1)
    p = sim.reconcile()
    assert not p.delete_pods and p.requeue_after == 1.0
    sim.now += timedelta(seconds=1)
    p = sim.reconcile()
    assert [x["metadata"]["name"] for x in p.create_pods] == ["bert-node-1"]
    del sim.pods["bert-node-1"]  # refused again
    sim.refused = refused(QUOTA, "pod bert-node-1", 0, 5, tries=2)
    sim.now = T0 + timedelta(seconds=planner_grace())
    p = sim.reconcile()
    assert p.delete_pods == ["bert-node-0"] and not p.create_pods
    assert c.GANG_RELEASED in sim.reasons()
    # Nothing is created while the released pod terminates, even when the retry is due.
    sim.now += timedelta(seconds=5)
    p = sim.reconcile()
    assert not p.create_pods and not p.delete_pods
    assert cond(sim.status, c.CREATED)["reason"] == c.QUOTA_EXCEEDED
    sim.gc()
    p = sim.reconcile()
    assert [x["metadata"]["name"] for x in p.create_pods] == ["bert-node-0", "bert-node-1"]


def planner_grace() -> float:
    from gpujob_operator.lifecycle import planner

    return planner.GANG_GRACE_SECONDS


def test_a_permanent_refusal_fails_the_job_with_its_reason_and_keeps_no_pod() -> None:
    sim = Sim(make_job(nodes=2, gpusPerNode=8))
    sim.reconcile()
    del sim.pods["bert-node-1"]
    sim.refused = refused(INVALID, "pod bert-node-1", 0, 0)
    p = sim.reconcile()
    assert p.delete_pods == ["bert-node-0"] and not p.create_pods
    st = sim.status
    assert st["phase"] == "Failed"
    assert cond(st, c.FAILED)["reason"] == c.INVALID_POD_TEMPLATE
    assert "metadata.annotations: Too long" in cond(st, c.FAILED)["message"]
    assert st["failure"]["reason"] == c.INVALID_POD_TEMPLATE
    assert st["failure"]["pod"] == "bert-node-1"
    assert "metadata.annotations" in st["failure"]["message"]
    assert "nextAttemptTime" not in st["gang"]
    assert [e.type for e in sim.events if e.reason == c.INVALID_POD_TEMPLATE] == ["Warning"]
    # A finished job ignores what the shell still remembers.
    assert not sim.reconcile().create_pods


def test_a_refused_service_waits_for_its_retry_too() -> None:
    sim = Sim(make_job(nodes=2, gpusPerNode=8))
    p = sim.reconcile()
    assert p.create_service is not None
    sim.pods.clear()
    sim.service = False
    throttled = refusals.Refusal(c.API_THROTTLED, False, "too many requests", 429)
    sim.refused = refused(throttled, "service bert", 0, 4)
    p = sim.reconcile()
    assert p.create_service is None and not p.create_pods
    assert "creating service bert was refused (429)" in cond(sim.status, c.CREATED)["message"]
    sim.now += timedelta(seconds=4)
    p = sim.reconcile()
    assert p.create_service is not None and len(p.create_pods) == 2


def test_gang_restarts_back_off_exponentially_and_status_says_when() -> None:
    sim = Sim(make_job(nodes=2, gpusPerNode=8, runPolicy={"backoffLimit": 5}))
    sim.restart_backoff = backoff.Policy(10.0, 25.0)
    sim.reconcile()
    sim.run_all()
    sim.reconcile()
    waits = []
    for restart in (1, 2, 3):
        sim.fail("bert-node-1", code=1)
        failed_at = sim.now
        sim.reconcile()
        assert sim.status["gang"]["restarts"] == restart
        nat = c.parse_time(sim.status["gang"]["nextAttemptTime"])
        assert nat is not None
        waits.append((nat - failed_at).total_seconds())
        assert (
            f"at {sim.status['gang']['nextAttemptTime']}"
            in cond(sim.status, c.RESTARTING)["message"]
        )
        sim.gc()
        p = sim.reconcile()
        assert not p.create_pods and p.requeue_after == waits[-1]
        assert cond(sim.status, c.RUNNING)["reason"] == c.GANG_RESTART
        assert "restart backoff" in cond(sim.status, c.RUNNING)["message"]
        sim.now = nat
        p = sim.reconcile()
        assert len(p.create_pods) == 2
        sim.reconcile()
        assert "nextAttemptTime" not in sim.status["gang"]
        sim.run_all()
        sim.reconcile()
        assert sim.status["phase"] == "Running"
    assert waits == [10.0, 20.0, 25.0]


def classified(code: int, message: str) -> refusals.Refusal:
    """A refusal as the classifier reads the API server's metav1.Status."""
    body = {"kind": "Status", "status": "Failure", "message": message, "code": code}
    return refusals.classify(code, body)


MUST_SPECIFY = classified(
    403,
    'pods "bert-node-0" is forbidden: failed quota: compute-resources: must specify '
    "limits.cpu,limits.memory",
)
DENIED = classified(
    403,
    'admission webhook "budget.example.com" denied the request: GPU budget of team ml spent '
    "for now",
)


def test_a_quota_that_requires_limits_fails_the_job_and_says_what_to_set() -> None:
    sim = Sim(make_job(nodes=2, gpusPerNode=8))
    refused_whole_gang(sim, MUST_SPECIFY)
    p = sim.reconcile()
    assert not p.create_pods and not p.requeue_after
    st = sim.status
    assert st["phase"] == "Failed" and "nextAttemptTime" not in st["gang"]
    failed = cond(st, c.FAILED)
    assert failed["reason"] == c.QUOTA_REQUIREMENTS_UNMET == st["failure"]["reason"]
    assert "ResourceQuota compute-resources requires every container" in failed["message"]
    assert "spec.resources.limits.cpu, spec.resources.limits.memory" in failed["message"]
    assert [e.type for e in sim.events if e.reason == c.QUOTA_REQUIREMENTS_UNMET] == ["Warning"]


def denied_job(window: int | None = 60) -> Sim:
    run_policy = {} if window is None else {"admissionRetrySeconds": window}
    sim = Sim(make_job(nodes=2, gpusPerNode=8, runPolicy=run_policy))
    refused_whole_gang(sim, DENIED, retry_s=2)
    return sim


def test_a_webhooks_denial_is_retried_and_the_condition_says_until_when() -> None:
    sim = denied_job(60)
    p = sim.reconcile()
    assert not p.create_pods and p.requeue_after == 2.0
    st = sim.status
    assert st["phase"] == "Pending" and c.FAILED not in {x["type"] for x in st["conditions"]}
    message = cond(st, c.CREATED)["message"]
    assert cond(st, c.CREATED)["reason"] == c.ADMISSION_WEBHOOK_DENIED
    assert "GPU budget of team ml spent" in message
    assert "retried until 2026-03-01T12:01:00Z (spec.runPolicy.admissionRetrySeconds: 60" in message
    assert "retrying at 2026-03-01T12:00:02Z" in message
    assert st["operatorState"]["admissionDenial"] == {
        "since": "2026-03-01T12:00:00Z",
        "target": "pod bert-node-1",
    }
    sim.now += timedelta(seconds=2)
    assert len(sim.reconcile().create_pods) == 2  # the retry is due: the gang is tried again


def test_a_webhooks_denial_fails_the_job_once_retried_for_its_window() -> None:
    sim = denied_job(60)
    sim.reconcile()
    # Denied again and again; the retry after the window's end is due past it.
    sim.refused = refused(DENIED, "pod bert-node-1", 0, 90, tries=6)
    sim.now = T0 + timedelta(seconds=59)
    p = sim.reconcile()
    assert sim.status["phase"] == "Pending" and p.requeue_after == 1.0  # the window's end
    sim.now = T0 + timedelta(seconds=60)
    p = sim.reconcile()
    st = sim.status
    assert st["phase"] == "Failed" and not p.create_pods
    failed = cond(st, c.FAILED)
    assert failed["reason"] == c.ADMISSION_WEBHOOK_DENIED == st["failure"]["reason"]
    assert "GPU budget of team ml spent" in failed["message"]
    assert "denied since 2026-03-01T12:00:00Z and retried for 60s" in failed["message"]
    assert "admissionRetrySeconds: 60): giving up" in failed["message"]
    assert "admissionDenial" not in state(st)


def test_a_window_of_zero_fails_at_the_first_denial() -> None:
    sim = denied_job(0)
    sim.reconcile()
    failed = cond(sim.status, c.FAILED)
    assert failed["reason"] == c.ADMISSION_WEBHOOK_DENIED
    assert "not retried (spec.runPolicy.admissionRetrySeconds: 0)" in failed["message"]


def test_the_default_window_is_ten_minutes() -> None:
    assert api.parse_spec(make_job()["spec"]).run_policy.admission_retry_seconds == 600
    sim = denied_job(None)
    sim.reconcile()
    assert "retried until 2026-03-01T12:10:00Z" in cond(sim.status, c.CREATED)["message"]


def test_an_operator_restart_does_not_restart_the_denials_window() -> None:
    sim = denied_job(60)
    sim.reconcile()
    # The operator restarts: the shell remembers nothing, the status still does.
    sim.refused = None
    sim.now = T0 + timedelta(seconds=50)
    sim.reconcile()
    assert sim.status["operatorState"]["admissionDenial"]["since"] == "2026-03-01T12:00:00Z"
    # The new process's first retry is denied: its own run starts now, the status's earlier.
    sim.pods.clear()
    sim.refused = refused(DENIED, "pod bert-node-0", 50, 52)
    sim.reconcile()
    assert sim.status["phase"] == "Pending"
    assert "denied since 2026-03-01T12:00:00Z" in cond(sim.status, c.CREATED)["message"]
    sim.now = T0 + timedelta(seconds=61)
    sim.reconcile()
    assert sim.status["phase"] == "Failed"
    assert "retried for 61s" in cond(sim.status, c.FAILED)["message"]


def test_created_pods_or_another_refusal_end_the_run_of_denials() -> None:
    sim = denied_job(60)
    sim.reconcile()
    sim.refused = refused(QUOTA, "pod bert-node-1", 1, 3)
    sim.reconcile()
    assert "admissionDenial" not in state(sim.status)  # a full quota is no webhook's denial
    sim.refused = refused(DENIED, "pod bert-node-1", 2, 4)
    sim.reconcile()
    assert sim.status["operatorState"]["admissionDenial"]["since"] == "2026-03-01T12:00:02Z"
    sim.now = T0 + timedelta(seconds=4)
    sim.reconcile()
    sim.refused = None  # every create went through
    sim.reconcile()
    assert cond(sim.status, c.CREATED)["reason"] == c.PODS_CREATED
    assert "admissionDenial" not in state(sim.status)


def restarted(sim: Sim) -> None:
    """The operator restarts: the shell remembers no refusal, only the status does."""
    sim.refused = None


def test_a_restart_resumes_the_backoff_from_the_status_instead_of_trying_at_once() -> None:
    sim = Sim(make_job(nodes=2, gpusPerNode=8))
    refused_whole_gang(sim, QUOTA)
    sim.refused = refused(QUOTA, "pod bert-node-1", 0, 30, tries=4)
    sim.reconcile()
    record = sim.status["operatorState"]["createBackoff"]
    assert record["tries"] == 4 and record["retryAt"] == "2026-03-01T12:00:30Z"
    assert record["since"] == "2026-03-01T12:00:00Z" and record["reason"] == c.QUOTA_EXCEEDED
    api.parse_status(sim.status)
    restarted(sim)
    events = len(sim.events)
    sim.now = T0 + timedelta(seconds=10)
    p = sim.reconcile()
    assert not p.create_pods and p.requeue_after == 20.0
    assert sim.status["operatorState"]["createBackoff"] == record
    assert cond(sim.status, c.CREATED)["reason"] == c.QUOTA_EXCEEDED
    assert len(sim.events) == events  # the same refusal, not a new Warning
    sim.now = T0 + timedelta(seconds=29)
    assert not sim.reconcile().create_pods
    sim.now = T0 + timedelta(seconds=30)
    assert len(sim.reconcile().create_pods) == 2
    # The shell's next refusal continues the run: the 5th try, twice the 4th's delay.
    prev = refusals.resume(sim.status["operatorState"]["createBackoff"])
    assert prev is not None and prev.tries == 4
    nxt = refusals.next_refused(prev, "pod bert-node-1", QUOTA, sim.now, backoff.RETRY.delay(5))
    assert nxt.tries == 5 and nxt.since == T0
    assert backoff.RETRY.delay(5) == 2 * backoff.RETRY.delay(4)


def test_a_shell_that_tried_does_not_resume_a_stale_record() -> None:
    sim = Sim(make_job(nodes=2, gpusPerNode=8))
    refused_whole_gang(sim, QUOTA)
    sim.refused = refused(QUOTA, "pod bert-node-1", 0, 30, tries=4)
    sim.reconcile()
    p = planner_plan(sim, resume_backoff=False)
    assert "createBackoff" not in state(p.status)


def planner_plan(sim: Sim, *, resume_backoff: bool) -> Any:
    from gpujob_operator.lifecycle import planner

    return planner.plan(
        sim.job, sim.observed(), sim.now, service_exists=sim.service, refused=None,
        resume_backoff=resume_backoff,
    )  # fmt: skip


def test_the_gangs_grace_start_is_kept_across_a_restart() -> None:
    sim = Sim(make_job(nodes=2, gpusPerNode=8))
    sim.reconcile()
    del sim.pods["bert-node-1"]  # pod 0 was created, pod 1 refused by the quota
    grace = planner_grace()
    sim.refused = refused(QUOTA, "pod bert-node-1", 0, grace + 30, tries=6)
    sim.reconcile()
    restarted(sim)
    sim.now = T0 + timedelta(seconds=grace - 1)
    p = sim.reconcile()
    assert not p.delete_pods and not p.create_pods and p.requeue_after == 1.0
    assert sim.status["operatorState"]["createBackoff"]["since"] == "2026-03-01T12:00:00Z"
    sim.now = T0 + timedelta(seconds=grace)
    p = sim.reconcile()
    assert p.delete_pods == ["bert-node-0"] and c.GANG_RELEASED in sim.reasons()


def test_the_record_ends_once_every_pod_exists_or_the_job_finishes() -> None:
    sim = Sim(make_job(nodes=2, gpusPerNode=8))
    refused_whole_gang(sim, QUOTA)
    sim.reconcile()
    assert "createBackoff" in state(sim.status)
    sim.now += timedelta(seconds=2)
    sim.reconcile()  # the retry creates both pods
    restarted(sim)
    sim.reconcile()
    assert "createBackoff" not in state(sim.status)
    assert cond(sim.status, c.CREATED)["reason"] == c.PODS_CREATED


def test_a_record_round_trips_and_a_damaged_one_is_ignored() -> None:
    r = refused(QUOTA, "pod bert-node-1", 0, 30, tries=4)
    assert refusals.resume(refusals.backoff_record(r)) == r
    denied = refusals.resume(refusals.backoff_record(refused(DENIED, "pod bert-node-0", 0, 1)))
    assert denied is not None and denied.refusal.bounded
    for bad in ({}, {"tries": 0}, {**refusals.backoff_record(r), "since": "soon"}):
        assert refusals.resume(bad) is None


def test_a_suspension_ends_the_run_of_denials_so_a_resume_gets_a_whole_window() -> None:
    """Before, the record outlived the suspension: the first denial after a resume days
    later merged with the old start and failed the job at once."""
    sim = denied_job(60)
    sim.reconcile()
    assert "admissionDenial" in state(sim.status)
    sim.job["spec"]["runPolicy"]["suspend"] = True
    sim.refused = None
    sim.reconcile()
    assert "admissionDenial" not in state(sim.status) and "createBackoff" not in state(sim.status)
    sim.job["spec"]["runPolicy"]["suspend"] = False
    sim.now = T0 + timedelta(days=2)
    assert len(sim.reconcile().create_pods) == 2
    sim.pods.clear()  # the dry run was denied: nothing exists
    sim.refused = refused(DENIED, "pod bert-node-0", 2 * 86400, 2 * 86400 + 2)
    sim.reconcile()
    assert sim.status["phase"] not in ("Failed", "Suspended"), sim.status
    assert sim.status["operatorState"]["admissionDenial"]["since"] == "2026-03-03T12:00:00Z"
