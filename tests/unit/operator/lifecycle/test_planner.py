"""The planner's lifecycle, driven through a fake cluster that applies each plan.

A :class:`Sim` plays the I/O shell (status first, then deletes, then creates) and the
kubelet (phases, exit codes), so each test reads as the story of one job.
"""

from __future__ import annotations

import copy
import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from gpujob_operator import api
from gpujob_operator.api import conditions as c
from gpujob_operator.api.events import Event
from gpujob_operator.api.patches import minimal_patch
from gpujob_operator.api.statusupgrade import MOVES, is_legacy
from gpujob_operator.lifecycle import backoff, observations, planner, restarts
from gpujob_operator.lifecycle.apiserver.refusals import Refused
from gpujob_operator.lifecycle.blame import NodeView
from gpujob_operator.lifecycle.observations import ObservedPod, observe_pod, project_pod
from gpujob_operator.lifecycle.planner import Plan
from tests.support.fakekube import apply_merge_patch

T0 = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)


def make_job(status: dict[str, Any] | None = None, **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"image": "trainer:1", "command": ["python", "-m", "train"]}
    body.update(spec)
    job: dict[str, Any] = {
        "apiVersion": api.API_VERSION,
        "kind": api.KIND,
        "metadata": {"name": "bert", "namespace": "ml", "uid": "u1", "generation": 1},
        "spec": body,
    }
    if status is not None:
        job["status"] = status
    return job


def cond(status: dict[str, Any], type_: str) -> dict[str, Any]:
    found = c.find(status.get("conditions"), type_)
    assert found is not None, f"no {type_} condition in {status.get('conditions')}"
    return dict(found)


class Sim:
    """A fake API server + kubelet holding the job and its pods as raw JSON."""

    def __init__(self, job: dict[str, Any]) -> None:
        self.job = job
        self.pods: dict[str, dict[str, Any]] = {}
        self.service = False
        self.now = T0
        self.events: list[Event] = []
        self.deleted_job = False
        self.refused: Refused | None = None
        # No restart backoff unless a test asks for one: the others step time themselves.
        self.restart_backoff = backoff.Policy(0.0, 0.0)
        self.gone: list[ObservedPod] = []  # what the shell remembers of disrupted pods

    # -- the operator's side
    def observed(self) -> list[ObservedPod]:
        # Through the projection the pod index keeps: the planner must decide the same.
        return [observe_pod(project_pod(p)) for p in self.pods.values()]

    def plan(self, log_tails: dict[str, str] | None = None) -> Plan:
        return planner.plan(
            self.job,
            self.observed(),
            self.now,
            service_exists=self.service,
            log_tails=log_tails,
            refused=self.refused,
            restart_backoff=self.restart_backoff,
            gone=self.gone,
            nodes=self.node_view(),
        )

    def node_view(self) -> NodeView | None:
        """The nodes the shell would read for this pass (none here; see test_blame)."""
        return None

    def reconcile(self, log_tails: dict[str, str] | None = None) -> Plan:
        p = self.plan(log_tails)
        patch = minimal_patch(self.job.get("status") or {}, p.status)
        self.job["status"] = apply_merge_patch(self.job.get("status") or {}, patch)
        assert self.job["status"] == p.status
        for name in p.delete_pods:
            self.pods[name]["metadata"]["deletionTimestamp"] = c.format_time(self.now)
        if p.create_service is not None:
            self.service = True
        for body in p.create_pods:
            name = body["metadata"]["name"]
            assert name not in self.pods, f"duplicate pod {name}"
            pod = copy.deepcopy(body)
            pod["status"] = {"phase": "Pending"}
            self.pods[name] = pod
        self.events += p.events
        self.deleted_job = self.deleted_job or p.delete_job
        return p

    # -- the cluster's side
    def gc(self, *names: str) -> None:
        """Terminating pods finish terminating (all, or the named ones)."""
        for name in list(self.pods):
            if self.pods[name]["metadata"].get("deletionTimestamp") and (
                not names or name in names
            ):
                del self.pods[name]

    def set_phase(self, name: str, phase: str, **term: Any) -> None:
        st: dict[str, Any] = {"phase": phase, "startTime": c.format_time(T0)}
        if term:
            st["containerStatuses"] = [
                {
                    "name": "trainer",
                    "state": {
                        "terminated": {
                            "finishedAt": c.format_time(self.now),
                            **term,
                        }
                    },
                }
            ]
        self.pods[name]["status"] = st

    def run_all(self) -> None:
        for name, pod in self.pods.items():
            if pod["status"]["phase"] == "Pending":
                self.set_phase(name, "Running")

    def succeed_all(self) -> None:
        for name in self.pods:
            self.set_phase(name, "Succeeded", exitCode=0, reason="Completed")

    def fail(self, name: str, code: int = 1, reason: str = "Error", message: str = "") -> None:
        self.set_phase(name, "Failed", exitCode=code, reason=reason, message=message)

    def attempts(self) -> set[str]:
        return {p["metadata"]["labels"]["gpujob.dev/attempt"] for p in self.pods.values()}

    @property
    def status(self) -> dict[str, Any]:
        return self.job["status"]

    def reasons(self) -> list[str]:
        return [e.reason for e in self.events]


def running_sim(nodes: int = 2, **spec: Any) -> Sim:
    sim = Sim(make_job(nodes=nodes, gpusPerNode=8, **spec))
    sim.reconcile()
    sim.run_all()
    sim.reconcile()
    assert sim.status["phase"] == "Running"
    return sim


# ---- creation, pending, running, success ------------------------------------------------


def test_new_job_creates_service_and_all_pods_of_attempt_0() -> None:
    sim = Sim(make_job(nodes=3, gpusPerNode=8))
    p = sim.reconcile()
    assert p.create_service is not None and p.create_service["metadata"]["name"] == "bert"
    assert [x["metadata"]["name"] for x in p.create_pods] == [
        "bert-node-0",
        "bert-node-1",
        "bert-node-2",
    ]
    assert sim.attempts() == {"0"}
    st = sim.status
    assert st["phase"] == "Pending"
    assert st["observedGeneration"] == 1
    assert st["gang"]["attempt"] == 0 and st["gang"]["restarts"] == 0
    assert st["gang"]["gpus"]["requested"] == 24
    assert st["startTime"] == "2026-03-01T12:00:00Z"
    assert st["gang"]["replicas"] == {
        "desired": 3,
        "created": 0,
        "pending": 0,
        "running": 0,
        "succeeded": 0,
        "failed": 0,
    }
    assert cond(st, c.CREATED)["reason"] == c.PODS_CREATING
    assert sim.reasons() == [c.PODS_CREATING]
    p2 = sim.reconcile()
    assert not p2.create_pods and p2.create_service is None
    assert cond(sim.status, c.CREATED)["status"] == "True"
    assert (
        sim.status["gang"]["replicas"]["created"] == 3
        and sim.status["gang"]["replicas"]["pending"] == 3
    )
    assert cond(sim.status, c.RUNNING)["reason"] == c.PODS_PENDING


def test_unschedulable_carries_the_schedulers_reason_and_warns_once() -> None:
    sim = Sim(make_job(nodes=2, gpusPerNode=8))
    sim.reconcile()
    msg = "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."
    sim.pods["bert-node-1"]["status"] = {
        "phase": "Pending",
        "conditions": [
            {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": msg}
        ],
    }
    sim.reconcile()
    running = cond(sim.status, c.RUNNING)
    assert sim.status["phase"] == "Pending"
    assert running["status"] == "False" and running["reason"] == c.UNSCHEDULABLE
    assert "bert-node-1" in running["message"] and msg in running["message"]
    assert sim.reasons().count(c.UNSCHEDULABLE) == 1
    sim.reconcile()
    assert sim.reasons().count(c.UNSCHEDULABLE) == 1, "no repeated warning"


def test_image_pull_failure_is_reported() -> None:
    sim = Sim(make_job())
    sim.reconcile()
    sim.pods["bert-node-0"]["status"] = {
        "phase": "Pending",
        "containerStatuses": [
            {
                "name": "trainer",
                "state": {"waiting": {"reason": "ImagePullBackOff", "message": "not found"}},
            }
        ],
    }
    sim.reconcile()
    running = cond(sim.status, c.RUNNING)
    assert running["reason"] == c.IMAGE_PULL_FAILED and "trainer:1" in running["message"]
    assert c.IMAGE_PULL_FAILED in sim.reasons()


def test_running_when_every_rank_runs() -> None:
    sim = Sim(make_job(nodes=2))
    sim.reconcile()
    sim.set_phase("bert-node-0", "Running")
    sim.reconcile()
    assert sim.status["phase"] == "Pending"
    assert cond(sim.status, c.RUNNING)["message"] == "1/2 ranks running (attempt 0)"
    sim.run_all()
    sim.reconcile()
    assert sim.status["phase"] == "Running"
    assert cond(sim.status, c.RUNNING)["reason"] == c.ALL_RANKS_RUNNING
    assert sim.status["gang"]["replicas"]["running"] == 2
    sim.reconcile()
    assert sim.reasons().count(c.ALL_RANKS_RUNNING) == 1


def test_succeeded_when_every_rank_exits_0() -> None:
    sim = running_sim()
    sim.set_phase("bert-node-0", "Succeeded", exitCode=0, reason="Completed")
    sim.reconcile()
    assert sim.status["phase"] == "Running", "one rank done, the other still running"
    sim.now += timedelta(minutes=1)
    sim.succeed_all()
    p = sim.reconcile()
    st = sim.status
    assert st["phase"] == "Succeeded"
    assert cond(st, c.SUCCEEDED)["reason"] == c.ALL_RANKS_SUCCEEDED
    assert cond(st, c.RUNNING)["status"] == "False"
    assert st["completionTime"] == "2026-03-01T12:01:00Z"
    assert p.delete_pods == [], "cleanPodPolicy Running: nothing left running"
    assert st["gang"]["replicas"]["succeeded"] == 2
    sim.now += timedelta(hours=1)
    p = sim.reconcile()
    assert not p.create_pods and not p.delete_pods and not p.delete_job
    assert sim.status["completionTime"] == "2026-03-01T12:01:00Z"


def test_a_gang_that_ran_and_ended_between_two_passes_reads_created() -> None:
    """The pass that created the pods said 0/2 exist; the next one sees them done already."""
    for ending, phase in (("succeed", "Succeeded"), ("fail", "Failed")):
        sim = Sim(make_job(nodes=2, runPolicy={"backoffLimit": 0}))
        sim.reconcile()
        assert cond(sim.status, c.CREATED)["reason"] == c.PODS_CREATING
        if ending == "succeed":
            sim.succeed_all()
        else:
            for name in list(sim.pods):
                sim.fail(name)
        sim.reconcile()
        assert sim.status["phase"] == phase
        created = cond(sim.status, c.CREATED)
        assert (created["status"], created["reason"]) == ("True", c.PODS_CREATED), created
        assert "nextAttemptTime" not in sim.status["gang"]


@pytest.mark.parametrize(
    ("policy", "deleted"),
    [("None", []), ("Running", []), ("All", ["bert-node-0", "bert-node-1"])],
)
def test_clean_pod_policy_after_success(policy: str, deleted: list[str]) -> None:
    sim = running_sim(runPolicy={"cleanPodPolicy": policy})
    sim.succeed_all()
    assert sim.reconcile().delete_pods == deleted


# ---- failures, gang restart, backoff -----------------------------------------------------


def test_failed_rank_restarts_the_whole_gang_after_old_pods_are_gone() -> None:
    sim = running_sim(nodes=3)
    sim.fail("bert-node-1", code=1, message="Traceback: boom")
    p = sim.reconcile()
    st = sim.status
    assert sorted(p.delete_pods) == ["bert-node-0", "bert-node-1", "bert-node-2"]
    assert not p.create_pods
    assert st["phase"] == "Restarting"
    assert (st["gang"]["attempt"], st["gang"]["restarts"]) == (1, 1)
    assert cond(st, c.RESTARTING)["reason"] == c.GANG_RESTART
    assert "restart 1/3" in cond(st, c.RESTARTING)["message"]
    assert cond(st, c.RUNNING)["reason"] == c.RANK_FAILED
    assert st["failure"] == {
        "pod": "bert-node-1",
        "container": "trainer",
        "nodeRank": 1,
        "attempt": 0,
        "exitCode": 1,
        "reason": "Error",
        "message": "pod bert-node-1 (node rank 1) failed with exit code 1: Error",
        "logTail": "Traceback: boom",
        "time": "2026-03-01T12:00:00Z",
    }
    assert sim.reasons().count(c.GANG_RESTART) == 1

    # Old pods still terminating: nothing is created, nothing counted twice.
    sim.gc("bert-node-0", "bert-node-1")
    p = sim.reconcile()
    assert not p.create_pods and not p.delete_pods
    assert sim.status["gang"]["restarts"] == 1
    assert cond(sim.status, c.RUNNING)["reason"] == c.WAITING_FOR_OLD_PODS

    sim.gc()
    p = sim.reconcile()
    assert [x["metadata"]["labels"]["gpujob.dev/attempt"] for x in p.create_pods] == ["1"] * 3
    assert sim.status["phase"] == "Restarting"
    assert cond(sim.status, c.RUNNING)["reason"] == c.GANG_RESTART
    sim.run_all()
    sim.reconcile()
    st = sim.status
    assert st["phase"] == "Running" and st["gang"]["restarts"] == 1
    assert cond(st, c.RESTARTING)["status"] == "False"
    assert st["failure"]["attempt"] == 0, "the last failure stays for the record"


def test_backoff_limit_exceeded_fails_with_the_root_cause() -> None:
    sim = running_sim(runPolicy={"backoffLimit": 1})
    sim.fail("bert-node-0", code=2)
    sim.reconcile()
    sim.gc()
    sim.reconcile()
    sim.run_all()
    sim.reconcile()
    sim.now += timedelta(seconds=30)
    sim.fail("bert-node-1", code=137, reason="OOMKilled")
    p = sim.reconcile()
    st = sim.status
    assert st["phase"] == "Failed"
    failed = cond(st, c.FAILED)
    assert failed["reason"] == c.BACKOFF_LIMIT_EXCEEDED
    assert "bert-node-1 (node rank 1) failed: exit code 137 (OOMKilled)" in failed["message"]
    assert st["failure"]["reason"] == "OOMKilled" and st["failure"]["exitCode"] == 137
    assert st["failure"]["attempt"] == 1
    assert st["gang"]["restarts"] == 1
    assert st["completionTime"] == "2026-03-01T12:00:30Z"
    assert p.delete_pods == ["bert-node-0"], "cleanPodPolicy Running deletes the live rank"
    assert c.BACKOFF_LIMIT_EXCEEDED in sim.reasons()
    assert cond(st, c.RESTARTING)["status"] == "False"


def test_backoff_limit_zero_fails_on_first_failure() -> None:
    sim = running_sim(runPolicy={"backoffLimit": 0, "cleanPodPolicy": "None"})
    sim.fail("bert-node-0")
    p = sim.reconcile()
    assert sim.status["phase"] == "Failed" and p.delete_pods == []


@pytest.mark.parametrize(
    ("codes", "exit_code", "phase", "reason"),
    [
        (None, 1, "Restarting", c.GANG_RESTART),
        ([137], 137, "Restarting", c.GANG_RESTART),
        ([137], 1, "Failed", c.NON_RETRYABLE_EXIT_CODE),
        ([], 137, "Failed", c.NON_RETRYABLE_EXIT_CODE),
    ],
)
def test_retryable_exit_codes(
    codes: list[int] | None, exit_code: int, phase: str, reason: str
) -> None:
    policy: dict[str, Any] = {} if codes is None else {"retryableExitCodes": codes}
    sim = running_sim(runPolicy=policy)
    sim.fail("bert-node-0", code=exit_code)
    sim.reconcile()
    assert sim.status["phase"] == phase
    assert reason in sim.reasons()
    if phase == "Failed":
        assert sim.status["gang"]["restarts"] == 0
        assert "is not in retryableExitCodes" in cond(sim.status, c.FAILED)["message"]


def test_failure_without_exit_code_is_always_retryable() -> None:
    sim = running_sim(runPolicy={"retryableExitCodes": []})
    sim.pods["bert-node-0"]["status"] = {
        "phase": "Failed",
        "reason": "Evicted",
        "message": "The node was low on resource: memory.",
    }
    sim.reconcile()
    assert sim.status["phase"] == "Restarting"
    assert sim.status["failure"]["reason"] == "Evicted"
    assert sim.status["failure"]["message"] == "The node was low on resource: memory."
    assert "exitCode" not in sim.status["failure"]


def test_root_cause_is_the_first_to_fail_not_the_lowest_rank() -> None:
    sim = running_sim(nodes=3)
    sim.now = T0 + timedelta(seconds=10)
    sim.fail("bert-node-2", code=137, reason="OOMKilled")
    sim.now = T0 + timedelta(seconds=40)
    sim.fail("bert-node-0", code=1, message="NCCL watchdog timeout")
    assert observations.root_cause(sim.observed()).name == "bert-node-2"  # type: ignore[union-attr]
    sim.reconcile()
    assert sim.status["failure"]["pod"] == "bert-node-2"
    assert sim.status["failure"]["reason"] == "OOMKilled"


def test_log_tail_from_the_shell_wins_and_is_truncated() -> None:
    sim = running_sim()
    sim.fail("bert-node-0", message="last lines from the termination message")
    tail = "x" * 10_000 + "THE END"
    sim.reconcile(log_tails={"bert-node-0": tail})
    failure = sim.status["failure"]
    assert failure["logTail"].endswith("THE END")
    assert len(failure["logTail"]) == observations.LOG_TAIL_MAX_CHARS
    assert failure["message"] == "last lines from the termination message"


def test_pod_lost_after_the_gang_was_complete_restarts_it() -> None:
    sim = running_sim()
    del sim.pods["bert-node-1"]
    sim.reconcile()
    assert sim.status["phase"] == "Restarting"
    assert sim.status["failure"]["reason"] == c.POD_LOST
    assert cond(sim.status, c.RUNNING)["reason"] == c.POD_LOST


def test_externally_deleted_pod_counts_as_lost() -> None:
    sim = running_sim()
    sim.pods["bert-node-0"]["metadata"]["deletionTimestamp"] = c.format_time(T0)
    sim.reconcile()
    assert sim.status["failure"]["pod"] == "bert-node-0"
    assert sim.status["gang"]["restarts"] == 1


def disrupt(sim: Sim, name: str, reason: str, message: str = "") -> None:
    """What Kubernetes does before taking a pod away: the condition, then the deletion."""
    pod = sim.pods[name]
    pod["status"].setdefault("conditions", []).append(
        {"type": "DisruptionTarget", "status": "True", "reason": reason, "message": message}
    )
    pod["metadata"]["deletionTimestamp"] = c.format_time(sim.now)


@pytest.mark.parametrize(
    ("k8s_reason", "shown"),
    [
        ("PreemptionByScheduler", c.PREEMPTED),
        ("EvictionByEvictionAPI", c.EVICTED),
        ("DeletionByTaintManager", c.EVICTED),
        ("TerminationByKubelet", c.EVICTED),
    ],
)
def test_a_disrupted_pod_restarts_the_gang_without_using_the_backoff_limit(
    k8s_reason: str, shown: str
) -> None:
    sim = running_sim(runPolicy={"backoffLimit": 0, "retryableExitCodes": [1]})
    # the SIGTERM'd rank exits 143 and its peer dies in the collective (here even first):
    # consequences of the disruption, not causes
    sim.fail("bert-node-0", code=134, message="NCCL error")
    sim.now += timedelta(seconds=5)
    sim.fail("bert-node-1", code=143)
    disrupt(sim, "bert-node-1", k8s_reason, "taken for a higher-priority job")
    p = sim.reconcile()
    st = sim.status
    assert st["phase"] == "Restarting", st
    assert (st["gang"]["attempt"], st["gang"]["restarts"]) == (1, 0)
    assert st["gang"]["preemptions"] == 1
    running = cond(st, c.RUNNING)
    assert running["reason"] == shown and cond(st, c.RESTARTING)["reason"] == shown
    assert k8s_reason in running["message"] and "bert-node-1" in running["message"]
    assert "not counted against backoffLimit" in running["message"]
    assert "failure" not in st or st["failure"].get("reason") not in ("Error", c.POD_LOST)
    assert p.delete_pods == ["bert-node-0"]  # bert-node-1 is already being deleted
    assert shown in sim.reasons() and c.GANG_RESTART not in sim.reasons()

    sim.gc()
    p = sim.reconcile()
    assert [x["metadata"]["labels"]["gpujob.dev/attempt"] for x in p.create_pods] == ["1"] * 2
    sim.run_all()
    sim.reconcile()
    assert sim.status["phase"] == "Running" and sim.status["gang"]["restarts"] == 0


def test_a_disrupted_pod_that_vanished_before_a_pass_saw_it_is_still_a_disruption() -> None:
    # The rank died at once on SIGTERM and the pod object is gone; the shell saw the
    # DisruptionTarget condition in the pod watch and passes that last state on.
    sim = running_sim(runPolicy={"backoffLimit": 0})
    disrupt(sim, "bert-node-1", "PreemptionByScheduler")
    sim.gone = [observe_pod(sim.pods["bert-node-1"])]
    del sim.pods["bert-node-1"]
    sim.reconcile()
    st = sim.status
    assert st["phase"] == "Restarting" and st["gang"]["restarts"] == 0, st
    assert cond(st, c.RUNNING)["reason"] == c.PREEMPTED
    # a remembered disruption of an earlier attempt explains nothing now
    sim.gc()
    sim.reconcile()
    sim.run_all()
    sim.reconcile()
    del sim.pods["bert-node-0"]
    sim.reconcile()
    assert sim.status["phase"] == "Failed"
    assert sim.status["failure"]["reason"] == c.POD_LOST


def test_a_real_failure_still_counts_when_no_pod_was_disrupted() -> None:
    sim = running_sim(runPolicy={"backoffLimit": 0})
    sim.fail("bert-node-1", code=143)
    sim.reconcile()
    assert sim.status["phase"] == "Failed"
    assert cond(sim.status, c.FAILED)["reason"] == c.BACKOFF_LIMIT_EXCEEDED


def test_pod_missing_before_the_gang_was_complete_is_just_created() -> None:
    sim = Sim(make_job(nodes=2))
    p = sim.plan()
    # The shell created only the first pod (the second create failed).
    sim.job["status"] = p.status
    pod = copy.deepcopy(p.create_pods[0])
    pod["status"] = {"phase": "Running"}
    sim.pods[pod["metadata"]["name"]] = pod
    p2 = sim.reconcile()
    assert [x["metadata"]["name"] for x in p2.create_pods] == ["bert-node-1"]
    assert sim.status["gang"]["restarts"] == 0


def test_a_stall_without_evidence_restarts_once_the_wait_for_it_is_over() -> None:
    """A capture that never reports (a wedged operator task) never blocks restartOnStall."""
    sim = running_sim(runPolicy={"restartOnStall": True})
    sim.status["conditions"].append(
        c.make(c.STALLED, "True", c.STALL_CONFIRMED, "no step for 615s", T0)
    )
    sim.now = T0 + timedelta(seconds=restarts.EVIDENCE_WAIT_SECONDS - 1)
    assert not sim.reconcile().delete_pods
    sim.now = T0 + timedelta(seconds=restarts.EVIDENCE_WAIT_SECONDS + 1)
    assert sim.reconcile().delete_pods
    assert "no hang evidence was recorded in time" in sim.status["failure"]["message"]


def test_stall_restarts_only_when_asked_and_confirmed() -> None:
    detected = c.make(c.STALLED, "True", c.STALL_DETECTED, "no step for 600s", T0)
    confirmed = c.make(c.STALLED, "True", c.STALL_CONFIRMED, "no step for 615s (2 scrapes)", T0)
    sim = running_sim()
    sim.status["conditions"].append(confirmed)
    sim.reconcile()
    assert sim.status["phase"] == "Running", "restartOnStall is off by default"
    assert c.is_true(sim.status["conditions"], c.STALLED), "the analyzer's condition is kept"

    sim = running_sim(runPolicy={"restartOnStall": True})
    sim.status["conditions"].append(detected)
    p = sim.reconcile()
    assert not p.delete_pods and sim.status["phase"] == "Running", "one scrape kills no gang"
    assert sim.status["gang"]["restarts"] == 0

    sim.status["conditions"] = c.set_condition(
        sim.status["conditions"], c.STALLED, "True", c.STALL_CONFIRMED, "2 scrapes", T0
    )
    p = sim.reconcile()
    assert not p.delete_pods and sim.status["phase"] == "Running", "the evidence comes first"
    assert p.requeue_after is not None and p.requeue_after <= 60
    since = cond(sim.status, c.STALLED)["lastTransitionTime"]
    sim.status["hangEvidence"] = {
        "stalledSince": since,
        "summary": "rank 1 (pod bert-node-1) is not in all_reduce #11 where rank 0 waits",
        "note": "the ConfigMap was not written: 403 Forbidden",
    }
    p = sim.reconcile()
    assert sim.status["phase"] == "Restarting" and len(p.delete_pods) == 2
    assert sim.status["failure"]["reason"] == "Stalled"
    assert "rank 1 (pod bert-node-1) is not in all_reduce #11" in sim.status["failure"]["message"]
    assert "403 Forbidden" in sim.status["failure"]["message"]
    assert cond(sim.status, c.STALLED)["status"] == "False"
    assert cond(sim.status, c.STALLED)["reason"] == c.GANG_RESTART
    assert sim.status["gang"]["restarts"] == 1


def test_any_gang_restart_clears_stalled_so_one_incident_counts_once() -> None:
    # A hang is confirmed, then the NCCL watchdog kills a rank: RankFailed restarts the gang.
    # The old Stalled must not restart the new attempt a second time.
    sim = running_sim(runPolicy={"restartOnStall": True, "backoffLimit": 5})
    sim.status["conditions"].append(
        c.make(c.STALLED, "True", c.STALL_CONFIRMED, "no step for 615s", T0)
    )
    sim.fail("bert-node-1", code=134)
    sim.reconcile()
    assert sim.status["gang"]["restarts"] == 1 and sim.status["failure"]["reason"] != "Stalled"
    assert cond(sim.status, c.STALLED)["status"] == "False"
    sim.gc()
    sim.reconcile()
    sim.run_all()
    sim.reconcile()
    assert sim.status["phase"] == "Running" and sim.status["gang"]["restarts"] == 1


def test_suspend_clears_stalled() -> None:
    sim = running_sim(runPolicy={"restartOnStall": True})
    sim.status["conditions"].append(
        c.make(c.STALLED, "True", c.STALL_CONFIRMED, "no step for 615s", T0)
    )
    sim.job["spec"]["runPolicy"]["suspend"] = True
    sim.reconcile()
    assert cond(sim.status, c.STALLED)["status"] == "False"
    assert cond(sim.status, c.STALLED)["reason"] == c.SUSPENDED_REASON
    sim.gc()
    sim.job["spec"]["runPolicy"]["suspend"] = False
    sim.reconcile()
    sim.run_all()
    sim.reconcile()
    assert sim.status["phase"] == "Running" and sim.status["gang"]["restarts"] == 0


# ---- suspend / resume --------------------------------------------------------------------


def test_suspend_deletes_pods_and_resume_creates_a_new_attempt() -> None:
    sim = running_sim()
    sim.job["spec"]["runPolicy"] = {"suspend": True}
    p = sim.reconcile()
    st = sim.status
    assert sorted(p.delete_pods) == ["bert-node-0", "bert-node-1"]
    assert st["phase"] == "Suspended"
    assert cond(st, c.SUSPENDED)["status"] == "True"
    assert st["gang"]["attempt"] == 1 and st["gang"]["restarts"] == 0
    # Pods killed by the suspension fail; that is no reason to restart anything.
    sim.fail("bert-node-0", code=143)
    p = sim.reconcile()
    assert not p.create_pods and sim.status["gang"]["restarts"] == 0
    sim.gc()
    assert not sim.reconcile().create_pods, "no pods while suspended"
    assert sim.reasons().count(c.SUSPENDED_REASON) == 1

    sim.now += timedelta(hours=2)
    sim.job["spec"]["runPolicy"] = {"suspend": False}
    p = sim.reconcile()
    st = sim.status
    assert [x["metadata"]["labels"]["gpujob.dev/attempt"] for x in p.create_pods] == ["1", "1"]
    assert cond(st, c.SUSPENDED) == {
        **cond(st, c.SUSPENDED),
        "status": "False",
        "reason": c.RESUMED,
    }
    assert st["startTime"] == "2026-03-01T14:00:00Z", "resume restarts the deadline clock"
    assert st["phase"] == "Pending" and st["gang"]["restarts"] == 0
    assert c.RESUMED in sim.reasons()


def test_resume_waits_for_pods_still_terminating() -> None:
    sim = running_sim()
    sim.job["spec"]["runPolicy"] = {"suspend": True}
    sim.reconcile()
    sim.job["spec"]["runPolicy"] = {"suspend": False}
    p = sim.reconcile()
    assert not p.create_pods and sim.status["gang"]["restarts"] == 0
    sim.gc()
    assert len(sim.reconcile().create_pods) == 2


def test_created_suspended_makes_no_pods() -> None:
    sim = Sim(make_job(runPolicy={"suspend": True}))
    p = sim.reconcile()
    assert not p.create_pods and not p.delete_pods
    assert sim.status["phase"] == "Suspended"
    assert "startTime" not in sim.status and sim.status["gang"]["attempt"] == 0


# ---- deadline and TTL -------------------------------------------------------------------


def test_active_deadline_fails_the_job_and_stops_its_pods() -> None:
    sim = running_sim(runPolicy={"activeDeadlineSeconds": 600, "cleanPodPolicy": "None"})
    sim.now = T0 + timedelta(seconds=200)
    assert sim.reconcile().requeue_after == pytest.approx(400)
    sim.now = T0 + timedelta(seconds=600)
    p = sim.reconcile()
    st = sim.status
    assert st["phase"] == "Failed"
    assert cond(st, c.FAILED)["reason"] == c.DEADLINE_EXCEEDED
    assert st["failure"]["reason"] == c.DEADLINE_EXCEEDED
    assert sorted(p.delete_pods) == ["bert-node-0", "bert-node-1"], "active pods always stop"
    assert c.DEADLINE_EXCEEDED in sim.reasons()


def test_deadline_does_not_run_while_suspended() -> None:
    sim = running_sim(runPolicy={"activeDeadlineSeconds": 60})
    sim.job["spec"]["runPolicy"]["suspend"] = True
    sim.reconcile()
    sim.now += timedelta(hours=1)
    sim.reconcile()
    assert sim.status["phase"] == "Suspended"


def test_ttl_after_finished_deletes_the_job() -> None:
    sim = running_sim(runPolicy={"ttlSecondsAfterFinished": 100})
    sim.succeed_all()
    p = sim.reconcile()
    assert p.requeue_after == pytest.approx(100) and not p.delete_job
    sim.now += timedelta(seconds=99)
    assert not sim.reconcile().delete_job
    sim.now += timedelta(seconds=1)
    p = sim.reconcile()
    assert p.delete_job and c.TTL_EXPIRED in [e.reason for e in p.events]


# ---- idempotency and operator restarts --------------------------------------------------


def test_planning_twice_gives_the_same_plan() -> None:
    sim = running_sim(nodes=3)
    sim.fail("bert-node-2")
    observed = sim.observed()
    a = planner.plan(sim.job, observed, sim.now, service_exists=True)
    b = planner.plan(copy.deepcopy(sim.job), list(observed), sim.now, service_exists=True)
    assert a == b


def test_operator_restart_between_status_write_and_deletes_counts_once() -> None:
    """Crash after the status write: a fresh planner deletes the old gang, counts nothing."""
    sim = running_sim()
    sim.fail("bert-node-0")
    p = sim.plan()
    sim.job["status"] = p.status  # written; then the operator died before deleting
    again = sim.plan()  # a new operator process: no memory, same inputs
    assert sorted(again.delete_pods) == ["bert-node-0", "bert-node-1"]
    assert again.status["gang"]["restarts"] == 1 and again.status["gang"]["attempt"] == 1
    assert c.GANG_RESTART not in [e.reason for e in again.events]


def test_operator_restart_after_deletes_creates_the_next_attempt_once() -> None:
    sim = running_sim()
    sim.fail("bert-node-1")
    sim.reconcile()
    sim.gc()
    fresh = Sim(copy.deepcopy(sim.job))  # the persisted job, no pods left, a new operator
    fresh.service = True
    p = fresh.reconcile()
    assert [x["metadata"]["labels"]["gpujob.dev/attempt"] for x in p.create_pods] == ["1", "1"]
    assert fresh.status["gang"]["restarts"] == 1


def previous_shape(status: dict[str, Any]) -> dict[str, Any]:
    """``status`` as the previous version wrote it: every moved field at its old path, and
    the derived fields it kept beside them (statusupgrade.MOVES, read backwards)."""
    old = copy.deepcopy(status)
    for was, now in reversed(MOVES):  # totalGPUs first: gpus then takes requested along
        if now is None:
            continue
        parent: dict[str, Any] = old
        for key in now[:-1]:
            parent = parent.get(key) or {}
        if parent.get(now[-1]) is None:
            continue
        value = parent[now[-1]] if now[-1] == "requested" else parent.pop(now[-1])
        target = old if len(was) == 1 else old.setdefault(was[0], {})
        target[was[-1]] = copy.deepcopy(value)
    for part in ("gang", "operatorState"):
        for key in [k for k, v in (old.get(part) or {}).items() if v in ({}, None)]:
            del old[part][key]
        if not old.get(part):
            old.pop(part, None)
    old["restartsWithoutProgress"] = len(old.get("attemptsWithoutProgress") or [])
    old["summary"] = {"wallSeconds": 60.0, "restarts": old.get("restarts", 0)}
    old.setdefault("progress", {})["secondsPerSample"] = 0.01
    return old


def test_a_status_of_the_previous_version_is_planned_alike_and_moved_to_the_new_shape() -> None:
    """An operator upgrade: the job's status is still in the previous version's shape (its
    bookkeeping, attempt and GPUs at the top level). The planner reads it as it reads the
    same status in this version's shape, and its status comes out in this shape, the old
    fields deleted by the patch."""
    sim = running_sim(nodes=2, runPolicy={"backoffLimit": 5})
    sim.job["metadata"]["creationTimestamp"] = c.format_time(T0)
    sim.status["progress"] = {"step": 600, "furthestStep": 600, "totalSteps": 1000}
    sim.reconcile()
    sim.now += timedelta(seconds=30)
    sim.fail("bert-node-1")
    sim.reconcile()  # attempt 1, restart 1; attempt 0 passed step 0: progress
    sim.gc()
    sim.reconcile()
    sim.run_all()
    sim.reconcile()
    sim.status["progress"] = {"step": 590, "furthestStep": 600, "totalSteps": 1000}
    sim.status["gang"]["gpus"] = {"requested": 16, "observed": 16, "product": "H100"}
    sim.status["gang"]["startForecast"] = {"confidence": "Exact", "forecastErrorSeconds": 4.0}
    sim.status.setdefault("operatorState", {})["rateSince"] = {
        "time": c.format_time(sim.now),
        "step": 580,
        "attempt": 1,
    }
    sim.now += timedelta(seconds=30)
    sim.fail("bert-node-0")
    new_shape = copy.deepcopy(sim.job)
    assert is_legacy(new_shape["status"]) is False
    st = new_shape["status"]
    assert st["gang"]["attempt"] == 1 and st["operatorState"]["goodput"]["accountedUntil"]
    sim.job["status"] = previous_shape(st)
    assert is_legacy(sim.job["status"]) and "gang" in sim.job["status"]
    assert sim.job["status"]["attempt"] == 1 and sim.job["status"]["totalGPUs"] == 16
    assert "operatorState" not in sim.job["status"]
    assert sim.job["status"]["goodput"]["accountedUntil"]
    assert sim.job["status"]["progress"]["rateSince"]["step"] == 580

    alike = planner.plan(
        new_shape, sim.observed(), sim.now, service_exists=True, restart_backoff=sim.restart_backoff
    )
    read = sim.reconcile()  # the patch it applies deletes each old field (checked there)
    assert read == alike, "planned as the same status in this shape"
    out = sim.status
    assert not is_legacy(out)
    for was, _ in MOVES:
        assert was[-1] not in (out if len(was) == 1 else out.get(was[0]) or {}), was
    assert (out["phase"], out["gang"]["attempt"], out["gang"]["restarts"]) == ("Restarting", 2, 2)
    assert out["gang"]["gpus"] == {"requested": 16, "observed": 16, "product": "H100"}
    assert out["gang"]["startForecast"]["forecastErrorSeconds"] == 4.0
    assert out["operatorState"]["attemptsWithoutProgress"] == [1]
    assert out["operatorState"]["furthestStepAtAttemptStart"] == 600
    assert "rateSince" not in out["operatorState"], "the ended attempt's basis goes"
    assert set(out["goodput"]) >= {"since", "seconds", "ratio", "gpuHours", "lostGPUHours"}
    assert "accountedUntil" in out["operatorState"]["goodput"]
    assert out["goodput"]["since"] == c.format_time(T0), "the ledger goes on, not afresh"
    api.parse_status(out)


def test_attempt_is_derived_from_pod_labels_when_status_lags() -> None:
    """Pods of attempt 2 exist but the status read is older: never recreate attempt 0."""
    sim = running_sim()
    for pod in sim.pods.values():
        pod["metadata"]["labels"]["gpujob.dev/attempt"] = "2"
    p = sim.plan()
    assert p.status["gang"]["attempt"] == 2
    assert not p.create_pods and not p.delete_pods


def test_no_duplicate_pods_across_many_reconciles() -> None:
    sim = Sim(make_job(nodes=4))
    for _ in range(5):
        sim.reconcile()  # Sim asserts a name is never created twice
    assert len(sim.pods) == 4


def test_stray_pods_are_deleted() -> None:
    sim = running_sim()
    stray = copy.deepcopy(sim.pods["bert-node-1"])
    stray["metadata"]["name"] = "bert-node-7"
    stray["metadata"]["labels"]["gpujob.dev/node-rank"] = "7"
    sim.pods["bert-node-7"] = stray
    assert sim.reconcile().delete_pods == ["bert-node-7"]


# ---- status hygiene ---------------------------------------------------------------------


def test_status_keeps_the_analyzers_fields_and_renders_display() -> None:
    sim = running_sim(nodes=2)
    sim.status["progress"] = {
        "step": 413,
        "totalSteps": 1000,
        "percent": 41.3,
        "etaSeconds": 1100,
        "samplesPerSecond": 2840.4,
    }
    sim.status["bottleneck"] = {"verdict": "Straggler", "rank": 13}
    sim.status["conditions"].append(c.make(c.METRICS_AVAILABLE, "True", "Scraped", "", T0))
    sim.status["kopf"] = {"progress": {}}
    sim.reconcile()
    st = sim.status
    assert "kopf" not in st, "fields the schema would prune are not written"
    assert st["progress"]["step"] == 413
    assert c.is_true(st["conditions"], c.METRICS_AVAILABLE)
    assert st["display"] == {
        "progress": "41.3%",
        "eta": "18m20s",
        "throughput": "2840 samples/s",
        "bottleneck": "Straggler(r13)",
    }
    api.parse_status(st)  # the whole status fits the schema's model
    sim.succeed_all()
    sim.reconcile()
    assert sim.status["display"] == {"progress": "100.0%"}, (
        "no ETA for a finished job; success is 100%"
    )


def test_status_validates_against_the_model_at_every_stage() -> None:
    sim = running_sim()
    sim.fail("bert-node-0")
    sim.reconcile()
    for st in (sim.status,):
        parsed = api.parse_status(st)
        assert parsed.phase == "Restarting"
        assert api.dump(parsed)["conditions"] == st["conditions"]


def test_accepts_the_model_as_job() -> None:
    model = api.GPUTrainingJob.model_validate(make_job(nodes=2))
    p = planner.plan(model, [], T0, service_exists=False)
    assert len(p.create_pods) == 2 and p.create_service is not None


def test_observed_generation_follows_metadata() -> None:
    sim = running_sim()
    sim.job["metadata"]["generation"] = 5
    sim.reconcile()
    assert sim.status["observedGeneration"] == 5
    assert cond(sim.status, c.RUNNING)["observedGeneration"] == 5


# ---- observe_pod -------------------------------------------------------------------------


def test_observe_pod_reads_raw_camel_case_json() -> None:
    pod = {
        "metadata": {
            "name": "bert-node-3",
            "labels": {"gpujob.dev/node-rank": "3", "gpujob.dev/attempt": "2"},
            "deletionTimestamp": "2026-03-01T12:00:00Z",
        },
        "spec": {"nodeName": "gpu-7"},
        "status": {
            "phase": "Failed",
            "startTime": "2026-03-01T11:00:00Z",
            "containerStatuses": [
                {
                    "name": "trainer",
                    "state": {
                        "terminated": {
                            "exitCode": 137,
                            "reason": "OOMKilled",
                            "message": "killed",
                            "finishedAt": "2026-03-01T11:59:00Z",
                        }
                    },
                }
            ],
        },
    }
    o = observe_pod(pod)
    assert o == ObservedPod(
        name="bert-node-3",
        node_rank=3,
        attempt=2,
        phase="Failed",
        terminating=True,
        container="trainer",
        exit_code=137,
        reason="OOMKilled",
        message="killed",
        finished_at=datetime(2026, 3, 1, 11, 59, tzinfo=UTC),
        start_time=datetime(2026, 3, 1, 11, 0, tzinfo=UTC),
        node_name="gpu-7",
        uid=o.uid,
        terminal=True,
    )
    assert not o.active


def test_observe_pod_scheduling_init_failure_and_defaults() -> None:
    pending = observe_pod(
        {
            "metadata": {"name": "j-node-0"},
            "status": {
                "phase": "Pending",
                "conditions": [
                    {
                        "type": "PodScheduled",
                        "status": "False",
                        "reason": "Unschedulable",
                        "message": "Insufficient nvidia.com/gpu",
                    }
                ],
            },
        }
    )
    assert pending.unschedulable and pending.node_rank == 0 and pending.attempt == 0
    assert pending.scheduled_message == "Insufficient nvidia.com/gpu"
    init = observe_pod(
        {
            "metadata": {"name": "j-node-1", "labels": {"gpujob.dev/node-rank": "1"}},
            "status": {
                "phase": "Failed",
                "initContainerStatuses": [
                    {"name": "fetch", "state": {"terminated": {"exitCode": 3, "reason": "Error"}}}
                ],
                "containerStatuses": [
                    {"name": "trainer", "state": {"waiting": {"reason": "PodInitializing"}}}
                ],
            },
        }
    )
    assert (init.container, init.exit_code, init.reason) == ("fetch", 3, "Error")
    bare = observe_pod({"metadata": {"name": "x"}})
    assert bare.phase == "Pending" and bare.node_rank is None and not bare.terminating


# ---- minimal_patch -------------------------------------------------------------------------


def test_merge_patch_round_trips_and_deletes_with_null() -> None:
    old = {"a": 1, "b": {"c": 2, "d": 3}, "e": [1, 2], "gone": {"x": 1}}
    new = {"a": 1, "b": {"c": 20}, "e": [1], "f": "new"}
    patch = minimal_patch(old, new)
    assert patch == {"b": {"c": 20, "d": None}, "e": [1], "f": "new", "gone": None}
    assert apply_merge_patch(old, patch) == new
    assert minimal_patch(new, new) == {}


def test_success_completes_the_progress_it_carries() -> None:
    sim = Sim(make_job(nodes=2, training={"totalSteps": 200}))
    sim.reconcile()
    sim.run_all()
    sim.reconcile()
    sim.job["status"]["progress"] = {
        "step": 190,
        "totalSteps": 200,
        "percent": 95.0,
        "etaSeconds": 12.0,
        "resumedFromStep": 150,
    }
    sim.job["status"]["operatorState"] = {
        "rateSince": {"time": "2026-03-01T11:00:00Z", "step": 160, "attempt": 0},
    }
    sim.succeed_all()
    result = sim.reconcile()
    assert result.phase == "Succeeded"
    # The furthest step and the resume point stay for the record; the ETA's basis goes.
    assert result.status["progress"] == {
        "step": 200,
        "totalSteps": 200,
        "percent": 100.0,
        "furthestStep": 200,
        "resumedFromStep": 150,
    }
    assert "rateSince" not in result.status.get("operatorState", {})
    assert result.status["display"]["progress"] == "100.0%"


# ---- ownership: a job re-created under the same name -------------------------------------


def recreated(old_phase: str, *, orphaned: bool = False) -> Sim:
    """The job `bert` (uid u1) ran two pods; it was deleted and applied again (uid u2)
    while its pods still exist (being garbage-collected, or orphaned)."""
    old = running_sim()
    if old_phase == "Succeeded":
        old.succeed_all()
    sim = Sim(make_job(nodes=2, gpusPerNode=8))
    sim.job["metadata"]["uid"] = "u2"
    sim.pods = old.pods
    for pod in sim.pods.values():
        if orphaned:
            pod["metadata"]["ownerReferences"] = []
        assert pod["metadata"]["ownerReferences"] == [] or (
            pod["metadata"]["ownerReferences"][0]["uid"] == "u1"
        )
    return sim


@pytest.mark.parametrize("orphaned", [False, True])
def test_a_recreated_job_never_counts_the_old_jobs_succeeded_pods(orphaned: bool) -> None:
    sim = recreated("Succeeded", orphaned=orphaned)
    p = sim.reconcile()
    # Not Succeeded from someone else's pods; nothing created over names that are taken.
    assert sim.status["phase"] == "Pending" and not p.create_pods and not p.delete_pods
    running = cond(sim.status, c.RUNNING)
    assert running["reason"] == c.POD_NAME_TAKEN
    assert "bert-node-0" in running["message"]
    assert ("orphaned" in running["message"]) == orphaned
    assert (
        sim.status["gang"]["replicas"]["created"] == 0
        and sim.status["gang"]["replicas"]["succeeded"] == 0
    )
    assert sim.reasons() == [c.POD_NAME_TAKEN]
    sim.reconcile()
    assert sim.reasons() == [c.POD_NAME_TAKEN]  # warned once
    sim.pods.clear()  # the garbage collector (or the user) removed the old pods
    p = sim.reconcile()
    assert [x["metadata"]["name"] for x in p.create_pods] == ["bert-node-0", "bert-node-1"]
    assert all(x["metadata"]["ownerReferences"][0]["uid"] == "u2" for x in p.create_pods)
    sim.run_all()
    sim.reconcile()
    sim.succeed_all()
    sim.reconcile()
    assert sim.status["phase"] == "Succeeded" and sim.status["gang"]["restarts"] == 0


def test_old_pods_vanishing_are_no_pod_lost_of_the_recreated_job() -> None:
    sim = recreated("Running")
    sim.reconcile()
    sim.reconcile()
    assert sim.status["phase"] == "Pending" and not c.is_true(sim.status["conditions"], c.CREATED)
    for pod in sim.pods.values():
        pod["metadata"]["deletionTimestamp"] = c.format_time(sim.now)
    sim.reconcile()
    sim.gc()
    sim.reconcile()
    sim.run_all()
    sim.reconcile()
    assert sim.status["phase"] == "Running"
    assert sim.status["gang"]["restarts"] == 0 and c.POD_LOST not in sim.reasons()
    assert sim.status["gang"]["attempt"] == 0


def test_a_stored_spec_the_model_refuses_fails_the_job_once_with_invalid_spec() -> None:
    # Stored before a rule existed: warn ratio equal to the bound ratio is refused today.
    job = make_job(
        monitoring={"thresholds": {"inputWarnRatio": 0.2, "inputBoundRatio": 0.2}},
    )
    p = planner.plan(job, [], T0, service_exists=False)
    failed = cond(p.status, c.FAILED)
    assert (failed["status"], failed["reason"]) == ("True", c.INVALID_SPEC)
    assert "spec.monitoring.thresholds" in failed["message"], failed
    assert p.phase == c.PHASE_FAILED
    assert not p.create_pods and not p.delete_pods and p.create_service is None
    assert [e.reason for e in p.events] == [c.INVALID_SPEC]
    # The next pass changes nothing and posts no second Event.
    again = planner.plan({**job, "status": p.status}, [], T0, service_exists=False)
    assert again.status == p.status and not again.events


def test_a_job_whose_pods_would_not_fit_the_operator_fails_before_any_pod() -> None:
    """Past the webhook (down, failurePolicy Ignore): the operator refuses it itself, once."""
    env = [{"name": f"V{i}", "value": "x" * 4000} for i in range(100)]
    job = make_job(
        nodes=512, template={"containers": [{"name": "sidecar", "image": "busybox:1", "env": env}]}
    )
    bound = 64 * 2**20
    p = planner.plan(job, [], T0, service_exists=False, max_pod_bytes=bound)
    failed = cond(p.status, c.FAILED)
    assert (failed["status"], failed["reason"]) == ("True", c.PODS_TOO_LARGE)
    assert "x spec.nodes 512 = 199 MiB" in failed["message"], failed
    assert p.phase == c.PHASE_FAILED and not p.create_pods and p.create_service is None
    assert [e.type for e in p.events] == ["Warning"]
    # the next passes are an ended job's: nothing created, no second Event, still Failed
    again = planner.plan(
        {**job, "status": p.status}, [], T0, service_exists=False, max_pod_bytes=bound
    )
    assert again.phase == c.PHASE_FAILED and not again.create_pods and not again.events
    assert cond(again.status, c.FAILED)["reason"] == c.PODS_TOO_LARGE
    # no bound: planned as ever
    first = planner.plan(job, [], T0, service_exists=False, max_pod_bytes=0)
    assert first.create_pods
    # a job that ran (here: between two attempts, no pod left) is never failed by the bound
    ran = {**job, "status": {**first.status, "phase": c.PHASE_RESTARTING}}
    later = planner.plan(ran, [], T0, service_exists=False, max_pod_bytes=bound)
    assert later.phase != c.PHASE_FAILED, later.status


# ---- wide gangs: pods built and created in batches ------------------------------------------


def test_a_wide_gang_is_built_in_batches_bounded_in_bytes_until_every_pod_exists() -> None:
    from gpujob_operator.lifecycle import converge

    # About 400 KB of env per pod: a batch holds 16 MiB of pod JSON, never the whole gang.
    env = [{"name": f"PAD_{i}", "value": "x" * 4000} for i in range(100)]
    sim = Sim(make_job(nodes=300, gpusPerNode=8, env=env))
    sizes, more = [], []
    for _ in range(20):
        p = sim.reconcile()
        if not p.create_pods:
            break
        sizes.append(len(p.create_pods))
        more.append(p.more_pods)
        assert sum(len(json.dumps(b)) for b in p.create_pods) <= converge.CREATE_BATCH_BYTES
        if p.more_pods:
            assert p.requeue_after is not None and p.requeue_after <= converge.NEXT_BATCH_SECONDS
    assert sum(sizes) == 300 and len(sim.pods) == 300 and max(sizes) < 50
    assert more[0] == 300 - sizes[0] and more[-1] == 0
    creating = [e.message for e in sim.events if e.reason == c.PODS_CREATING]
    assert creating[0] == "creating 300 pods, bert-node-0 .. bert-node-299 (attempt 0)"
    assert len(creating) == 2  # the first batch names the gang, the last what it adds


def test_small_pods_are_created_in_batches_of_at_most_the_cap() -> None:
    from gpujob_operator.lifecycle import converge

    sim = Sim(make_job(nodes=200, gpusPerNode=8))
    first = sim.reconcile()
    assert len(first.create_pods) == converge.CREATE_BATCH_MAX and first.more_pods == 72
    assert len(sim.reconcile().create_pods) == 72 and len(sim.pods) == 200
    few = Sim(make_job(nodes=3))
    p = few.reconcile()
    assert len(p.create_pods) == 3 and p.more_pods == 0
    assert [e.message for e in p.events if e.reason == c.PODS_CREATING] == [
        "creating bert-node-0, bert-node-1, bert-node-2 (attempt 0)"
    ]
