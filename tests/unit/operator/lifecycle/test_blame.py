"""Blamed nodes (issue 38, part 2): an attempt that ends with a cause naming a node keeps the
next attempts off it (required node affinity), with the reason and an expiry in status, and
never so many nodes that the gang cannot fit."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from gpujob_operator.api import conditions as c
from gpujob_operator.lifecycle import blame, planner
from gpujob_operator.lifecycle.blame import NodeView
from gpujob_operator.lifecycle.observations import ObservedPod
from gpujob_operator.lifecycle.planner import Plan
from tests.unit.operator.lifecycle.test_planner import T0, Sim, cond, make_job


def node(name: str, gpus: int = 8, **spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
        "spec": spec,
        "status": {"allocatable": {"nvidia.com/gpu": str(gpus), "cpu": "64", "memory": "512Gi"}},
    }


class PlacedSim(Sim):
    """The planner's simulator with nodes: the shell's node view, and the scheduler binding
    each new pod to the first node its required affinity allows."""

    def __init__(self, job: dict[str, Any], nodes: list[dict[str, Any]] | None) -> None:
        super().__init__(job)
        self.nodes = nodes
        self.view_error: str | None = None

    def node_view(self) -> NodeView | None:
        if not planner.needs_nodes(self.job, self.observed(), self.now):
            return None
        return NodeView(tuple(self.nodes or ()), self.view_error)

    def bind(self, *names: str) -> None:
        """Bind the unbound pods in order: rank i to the i-th node its affinity allows."""
        from gpujob_operator.lifecycle.forecast.queueview import fits_node

        free = list(names) or [n["metadata"]["name"] for n in self.nodes or ()]
        for pod in sorted(self.pods.values(), key=lambda p: p["metadata"]["name"]):
            if pod["spec"].get("nodeName"):
                continue
            for n in free:
                if fits_node(pod["spec"], node(n)):
                    pod["spec"]["nodeName"] = n
                    free.remove(n)
                    break

    def node_of(self, pod: str) -> str | None:
        return self.pods[pod]["spec"].get("nodeName")

    def publish(self, verdict: str, on: str, since: Any = T0, **extra: Any) -> None:
        """The metrics task's published verdict naming node ``on``."""
        self.status["bottleneck"] = {
            "verdict": verdict,
            "severity": "Critical" if verdict == "HardwareFault" else "Warning",
            "summary": f"{verdict} on {on}",
            "node": on,
            "since": c.format_time(since),
            **extra,
        }


def excluded(pod: dict[str, Any]) -> list[list[str]]:
    """The node names each required term of the pod keeps it off."""
    req = ((pod["spec"].get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    ) or {}
    return [
        [f["values"][0] for f in t.get("matchFields") or () if f["operator"] == "NotIn"]
        for t in req.get("nodeSelectorTerms") or ()
    ]


def running(nodes: int = 2, cluster: int = 3, **spec: Any) -> PlacedSim:
    sim = PlacedSim(
        make_job(nodes=nodes, gpusPerNode=8, **spec), [node(f"n{i}") for i in range(cluster)]
    )
    sim.reconcile()
    sim.bind()
    sim.run_all()
    sim.reconcile()
    assert sim.status["phase"] == "Running"
    return sim


def restart(sim: PlacedSim, failed: str = "bert-node-0", **term: Any) -> Plan:
    sim.fail(failed, **term)
    plan = sim.reconcile()
    assert sim.status["phase"] == "Restarting", sim.status["conditions"]
    return plan


def next_attempt(sim: PlacedSim) -> Plan:
    sim.gc()
    plan = sim.reconcile()
    assert plan.create_pods, sim.status["conditions"]
    return plan


def test_a_hardware_fault_the_analyzer_cleared_still_blames_its_node_when_the_rank_dies() -> None:
    sim = running()
    assert sim.node_of("bert-node-0") == "n0"
    sim.publish("HardwareFault", "n0", gpuUUID="GPU-1")
    sim.reconcile()
    suspects = sim.status["operatorState"]["suspects"]
    assert [(s["node"], s["verdict"], s["attempt"]) for s in suspects] == [
        ("n0", "HardwareFault", 0)
    ]
    del sim.status["bottleneck"]  # one window later the XID count no longer rises
    sim.now += timedelta(minutes=5)
    sim.reconcile()
    assert sim.status["operatorState"]["suspects"][0]["node"] == "n0"

    sim.now += timedelta(minutes=5)
    restart(sim, code=1)
    avoided = sim.status["gang"]["avoidedNodes"]
    assert [(a["node"], a["reason"], a["attempt"]) for a in avoided] == [("n0", "HardwareFault", 0)]
    assert avoided[0]["since"] == c.format_time(sim.now)
    assert avoided[0]["expires"] == c.format_time(sim.now + timedelta(seconds=3600))
    assert "HardwareFault on n0" in avoided[0]["message"]
    assert "avoiding n0 (HardwareFault)" in cond(sim.status, c.RESTARTING)["message"]
    blamed = [e for e in sim.events if e.reason == c.NODE_BLAMED]
    assert len(blamed) == 1 and blamed[0].type == "Warning" and "n0" in blamed[0].message
    assert "suspects" not in sim.status.get("operatorState", {}), "the next attempt starts clean"

    plan = next_attempt(sim)
    assert all(excluded(p) == [["n0"]] for p in plan.create_pods)
    sim.bind()
    assert {sim.node_of("bert-node-0"), sim.node_of("bert-node-1")} == {"n1", "n2"}
    got = cond(sim.status, c.NODES_AVOIDED)
    assert (got["status"], got["reason"]) == ("True", c.BLAMED_NODES_AVOIDED)
    assert "attempt 1 avoids n0 (HardwareFault until" in got["message"]


def test_a_gang_that_would_not_fit_goes_back_on_the_blamed_node_and_says_so() -> None:
    sim = running(cluster=2)
    sim.publish("HardwareFault", "n1")
    sim.reconcile()
    restart(sim, failed="bert-node-1")
    plan = next_attempt(sim)
    assert all(excluded(p) == [] for p in plan.create_pods), "two 8-GPU pods need both nodes"
    got = cond(sim.status, c.NODES_AVOIDED)
    assert (got["status"], got["reason"]) == ("False", c.TOO_FEW_NODES)
    assert "do not fit without n1 (HardwareFault" in got["message"]
    warnings = [e for e in sim.events if e.reason == c.TOO_FEW_NODES]
    assert len(warnings) == 1 and warnings[0].type == "Warning"
    assert sim.status["gang"]["avoidedNodes"][0]["node"] == "n1", "still on record"


def test_the_least_severe_exclusion_is_given_up_first() -> None:
    avoided = [
        {"node": "n1", "reason": "Straggler", "since": "2026-03-01T12:00:00Z"},
        {"node": "n0", "reason": "HardwareFault", "since": "2026-03-01T12:00:00Z"},
    ]
    pod = {"spec": {"containers": [{"resources": {"requests": {"nvidia.com/gpu": "8"}}}]}}
    view = NodeView(tuple(node(f"n{i}") for i in range(3)))
    p = blame.placement(avoided, pod, 2, view, 4)
    assert p is not None and p.excluded == ("n0",)
    assert (p.status, p.reason) == (c.FALSE, c.TOO_FEW_NODES)
    assert "without n1 (Straggler" in p.message and "still avoids n0 (HardwareFault" in p.message
    # Enough nodes: both kept; a gang that does not fit anyway keeps them too.
    more = NodeView(tuple(node(f"n{i}") for i in range(4)))
    assert blame.placement(avoided, pod, 2, more, 4).excluded == ("n0", "n1")  # type: ignore[union-attr]
    few = NodeView((node("n0"), node("n1")))
    kept = blame.placement(avoided, pod, 3, few, 4)
    assert kept is not None and kept.excluded == ("n0", "n1") and "only 2 of its 3" in kept.message


def test_nodes_that_cannot_be_read_place_the_gang_anywhere_and_say_why() -> None:
    sim = running()
    sim.publish("HardwareFault", "n0")
    sim.reconcile()
    restart(sim)
    sim.view_error = "cannot list nodes: 403 Forbidden"
    plan = next_attempt(sim)
    assert all(excluded(p) == [] for p in plan.create_pods)
    got = cond(sim.status, c.NODES_AVOIDED)
    assert (got["status"], got["reason"]) == ("False", c.NODES_UNKNOWN)
    assert "403 Forbidden" in got["message"] and "placing them on any node" in got["message"]


def test_a_rank_that_died_of_a_gpu_fault_blames_its_node_from_its_log() -> None:
    sim = running()
    sim.fail("bert-node-1", code=1)
    tail = "step 410\nRuntimeError: CUDA error: uncorrectable ECC error encountered\n"
    sim.reconcile(log_tails={"bert-node-1": tail})
    avoided = sim.status["gang"]["avoidedNodes"]
    assert [(a["node"], a["reason"]) for a in avoided] == [("n1", "HardwareFault")]
    assert "uncorrectable ECC error encountered" in avoided[0]["message"]


def test_an_ordinary_failure_blames_no_node() -> None:
    sim = running()
    sim.fail("bert-node-1", code=1)
    sim.reconcile(log_tails={"bert-node-1": "KeyError: 'labels'\n"})
    assert "avoidedNodes" not in sim.status["gang"]
    assert c.NODE_BLAMED not in sim.reasons()
    plan = next_attempt(sim)
    assert all("affinity" not in p["spec"] for p in plan.create_pods)
    assert c.find(sim.status["conditions"], c.NODES_AVOIDED) is None


@pytest.mark.parametrize(("held_minutes", "blamed"), [(5, False), (6, True), (20, True)])
def test_a_straggler_is_blamed_once_it_held_avoid_after_windows(
    held_minutes: int, blamed: bool
) -> None:
    sim = running(runPolicy={"avoidAfterWindows": 3})  # 3 x the 120 s window = 6 min
    sim.publish("Straggler", "n1", since=T0)
    sim.reconcile()
    sim.now = T0 + timedelta(minutes=held_minutes)
    sim.reconcile()
    restart(sim)
    avoided = sim.status["gang"].get("avoidedNodes") or []
    assert [(a["node"], a["reason"]) for a in avoided] == ([("n1", "Straggler")] if blamed else [])
    if blamed:
        assert f"held {held_minutes / 2:.1f} windows" in avoided[0]["message"]


def test_a_stall_restart_blames_the_node_its_hang_evidence_names() -> None:
    sim = running(runPolicy={"restartOnStall": True})
    sim.status["conditions"] += [
        c.make(c.STALLED, "True", c.STALL_CONFIRMED, "no step for 615s (2 scrapes)", T0),
    ]
    sim.status["hangEvidence"] = {
        "attempt": 0,
        "stalledSince": c.format_time(T0),
        "summary": "rank 9 is in all_reduce #812 while the others wait in #813",
        "culprits": [9],
        "node": "n1",
    }
    sim.reconcile()
    avoided = sim.status["gang"]["avoidedNodes"]
    assert [(a["node"], a["reason"]) for a in avoided] == [("n1", "Stalled")]
    assert "rank 9" in avoided[0]["message"]


def test_a_pod_evicted_from_a_not_ready_node_blames_it_without_counting_a_restart() -> None:
    sim = running()
    pod = sim.pods["bert-node-0"]
    pod["metadata"]["deletionTimestamp"] = c.format_time(T0)
    pod["status"]["conditions"] = [
        {
            "type": "DisruptionTarget",
            "status": "True",
            "reason": blame.TAINT_MANAGER,
            "message": "Taint manager: deleting due to NoExecute taint",
        }
    ]
    sim.reconcile()
    assert sim.status["gang"]["restarts"] == 0 and sim.status["gang"]["preemptions"] == 1
    avoided = sim.status["gang"]["avoidedNodes"]
    assert [(a["node"], a["reason"]) for a in avoided] == [("n0", "NodeNotReady")]


def test_opting_out_blames_and_avoids_nothing() -> None:
    sim = running(runPolicy={"avoidBlamedNodes": False})
    sim.publish("HardwareFault", "n0")
    sim.reconcile()
    restart(sim)
    assert "avoidedNodes" not in sim.status["gang"]
    plan = next_attempt(sim)
    assert all("affinity" not in p["spec"] for p in plan.create_pods)


def test_a_blamed_node_is_avoided_until_it_expires() -> None:
    sim = running(runPolicy={"avoidSeconds": 600, "backoffLimit": 5})
    sim.publish("HardwareFault", "n0")
    sim.reconcile()
    restart(sim)
    plan = next_attempt(sim)
    assert excluded(plan.create_pods[0]) == [["n0"]]
    sim.bind()
    sim.run_all()
    sim.reconcile()
    sim.now += timedelta(seconds=601)
    restart(sim, failed="bert-node-1")
    assert "avoidedNodes" not in sim.status["gang"], "expired entries go"
    plan = next_attempt(sim)
    assert all("affinity" not in p["spec"] for p in plan.create_pods)
    got = cond(sim.status, c.NODES_AVOIDED)
    assert (got["status"], got["reason"]) == ("False", c.NO_BLAMED_NODES)


def test_blamed_nodes_add_to_every_term_of_the_users_own_affinity() -> None:
    terms = [
        {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]},
        {"matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": ["n9"]}]},
    ]
    pod = {
        "spec": {
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}
                }
            }
        }
    }
    out = blame.exclude(pod, ["n0", "n1"])
    assert excluded(out) == [["n0", "n1"], ["n9", "n0", "n1"]]
    got = out["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert got["nodeSelectorTerms"][0]["matchExpressions"] == terms[0]["matchExpressions"]
    assert excluded(pod) == [[], ["n9"]], "the input is not changed"
    assert blame.exclude(pod, []) is pod


def test_the_shell_reads_nodes_only_for_a_pass_that_may_create_avoiding_pods() -> None:
    sim = running()
    assert not planner.needs_nodes(sim.job, sim.observed(), sim.now), "nothing avoided"
    sim.publish("HardwareFault", "n0")
    sim.reconcile()
    restart(sim)
    assert not planner.needs_nodes(sim.job, sim.observed(), sim.now), "the old pods still go"
    sim.gc()
    assert planner.needs_nodes(sim.job, sim.observed(), sim.now), "the next attempt lacks its pods"
    sim.job["spec"]["runPolicy"] = {"suspend": True}
    assert not planner.needs_nodes(sim.job, sim.observed(), sim.now), "suspended"
    del sim.job["spec"]["runPolicy"]
    sim.status["gang"]["nextAttemptTime"] = c.format_time(sim.now + timedelta(seconds=20))
    assert not planner.needs_nodes(sim.job, sim.observed(), sim.now), "backing off"
    del sim.status["gang"]["nextAttemptTime"]
    next_attempt(sim)
    assert not planner.needs_nodes(sim.job, sim.observed(), sim.now), "every rank of it exists"


def test_suspects_stay_bounded_and_a_straggler_never_pushes_out_a_hardware_fault() -> None:
    status: dict[str, Any] = {"operatorState": {"suspects": []}}
    for i in range(blame.MAX_SUSPECTS):
        kind = "HardwareFault" if i == 0 else "Straggler"
        status["bottleneck"] = {"verdict": kind, "node": f"n{i}", "since": "2026-03-01T12:00:00Z"}
        status["operatorState"]["suspects"] = blame.suspects(status, 0, T0)
    status["bottleneck"] = {"verdict": "Straggler", "node": "late"}
    got = blame.suspects(status, 0, T0)
    assert len(got) == blame.MAX_SUSPECTS
    assert got[0]["node"] == "n0" and got[-1]["node"] == "late"
    # An older attempt's suspects are dropped; other verdicts name no suspect.
    assert blame.suspects({**status, "bottleneck": {"verdict": "InputBound"}}, 1, T0) == []


def test_capacity_counts_what_each_node_holds_and_skips_what_the_pod_cannot_use() -> None:
    pod = {"spec": {"containers": [{"resources": {"requests": {"nvidia.com/gpu": "4"}}}]}}
    nodes = [
        node("a", gpus=8),
        node("b", gpus=4),
        node("c", gpus=8, unschedulable=True),
        node("d", gpus=8, taints=[{"key": "k", "effect": "NoSchedule"}]),
        {"metadata": {"name": "cpu"}, "status": {"allocatable": {"cpu": "64"}}},
    ]
    assert blame.capacity(pod, nodes, frozenset(), 10) == 3
    assert blame.capacity(pod, nodes, frozenset({"a"}), 10) == 1
    assert blame.capacity(pod, nodes, frozenset(), 2) == 2, "capped at what is needed"
    assert blame.capacity({"spec": {"containers": [{}]}}, nodes, frozenset(), 5) == 5


def test_a_failed_pod_without_a_node_blames_nothing() -> None:
    end = blame.Ending(
        failure={"message": "GPU is lost"},
        failed=ObservedPod("p", 0, 0, phase="Failed", node_name=None),
    )
    assert blame.blamed(end) == []


def test_a_failed_preflight_blames_the_node_its_last_line_names() -> None:
    sim = running(runPolicy={"preflight": {"enabled": True}})
    line = "gpujob preflight FAILED on node n1 (node rank 1): GEMM 0.1 TFLOP/s on cpu is 0.2x"
    sim.fail("bert-node-1", code=86)
    sim.reconcile(log_tails={"bert-node-1": f"loading\n{line} (1.8s)\n"})
    avoided = sim.status["gang"]["avoidedNodes"]
    assert [(a["node"], a["reason"]) for a in avoided] == [("n1", "Preflight")]
    assert avoided[0]["message"] == f"{line} (1.8s)"


def test_a_gang_wide_preflight_failure_or_another_exit_code_blames_no_node() -> None:
    for code, tail in (
        (86, "gpujob preflight FAILED for the gang: the 2 nodes did not meet within 300s"),
        (1, "gpujob preflight FAILED on node n1 (node rank 1): printed by the user's script"),
    ):
        sim = running(runPolicy={"preflight": {"enabled": True}})
        sim.fail("bert-node-1", code=code)
        sim.reconcile(log_tails={"bert-node-1": tail})
        assert "avoidedNodes" not in sim.status["gang"], (code, tail)


@pytest.mark.parametrize("launcher", ["torchrun", "none"])
def test_preflight_runs_before_the_command_and_is_told_its_node(launcher: str) -> None:
    from gpujob_operator.lifecycle import builders

    job = make_job(
        nodes=2,
        gpusPerNode=8,
        training={"launcher": launcher},
        runPolicy={"preflight": {"enabled": True, "minGemmTFLOPS": 400, "timeoutSeconds": 60}},
    )
    pod = builders.build_pod(job, 1, 0)
    trainer = pod["spec"]["containers"][0]
    command = trainer["command"]
    check = command[: command.index("--") + 1]
    assert check == [
        "python", "-m", "gpujob_trainer.preflight", "--min-relative=0.5",
        "--min-peak-ratio=0.25", "--timeout=60", "--port=29501", "--min-tflops=400", "--",
    ]  # fmt: skip
    rest = command[len(check) :]
    assert rest[0] == ("torchrun" if launcher == "torchrun" else "python")
    assert rest[-2:] == ["-m", "train"]
    env = {e["name"]: e for e in trainer["env"]}
    assert env["GPUJOB_NODE_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    plain = builders.build_pod(make_job(nodes=2, gpusPerNode=8), 1, 0)
    assert plain["spec"]["containers"][0]["command"][0] == "torchrun"
    assert "GPUJOB_NODE_NAME" not in {e["name"] for e in plain["spec"]["containers"][0]["env"]}


def test_a_published_suspect_does_not_make_every_pass_write_the_status() -> None:
    from gpujob_operator.api.patches import minimal_patch

    sim = running()
    sim.publish("Straggler", "n1", since=T0)
    sim.reconcile()
    for seconds in (5, 30, 59, 61, 119):
        sim.now = T0 + timedelta(seconds=seconds)
        assert minimal_patch(sim.status, sim.plan().status) == {}, seconds


def test_a_straggler_holds_in_spells_and_a_moved_verdict_lends_no_time() -> None:
    sim = running(runPolicy={"avoidAfterWindows": 3})  # 360 s
    sim.publish("Straggler", "n0", since=T0)
    sim.reconcile()
    sim.now = T0 + timedelta(minutes=10)  # n0 held 10 min, then the verdict moves to n1
    sim.publish("Straggler", "n1", since=T0)  # hysteresis keeps the verdict's first time
    sim.reconcile()
    got = {s["node"]: s for s in sim.status["operatorState"]["suspects"]}
    assert got["n0"]["heldSeconds"] == 600 and "since" not in got["n0"]
    assert got["n1"]["since"] == c.format_time(sim.now), "its own spell, not the verdict's"
    sim.now += timedelta(seconds=30)
    del sim.status["bottleneck"]
    sim.reconcile()
    sim.now += timedelta(hours=1)  # a long gap, then n1 straggles for a minute more
    sim.publish("Straggler", "n1", since=T0)
    sim.reconcile()
    sim.now += timedelta(minutes=1)
    restart(sim)
    avoided = sim.status["gang"]["avoidedNodes"]
    assert [(a["node"], a["reason"]) for a in avoided] == [("n0", "Straggler")]
    assert "held 5.0 windows" in avoided[0]["message"]


def test_a_node_blamed_again_keeps_its_more_severe_reason() -> None:
    avoided = [{"node": "n0", "reason": "HardwareFault", "message": "XID 79", "attempt": 0}]
    got = blame.record(avoided, [("n0", "Straggler", "slow"), ("n1", "Stalled", "rank 3")], 2,
                       T0, 600)  # fmt: skip
    assert [(a["node"], a["reason"], a["message"], a["attempt"]) for a in got] == [
        ("n0", "HardwareFault", "XID 79", 2),
        ("n1", "Stalled", "rank 3", 2),
    ]
    assert got[0]["expires"] == c.format_time(T0 + timedelta(seconds=600))


def test_every_pod_that_failed_its_preflight_is_blamed_not_only_the_first() -> None:
    sim = running(nodes=2, cluster=4, runPolicy={"preflight": {"enabled": True}})
    for rank, node in ((0, "n0"), (1, "n1")):
        line = f"gpujob preflight FAILED on node {node} (node rank {rank}): GEMM slow"
        sim.fail(f"bert-node-{rank}", code=86, message=f"x\n{line}")
    sim.reconcile()
    avoided = sim.status["gang"]["avoidedNodes"]
    assert sorted((a["node"], a["reason"]) for a in avoided) == [
        ("n0", "Preflight"),
        ("n1", "Preflight"),
    ]


def test_a_failed_preflight_is_retried_whatever_retryable_exit_codes_say() -> None:
    sim = running(runPolicy={"preflight": {"enabled": True}, "retryableExitCodes": [1]})
    line = "gpujob preflight FAILED on node n1 (node rank 1): GEMM slow"
    sim.fail("bert-node-1", code=86, message=line)
    sim.reconcile()
    assert sim.status["phase"] == "Restarting"
    assert sim.status["gang"]["avoidedNodes"][0]["node"] == "n1"
    sim2 = running(runPolicy={"retryableExitCodes": [1]})
    sim2.fail("bert-node-1", code=86, message=line)
    sim2.reconcile()
    assert sim2.status["phase"] == "Failed", "without the check, 86 is the user's own code"
