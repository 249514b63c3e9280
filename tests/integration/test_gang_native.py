"""Native gang scheduling: the real kube-scheduler binds a job's pods all together or none.

A control plane of its own with the GenericWorkload gate and the Workload/PodGroup API on
(``LocalCluster(gang_scheduling=True)``), two nodes of 4 GPUs. Job A (2 x 4 GPUs) holds the
whole cluster; job B (2 x 4 GPUs) arrives. A's ranks end one after the other, so for a while
one node is free:

* ``Native``: B waits as a whole (WaitingForGang): no pod of B is bound and B holds no GPU
  even with a free node; when A's last rank ends, B's pods bind together and B succeeds.
* ``None`` (the control case): the default scheduler binds half of B onto the free node:
  B holds 4 GPUs it cannot use, the partial binding gang scheduling prevents.

And with either mechanism, kube-scheduler preempting a rank for a higher-priority pod reads
as `Preempted`, a disruption and not a failure.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpujob_localcluster.cluster import LocalCluster
from tests.integration.conftest import fresh_namespace, job_status, own_cluster
from tests.support.events import wait_event
from tests.support.jobs import python_job
from tests.support.kube import Kube
from tests.support.operator import OperatorProcess
from tests.support.waiting import wait_until

GPUS = "nvidia.com/gpu"


@pytest.fixture(scope="module")
def gang_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """Two nodes of 4 GPUs behind a control plane with native gang scheduling on."""
    with own_cluster(
        tmp_path_factory.mktemp("gang-cluster"), "with gang scheduling", gang_scheduling=True
    ) as lc:
        yield lc


@pytest.fixture
def gkube(gang_cluster: LocalCluster) -> Iterator[Kube]:
    # The next test needs every GPU back: fresh_namespace waits until the pods are gone.
    with fresh_namespace(gang_cluster, "gang") as k:
        yield k


@pytest.fixture
def gop(gkube: Kube, tmp_path: Path) -> Iterator[OperatorProcess]:
    op = OperatorProcess(gkube.kubeconfig, [gkube.namespace], tmp_path / "operator.log").start()
    yield op
    op.stop()


def waiting_job(name: str, marker: Path, gang: str) -> dict[str, Any]:
    """2 x 4 GPUs; rank r runs until the file ``<marker><r>`` exists (no torch, no torchrun)."""
    script = f"""
        import os, time
        path = "{marker}" + os.environ["RANK"]
        while not os.path.exists(path):
            time.sleep(0.1)
    """
    return python_job(
        name, script, gpus=4, monitoring={"enabled": False}, scheduling={"gang": gang}
    )


def bound(kube: Kube, job: str) -> list[dict[str, Any]]:
    """The job's pods that a node holds (bound and not finished)."""
    return [
        p
        for p in kube.list("pods", f"gpujob.dev/job-name={job}")
        if p["spec"].get("nodeName") and p["status"].get("phase") not in ("Succeeded", "Failed")
    ]


def gpus_held(kube: Kube, job: str) -> int:
    total = 0
    for pod in bound(kube, job):
        for ctr in pod["spec"]["containers"]:
            total += int((ctr.get("resources", {}).get("limits") or {}).get(GPUS, 0))
    return total


def running_reason(kube: Kube, job: str) -> str | None:
    for cond in job_status(kube, job).get("conditions") or []:
        if cond["type"] == "Running":
            return str(cond.get("reason"))
    return None


def test_native_gang_binds_all_pods_together_or_none(
    gkube: Kube, gop: OperatorProcess, tmp_path: Path
) -> None:
    a, b = tmp_path / "a-done-", tmp_path / "b-done-"
    gkube.apply(waiting_job("first", a, "Native"))
    wait_until(lambda: job_status(gkube, "first").get("phase") == "Running", 90, "first Running")
    first = job_status(gkube, "first")
    assert first["gang"]["mechanism"] == "Native"
    group = gkube.get("podgroups.scheduling.k8s.io", first["gang"]["podGroup"])
    assert group is not None
    assert group["spec"]["schedulingPolicy"]["gang"]["minCount"] == 2
    assert group["metadata"]["ownerReferences"][0]["name"] == "first"
    assert gkube.get("workloads.scheduling.k8s.io", "first") is not None

    gkube.apply(waiting_job("second", b, "Native"))
    # Free one node: first's rank 0 ends, rank 1 keeps its node.
    (a.parent / f"{a.name}0").touch()
    wait_until(lambda: len(bound(gkube, "first")) == 1, 60, "first's rank 0 done")
    status = wait_until(
        lambda: running_reason(gkube, "second") == "WaitingForGang" and job_status(gkube, "second"),
        60,
        "second WaitingForGang",
    )
    message = next(c["message"] for c in status["conditions"] if c["type"] == "Running")
    # Ours (the group), then the scheduler's own reason, e.g. "minCount (2) cannot be satisfied".
    assert "second-a0" in message and "minCount" in message, message
    pods = gkube.list("pods", "gpujob.dev/job-name=second")
    assert len(pods) == 2
    assert all(p["spec"]["schedulingGroup"]["podGroupName"] == "second-a0" for p in pods)
    # A free node with 4 GPUs is not enough for a gang of two 4-GPU pods: nothing binds.
    for _ in range(10):  # sampled over a few seconds of kubectl round trips
        assert gpus_held(gkube, "second") == 0, "a pod of the waiting gang holds GPUs"
        assert job_status(gkube, "second")["phase"] == "Pending"

    (a.parent / f"{a.name}1").touch()
    wait_until(lambda: job_status(gkube, "first").get("phase") == "Succeeded", 60, "first done")
    wait_until(lambda: len(bound(gkube, "second")) == 2, 60, "second's pods bound together")
    wait_until(lambda: job_status(gkube, "second").get("phase") == "Running", 60, "second runs")
    for rank in (0, 1):
        (b.parent / f"{b.name}{rank}").touch()
    wait_until(
        lambda: job_status(gkube, "second").get("phase") == "Succeeded", 60, "second Succeeded"
    )
    assert gop.rbac_denials() == []


def test_without_gang_scheduling_half_a_gang_holds_gpus(
    gkube: Kube, gop: OperatorProcess, tmp_path: Path
) -> None:
    """The control case: the same jobs with gang None bind partially."""
    a, b = tmp_path / "a-done-", tmp_path / "b-done-"
    gkube.apply(waiting_job("first", a, "None"))
    wait_until(lambda: job_status(gkube, "first").get("phase") == "Running", 90, "first Running")
    gkube.apply(waiting_job("second", b, "None"))
    (a.parent / f"{a.name}0").touch()
    wait_until(lambda: gpus_held(gkube, "second") == 4, 60, "half of second bound")
    # The status may still carry the reason of its previous reconcile (PodsCreating: the
    # pods were being created) when the scheduler binds: wait for the operator to catch up.
    wait_until(
        lambda: running_reason(gkube, "second") in ("Unschedulable", "PodsPending"),
        60,
        "second's reason Unschedulable or PodsPending",
    )
    assert job_status(gkube, "second")["gang"]["mechanism"] == "None"
    assert len(bound(gkube, "second")) == 1
    (a.parent / f"{a.name}1").touch()
    wait_until(lambda: job_status(gkube, "second").get("phase") == "Running", 60, "second runs")
    for rank in (0, 1):
        (b.parent / f"{b.name}{rank}").touch()
    wait_until(
        lambda: job_status(gkube, "second").get("phase") == "Succeeded", 60, "second Succeeded"
    )


@pytest.mark.parametrize("mechanism", ["None", "Native"])
def test_a_rank_preempted_by_the_scheduler_restarts_the_gang_as_preempted(
    gkube: Kube, gop: OperatorProcess, tmp_path: Path, mechanism: str
) -> None:
    """kube-scheduler preempts the job for a higher-priority pod (DisruptionTarget with
    PreemptionByScheduler; the ranks exit at once on SIGTERM, so the pods may be gone before
    a pass sees them). The job says Preempted, counts no restart (backoffLimit 0 would fail
    it), and its next gang runs to Succeeded once the pod is done."""
    marker = tmp_path / "done-"
    body = waiting_job("victim", marker, mechanism)
    body["spec"]["runPolicy"] = {"backoffLimit": 0}
    gkube.apply(body)
    wait_until(lambda: job_status(gkube, "victim").get("phase") == "Running", 90, "victim runs")
    urgent = f"urgent-{gkube.namespace}"
    gkube.apply(
        {
            "apiVersion": "scheduling.k8s.io/v1",
            "kind": "PriorityClass",
            "metadata": {"name": urgent},
            "value": 1_000_000,
        }
    )
    try:
        gkube.apply(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": "urgent"},
                "spec": {
                    "priorityClassName": urgent,
                    "restartPolicy": "Never",
                    "containers": [
                        {
                            "name": "main",
                            "image": "python:3.11-slim",
                            "command": ["python", "-c", "import time; time.sleep(5)"],
                            "resources": {"limits": {GPUS: "4"}},
                        }
                    ],
                },
            }
        )
        status = wait_until(
            lambda: (s := job_status(gkube, "victim")).get("gang", {}).get("preemptions") and s,
            90,
            "the victim preempted",
        )
        assert status["gang"]["restarts"] == 0 and status["phase"] != "Failed", status
        for rank in (0, 1):
            (marker.parent / f"{marker.name}{rank}").touch()
        final = wait_until(
            lambda: (
                (s := job_status(gkube, "victim")).get("phase") in ("Succeeded", "Failed") and s
            ),
            120,
            "the victim to finish",
        )
        assert final["phase"] == "Succeeded" and final["gang"]["restarts"] == 0, final
        assert final["gang"]["preemptions"] >= 1, final
        reasons = wait_event(gkube, "victim", "Preempted")
        assert "Preempted" in reasons and "GangRestart" not in reasons, reasons
        urgent_pod = gkube.get("pod", "urgent")
        assert urgent_pod is not None and urgent_pod["spec"].get("nodeName"), urgent_pod
    finally:
        gkube.run("delete", "priorityclass", urgent, ns=False)


def test_native_gang_without_rbac_for_podgroups_creates_no_pod_and_says_why(
    gkube: Kube, gang_cluster: LocalCluster, tmp_path: Path
) -> None:
    """An operator not allowed to use Workloads/PodGroups holds the gang with a reason."""
    ns = gkube.namespace
    rules = [
        {"apiGroups": ["gpujob.dev"], "resources": ["gputrainingjobs"], "verbs": ["get", "list", "watch", "patch"]},
        {"apiGroups": ["gpujob.dev"], "resources": ["gputrainingjobs/status"], "verbs": ["get", "patch"]},
        {"apiGroups": [""], "resources": ["pods", "services"], "verbs": ["get", "list", "watch", "create", "delete"]},
        {"apiGroups": ["", "events.k8s.io"], "resources": ["events"], "verbs": ["create", "patch"]},
    ]  # fmt: skip
    gkube.run("create", "serviceaccount", "op", check=True)
    gkube.apply({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
                 "metadata": {"name": "op"}, "rules": rules})  # fmt: skip
    gkube.run("create", "rolebinding", "op", "--role=op", f"--serviceaccount={ns}:op", check=True)
    # What the chart's rbac.clusterDiscovery grants: kopf's CRD and namespace scans.
    gkube.run("create", "clusterrole", f"op-{ns}", "--verb=list,watch",
              "--resource=customresourcedefinitions.apiextensions.k8s.io,namespaces",
              ns=False, check=True)  # fmt: skip
    gkube.run("create", "clusterrolebinding", f"op-{ns}", f"--clusterrole=op-{ns}",
              f"--serviceaccount={ns}:op", ns=False, check=True)  # fmt: skip
    assert gang_cluster.cp is not None
    kc = gang_cluster.cp.token_kubeconfig(ns, "op", tmp_path / "op.kubeconfig")
    op = OperatorProcess(kc, [ns], tmp_path / "operator.log").start()
    try:
        gkube.apply(waiting_job("denied", tmp_path / "d-", "Native"))
        wait_until(
            lambda: running_reason(gkube, "denied") == "GangSchedulingUnavailable",
            60,
            "denied held with GangSchedulingUnavailable",
        )
        message = next(
            c["message"]
            for c in job_status(gkube, "denied")["conditions"]
            if c["type"] == "Running"
        )
        assert "403" in message and "podgroups" in message, message
        assert gkube.list("pods", "gpujob.dev/job-name=denied") == []
        assert "Traceback" not in op.log_path.read_text()
    finally:
        op.stop()
        gkube.run("delete", f"clusterrolebinding/op-{ns}", f"clusterrole/op-{ns}", ns=False)
