"""In-place gang restarts, planned: which strategy an attempt gets, the move, the release,
the fallbacks (a pod that cannot stay, a timeout, a missing supervisor), and a successor that
finishes a move its predecessor began."""

from __future__ import annotations

import itertools
from datetime import timedelta
from typing import Any

from gpujob_operator.api import conditions as c
from gpujob_operator.lifecycle import builders, inplace, observations
from gpujob_operator.lifecycle.planner import Plan
from gpujob_trainer import contract
from tests.unit.operator.lifecycle.test_blame import PlacedSim, node
from tests.unit.operator.lifecycle.test_planner import cond, make_job

_uids = itertools.count()


def declaring(name: str) -> dict[str, Any]:
    out = node(name)
    out["status"]["declaredFeatures"] = [inplace.FEATURE]
    return out


class InPlaceSim(PlacedSim):
    """The simulator with a kubelet that restarts pods in place, and the pod patches applied."""

    def reconcile(self, log_tails: dict[str, str] | None = None, patch: bool = True) -> Plan:
        p = super().reconcile(log_tails)
        for body in p.create_pods:
            self.pods[body["metadata"]["name"]]["metadata"]["uid"] = f"uid-{next(_uids)}"
        if patch:
            self.apply_patches(p)
        return p

    def apply_patches(self, p: Plan) -> None:
        for name, uid, patch in p.patch_pods:
            meta = self.pods[name]["metadata"]
            assert uid == meta.get("uid"), (name, uid, meta.get("uid"))
            for key in ("labels", "annotations"):
                meta.setdefault(key, {}).update(patch["metadata"].get(key) or {})

    def trainer(self, name: str) -> dict[str, Any]:
        st = self.pods[name]["status"]
        st["phase"] = "Running"
        statuses = st.setdefault("containerStatuses", [{"name": "trainer", "restartCount": 0}])
        return statuses[0]

    def run_in_place(self) -> None:
        for name in self.pods:
            self.trainer(name).setdefault("state", {"running": {}})

    def exit_in_place(self, name: str, code: int, message: str = "") -> None:
        """The trainer exits and the kubelet restarts the whole pod in place."""
        ts = self.trainer(name)
        ts["restartCount"] = ts.get("restartCount", 0) + 1
        term = {"exitCode": code, "reason": "Error", "finishedAt": c.format_time(self.now)}
        if message:
            term["message"] = message
        ts["lastState"] = {"terminated": term}
        ts["state"] = {"running": {}}

    def labels(self, name: str) -> dict[str, str]:
        return dict(self.pods[name]["metadata"].get("labels") or {})

    def annotations(self, name: str) -> dict[str, str]:
        return dict(self.pods[name]["metadata"].get("annotations") or {})


def running(nodes: int = 2, view: list[dict[str, Any]] | None = None, **spec: Any) -> InPlaceSim:
    view = view if view is not None else [declaring(f"n{i}") for i in range(nodes + 1)]
    sim = InPlaceSim(make_job(nodes=nodes, gpusPerNode=8, **spec), view)
    sim.reconcile()
    sim.bind()
    sim.run_in_place()
    sim.reconcile()
    return sim


def trainer_spec(pod: dict[str, Any]) -> dict[str, Any]:
    return next(x for x in pod["spec"]["containers"] if x["name"] == builders.CONTAINER_NAME)


def test_pods_restart_in_place_where_the_nodes_declare_it() -> None:
    sim = running()
    pod = sim.pods["bert-node-0"]
    ctr = trainer_spec(pod)
    assert ctr["restartPolicy"] == "Never"
    assert ctr["restartPolicyRules"][0]["action"] == "RestartAllContainers"
    assert ctr["restartPolicyRules"][0]["exitCodes"] == {
        "operator": "NotIn",
        "values": [0, contract.PREFLIGHT_EXIT_CODE],
    }
    assert ctr["command"][1:3] == ["-m", contract.SUPERVISOR_MODULE]
    assert ctr["command"].index("--") < ctr["command"].index("torchrun")
    mounts = {m["mountPath"] for m in ctr["volumeMounts"]}
    assert {contract.PODINFO_DIR, contract.INPLACE_STATE_DIR} <= mounts
    strategy = sim.status["gang"]["restartStrategy"]
    assert (strategy["strategy"], strategy["reason"]) == ("InPlace", "NodesDeclareIt")
    assert sim.status["phase"] == "Running"


def test_without_the_feature_or_the_nodes_the_pods_are_recreated_and_say_why() -> None:
    few = [declaring("n0"), node("n1"), node("n2")]
    sim = running(view=few)
    assert "restartPolicyRules" not in trainer_spec(sim.pods["bert-node-0"])
    strategy = sim.status["gang"]["restartStrategy"]
    assert strategy["reason"] == "FeatureNotDeclared" and "1 of 3 nodes" in strategy["message"]
    # Asked for, and not to be had: the job runs by Recreate and says so once.
    sim = running(view=few, runPolicy={"restartStrategy": "InPlace"})
    assert sim.status["gang"]["restartStrategy"]["strategy"] == "Recreate"
    assert sim.reasons().count(c.IN_PLACE_FALLBACK) == 1
    sim = running(runPolicy={"restartStrategy": "Recreate"})
    assert sim.status["gang"]["restartStrategy"]["reason"] == "Requested"
    assert "restartPolicyRules" not in trainer_spec(sim.pods["bert-node-0"])
    unknown = InPlaceSim(make_job(nodes=2), [declaring("n0"), declaring("n1")])
    unknown.view_error = "nodes is forbidden"
    unknown.reconcile()
    strategy = unknown.status["gang"]["restartStrategy"]
    assert (strategy["strategy"], strategy["reason"]) == ("Recreate", c.NODES_UNKNOWN)
    assert "nodes is forbidden" in strategy["message"]


def test_a_failed_rank_restarts_the_gang_in_place_and_the_release_waits_for_every_pod() -> None:
    sim = running(runPolicy={"backoffLimit": 3})
    uids = {n: p["metadata"]["uid"] for n, p in sim.pods.items()}
    sim.now += timedelta(seconds=30)
    sim.exit_in_place("bert-node-1", 3)
    p = sim.reconcile()
    assert not p.delete_pods and not p.create_pods
    st = sim.status
    assert st["gang"]["attempt"] == 1 and st["gang"]["restarts"] == 1
    assert st["gang"]["inPlaceRestarts"] == 1
    assert "nextAttemptTime" not in st["gang"], "the kubelet's back-off, not ours"
    assert "in place: 2 pod(s) keep their nodes" in cond(st, c.RESTARTING)["message"]
    assert st["failure"]["exitCode"] == 3 and st["failure"]["pod"] == "bert-node-1"
    # Both moved: the failed one starts its new run at its present count, the other at the
    # next (the move stops its old run).
    assert sim.labels("bert-node-0")[contract.LABEL_ATTEMPT] == "1"
    assert sim.annotations("bert-node-0")[observations.RESTARTS_BASE] == "1"
    assert sim.annotations("bert-node-1")[observations.RESTARTS_BASE] == "1"
    assert st["operatorState"]["inPlace"]["attempt"] == 1
    # node-0's old run still goes: nobody is released.
    p = sim.reconcile()
    assert not p.patch_pods and sim.status["phase"] != "Running"
    assert cond(sim.status, c.RUNNING)["reason"] == c.GANG_RESTART
    sim.exit_in_place("bert-node-0", contract.RESTART_EXIT_CODE)
    p = sim.reconcile()
    released = {
        n: pt["metadata"]["annotations"][contract.ANNOTATION_RELEASED] for n, _, pt in p.patch_pods
    }
    assert released == {"bert-node-0": "1", "bert-node-1": "1"}
    assert c.RESTARTED_IN_PLACE in sim.reasons()
    assert "inPlace" not in sim.status.get("operatorState", {})
    sim.reconcile()
    assert sim.status["phase"] == "Running"
    assert cond(sim.status, c.RESTARTING)["status"] == "False"
    assert {n: p["metadata"]["uid"] for n, p in sim.pods.items()} == uids
    assert sim.status["gang"]["restarts"] == 1, "the supervisor's own exit is no failure"
    # A failure of the new run is the next attempt's end.
    sim.exit_in_place("bert-node-0", 1)
    sim.reconcile()
    assert sim.status["gang"]["attempt"] == 2 and sim.status["gang"]["restarts"] == 2


def test_a_pod_that_does_not_restart_in_time_is_recreated() -> None:
    sim = running(runPolicy={"inPlaceTimeoutSeconds": 30})
    sim.exit_in_place("bert-node-1", 1)
    sim.reconcile()
    p = sim.reconcile()
    assert p.requeue_after is not None and p.requeue_after <= 30
    sim.now += timedelta(seconds=31)
    p = sim.reconcile()
    assert p.delete_pods == ["bert-node-0"]
    assert any(e.reason == c.IN_PLACE_FALLBACK and "bert-node-0" in e.message for e in sim.events)
    sim.gc()
    p = sim.reconcile()
    assert [b["metadata"]["name"] for b in p.create_pods] == ["bert-node-0"]
    new = p.create_pods[0]
    assert new["metadata"]["labels"][contract.LABEL_ATTEMPT] == "1"
    assert "restartPolicyRules" in trainer_spec(new), "the attempt's pods restart alike"
    # Created while the restart is under way: its first run waits for the release too.
    assert new["metadata"]["annotations"][contract.ANNOTATION_HOLD] == "true"
    sim.bind("n2")
    sim.run_in_place()
    p = sim.reconcile()
    # The restarted pod and the new one wait until the whole gang is there: now it is.
    assert sorted(n for n, _, _ in p.patch_pods) == ["bert-node-0", "bert-node-1"]
    sim.reconcile()
    assert sim.status["phase"] == "Running"


def test_a_moved_pod_whose_old_run_ends_on_its_own_is_recreated_without_the_wait() -> None:
    # Its run finished (exit 0) after the move asked it to stop and before it did: the pod
    # is Succeeded and will never restart; before, the gang waited out the whole timeout.
    sim = running(runPolicy={"inPlaceTimeoutSeconds": 300, "backoffLimit": 3})
    sim.exit_in_place("bert-node-1", 1)
    sim.reconcile()
    assert sim.labels("bert-node-0")[contract.LABEL_ATTEMPT] == "1"
    sim.pods["bert-node-0"]["status"]["phase"] = "Succeeded"
    p = sim.reconcile()
    assert p.delete_pods == ["bert-node-0"]
    said = [e.message for e in sim.events if e.reason == c.IN_PLACE_FALLBACK]
    assert any("bert-node-0 (Succeeded) ended before restarting in place" in m for m in said)
    sim.gc()
    p = sim.reconcile()
    assert [b["metadata"]["name"] for b in p.create_pods] == ["bert-node-0"]
    assert sim.status["gang"]["restarts"] == 1 and sim.status["phase"] != "Succeeded"
    sim.bind("n2")
    sim.run_in_place()
    sim.reconcile()
    sim.reconcile()
    assert sim.status["phase"] == "Running" and sim.status["gang"]["restarts"] == 1


def test_the_timeout_counts_from_the_last_move_not_from_the_restarts_first_pass() -> None:
    # A wide gang's moves take several passes; the pods moved last still get the whole
    # timeout to restart (at 512 pods, 60 s from the first pass left the last ones 16 s).
    sim = running(runPolicy={"inPlaceTimeoutSeconds": 30})
    sim.exit_in_place("bert-node-1", 1)
    sim.reconcile(patch=False)  # the first pass's moves did not land
    sim.now += timedelta(seconds=25)
    p = sim.reconcile()
    assert sorted(n for n, _, _ in p.patch_pods) == ["bert-node-0", "bert-node-1"]
    sim.now += timedelta(seconds=20)  # 45 s after the restart began, 20 s after the move
    p = sim.reconcile()
    assert not p.delete_pods and p.requeue_after is not None and p.requeue_after <= 10
    sim.now += timedelta(seconds=11)
    p = sim.reconcile()
    assert p.delete_pods == ["bert-node-0"], "node-1 restarted when it failed; node-0 did not"


def test_a_pod_on_a_blamed_node_is_recreated_and_the_others_stay() -> None:
    sim = running()
    bad = sim.node_of("bert-node-1")
    sim.publish("HardwareFault", bad)
    sim.reconcile()
    sim.exit_in_place("bert-node-1", 1)
    p = sim.reconcile()
    assert p.delete_pods == ["bert-node-1"]
    assert [n for n, _, _ in p.patch_pods] == ["bert-node-0"]
    assert any(e.reason == c.IN_PLACE_FALLBACK and bad in e.message for e in sim.events)
    sim.gc()
    p = sim.reconcile()
    assert [b["metadata"]["name"] for b in p.create_pods] == ["bert-node-1"]
    sim.bind()
    assert sim.node_of("bert-node-1") != bad


def test_a_pod_that_ended_is_recreated_and_the_others_stay() -> None:
    sim = running()
    sim.pods["bert-node-0"]["status"]["phase"] = "Succeeded"
    sim.exit_in_place("bert-node-1", 1)
    p = sim.reconcile()
    assert p.delete_pods == ["bert-node-0"] and [n for n, _, _ in p.patch_pods] == ["bert-node-1"]


def test_a_successor_finishes_the_move_instead_of_deleting() -> None:
    sim = running()
    sim.exit_in_place("bert-node-0", 1)
    sim.reconcile(patch=False)  # the operator died after writing the status
    p = sim.reconcile()
    assert not p.delete_pods
    assert sorted(n for n, _, _ in p.patch_pods) == ["bert-node-0", "bert-node-1"]
    assert sim.annotations("bert-node-0")[observations.RESTARTS_BASE] == "1"
    assert sim.status["gang"]["restarts"] == 1, "one restart, counted once"


def test_the_end_of_the_job_deletes_pods_that_would_restart_whatever_the_policy() -> None:
    sim = running(runPolicy={"backoffLimit": 0, "cleanPodPolicy": "None"})
    sim.exit_in_place("bert-node-0", 1)
    p = sim.reconcile()
    assert sim.status["phase"] == "Failed"
    assert sorted(p.delete_pods) == ["bert-node-0", "bert-node-1"]


def test_an_image_without_the_supervisor_falls_back_to_recreate_for_good() -> None:
    sim = running()
    sim.exit_in_place(
        "bert-node-0", 1, "/usr/bin/python: No module named gpujob_trainer.supervisor"
    )
    p = sim.reconcile()
    assert sorted(p.delete_pods) == ["bert-node-0", "bert-node-1"] and not p.patch_pods
    restarting = cond(sim.status, c.RESTARTING)
    assert restarting["reason"] == c.IN_PLACE_FALLBACK
    assert "not counted against backoffLimit" in restarting["message"]
    assert sim.status["gang"]["restarts"] == 0 and sim.status["gang"]["attempt"] == 1
    assert "gpujob_trainer" in sim.status["operatorState"]["inPlaceUnsupported"]
    sim.gc()
    sim.now += timedelta(minutes=5)
    p = sim.reconcile()
    assert p.create_pods and "restartPolicyRules" not in trainer_spec(p.create_pods[0])
    assert sim.status["gang"]["restartStrategy"]["reason"] == "SupervisorMissing"


def test_the_default_needs_a_python_command_and_no_native_gang() -> None:
    sim = running(command=["/app/train"], training={"launcher": "none"})
    assert sim.status["gang"]["restartStrategy"]["reason"] == "NoPython"
    sim = running(command=["/app/train"], runPolicy={"restartStrategy": "InPlace"})
    assert sim.status["gang"]["restartStrategy"]["strategy"] == "InPlace"
    assert trainer_spec(sim.pods["bert-node-0"])["command"][0] == "python3"


def test_the_restart_rule_follows_retryable_exit_codes() -> None:
    sim = running(runPolicy={"retryableExitCodes": [3, 137]})
    rules = trainer_spec(sim.pods["bert-node-0"])["restartPolicyRules"]
    assert rules[0]["exitCodes"] == {
        "operator": "In",
        "values": [3, contract.RESTART_EXIT_CODE, 137],
    }


def test_a_restart_the_supervisor_was_asked_for_is_no_failure() -> None:
    sim = running()
    sim.exit_in_place("bert-node-1", 1)
    sim.reconcile()
    # Its view lagged: node-1 restarted twice at its supervisor's word.
    sim.exit_in_place("bert-node-1", contract.RESTART_EXIT_CODE)
    sim.exit_in_place("bert-node-0", contract.RESTART_EXIT_CODE)
    p = sim.reconcile()
    assert sim.status["gang"]["restarts"] == 1 and sim.status["gang"]["attempt"] == 1
    assert ("bert-node-1", {observations.RESTARTS_BASE: "2"}) in [
        (n, pt["metadata"]["annotations"]) for n, _, pt in p.patch_pods
    ]
    sim.reconcile()
    sim.reconcile()
    assert sim.status["phase"] == "Running"


def test_an_in_place_trainer_that_exits_0_beside_a_helper_ends_its_rank() -> None:
    helper = {"name": "sidecar", "image": "busybox"}
    sim = running(template={"containers": [helper]})
    for name in sim.pods:
        ts = sim.trainer(name)
        ts["state"] = {"terminated": {"exitCode": 0, "reason": "Completed"}}
    p = sim.reconcile()
    assert sim.status["phase"] == "Succeeded"
    assert sorted(p.delete_pods) == ["bert-node-0", "bert-node-1"], "the helpers go"
