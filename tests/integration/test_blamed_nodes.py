"""A node blamed for a HardwareFault is avoided by the next attempt (issue 38, part 2).

Real API server, scheduler, node agent and operator; the rank is a real process with the
trainer's exporter. What cannot run here is a GPU: the rank's NVML collector reads the
shared fake (`tests.support.fake_nvml`), which reports an XID when the test asks for one,
and the rank then dies as a CUDA process does on a lost GPU. Each step is driven by files
the test writes and the rank polls, so nothing depends on timing: the rank faults only once
the test has seen the pod on its node and the operator has scraped the XID counter at 0, and
dies only once the operator published the verdict.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gpujob_operator.api import conditions as c
from tests.integration.conftest import job_status, wait_job_phase
from tests.support.jobs import python_job, repo_code_env
from tests.support.kube import Kube
from tests.support.operator import OperatorProcess
from tests.support.waiting import wait_until

FAULTY_RANK = """
    import os, pathlib, sys, time
    from prometheus_client import CollectorRegistry
    from gpujob_trainer import contract
    from gpujob_trainer.env import metrics_addr, metrics_base_port
    from gpujob_trainer.exporter import Exporter, TrainerCollector
    from gpujob_trainer.nvml import NvmlCollector
    from gpujob_trainer.tracker import Tracker
    from tests.support.fake_nvml import FakeGpu, FakeNvml

    box = pathlib.Path(DIR)
    attempt = os.environ["ATTEMPT"]
    gpu = FakeGpu(f"GPU-{os.environ['NODE']}")
    tracker = Tracker(hook_optimizers=False)
    registry = CollectorRegistry(auto_describe=False)

    class Scrapes:  # counts the operator's scrapes: a counter it never saw at 0 has no increase
        seen = 0

        def collect(self):
            Scrapes.seen += 1
            return iter(())

    registry.register(Scrapes())
    registry.register(TrainerCollector(tracker))
    registry.register(NvmlCollector(nvml=FakeNvml([gpu]), min_interval=0.0))
    port = contract.metrics_port(metrics_base_port(), tracker.rank.local_rank)
    Exporter(registry, port, metrics_addr()).start()
    faulted = False
    while not (box / f"finish-{attempt}").exists():
        time.sleep(0.2)
        tracker.end_step()
        tracker.log(samples=8)
        if not faulted and Scrapes.seen >= 2 and (box / f"xid-{attempt}").exists():
            gpu.xids.append(79)  # "GPU has fallen off the bus"
            faulted = True
        if (box / f"crash-{attempt}").exists():
            sys.exit("RuntimeError: CUDA error: unspecified launch failure")
"""


def faulty_job(name: str, box: Path) -> dict[str, Any]:
    """One rank holding a whole node (4 GPUs), told its attempt and node by the downward API."""
    env = [
        repo_code_env(),
        {"name": "ATTEMPT", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['gpujob.dev/attempt']"}}},
        {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
    ]  # fmt: skip
    return python_job(
        name,
        FAULTY_RANK.replace("DIR", repr(str(box))),
        nodes=1,
        gpus=4,
        env=env,
        monitoring={"scrapeIntervalSeconds": 2},
        runPolicy={"backoffLimit": 3},
    )


def pod_of(kube: Kube, name: str, attempt: int) -> dict[str, Any] | None:
    pod = kube.get("pod", f"{name}-node-0")
    if not pod or pod["metadata"]["labels"].get("gpujob.dev/attempt") != str(attempt):
        return None
    return pod if pod["spec"].get("nodeName") and pod["status"].get("phase") == "Running" else None


def fault(kube: Kube, name: str, box: Path, attempt: int) -> str:
    """Attempt ``attempt`` runs on some node; its GPU reports an XID, the operator publishes
    HardwareFault on that node, then the rank dies. Returns the node."""
    pod = wait_until(
        lambda: pod_of(kube, name, attempt), 120, f"attempt {attempt} running", interval=0.5
    )
    where = str(pod["spec"]["nodeName"])
    (box / f"xid-{attempt}").touch()

    def published() -> dict[str, Any] | None:
        b = job_status(kube, name).get("bottleneck") or {}
        return b if b.get("verdict") == "HardwareFault" else None

    verdict = wait_until(published, 90, f"HardwareFault of attempt {attempt}", interval=0.5)
    assert verdict["node"] == where, verdict
    (box / f"crash-{attempt}").touch()
    return where


def test_the_next_attempt_avoids_the_node_of_a_hardware_fault_and_then_says_it_cannot(
    kube: Kube, crd: Path, tmp_path: Path
) -> None:
    box = tmp_path / "box"
    box.mkdir()
    op = OperatorProcess(
        kube.kubeconfig,
        [kube.namespace],
        tmp_path / "operator.log",
        extra_env={"GPUJOB_RESTART_BACKOFF_BASE_SECONDS": "1"},
    ).start()
    try:
        kube.apply(faulty_job("xid", box))
        first = fault(kube, "xid", box, 0)

        # Attempt 1 is placed off the faulty node, and the status says why.
        pod = wait_until(lambda: pod_of(kube, "xid", 1), 120, "attempt 1 running", interval=0.5)
        second = str(pod["spec"]["nodeName"])
        assert second != first
        status = job_status(kube, "xid")
        avoided = status["gang"]["avoidedNodes"]
        assert [(a["node"], a["reason"], a["attempt"]) for a in avoided] == [
            (first, "HardwareFault", 0)
        ]
        terms = pod["spec"]["affinity"]["nodeAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"
        ]["nodeSelectorTerms"]
        assert terms == [
            {"matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": [first]}]}
        ]
        got = c.find(status["conditions"], c.NODES_AVOIDED) or {}
        assert (got.get("status"), got.get("reason")) == ("True", c.BLAMED_NODES_AVOIDED), got

        # Attempt 1 faults too: both nodes are blamed. The gang would not fit without them,
        # so attempt 2 goes back on the newest one, keeps avoiding the first, and says so.
        assert fault(kube, "xid", box, 1) == second
        pod = wait_until(lambda: pod_of(kube, "xid", 2), 120, "attempt 2 running", interval=0.5)
        assert pod["spec"]["nodeName"] == second
        status = job_status(kube, "xid")
        assert {a["node"] for a in status["gang"]["avoidedNodes"]} == {first, second}
        got = c.find(status["conditions"], c.NODES_AVOIDED) or {}
        assert (got.get("status"), got.get("reason")) == ("False", c.TOO_FEW_NODES), got
        assert f"without {second}" in got["message"] and f"still avoids {first}" in got["message"]
        events = kube.run("get", "events", "-o", "json", check=True).stdout
        assert "NodeBlamed" in events and "TooFewNodes" in events

        (box / "finish-2").touch()
        done = wait_job_phase(kube, "xid", ("Succeeded", "Failed"), 120)
        assert done["phase"] == "Succeeded", done.get("conditions")
        assert done["gang"]["restarts"] == 2
    finally:
        op.stop()


def test_a_gang_passes_its_preflight_and_trains(kube: Kube, operator: OperatorProcess) -> None:
    """Two pods meet over gloo on the rendezvous port + 1, then become the command."""
    kube.apply(
        python_job(
            "checked",
            "import os; print('trained on', os.environ['GPUJOB_NODE_NAME'])",
            nodes=2,
            gpus=1,
            runPolicy={"backoffLimit": 0, "preflight": {"enabled": True, "minRelativeSpeed": 0}},
        )
    )
    done = wait_job_phase(kube, "checked", ("Succeeded", "Failed"), 180)
    assert done["phase"] == "Succeeded", (done.get("failure"), done.get("conditions"))
    for rank in (0, 1):
        log = (
            kube.run("logs", f"checked-node-{rank}", check=True).stdout
            + kube.run("logs", f"checked-node-{rank}", check=True).stderr
        )
        pod = kube.get("pod", f"checked-node-{rank}") or {}
        node = pod["spec"]["nodeName"]
        assert f"gpujob preflight: node {node} (node rank {rank}) passed" in log, log
        assert f"trained on {node}" in log, log


def test_a_failed_preflight_names_its_node_and_the_next_attempt_avoids_it(
    kube: Kube, operator: OperatorProcess
) -> None:
    kube.apply(
        python_job(
            "unfit",
            "print('never runs')",
            nodes=1,
            gpus=4,
            runPolicy={"backoffLimit": 1, "preflight": {"enabled": True, "minGemmTFLOPS": 1e6}},
        )
    )
    done = wait_job_phase(kube, "unfit", ("Succeeded", "Failed"), 180)
    failed = c.find(done["conditions"], c.FAILED) or {}
    assert failed.get("reason") == c.BACKOFF_LIMIT_EXCEEDED, failed
    assert done["failure"]["exitCode"] == 86
    avoided = done["gang"]["avoidedNodes"]
    assert [a["reason"] for a in avoided] == ["Preflight"]
    first = avoided[0]["node"]
    assert f"gpujob preflight FAILED on node {first} (node rank 0)" in avoided[0]["message"]
    assert "below minGemmTFLOPS 1e+06" in avoided[0]["message"]
    assert avoided[0]["attempt"] == 0
    # Attempt 1 ran elsewhere (and failed there too): its pod is the one left.
    pod = kube.get("pod", "unfit-node-0") or {}
    assert pod["metadata"]["labels"]["gpujob.dev/attempt"] == "1"
    assert pod["spec"]["nodeName"] != first
    assert "never runs" not in kube.run("logs", "unfit-node-0").stdout
