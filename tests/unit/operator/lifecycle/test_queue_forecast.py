"""The forecast read from plain API objects and written as status.gang.startForecast
(lifecycle/forecast/queueview.py, lifecycle/forecast/queuestatus.py), and the ETA column and
metrics that show it."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gpujob_operator import api
from gpujob_operator.api.display import render_display
from gpujob_operator.lifecycle.forecast import queuestatus as qs
from gpujob_operator.lifecycle.forecast import queueview
from gpujob_operator.lifecycle.forecast.queueview import World, fits_node, kueue_view, node_view
from gpujob_operator.observability.jobsample import JobSample

NOW = 1_796_000_000.0  # 2026-11-30T00:53:20Z


def iso(t: float) -> str:
    return qs._time(t) or ""


def job(
    name: str,
    phase: str | None = "Pending",
    nodes: int = 1,
    gpus: int = 4,
    eta_at: float | None = None,
    created: str = "2026-11-30T00:00:00Z",
    labels: dict[str, str] | None = None,
    **spec: Any,
) -> dict[str, Any]:
    status: dict[str, Any] = {"phase": phase} if phase else {}
    if eta_at is not None:
        status["progress"] = {"estimatedCompletionTime": iso(eta_at), "etaSeconds": eta_at - NOW}
    return {
        "apiVersion": api.API_VERSION,
        "kind": api.KIND,
        "metadata": {
            "name": name,
            "namespace": "ml",
            "uid": f"uid-{name}",
            "creationTimestamp": created,
            "labels": labels or {},
        },
        "spec": {
            "image": "t:1",
            "command": ["python"],
            "nodes": nodes,
            "gpusPerNode": gpus,
            **spec,
        },
        "status": status,
    }


def node(
    name: str, gpus: int = 4, labels: dict[str, str] | None = None, **spec: Any
) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": labels or {}},
        "spec": spec,
        "status": {"allocatable": {"nvidia.com/gpu": str(gpus), "cpu": "64"}},
    }


def pod(
    name: str, node_name: str, gpus: int = 4, owner: str | None = None, phase: str = "Running"
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "ml"}
    if owner:
        meta["ownerReferences"] = [{"uid": f"uid-{owner}", "controller": True, "kind": api.KIND}]
    return {
        "metadata": meta,
        "spec": {
            "nodeName": node_name,
            "containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": gpus}}}],
        },
        "status": {"phase": phase},
    }


# ---- nodes ---------------------------------------------------------------------------------


def test_a_node_fits_only_what_its_labels_taints_and_cordon_allow() -> None:
    spec = {
        "nodeSelector": {"pool": "a100"},
        "tolerations": [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}
                    ]
                }
            }
        },
    }
    good = {"pool": "a100", "zone": "a"}
    assert fits_node(spec, node("n", labels=good, taints=[{"key": "gpu", "effect": "NoSchedule"}]))
    assert not fits_node(spec, node("n", labels={**good, "pool": "h100"}))
    assert not fits_node(spec, node("n", labels={**good, "zone": "b"}))
    assert not fits_node(spec, node("n", labels=good, unschedulable=True))
    other_taint = [{"key": "maint", "value": "x", "effect": "NoExecute"}]
    assert not fits_node(spec, node("n", labels=good, taints=other_taint))
    soft_taint = [{"key": "maint", "effect": "PreferNoSchedule"}]
    assert fits_node(spec, node("n", labels=good, taints=soft_taint))


def test_node_view_holders_are_jobs_with_their_eta_and_foreign_pods_without() -> None:
    jobs = [job("a", "Running", eta_at=NOW + 600), job("w")]
    pods = [
        pod("a-node-0", "n1", owner="a"),
        pod("notebook", "n2", gpus=2),
        pod("done", "n2", phase="Succeeded"),
        pod("unbound", "", gpus=4),
    ]
    view = node_view(NOW, jobs, [node("n1"), node("n2"), node("cpu", gpus=0)], pods, "None")
    assert view.capacity == {"node:n1": 4, "node:n2": 4}
    by_name = {h.name: h for h in view.holders}
    assert by_name["job ml/a"].usage == {"node:n1": 4}
    assert by_name["job ml/a"].ends_at == NOW + 600
    assert by_name["pod ml/notebook"].ends_at is None
    assert set(by_name) == {"job ml/a", "pod ml/notebook"}
    (w,) = view.waiters
    assert (w.name, w.count, w.per, w.slots) == ("job ml/w", 1, 4, (("node:n1",), ("node:n2",)))


def test_a_native_sidecars_gpus_count_in_what_a_pod_holds() -> None:
    """A bound pod holds what the scheduler counts (lifecycle/gang/podholds.py): its app containers
    plus its native sidecars (init containers with restartPolicy: Always), or its largest
    init container if more; a sidecar's GPU used to be left out, and the waiter fit."""
    notebook = pod("notebook", "n1", gpus=2)
    notebook["spec"]["initContainers"] = [
        {"name": "prep", "resources": {"limits": {"nvidia.com/gpu": 1}}},
        {"name": "viz", "restartPolicy": "Always", "resources": {"limits": {"nvidia.com/gpu": 1}}},
    ]
    view = node_view(NOW, [job("w", gpus=2)], [node("n1")], [notebook], "None")
    assert [(h.name, h.usage) for h in view.holders] == [("pod ml/notebook", {"node:n1": 3})]
    world = World(nodes=[node("n1")], pods=[notebook])
    got = qs.forecast_blocks(NOW, [job("w", gpus=2)], world, "None")["ml/w"]
    # 1 GPU of 4 free: the 2-GPU job waits for the notebook (it fit "now, Exact" before)
    assert (got["confidence"], got["reason"]) == ("LowerBound", "no known end: pod ml/notebook")


def test_the_forecast_reads_the_same_from_its_pod_projection() -> None:
    """The forecast keeps holder_projection of each listed pod, never the body."""
    jobs = [job("a", "Running", eta_at=NOW + 600), job("w", nodes=2), job("x", gpus=2)]
    notebook = pod("notebook", "n2", gpus=1)
    notebook["spec"]["initContainers"] = [
        {"name": "viz", "restartPolicy": "Always", "resources": {"limits": {"nvidia.com/gpu": 1}}},
    ]
    notebook["spec"]["overhead"] = {"cpu": "100m"}
    notebook["spec"]["containers"][0]["env"] = [{"name": "PAD", "value": "x" * 100_000}]
    pods = [
        pod("a-node-0", "n1", owner="a"),
        pod("w-node-0", "n3", owner="w"),
        notebook,
        pod("done", "n2", phase="Succeeded"),
        pod("unbound", "", gpus=4),
    ]
    nodes = [node("n1"), node("n2"), node("n3")]
    small = [queueview.holder_projection(p) for p in pods]
    assert node_view(NOW, jobs, nodes, small, "None") == node_view(NOW, jobs, nodes, pods, "None")
    full = qs.forecast_blocks(NOW, jobs, World(nodes=nodes, pods=pods), "None")
    assert qs.forecast_blocks(NOW, jobs, World(nodes=nodes, pods=small), "None") == full
    assert len(json.dumps(small[2])) < 600


def test_node_view_uses_the_pod_the_operator_would_build_for_placement() -> None:
    tpl = {"nodeSelector": {"pool": "a100"}}
    jobs = [job("w", template=tpl)]
    view = node_view(NOW, jobs, [node("n1", labels={"pool": "a100"}), node("n2")], [], "None")
    assert view.waiters[0].slots == (("node:n1",),)


def test_a_waiting_gangs_own_bound_pods_are_not_holders_it_waits_for() -> None:
    """Without gang scheduling half a gang can be bound while the rest waits: it will start
    on those GPUs, so they must not count against it (it would wait for itself forever)."""
    jobs = [job("w", nodes=2)]
    pods = [pod("w-node-0", "n1", owner="w")]
    view = node_view(NOW, jobs, [node("n1"), node("n2")], pods, "None")
    assert view.holders == []
    got = qs.forecast_blocks(NOW, jobs, World(nodes=[node("n1"), node("n2")], pods=pods), "None")
    assert (got["ml/w"]["confidence"], got["ml/w"]["estimatedStartTime"]) == ("Exact", iso(NOW))


@pytest.mark.parametrize("bad", ["1e999999999", "lots", -4, "-1", True, "4Ki" * 40, {"x": 1}])
def test_odd_quantities_and_times_cost_their_field_not_the_forecast(bad: Any) -> None:
    noisy = node("n2")
    noisy["status"]["allocatable"]["nvidia.com/gpu"] = bad
    running = job("a", "Running")
    running["status"]["progress"] = {"estimatedCompletionTime": "yesterday", "etaSeconds": "x"}
    odd = pod("odd", "n1", gpus=4)
    odd["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = bad
    world = World(nodes=[node("n1"), noisy], pods=[pod("a-node-0", "n1", owner="a"), odd])
    got = qs.forecast_blocks(NOW, [running, job("w")], world, "None")["ml/w"]
    assert got["confidence"] == "LowerBound"  # a's ETA is unreadable: no known end
    assert got["reason"] == "no known end: job ml/a"


def test_input_the_forecast_cannot_use_makes_that_kinds_jobs_unknown_not_the_pass_fail() -> None:
    broken = World(nodes=[{"metadata": {}, "status": {"allocatable": {"nvidia.com/gpu": "4"}}}])
    got = qs.forecast_blocks(NOW, [job("w")], broken, "None")["ml/w"]
    assert got["confidence"] == "Unknown" and got["reason"].startswith("cannot forecast: KeyError")


def test_waiting_jobs_queue_by_creation_and_others_do_not_wait() -> None:
    jobs = [
        job("late", created="2026-11-30T00:05:00Z"),
        job("early", created="2026-11-30T00:01:00Z"),
        job("running", "Running"),
        job("suspended", runPolicy={"suspend": True}),
        job("cpu-only", gpus=0),
        # GPUs from DRA claims: not in the nvidia.com/gpu pools the forecast models.
        job("dra", gpusFrom="ResourceClaims", resources={"claims": [{"name": "gpus"}]}),
        job("kueue", labels={api.KUEUE_QUEUE_LABEL: "team"}),
    ]
    view = node_view(NOW, jobs, [node("n1")], [], "None")
    assert [w.name for w in view.waiters] == ["job ml/early", "job ml/late"]


# ---- Kueue ---------------------------------------------------------------------------------


def cq(
    name: str,
    nominal: int,
    cohort: str | None = None,
    borrow: int | None = None,
    preemption: str | None = None,
    strategy: str | None = None,
) -> dict[str, Any]:
    res: dict[str, Any] = {"name": "nvidia.com/gpu", "nominalQuota": nominal}
    if borrow is not None:
        res["borrowingLimit"] = borrow
    spec: dict[str, Any] = {
        "resourceGroups": [
            {"coveredResources": ["nvidia.com/gpu"], "flavors": [{"name": "f", "resources": [res]}]}
        ]
    }
    if cohort:
        spec["cohortName"] = cohort
    if preemption:
        spec["preemption"] = {"withinClusterQueue": preemption}
    if strategy:
        spec["queueingStrategy"] = strategy
    return {"metadata": {"name": name}, "spec": spec}


def lq(name: str, cluster_queue: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "ml"}, "spec": {"clusterQueue": cluster_queue}}


def workload(
    name: str,
    queue: str,
    gpus: int = 4,
    admitted_in: str | None = None,
    job_name: str | None = None,
    priority: int = 0,
    created: str = "2026-11-30T00:00:00Z",
) -> dict[str, Any]:
    wl: dict[str, Any] = {
        "metadata": {
            "name": name,
            "namespace": "ml",
            "creationTimestamp": created,
            "labels": {"gpujob.dev/job-name": job_name} if job_name else {},
        },
        "spec": {
            "queueName": queue,
            "priority": priority,
            "podSets": [
                {
                    "name": "workers",
                    "count": 1,
                    "template": {
                        "spec": {
                            "containers": [
                                {"name": "c", "resources": {"requests": {"nvidia.com/gpu": gpus}}}
                            ]
                        }
                    },
                }
            ],
        },
        "status": {},
    }
    if admitted_in:
        wl["status"]["admission"] = {
            "clusterQueue": admitted_in,
            "podSetAssignments": [
                {
                    "name": "workers",
                    "flavors": {"nvidia.com/gpu": "f"},
                    "resourceUsage": {"nvidia.com/gpu": str(gpus)},
                    "count": 1,
                }
            ],
        }
    return wl


KUEUE = {api.KUEUE_QUEUE_LABEL: "team"}


def test_kueue_view_holds_quota_per_admitted_workload_and_queues_by_priority_then_age() -> None:
    jobs = [
        job("a", "Running", eta_at=NOW + 100, labels=KUEUE),
        job("w1", labels=KUEUE),
        job("w2", labels=KUEUE),
    ]
    wls = [
        workload("wl-a", "team", admitted_in="gpus", job_name="a"),
        workload("wl-other", "team", admitted_in="gpus"),
        workload("wl-w1", "team", job_name="w1", created="2026-11-30T00:01:00Z"),
        workload("wl-w2", "team", job_name="w2", created="2026-11-30T00:02:00Z", priority=10),
        workload("wl-foreign", "team", created="2026-11-30T00:00:30Z"),
    ]
    view = kueue_view(NOW, jobs, [cq("gpus", 8)], [lq("team", "gpus")], wls)
    assert view.capacity == {"cq:gpus/f": 8}
    ends = {h.name: h.ends_at for h in view.holders}
    assert ends == {"job ml/a": NOW + 100, "workload ml/wl-other": None}
    assert [(w.name, w.target) for w in view.waiters] == [
        ("job ml/w2", True),
        ("workload ml/wl-foreign", False),
        ("job ml/w1", True),
    ]


def test_kueue_cohort_pools_cap_borrowing() -> None:
    view = kueue_view(NOW, [], [cq("a", 4, "c", borrow=2), cq("b", 8, "c"), cq("solo", 2)], [], [])
    assert view.capacity == {
        "cq:a/f": 6,
        "cq:b/f": 12,
        "cohort:c/f": 12,
        "cq:solo/f": 2,
    }


def test_a_job_in_an_unknown_local_queue_is_unknown_with_why() -> None:
    jobs = [job("w", labels=KUEUE)]
    world = World(
        workloads=[workload("wl", "missing", job_name="w")], cluster_queues=[cq("gpus", 8)]
    )
    blocks = qs.forecast_blocks(NOW, jobs, world, "None")
    assert blocks["ml/w"]["confidence"] == "Unknown"
    assert blocks["ml/w"]["reason"] == "LocalQueue ml/missing not found"


def test_kueue_forecast_end_to_end_from_objects() -> None:
    jobs = [
        job("a", "Running", eta_at=NOW + 100, labels=KUEUE),
        job("b", "Running", eta_at=NOW + 400, labels=KUEUE),
        job("third", labels=KUEUE),
        job("fourth", labels=KUEUE),
    ]
    world = World(
        cluster_queues=[cq("gpus", 8)],
        local_queues=[lq("team", "gpus")],
        workloads=[
            workload("wa", "team", admitted_in="gpus", job_name="a"),
            workload("wb", "team", admitted_in="gpus", job_name="b"),
            workload("w3", "team", job_name="third", created="2026-11-30T00:01:00Z"),
            workload("w4", "team", job_name="fourth", created="2026-11-30T00:02:00Z"),
        ],
    )
    blocks = qs.forecast_blocks(NOW, jobs, world, "None")
    third, fourth = blocks["ml/third"], blocks["ml/fourth"]
    assert (third["estimatedStartTime"], third["confidence"]) == (iso(NOW + 100), "Exact")
    assert third["waitsFor"] == ["job ml/a"] and third["ahead"] == 0
    assert (fourth["estimatedStartTime"], fourth["latestStartTime"]) == (
        iso(NOW + 100),
        iso(NOW + 400),
    )
    assert fourth["confidence"] == "LowerBound" and fourth["reason"] == "no known end: job ml/third"
    assert fourth["basis"] == (
        "after job ml/third end, at the latest after job ml/b end; 1 ahead in queue"
    )
    assert fourth["waitsFor"] == ["job ml/third", "job ml/b"]


def small_behind_big(strategy: str | None) -> dict[str, dict[str, Any]]:
    """A ClusterQueue of 8 GPUs, 6 held for 10 h; big (8 GPUs, 1 h) then small (2) wait."""
    jobs = [
        job("holder", "Running", nodes=2, gpus=3, eta_at=NOW + 36_000, labels=KUEUE),
        job("big", nodes=2, gpus=4, eta_at=NOW + 3600, labels=KUEUE),
        job("small", gpus=2, labels=KUEUE),
    ]
    world = World(
        cluster_queues=[cq("gpus", 8, strategy=strategy)],
        local_queues=[lq("team", "gpus")],
        workloads=[
            workload("w-holder", "team", gpus=6, admitted_in="gpus", job_name="holder"),
            workload("w-big", "team", gpus=8, job_name="big", created="2026-11-30T00:01:00Z"),
            workload("w-small", "team", gpus=2, job_name="small", created="2026-11-30T00:02:00Z"),
        ],
    )
    return qs.forecast_blocks(NOW, jobs, world, "None")


def test_kueue_best_effort_fifo_starts_a_small_job_behind_a_big_one_now_and_not_exact() -> None:
    """Kueue's default queueingStrategy, BestEffortFIFO, admits small at once, past big."""
    small = small_behind_big(None)["ml/small"]
    assert (small["estimatedStartTime"], small["confidence"]) == (iso(NOW), "LowerBound")
    assert small["latestStartTime"] is None and small["ahead"] == 1
    assert "jumps ahead of job ml/big" in small["reason"]


def test_kueue_strict_fifo_holds_a_small_job_behind_the_big_head() -> None:
    got = small_behind_big("StrictFIFO")
    assert (got["ml/big"]["estimatedStartTime"], got["ml/big"]["confidence"]) == (
        iso(NOW + 36_000),
        "Exact",
    )
    small = got["ml/small"]
    assert (small["estimatedStartTime"], small["confidence"]) == (iso(NOW + 39_600), "Exact")
    assert small["waitsFor"] == ["job ml/big"]


def test_kube_scheduler_starts_a_small_native_gang_behind_a_big_one_now_and_not_exact() -> None:
    """Each pod is placed on its own: the gang that fits starts, whoever waits ahead."""
    jobs = [
        job("holder", "Running", eta_at=NOW + 36_000),
        job("big", gpus=8, created="2026-11-30T00:01:00Z"),
        job("small", gpus=2, created="2026-11-30T00:02:00Z"),
    ]
    world = World(nodes=[node("n1", gpus=8)], pods=[pod("holder-0", "n1", 6, owner="holder")])
    small = qs.forecast_blocks(NOW, jobs, world, "None")["ml/small"]
    assert (small["estimatedStartTime"], small["confidence"]) == (iso(NOW), "LowerBound")
    assert "jumps ahead of job ml/big" in small["reason"]


def preemption_world(policy: str | None) -> tuple[list[dict[str, Any]], World]:
    """8 GPUs: low (priority 10, 4 GPUs, 600 s left) and mid (100, 4 GPUs, 900 s left) run;
    urgent (priority 1000) waits for 4."""
    jobs = [
        job("low", "Running", eta_at=NOW + 600, labels=KUEUE),
        job("mid", "Running", eta_at=NOW + 900, labels=KUEUE),
        job("urgent", labels=KUEUE),
        job("later", labels=KUEUE),
    ]
    world = World(
        cluster_queues=[cq("gpus", 8, preemption=policy)],
        local_queues=[lq("team", "gpus")],
        workloads=[
            workload("w-low", "team", admitted_in="gpus", job_name="low", priority=10),
            workload("w-mid", "team", admitted_in="gpus", job_name="mid", priority=100),
            workload("w-urgent", "team", job_name="urgent", priority=1000),
            workload(
                "w-later", "team", job_name="later", priority=10, created="2026-11-30T00:09:00Z"
            ),
        ],
    )
    return jobs, world


def test_a_preempting_queue_head_starts_now_and_its_victim_queues_again() -> None:
    jobs, world = preemption_world("LowerPriority")
    blocks = qs.forecast_blocks(NOW, jobs, world, "None")
    urgent = blocks["ml/urgent"]
    assert (urgent["estimatedStartTime"], urgent["confidence"]) == (iso(NOW), "Exact")
    assert urgent["waitsFor"] == ["job ml/low"]  # the lowest priority is the one evicted
    assert urgent["basis"] == "by preempting job ml/low"
    # low requeues ahead of later (same priority, older) with its 600 s left. urgent never
    # ran (no known duration): at the earliest it is over at once, low reruns now and later
    # starts when that rerun ends (600 s); at the latest urgent never ends, low reruns when
    # mid ends (900 s) and later starts after it (1,500 s).
    later = blocks["ml/later"]
    assert (later["estimatedStartTime"], later["latestStartTime"]) == (
        iso(NOW + 600),
        iso(NOW + 1500),
    )
    assert later["confidence"] == "LowerBound" and later["ahead"] == 2
    assert later["reason"] == "no known end: job ml/urgent"


def test_without_preemption_the_head_waits_for_the_first_end() -> None:
    jobs, world = preemption_world(None)
    urgent = qs.forecast_blocks(NOW, jobs, world, "None")["ml/urgent"]
    assert (urgent["estimatedStartTime"], urgent["confidence"]) == (iso(NOW + 600), "Exact")


def test_a_failed_read_makes_the_forecast_unknown_with_the_reason() -> None:
    world = World(nodes_error="cannot list nodes and pods: 403 Forbidden")
    blocks = qs.forecast_blocks(NOW, [job("w")], world, "None")
    assert blocks["ml/w"]["confidence"] == "Unknown"
    assert blocks["ml/w"]["reason"] == "cannot list nodes and pods: 403 Forbidden"


# ---- status.gang.startForecast patches ------------------------------------------------------------------


def waiting_with(queue: dict[str, Any]) -> dict[str, Any]:
    j = job("w")
    j["status"]["gang"] = {"startForecast": {k: v for k, v in queue.items() if v is not None}}
    j["status"]["display"] = render_display(j["status"])
    return j


def forecast(start: float, confidence: str = "Exact", **kw: Any) -> dict[str, Any]:
    from gpujob_operator.lifecycle.forecast.simulation import Forecast

    f = Forecast(
        "ml/w", start, kw.pop("latest", None), confidence, kw.pop("basis", "GPUs free"), **kw
    )  # type: ignore[arg-type]
    return qs.block(f, NOW)


def test_a_new_forecast_is_written_with_its_eta_column() -> None:
    (u,) = qs.updates(NOW, [job("w")], {"ml/w": forecast(NOW + 3600)})
    assert u.patch["gang"]["startForecast"]["estimatedStartTime"] == iso(NOW + 3600)
    assert u.patch["display"] == {"eta": "starts ~01:53"}
    assert u.event is not None and u.event.reason == "StartForecast"
    assert u.event.message == "starts ~01:53 (Exact): GPUs free"


def test_a_forecast_that_moved_little_is_not_rewritten_and_one_that_moved_is() -> None:
    j = waiting_with(forecast(NOW + 3600))
    assert qs.updates(NOW + 5, [j], {"ml/w": forecast(NOW + 3610)}) == []
    # An hour ahead, two minutes is noise (under 5% of the wait); ten minutes is news.
    assert qs.updates(NOW + 5, [j], {"ml/w": forecast(NOW + 3600 - 120)}) == []
    (u,) = qs.updates(NOW + 5, [j], {"ml/w": forecast(NOW + 3600 - 600)})
    assert u.patch["gang"]["startForecast"]["estimatedStartTime"] == iso(NOW + 3000)
    assert u.event is None  # a moved forecast is no news for kubectl describe
    near = waiting_with(forecast(NOW + 60))
    (u,) = qs.updates(NOW, [near], {"ml/w": forecast(NOW + 50)})  # a minute ahead, 10 s is news
    (u,) = qs.updates(NOW + 5, [j], {"ml/w": forecast(NOW + 3600, "LowerBound", reason="r")})
    assert u.patch["display"] == {"eta": "starts >=01:53"}
    assert u.event is not None and u.event.message == "starts >=01:53 (LowerBound): GPUs free; r"


def test_a_start_of_now_is_not_rewritten_as_now_moves_on() -> None:
    """Blocked only by holders without an ETA, the earliest start is "now" on every pass."""
    j = waiting_with(forecast(NOW, "LowerBound", reason="r"))
    assert qs.updates(NOW + 30, [j], {"ml/w": forecast(NOW + 30, "LowerBound", reason="r")}) == []


def test_new_names_alone_are_not_news() -> None:
    j = waiting_with(forecast(NOW + 600, basis="after job ml/a end", waits_for=("job ml/a",)))
    same = forecast(NOW + 601, basis="after job ml/b end", waits_for=("job ml/b",))
    assert qs.updates(NOW, [j], {"ml/w": same}) == []


def test_a_started_job_gets_its_forecast_error_once() -> None:
    j = waiting_with(forecast(NOW + 600))
    j["status"].update(phase="Running", startTime=iso(NOW + 660))
    block = dict(j["status"]["gang"]["startForecast"])
    (u,) = qs.updates(NOW + 700, [j], {})
    assert u.patch["gang"]["startForecast"] == {**block, "forecastErrorSeconds": 60.0}
    assert u.error_seconds == 60.0
    assert u.event is not None
    assert u.event.message == f"started 60s after its forecast start {iso(NOW + 600)} (Exact)"
    j["status"]["gang"]["startForecast"]["forecastErrorSeconds"] = 60.0
    assert qs.updates(NOW + 800, [j], {}) == []


def test_a_stale_start_time_is_not_taken_for_the_start_the_forecast_was_about() -> None:
    j = waiting_with(forecast(NOW + 600))
    j["status"].update(phase="Running", startTime=iso(NOW - 9000))  # an earlier attempt's
    (u,) = qs.updates(NOW + 650, [j], {})
    assert u.error_seconds == 50.0


def test_the_start_is_when_all_ranks_ran_not_when_the_pass_noticed() -> None:
    """Native gang pods exist (``startTime``) long before they can run; the start a user saw
    is the ``Running`` transition, however late the forecaster's pass comes."""
    j = waiting_with(forecast(NOW + 600))
    running = {"type": "Running", "status": "True", "lastTransitionTime": iso(NOW + 610)}
    j["status"].update(phase="Running", startTime=iso(NOW - 100), conditions=[running])
    (u,) = qs.updates(NOW + 700, [j], {})
    assert u.error_seconds == 10.0
    running["status"] = "False"  # not running (yet): the pass time is all there is
    (u,) = qs.updates(NOW + 700, [j], {})
    assert u.error_seconds == 100.0


def test_a_suspended_job_drops_its_open_forecast() -> None:
    j = waiting_with(forecast(NOW + 600))
    j["status"]["phase"] = "Suspended"
    (u,) = qs.updates(NOW, [j], {})
    assert u.patch["gang"]["startForecast"] is None


@pytest.mark.parametrize(
    ("queue", "eta"),
    [
        ({"confidence": "Exact", "estimatedStartTime": "2026-12-05T14:20:00Z"}, "starts ~14:20"),
        (
            {
                "confidence": "LowerBound",
                "estimatedStartTime": "2026-12-05T14:20:00Z",
                "latestStartTime": "2026-12-05T14:35:00Z",
            },
            "starts 14:20-14:35",
        ),
        (
            {"confidence": "Exact", "estimatedStartTime": "2026-12-07T09:00:00Z"},
            "starts ~Dec 07 09:00",
        ),
        ({"confidence": "Unknown", "reason": "needs 16 GPUs"}, "waits"),
    ],
)
def test_the_eta_column_of_a_waiting_job_shows_its_start(queue: dict[str, Any], eta: str) -> None:
    forecast = {**queue, "computedAt": "2026-12-05T13:00:00Z"}
    status = {"phase": "Pending", "gang": {"startForecast": forecast}}
    assert render_display(status)["eta"] == eta
    running = {**status, "phase": "Running", "progress": {"etaSeconds": 60}}
    assert render_display(running)["eta"] == "1m"


def test_the_metrics_show_a_waiting_jobs_forecast_and_a_started_jobs_error() -> None:
    waiting: dict[str, Any] = {
        "phase": "Pending",
        "gang": {"startForecast": {"confidence": "LowerBound", "estimatedStartTime": iso(NOW)}},
    }
    s = JobSample.from_status(waiting)
    assert (s.start_forecast, s.start_forecast_confidence, s.start_forecast_error) == (
        NOW,
        "LowerBound",
        None,
    )
    forecast = {**waiting["gang"]["startForecast"], "forecastErrorSeconds": -12.5}
    started = {"phase": "Running", "gang": {"startForecast": forecast}}
    s = JobSample.from_status(started)
    assert (s.start_forecast, s.start_forecast_error) == (None, -12.5)


def test_the_forecast_error_of_a_status_of_the_previous_shape_keeps_its_estimate() -> None:
    """Before a pass moved it, a job's forecast is in ``status.queue``: the error is written
    with the whole block to its new place, so the estimate it was about is not lost."""
    j = waiting_with(forecast(NOW + 600))
    j["status"]["queue"] = j["status"]["gang"].pop("startForecast")
    j["status"].update(phase="Running", startTime=iso(NOW + 660))
    (u,) = qs.updates(NOW + 700, [j], {})
    written = u.patch["gang"]["startForecast"]
    assert written["forecastErrorSeconds"] == 60.0
    assert written["estimatedStartTime"] == iso(NOW + 600), written
