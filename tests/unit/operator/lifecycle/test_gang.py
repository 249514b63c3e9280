"""Gang admission, pure: gang.py's builders/readers and the planner's Native and Kueue paths.

:class:`GangSim` extends the planner's fake cluster with the gang objects the shell would
create, delete and status-patch, and with Kueue's side (admit, evict) played by hand.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from gpujob_operator import api
from gpujob_operator.api import conditions as c
from gpujob_operator.api.status import attempt_of
from gpujob_operator.lifecycle import observations, planner
from gpujob_operator.lifecycle.gang import gang
from gpujob_operator.lifecycle.planner import Plan
from tests.unit.operator.lifecycle.test_planner import Sim, cond, make_job

FLAVOR = {
    "metadata": {"name": "a100"},
    "spec": {
        "nodeLabels": {"gpu.example.com/model": "a100"},
        "tolerations": [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}],
    },
}


class GangSim(Sim):
    """Sim + the gang objects (by name) and what the shell observes of them."""

    def __init__(self, job: dict[str, Any], native_version: str | None = "v1beta1") -> None:
        super().__init__(job)
        self.objects: dict[str, dict[str, Any]] = {}
        self.native_version = native_version
        self.default = api.GANG_NONE
        self.priority: int | None = None
        self.error: str | None = None
        self.last: Plan | None = None

    def kueue_workload(self) -> dict[str, Any] | None:
        return next(
            (o for o in self.objects.values() if o["apiVersion"] == gang.KUEUE_API_VERSION), None
        )

    def plan(self, log_tails: dict[str, str] | None = None) -> Plan:
        name = self.job["metadata"]["name"]
        attempt = attempt_of(self.job.get("status") or {})
        obs = observations.GangObservation(
            default=self.default,
            native_version=self.native_version,
            pod_group=self.objects.get(gang.pod_group_name(name, attempt)),
            kueue_workload=self.kueue_workload(),
            flavors={"a100": FLAVOR},
            kueue_priority=self.priority,
            error=self.error,
        )
        return planner.plan(
            self.job,
            self.observed(),
            self.now,
            service_exists=self.service,
            refused=self.refused,
            restart_backoff=self.restart_backoff,
            gang_obs=obs,
        )

    def reconcile(self, log_tails: dict[str, str] | None = None) -> Plan:
        p = super().reconcile(log_tails)
        for ref in p.delete_objects:
            self.objects.pop(ref.name, None)
        for ref, patch in p.status_patches:
            obj = self.objects[ref.name]
            obj["status"] = {**obj.get("status", {}), **patch["status"]}
            if obj["status"].get("admission") is None:
                obj["status"].pop("admission", None)
        for obj in p.ensure_objects:
            self.objects.setdefault(obj["metadata"]["name"], copy.deepcopy(obj))
        self.last = p
        return p

    # -- Kueue's side
    def admit(self) -> None:
        wl = self.kueue_workload()
        assert wl is not None
        wl["status"] = {
            "admission": {
                "clusterQueue": "gpus",
                "podSetAssignments": [
                    {"name": "workers", "flavors": {"nvidia.com/gpu": "a100"}, "count": 2}
                ],
            },
            "conditions": [
                {"type": "QuotaReserved", "status": "True", "reason": "QuotaReserved"},
                {"type": "Admitted", "status": "True", "reason": "Admitted"},
            ],
        }

    def evict(self, reason: str = "Preempted") -> None:
        wl = self.kueue_workload()
        assert wl is not None
        wl["status"]["conditions"].append(
            {"type": "Evicted", "status": "True", "reason": reason, "message": "by high-prio"}
        )

    def pending(self, message: str) -> None:
        wl = self.kueue_workload()
        assert wl is not None
        wl["status"] = {
            "conditions": [
                {
                    "type": "QuotaReserved",
                    "status": "False",
                    "reason": "Pending",
                    "message": message,
                }
            ]
        }


def admission(status: dict[str, Any]) -> dict[str, Any]:
    """``status.gang``'s admission part: the mechanism and what admission reported (the
    attempt, restarts, pods, GPUs and start forecast left out)."""
    own = (
        "attempt",
        "restarts",
        "nextAttemptTime",
        "replicas",
        "gpus",
        "startForecast",
        "restartStrategy",
        "inPlaceRestarts",
    )
    return {k: v for k, v in (status.get("gang") or {}).items() if k not in own}


def native_job(**spec: Any) -> dict[str, Any]:
    return make_job(nodes=2, gpusPerNode=4, scheduling={"gang": "Native"}, **spec)


def kueue_job(queue: str | None = "team", **spec: Any) -> dict[str, Any]:
    job = make_job(nodes=2, gpusPerNode=4, **spec)
    if queue:
        job["metadata"]["labels"] = {api.KUEUE_QUEUE_LABEL: queue}
    return job


def cond_of(sim: Sim) -> dict[str, Any]:
    return cond(sim.status, c.RUNNING)


# ---- choosing the mechanism ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("gang_field", "labelled", "default", "expected"),
    [
        (None, False, "None", "None"),
        (None, False, "Native", "Native"),
        (None, True, "Native", "Kueue"),
        ("Native", True, "None", "Native"),
        ("None", False, "Native", "None"),
        ("Kueue", False, "None", "Kueue"),
    ],
)
def test_mechanism_spec_then_queue_label_then_operator_default(
    gang_field: str | None, labelled: bool, default: str, expected: str
) -> None:
    job = kueue_job("team" if labelled else None)
    if gang_field:
        job["spec"]["scheduling"] = {"gang": gang_field}
    assert gang.mechanism(job, api.parse_spec(job["spec"]), default) == expected


def test_the_recorded_mechanism_sticks_when_a_queue_label_is_added_later() -> None:
    sim = GangSim(make_job(nodes=2, gpusPerNode=4))
    sim.reconcile()
    sim.run_all()
    sim.reconcile()
    sim.job["metadata"]["labels"] = {api.KUEUE_QUEUE_LABEL: "team"}
    sim.default = api.GANG_NATIVE
    p = sim.reconcile()
    assert p.delete_pods == [] and p.ensure_objects == []
    assert admission(sim.status) == {"mechanism": "None"} and sim.status["phase"] == "Running"


def test_api_refuses_an_unknown_gang_mechanism() -> None:
    with pytest.raises(ValueError):
        api.parse_spec({"image": "x", "command": ["x"], "scheduling": {"gang": "Volcano"}})


# ---- native --------------------------------------------------------------------------------------


def test_native_creates_workload_and_attempt_pod_group_before_pods_and_joins_them() -> None:
    sim = GangSim(native_job())
    p = sim.reconcile()
    kinds = [(o["kind"], o["metadata"]["name"]) for o in p.ensure_objects]
    assert kinds == [("Workload", "bert"), ("PodGroup", "bert-a0")]
    wl, pg = p.ensure_objects
    assert wl["apiVersion"] == "scheduling.k8s.io/v1beta1"
    assert wl["spec"]["podGroupTemplates"] == [
        {"name": "workers", "schedulingPolicy": {"gang": {"minCount": 2}}}
    ]
    assert pg["spec"]["schedulingPolicy"] == {"gang": {"minCount": 2}}
    assert pg["spec"]["workloadRef"] == {"workloadName": "bert", "templateName": "workers"}
    for obj in (wl, pg):
        assert obj["metadata"]["ownerReferences"][0]["uid"] == "u1"
    assert all(x["spec"]["schedulingGroup"] == {"podGroupName": "bert-a0"} for x in p.create_pods)
    assert admission(sim.status) == {
        "mechanism": "Native",
        "workload": "bert",
        "podGroup": "bert-a0",
    }


def test_a_gang_restart_gets_a_fresh_pod_group_and_drops_the_old_one() -> None:
    sim = GangSim(native_job())
    sim.reconcile()
    sim.run_all()
    sim.reconcile()
    sim.fail("bert-node-1")
    sim.reconcile()
    sim.gc()
    p = sim.reconcile()
    assert [o["metadata"]["name"] for o in p.ensure_objects] == ["bert", "bert-a1"]
    assert [r.name for r in p.delete_objects] == ["bert-a0"]
    assert all(x["spec"]["schedulingGroup"]["podGroupName"] == "bert-a1" for x in p.create_pods)
    assert sim.status["gang"]["podGroup"] == "bert-a1"


def test_waiting_for_gang_carries_the_schedulers_pod_group_reason() -> None:
    sim = GangSim(native_job())
    sim.reconcile()
    msg = "minCount (2) cannot be satisfied: 0 scheduled, 1 remaining"
    sim.objects["bert-a0"]["status"] = {
        "conditions": [
            {
                "type": "PodGroupInitiallyScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "message": msg,
            }
        ]
    }
    sim.reconcile()
    running = cond_of(sim)
    assert running["reason"] == c.WAITING_FOR_GANG
    assert "bert-a0" in running["message"] and msg in running["message"]
    assert sim.status["phase"] == "Pending"
    sim.reconcile()
    assert sim.reasons().count(c.WAITING_FOR_GANG) == 1


def test_pods_just_created_are_pending_not_waiting_for_gang() -> None:
    sim = GangSim(native_job())
    sim.reconcile()
    sim.reconcile()
    assert cond_of(sim)["reason"] == c.PODS_PENDING


def test_native_without_the_api_creates_no_pod_and_says_what_to_enable() -> None:
    sim = GangSim(native_job(), native_version=None)
    p = sim.reconcile()
    assert p.create_pods == [] and p.ensure_objects == []
    running = cond_of(sim)
    assert running["reason"] == c.GANG_SCHEDULING_UNAVAILABLE
    assert "GenericWorkload" in running["message"]
    assert [e.type for e in p.events] == ["Warning"]
    sim.native_version = "v1alpha3"
    p = sim.reconcile()
    assert len(p.create_pods) == 2
    assert p.ensure_objects[1]["apiVersion"] == "scheduling.k8s.io/v1alpha3"


def test_none_mechanism_leaves_pods_alone() -> None:
    sim = GangSim(make_job(nodes=2, gpusPerNode=4))
    p = sim.reconcile()
    assert p.ensure_objects == [] and len(p.create_pods) == 2
    assert all("schedulingGroup" not in x["spec"] for x in p.create_pods)
    assert admission(sim.status) == {"mechanism": "None"}


# ---- Kueue ---------------------------------------------------------------------------------------


def test_kueue_job_creates_its_workload_and_no_pod_until_admitted() -> None:
    sim = GangSim(kueue_job())
    p = sim.reconcile()
    assert p.create_pods == []
    (wl,) = p.ensure_objects
    assert wl["apiVersion"] == "kueue.x-k8s.io/v1beta2" and wl["spec"]["queueName"] == "team"
    (ps,) = wl["spec"]["podSets"]
    assert ps["name"] == "workers" and ps["count"] == 2
    (ctr,) = ps["template"]["spec"]["containers"]
    assert ctr["resources"]["requests"] == {"nvidia.com/gpu": "4"}
    assert wl["metadata"]["ownerReferences"][0]["name"] == "bert"
    assert cond_of(sim)["reason"] == c.QUEUED and sim.status["phase"] == "Pending"

    sim.pending("insufficient unused quota for nvidia.com/gpu in flavor a100, 4 more needed")
    sim.reconcile()
    running = cond_of(sim)
    assert running["reason"] == c.QUEUED
    assert "LocalQueue team" in running["message"] and "4 more needed" in running["message"]
    assert sim.status["gang"]["admitted"] is False and sim.pods == {}


def workload_with(*conds: tuple[str, str, str]) -> dict[str, Any]:
    return {
        "status": {"conditions": [{"type": t, "status": st, "message": m} for t, st, m in conds]}
    }


QUOTA = "couldn't assign flavors to pod set workers: insufficient unused quota for nvidia.com/gpu"


@pytest.mark.parametrize(
    ("wl", "words"),
    [
        (workload_with(("QuotaReserved", "False", QUOTA)), QUOTA),
        (
            workload_with(
                ("QuotaReserved", "True", "Quota reserved in ClusterQueue gpus"),
                ("Admitted", "False", "The workload has not all checks ready"),
            ),
            "The workload has not all checks ready",
        ),
        (workload_with(("QuotaReserved", "False", "")), None),  # Kueue said nothing: ours
        (workload_with(("QuotaReserved", "False", 42)), None),  # type: ignore[arg-type]
        ({"status": {}}, None),  # not looked at by Kueue yet
        (None, None),
    ],
    ids=["quota", "admission-checks", "empty", "not-text", "no-conditions", "no-workload"],
)
def test_why_kueue_has_not_admitted_is_in_kueues_own_words(
    wl: dict[str, Any] | None, words: str | None
) -> None:
    assert gang.pending_words(wl) == words


def test_kueues_words_are_one_bounded_line_whatever_it_wrote() -> None:
    hostile = "insufficient\nquota\x1b[31m " + "x" * 5000
    words = gang.pending_words(workload_with(("QuotaReserved", "False", hostile)))
    assert words is not None and len(words) == gang.KUEUE_WORDS_MAX
    assert words.startswith("insufficient quota [31m x") and words.endswith("...")
    assert words.isprintable()


def test_a_queued_jobs_condition_quotes_kueue_bounded() -> None:
    sim = GangSim(kueue_job())
    sim.reconcile()
    sim.pending(QUOTA + ", 4 more needed" * 100)
    sim.reconcile()
    running = cond_of(sim)
    assert running["reason"] == c.QUEUED
    assert running["message"].startswith(
        f"queued in LocalQueue team, waiting for Kueue to admit it: {QUOTA}, 4 more needed"
    )
    assert len(running["message"]) < 100 + gang.KUEUE_WORDS_MAX


def test_admission_gives_pods_the_flavors_node_labels_and_tolerations() -> None:
    job = kueue_job(template={"nodeSelector": {"zone": "a"}})
    sim = GangSim(job)
    sim.reconcile()
    sim.admit()
    p = sim.reconcile()
    assert len(p.create_pods) == 2
    for pod in p.create_pods:
        assert pod["spec"]["nodeSelector"] == {"zone": "a", "gpu.example.com/model": "a100"}
        assert pod["spec"]["tolerations"] == FLAVOR["spec"]["tolerations"]
    gs = sim.status["gang"]
    assert gs["admitted"] is True and gs["clusterQueue"] == "gpus"
    assert gs["flavors"] == {"nvidia.com/gpu": "a100"}


def test_preemption_is_a_reason_hands_quota_back_and_the_job_resumes() -> None:
    sim = running_kueue_gang()

    sim.evict("Preempted")
    p = sim.reconcile()
    assert sorted(p.delete_pods) == ["bert-node-0", "bert-node-1"]
    assert p.status_patches == []  # the quota goes back only once the pods are gone
    running = cond_of(sim)
    assert running["reason"] == c.PREEMPTED and sim.status["phase"] == "Pending"
    assert sim.status["gang"]["restarts"] == 0 and "failure" not in sim.status
    assert sim.status["gang"]["preemptions"] == 1 and sim.status["gang"]["attempt"] == 1

    sim.gc()
    p = sim.reconcile()
    ((ref, patch),) = p.status_patches
    assert ref.plural == "workloads" and patch["status"]["admission"] is None
    conds = {x["type"]: x for x in patch["status"]["conditions"]}
    assert conds["QuotaReserved"]["status"] == "False"
    assert conds["Requeued"]["status"] == "True" and conds["Admitted"]["status"] == "False"
    assert cond_of(sim)["reason"] == c.PREEMPTED  # still says why it waits
    sim.reconcile()
    assert sim.status["gang"]["preemptions"] == 1

    sim.admit()
    p = sim.reconcile()
    assert len(p.create_pods) == 2
    assert {x["metadata"]["labels"]["gpujob.dev/attempt"] for x in p.create_pods} == {"1"}
    sim.run_all()
    sim.reconcile()
    assert sim.status["phase"] == "Running"


def test_finished_job_marks_its_kueue_workload_finished_once() -> None:
    sim = GangSim(kueue_job())
    sim.reconcile()
    sim.admit()
    sim.reconcile()
    sim.succeed_all()
    p = sim.reconcile()
    assert sim.status["phase"] == "Succeeded"
    ((_, patch),) = p.status_patches
    (finished,) = [x for x in patch["status"]["conditions"] if x["type"] == "Finished"]
    assert finished["status"] == "True" and finished["reason"] == "Succeeded"
    assert sim.reconcile().status_patches == []


def test_suspending_a_kueue_job_deletes_its_workload() -> None:
    sim = GangSim(kueue_job())
    sim.reconcile()
    sim.job["spec"]["runPolicy"] = {"suspend": True}
    p = sim.reconcile()
    assert [r.name for r in p.delete_objects] == [gang.kueue_workload_name(sim.job)]


def test_kueue_without_a_queue_label_warns_and_creates_nothing() -> None:
    sim = GangSim(kueue_job(queue=None, scheduling={"gang": "Kueue"}))
    p = sim.reconcile()
    assert p.create_pods == [] and p.ensure_objects == []
    assert cond_of(sim)["reason"] == c.QUEUE_NAME_MISSING
    assert [e.type for e in p.events] == ["Warning"]


def test_priority_class_label_sets_the_workloads_priority_or_waits_for_the_class() -> None:
    job = kueue_job()
    job["metadata"]["labels"][api.KUEUE_PRIORITY_LABEL] = "high"
    sim = GangSim(job)
    p = sim.reconcile()
    assert p.ensure_objects == [] and cond_of(sim)["reason"] == c.PRIORITY_CLASS_NOT_FOUND
    sim.priority = 1000
    (wl,) = sim.reconcile().ensure_objects
    assert wl["spec"]["priority"] == 1000
    assert wl["spec"]["priorityClassRef"] == {
        "group": "kueue.x-k8s.io",
        "kind": "WorkloadPriorityClass",
        "name": "high",
    }


def test_kueue_workload_name_changes_with_the_job_uid() -> None:
    a, b = kueue_job(), kueue_job()
    b["metadata"]["uid"] = "u2"
    assert gang.kueue_workload_name(a) != gang.kueue_workload_name(b)
    assert gang.kueue_workload_name(a).startswith("gpujob-bert-")


def test_kueue_state_reads_admission_check_pod_set_updates() -> None:
    wl = {
        "status": {
            "conditions": [{"type": "Admitted", "status": "True"}],
            "admissionChecks": [
                {
                    "name": "prov",
                    "podSetUpdates": [
                        {"name": "workers", "nodeSelector": {"pool": "spot"}, "labels": {"x": "1"}}
                    ],
                }
            ],
        }
    }
    st = gang.kueue_state(wl)
    pod: dict[str, Any] = {"metadata": {"labels": {"a": "b"}}, "spec": {}}
    gang.apply_admission(pod, st, {})
    assert pod["spec"]["nodeSelector"] == {"pool": "spot"}
    assert pod["metadata"]["labels"] == {"x": "1", "a": "b"}


@pytest.mark.parametrize("job", [native_job(), kueue_job()], ids=["native", "kueue"])
def test_unreadable_admission_objects_hold_the_gang_with_a_warning(job: dict[str, Any]) -> None:
    sim = GangSim(job)
    sim.error = 'kueue: 403 workloads.kueue.x-k8s.io "x" is forbidden'
    p = sim.reconcile()
    assert p.create_pods == [] and p.ensure_objects == []
    running = cond_of(sim)
    assert running["reason"] == c.GANG_SCHEDULING_UNAVAILABLE and "403" in running["message"]
    assert [e.type for e in p.events] == ["Warning"]
    sim.error = None
    sim.reconcile()
    assert sim.objects  # the gang's objects come once the operator may read them


def test_kueue_workload_hears_pods_ready_when_every_rank_runs_and_again_after_a_restart() -> None:
    sim = GangSim(kueue_job())
    sim.reconcile()
    sim.admit()
    p = sim.reconcile()

    def ready() -> tuple[str, str]:
        wl = sim.kueue_workload()
        assert wl is not None
        cond = next(x for x in wl["status"]["conditions"] if x["type"] == "PodsReady")
        return cond["status"], cond["reason"]

    assert ready() == ("False", "WaitForStart")
    sim.run_all()
    sim.reconcile()
    assert ready() == ("True", "Started")
    assert sim.reconcile().status_patches == []  # nothing changes, nothing is written
    sim.fail("bert-node-0")
    sim.reconcile()
    assert ready() == ("False", "WaitForRecovery")
    sim.gc()
    sim.reconcile()
    sim.run_all()
    sim.reconcile()
    assert ready() == ("True", "Recovered")
    assert p.create_pods


def test_workload_status_patches_apply_only_to_the_version_they_were_computed_from() -> None:
    wl = {
        "metadata": {"name": "w", "resourceVersion": "42"},
        "status": {"conditions": [{"type": "Evicted", "status": "True", "reason": "Preempted"}]},
    }
    now = "2026-03-01T12:00:00Z"
    for patch in (
        gang.release_quota_patch(wl, now),
        gang.finish_patch(wl, True, "done", now),
        gang.pods_ready_patch(wl, True, now),
    ):
        assert patch is not None and patch["metadata"] == {"resourceVersion": "42"}
        kept = [x for x in patch["status"]["conditions"] if x["type"] == "Evicted"]
        assert kept == wl["status"]["conditions"]  # Kueue's own conditions are carried over


def test_a_refused_kueue_workload_shows_the_refusal_and_waits_for_its_retry() -> None:
    from datetime import timedelta

    from gpujob_operator.lifecycle.apiserver.refusals import Refusal, Refused

    sim = GangSim(kueue_job())
    refusal = Refusal(c.OPERATOR_FORBIDDEN, False, "workloads is forbidden", 403)
    sim.refused = Refused(refusal, "Workload w", sim.now, sim.now + timedelta(seconds=8), 1)
    p = sim.reconcile()
    assert p.ensure_objects == [] and p.requeue_after == 8
    running = cond_of(sim)
    assert running["reason"] == c.OPERATOR_FORBIDDEN and "forbidden" in running["message"]
    assert [e.type for e in p.events] == ["Warning"]
    sim.now += timedelta(seconds=9)
    (wl,) = sim.reconcile().ensure_objects
    assert wl["kind"] == "Workload"


def running_kueue_gang() -> GangSim:
    sim = GangSim(kueue_job())
    sim.reconcile()
    sim.admit()
    sim.reconcile()
    sim.run_all()
    sim.reconcile()
    assert sim.status["phase"] == "Running" and sim.status["gang"]["attempt"] == 0
    return sim


def test_a_workload_deleted_while_the_gang_runs_counts_like_an_eviction() -> None:
    sim = running_kueue_gang()
    name = gang.kueue_workload_name(sim.job)
    del sim.objects[name]  # kubectl delete workload
    p = sim.reconcile()
    assert sorted(p.delete_pods) == ["bert-node-0", "bert-node-1"]
    assert p.ensure_objects == []  # no second Workload while the old pods hold the GPUs
    st = sim.status
    assert st["gang"]["attempt"] == 1 and st["gang"]["restarts"] == 0 and "failure" not in st
    assert st["gang"]["preemptions"] == 1 and st["phase"] == "Pending"
    running = cond_of(sim)
    assert running["reason"] == c.WORKLOAD_DELETED and name in running["message"]
    assert [(e.type, e.reason) for e in p.events] == [("Warning", c.WORKLOAD_DELETED)]
    # While the pods terminate: nothing new, no second Warning, no second count.
    p = sim.reconcile()
    assert p.ensure_objects == [] and p.events == [] and sim.status["gang"]["attempt"] == 1
    sim.gc()
    (wl,) = sim.reconcile().ensure_objects
    assert wl["metadata"]["name"] == name and cond_of(sim)["reason"] == c.WORKLOAD_DELETED
    sim.pending("waiting for quota")
    sim.reconcile()
    assert cond_of(sim)["reason"] == c.WORKLOAD_DELETED  # still says why it waits
    assert sim.status["gang"]["preemptions"] == 1
    sim.admit()
    p = sim.reconcile()
    assert {x["metadata"]["labels"]["gpujob.dev/attempt"] for x in p.create_pods} == {"1"}
    sim.run_all()
    sim.reconcile()
    assert sim.status["phase"] == "Running" and sim.status["gang"]["attempt"] == 1


@pytest.mark.parametrize("job", [native_job(), kueue_job()], ids=["native", "kueue"])
def test_a_failed_read_never_deletes_the_gangs_pods(job: dict[str, Any]) -> None:
    sim = GangSim(job)
    sim.reconcile()
    if sim.kueue_workload() is not None:
        sim.admit()
        sim.reconcile()
    sim.run_all()
    sim.reconcile()
    assert sim.status["phase"] == "Running"
    before = copy.deepcopy(sim.status)
    sim.error = '403 workloads.kueue.x-k8s.io "x" is forbidden'
    p = sim.reconcile()
    assert p.delete_pods == [] and p.create_pods == [] and p.ensure_objects == []
    assert p.requeue_after is not None and p.requeue_after <= 10
    st = sim.status
    assert st["phase"] == "Running" and st["gang"]["attempt"] == 0
    assert st["conditions"] == before["conditions"]
    assert {k: v for k, v in st["gang"].items() if k != "readError"} == before["gang"]
    assert "403" in st["gang"]["readError"]
    (warning,) = p.events
    assert warning.type == "Warning" and "pod(s) are kept" in warning.message
    assert sim.reconcile().events == []  # warned once while it lasts
    sim.error = None
    p = sim.reconcile()
    assert p.delete_pods == [] and "readError" not in sim.status["gang"]
    assert sim.status["phase"] == "Running"


def test_a_webhook_denying_the_kueue_workload_is_retried_for_its_window_then_fails() -> None:
    from datetime import timedelta

    from gpujob_operator.lifecycle.apiserver.refusals import Refused, classify

    sim = GangSim(kueue_job(runPolicy={"admissionRetrySeconds": 30}))
    body = {"message": 'admission webhook "budget.example.com" denied the request: not now'}
    denied = classify(403, body)
    t0 = sim.now
    sim.refused = Refused(
        denied, "Workload kueue.x-k8s.io/v1beta2 w", t0, t0 + timedelta(seconds=8)
    )
    p = sim.reconcile()
    assert p.ensure_objects == [] and p.requeue_after == 8
    running = cond_of(sim)
    assert running["reason"] == c.ADMISSION_WEBHOOK_DENIED and "retried until" in running["message"]
    assert sim.status["operatorState"]["admissionDenial"]["target"].startswith("Workload ")
    sim.now = t0 + timedelta(seconds=30)
    sim.reconcile()
    assert sim.status["phase"] == "Failed"
    assert "retried for 30s" in cond(sim.status, c.FAILED)["message"]


def test_a_workload_created_after_denials_ends_their_run() -> None:
    from datetime import timedelta

    from gpujob_operator.lifecycle.apiserver.refusals import Refused, classify

    sim = GangSim(kueue_job())
    denied = classify(403, {"message": 'admission webhook "b.example.com" denied the request'})
    t0 = sim.now
    sim.refused = Refused(
        denied, "Workload kueue.x-k8s.io/v1beta2 w", t0, t0 + timedelta(seconds=1)
    )
    sim.reconcile()
    sim.now = t0 + timedelta(seconds=1)
    sim.reconcile()  # the retry: this time the Workload is created
    sim.refused = None
    sim.reconcile()
    assert sim.kueue_workload() is not None and "admissionDenial" not in (
        sim.status.get("operatorState") or {}
    )


def test_kueue_pod_set_carries_init_containers_pod_resources_and_claims() -> None:
    """Kueue charges what the scheduler will: sidecars, pod-level resources, DRA claims."""
    job = kueue_job(
        template={
            "initContainers": [
                {
                    "name": "log",
                    "image": "x",
                    "restartPolicy": "Always",
                    "command": ["run"],
                    "resources": {"requests": {"cpu": "1"}},
                }
            ],
            "resources": {"requests": {"memory": "8Gi"}},
            "resourceClaims": [{"name": "nic", "resourceClaimTemplateName": "rdma"}],
        }
    )
    sim = GangSim(job)
    (wl,) = sim.reconcile().ensure_objects
    spec = wl["spec"]["podSets"][0]["template"]["spec"]
    assert spec["initContainers"] == [
        {
            "name": "log",
            "image": "x",
            "restartPolicy": "Always",
            "resources": {"requests": {"cpu": "1"}},
        }
    ]
    assert spec["resources"] == {"requests": {"memory": "8Gi"}}
    assert spec["resourceClaims"] == [{"name": "nic", "resourceClaimTemplateName": "rdma"}]


# ---- a wide gang's pods beyond the first batch ---------------------------------------------------


@pytest.mark.parametrize("mechanism", ["None", "Native", "Kueue"])
def test_pods_built_beyond_the_batch_are_those_a_later_pass_would_build(mechanism: str) -> None:
    """The I/O shell builds a wide gang's pods beyond the first batch with the plan's
    ``build_more``, after the plan: each must be the pod a later pass would have built
    (the gang's PodGroup or Kueue admission, the placement), and building them must not
    change the plan."""
    nodes = 200
    job = make_job(nodes=nodes, gpusPerNode=4)
    if mechanism == "Native":
        job["spec"]["scheduling"] = {"gang": "Native"}
    if mechanism == "Kueue":
        job["metadata"]["labels"] = {api.KUEUE_QUEUE_LABEL: "team"}
    sim = GangSim(job)
    if mechanism == "Kueue":
        sim.reconcile()  # the Workload first
        sim.admit()
        wl = sim.kueue_workload()
        assert wl is not None
        wl["status"]["admission"]["podSetAssignments"][0]["count"] = nodes
    p = sim.reconcile()
    assert p.create_pods and p.build_more is not None and p.more_pods == len(p.more_ranks)
    ensure, status = copy.deepcopy(p.ensure_objects), copy.deepcopy(p.status)
    early = {r: p.build_more(r) for r in p.more_ranks}
    assert (p.ensure_objects, p.status) == (ensure, status)
    later: dict[str, dict[str, Any]] = {}
    while (q := sim.reconcile()).create_pods:
        later.update({b["metadata"]["name"]: b for b in q.create_pods})
    assert len(sim.pods) == nodes
    assert {b["metadata"]["name"]: b for b in early.values()} == later
