"""Kueue admits gpujob jobs as whole gangs: the real Kueue manager on the local control plane.

Kueue v0.17 is built from its Go module (``hack/build-kueue.sh``) and runs with its webhooks
on loopback (``LocalCluster(kueue=True)``). gpujob is a Kueue *external framework*: the
operator creates each job's Kueue Workload, creates no pod until Kueue admits it, and hands
the quota back when Kueue evicts it. Two nodes of 4 GPUs, a ClusterQueue of 8 GPUs.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpujob_localcluster.cluster import LocalCluster
from tests.integration.conftest import fresh_namespace, job_status, own_cluster
from tests.integration.test_chart_install import SA, Release
from tests.support import forecast
from tests.support.jobs import paced_job, python_job
from tests.support.kube import Kube
from tests.support.operator import OperatorProcess
from tests.support.waiting import wait_until

QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
TAINT_KEY = "gpujob.dev/dedicated"


@pytest.fixture(scope="module")
def kueue_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with own_cluster(
        tmp_path_factory.mktemp("kueue-cluster"), "with Kueue", kueue=True, gang_scheduling=True
    ) as lc:
        yield lc


@pytest.fixture
def kkube(kueue_cluster: LocalCluster) -> Iterator[Kube]:
    with fresh_namespace(kueue_cluster, "kq") as k:
        yield k
    k.run("delete", "clusterqueue", f"gpus-{k.namespace}", "--wait=false", ns=False)


@pytest.fixture
def kop(kkube: Kube, tmp_path: Path) -> Iterator[OperatorProcess]:
    op = OperatorProcess(
        kkube.kubeconfig,
        [kkube.namespace],
        tmp_path / "operator.log",
        extra_env={"GPUJOB_KUEUE": "1", **forecast.ENV},
    ).start()
    yield op
    op.stop()


def queues(kube: Kube, preemption: bool = False) -> str:
    """A flavor (with node labels and a toleration), a ClusterQueue of 8 GPUs, a LocalQueue."""
    ns = kube.namespace
    cq: dict[str, Any] = {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "ClusterQueue",
        "metadata": {"name": f"gpus-{ns}"},
        "spec": {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}},
            "resourceGroups": [
                {
                    "coveredResources": ["nvidia.com/gpu"],
                    "flavors": [
                        {
                            "name": "local-gpu",
                            "resources": [{"name": "nvidia.com/gpu", "nominalQuota": 8}],
                        }
                    ],
                }
            ],
        },
    }
    if preemption:
        cq["spec"]["preemption"] = {"withinClusterQueue": "LowerPriority"}
    flavor = {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "ResourceFlavor",
        "metadata": {"name": "local-gpu"},
        "spec": {
            "nodeLabels": {"gpujob.dev/local-node": "true"},
            "tolerations": [{"key": TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"}],
        },
    }
    lq = {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "LocalQueue",
        "metadata": {"name": "team", "namespace": ns},
        "spec": {"clusterQueue": f"gpus-{ns}"},
    }
    for obj in (flavor, cq, lq):
        kube.apply(obj)
    return "team"


def job(name: str, marker: Path, labels: dict[str, str]) -> dict[str, Any]:
    """One node of 4 GPUs that runs until ``marker`` exists (no torch)."""
    script = f"""
        import os, time
        while not os.path.exists("{marker}"):
            time.sleep(0.1)
    """
    return python_job(name, script, 1, 4, labels, monitoring={"enabled": False})


def phase(kube: Kube, name: str) -> str | None:
    return job_status(kube, name).get("phase")


def running_cond(kube: Kube, name: str) -> dict[str, Any]:
    conds = job_status(kube, name).get("conditions") or []
    return next((c for c in conds if c["type"] == "Running"), {})


def pods_of(kube: Kube, name: str) -> list[dict[str, Any]]:
    return kube.list("pods", f"gpujob.dev/job-name={name}")


def test_kueue_runs_two_of_three_4gpu_jobs_in_8_gpus_then_the_third(
    kkube: Kube, kop: OperatorProcess, tmp_path: Path
) -> None:
    queue = queues(kkube)
    labels = {QUEUE_LABEL: queue}
    for name in ("j1", "j2"):
        kkube.apply(job(name, tmp_path / name, labels))
    for name in ("j1", "j2"):
        wait_until(lambda n=name: phase(kkube, n) == "Running", 90, f"{name} Running")
    gang = job_status(kkube, "j1")["gang"]
    assert gang["mechanism"] == "Kueue" and gang["queue"] == queue and gang["admitted"] is True
    assert gang["clusterQueue"] == f"gpus-{kkube.namespace}"
    assert gang["flavors"] == {"nvidia.com/gpu": "local-gpu"}
    # The admitted flavor's node labels and toleration reach the pod.
    (pod,) = pods_of(kkube, "j1")
    assert pod["spec"]["nodeSelector"]["gpujob.dev/local-node"] == "true"
    assert any(t.get("key") == TAINT_KEY for t in pod["spec"]["tolerations"])

    def wl_cond(job_name: str, type_: str) -> str | None:
        wl = kkube.get("workloads.kueue.x-k8s.io", job_status(kkube, job_name)["gang"]["workload"])
        conds = (wl or {}).get("status", {}).get("conditions") or []
        return next((c["status"] for c in conds if c["type"] == type_), None)

    # The operator reports readiness to Kueue (for waitForPodsReady), as Kueue's job controllers do.
    wait_until(lambda: wl_cond("j1", "PodsReady") == "True", 30, "j1's Workload PodsReady")

    kkube.apply(job("j3", tmp_path / "j3", labels))
    wait_until(lambda: running_cond(kkube, "j3").get("reason") == "Queued", 60, "j3 Queued")
    assert f"LocalQueue {queue}" in running_cond(kkube, "j3")["message"]
    status = job_status(kkube, "j3")
    assert status["phase"] == "Pending" and status["gang"]["admitted"] is False
    wl = kkube.get("workloads.kueue.x-k8s.io", status["gang"]["workload"])
    assert wl is not None and wl["spec"]["podSets"][0]["count"] == 1
    assert wl["metadata"]["ownerReferences"][0]["name"] == "j3"
    for _ in range(5):  # sampled: while not admitted, j3 has no pod at all
        assert pods_of(kkube, "j3") == []

    (tmp_path / "j1").touch()
    wait_until(lambda: phase(kkube, "j1") == "Succeeded", 60, "j1 Succeeded")
    wait_until(lambda: wl_cond("j1", "Finished") == "True", 30, "j1's Workload Finished")
    wait_until(lambda: phase(kkube, "j3") == "Running", 90, "j3 admitted and Running")
    for name in ("j2", "j3"):
        (tmp_path / name).touch()
    for name in ("j2", "j3"):
        wait_until(lambda n=name: phase(kkube, n) == "Succeeded", 60, f"{name} Succeeded")
    assert kop.rbac_denials() == []
    # The passes read their Workloads from the operator's watch, not a GET each.
    reads = 'gpujob_operator_workload_reads_total{source="%s"}'
    from_watch, from_api = kop.counter(reads % "watch"), kop.counter(reads % "api")
    assert from_watch > from_api > 0, (from_watch, from_api)


def test_kueue_preemption_is_a_reason_and_the_job_resumes(
    kkube: Kube, kop: OperatorProcess, tmp_path: Path
) -> None:
    queue = queues(kkube, preemption=True)
    for pname, value in (("low", 10), ("high", 1000)):
        kkube.apply(
            {
                "apiVersion": "kueue.x-k8s.io/v1beta2",
                "kind": "WorkloadPriorityClass",
                "metadata": {"name": f"{pname}-{kkube.namespace}"},
                "value": value,
            }
        )

    def labels(p: str) -> dict[str, str]:
        return {QUEUE_LABEL: queue, "kueue.x-k8s.io/priority-class": f"{p}-{kkube.namespace}"}

    for name in ("low1", "low2"):
        kkube.apply(job(name, tmp_path / name, labels("low")))
    for name in ("low1", "low2"):
        wait_until(lambda n=name: phase(kkube, n) == "Running", 90, f"{name} Running")
    kkube.apply(job("high", tmp_path / "high", labels("high")))
    wait_until(lambda: phase(kkube, "high") == "Running", 90, "high Running")

    def preempted() -> str | None:
        for name in ("low1", "low2"):
            if (job_status(kkube, name).get("gang") or {}).get("preemptions"):
                return name
        return None

    victim = wait_until(preempted, 30, "a low job preempted")
    status = job_status(kkube, victim)
    assert status["phase"] == "Pending", status  # a reason, not a failure
    assert running_cond(kkube, victim)["reason"] in ("Preempted", "Queued")
    assert status.get("gang", {}).get("restarts", 0) == 0 and "failure" not in status
    wait_until(lambda: not pods_of(kkube, victim), 60, f"{victim}'s pods deleted")

    (tmp_path / "high").touch()
    wait_until(lambda: phase(kkube, victim) == "Running", 90, f"{victim} resumes")
    for name in ("low1", "low2"):
        (tmp_path / name).touch()
    for name in ("low1", "low2", "high"):
        wait_until(lambda n=name: phase(kkube, n) == "Succeeded", 60, f"{name} Succeeded")


def test_the_charts_gang_rbac_is_enough_for_kueue_and_native_jobs(
    kkube: Kube, kueue_cluster: LocalCluster, tmp_path: Path
) -> None:
    """The operator with the chart's ServiceAccount (gang.native and gang.kueue enabled) runs a
    Kueue job and a Native job to success without one refused request."""
    release = Release(kueue_cluster, kkube.namespace, tmp_path)
    release.install({"gang": {"native": {"enabled": True}, "kueue": {"enabled": True}}})
    op: OperatorProcess | None = None
    try:
        assert kueue_cluster.cp is not None
        kc = kueue_cluster.cp.token_kubeconfig(kkube.namespace, SA, tmp_path / "sa.kubeconfig")
        op = OperatorProcess(
            kc, [], tmp_path / "operator.log", extra_env={"GPUJOB_KUEUE": "1"}
        ).start()
        queue = queues(kkube)
        kkube.apply(job("queued", tmp_path / "queued", {QUEUE_LABEL: queue}))
        native = job("native", tmp_path / "native", {})
        native["spec"]["scheduling"] = {"gang": "Native"}
        kkube.apply(native)
        for name in ("queued", "native"):
            wait_until(lambda n=name: phase(kkube, n) == "Running", 90, f"{name} Running")
            (tmp_path / name).touch()
        for name in ("queued", "native"):
            wait_until(lambda n=name: phase(kkube, n) == "Succeeded", 60, f"{name} Succeeded")
        assert job_status(kkube, "native")["gang"]["podGroup"] == "native-a0"
        assert op.rbac_denials() == []
    finally:
        if op is not None:
            op.stop()
        release.uninstall()


def test_queued_jobs_and_waiting_native_gangs_are_forecast_to_start_when_a_holder_ends(
    kkube: Kube, kop: OperatorProcess, tmp_path: Path
) -> None:
    """The forecast scenario (tests/support/forecast.py) on both admission paths at once:
    8 GPUs of ClusterQueue quota here, and two 4-GPU nodes behind native gang scheduling on
    a control plane of their own. Each scenario waits on its holders' ETAs (about 130 s) and
    needs little CPU, so the two share that wait instead of taking it one after the other."""
    failures: list[BaseException] = []

    def kueue_path() -> None:
        try:
            forecast.run(kkube, kop, labels={QUEUE_LABEL: queues(kkube)})
        except BaseException as e:  # re-raised by the test's own thread
            failures.append(e)

    with own_cluster(tmp_path / "gang", "with gang scheduling", gang_scheduling=True) as lc:
        kueue = threading.Thread(target=kueue_path, name="kueue-forecast", daemon=True)
        kueue.start()
        try:
            with fresh_namespace(lc, "gang") as gkube:
                gop = OperatorProcess(
                    gkube.kubeconfig,
                    [gkube.namespace],
                    tmp_path / "gang-operator.log",
                    extra_env=forecast.ENV,
                ).start()
                try:
                    forecast.run(gkube, gop, scheduling={"gang": "Native"})
                finally:
                    gop.stop()
        except BaseException as e:
            failures.append(e)
        # A failed native scenario fails the test now; the Kueue one is not waited out.
        kueue.join(timeout=5 if failures else 400)
    if len(failures) > 1:
        raise BaseExceptionGroup("both forecast scenarios failed", failures)
    if failures:
        raise failures[0]
    assert not kueue.is_alive(), "the Kueue scenario did not end within 400 s of the native one"
    assert kop.rbac_denials() == []


def test_best_effort_fifo_admits_a_small_job_behind_a_big_one_at_once_as_forecast(
    kkube: Kube, kop: OperatorProcess
) -> None:
    """Kueue's default queueingStrategy, BestEffortFIFO: 4 of 8 GPUs held for 10 h, big
    (8 GPUs) then small (2) wait. small is forecast to start now, not Exact (it jumps ahead
    of big), and Kueue admits it at once; big's Queued condition quotes Kueue's reason. The
    ClusterQueue is held (``stopPolicy: Hold``) while they queue, so the forecast is read
    before Kueue admits small."""
    labels = {QUEUE_LABEL: queues(kkube)}
    cq = f"gpus-{kkube.namespace}"
    holder = paced_job("holder", 72_000, 0.5, labels=labels)  # 10 h of 0.5 s steps
    holder["spec"]["monitoring"]["warmupSteps"] = forecast.WARMUP_STEPS
    kkube.apply(holder)
    wait_until(
        lambda: forecast.progress_end(kkube, "holder"), 90, "holder's ETA", interval=forecast.POLL
    )

    def stop_policy(policy: str) -> None:
        patch = f'{{"spec": {{"stopPolicy": "{policy}"}}}}'
        kkube.run("patch", "clusterqueue", cq, "--type=merge", "-p", patch, ns=False, check=True)

    stop_policy("Hold")
    big = python_job("big", "import time; time.sleep(3600)", 2, 4, labels)
    kkube.apply(big)
    wait_until(  # big's Workload first: Kueue orders by its creation
        lambda: (job_status(kkube, "big").get("gang") or {}).get("workload"),
        30,
        "big's Workload",
        interval=forecast.POLL,
    )
    kkube.apply(python_job("small", "import time; time.sleep(3600)", 1, 2, labels))
    said = wait_until(
        lambda: forecast.queue(kkube, "small").get("confidence"),
        30,
        "small's forecast",
        interval=forecast.POLL,
    )
    q = forecast.queue(kkube, "small")
    assert said == "LowerBound" and f"jumps ahead of job {kkube.namespace}/big" in q["reason"], q
    assert forecast.epoch(q["estimatedStartTime"]) <= time.time() + 5, q  # now, not in 10 h

    stop_policy("None")
    wait_until(
        lambda: (job_status(kkube, "small").get("gang") or {}).get("admitted"),
        60,
        "small admitted past big",
        interval=forecast.POLL,
    )
    wait_until(
        lambda: "insufficient unused quota" in running_cond(kkube, "big").get("message", ""),
        30,
        "big's Queued condition in Kueue's words",
        interval=forecast.POLL,
    )
    assert running_cond(kkube, "big")["reason"] == "Queued"
    assert kop.rbac_denials() == []
