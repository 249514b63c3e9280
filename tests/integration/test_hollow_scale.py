"""A wide job on hollow nodes: 128 pods x 8 ranks on the real API server and scheduler, each
pod reported Running by the hollow kubelet and its 8 ranks served by light processes. The
operator must create the gang, restart it in place when a rank fails (the same pods, all
running the next attempt again), and name the stalled rank from 1,024 ranks' evidence. The
frontier figures (2,048 pods beside a thousand jobs) are bench/frontier.py's; this is the
same path, small enough for CI."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpujob_localcluster.cluster import HollowConfig, LocalCluster, NodeConfig
from gpujob_localcluster.hollow.faults import RankFault
from tests.integration.conftest import fresh_namespace, job_status, own_cluster
from tests.support.jobs import hollow_job
from tests.support.kube import Kube
from tests.support.operator import OperatorProcess
from tests.support.waiting import wait_until

PODS = 128
RANKS = 8
PAD_KB = 200
"""Each pod's template carries 200 KB: a batch is about 80 pods (16 MB), so the gang is
created, and recreated, as one batch and the rest built pod by pod as each is sent."""
BATCH = 16 * 1024 // PAD_KB


@pytest.fixture(scope="module")
def hollow_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    folder = tmp_path_factory.mktemp("hollow-cluster")
    with own_cluster(
        folder,
        "with hollow nodes",
        nodes=NodeConfig(count=1),
        hollow=HollowConfig(count=PODS, gpus=RANKS),
    ) as lc:
        yield lc


@pytest.fixture
def hkube(hollow_cluster: LocalCluster) -> Iterator[Kube]:
    with fresh_namespace(hollow_cluster, "hollow") as k:
        yield k


def running(kube: Kube, name: str, attempt: int) -> int:
    """Pods of ``attempt`` the API server shows Running with an address."""
    pods = kube.list("pods", f"gpujob.dev/job-name={name},gpujob.dev/attempt={attempt}")
    return sum(
        p.get("status", {}).get("phase") == "Running" and bool(p["status"].get("podIP"))
        for p in pods
        if not p["metadata"].get("deletionTimestamp")
    )


def live(kube: Kube, name: str) -> list[dict]:
    return [
        p
        for p in kube.list("pods", f"gpujob.dev/job-name={name}")
        if not p["metadata"].get("deletionTimestamp")
    ]


def test_a_1024_rank_job_is_created_restarted_and_its_stalled_rank_named(
    hollow_cluster: LocalCluster, hkube: Kube, tmp_path: Path
) -> None:
    op = OperatorProcess(hkube.kubeconfig, [hkube.namespace], tmp_path / "operator.log").start()
    try:
        name = "wide"
        began = time.monotonic()
        hkube.apply(hollow_job(name, PODS, RANKS, pad_kb=PAD_KB))
        wait_until(
            lambda: running(hkube, name, 0) == PODS, 90, f"{PODS} pods Running", interval=1.0
        )
        created = time.monotonic() - began
        # A pass creates more than its batch: the rest are built as they are sent.
        log = op.log_path.read_text(errors="replace")
        created_by_pass = [
            int(n)
            for n in re.findall(rf"reconciled {hkube.namespace}/{name}: .*?created=(\d+)", log)
        ]
        assert max(created_by_pass, default=0) > BATCH, created_by_pass
        wait_until(
            lambda: (job_status(hkube, name).get("progress") or {}).get("step"),
            60,
            "progress from the hollow ranks",
            interval=1.0,
        )
        # Rank 1000 (pod 125) fails: hollow nodes declare in-place restarts, so the gang
        # restarts in place (the same pods, moved to attempt 1, released) and runs again.
        uids = {p["metadata"]["name"]: p["metadata"]["uid"] for p in live(hkube, name)}
        hollow_cluster.hollow_faults([RankFault(hkube.namespace, name, 1000, "fail")])
        began = time.monotonic()
        status = wait_until(
            lambda: (
                (s := job_status(hkube, name)).get("phase") == "Running"
                and s["gang"]["attempt"] == 1
                and s
            ),
            90,
            "attempt 1 Running",
            interval=1.0,
        )
        restarted = time.monotonic() - began
        assert running(hkube, name, 1) == PODS
        gang = status["gang"]
        assert gang["restarts"] == 1 and gang["restartStrategy"]["strategy"] == "InPlace", gang
        assert gang.get("inPlaceRestarts") == 1, gang
        assert {p["metadata"]["name"]: p["metadata"]["uid"] for p in live(hkube, name)} == uids
        failure = status["failure"]
        assert (failure["nodeRank"], failure["exitCode"], failure["attempt"]) == (125, 1, 0), (
            failure
        )
        # Rank 517 (pod 64, local rank 5) hangs in its data loader; the others wait in all_reduce.
        hollow_cluster.hollow_faults([RankFault(hkube.namespace, name, 517, "stall", "1")])
        began = time.monotonic()
        ev = wait_until(
            lambda: job_status(hkube, name).get("hangEvidence"), 90, "hang evidence", interval=1.0
        )
        named = time.monotonic() - began
        assert ev["culprits"] == [517], ev
        assert ev["summary"].startswith(f"rank 517 (pod {name}-node-64"), ev
        print(f"\nhollow {PODS}x{RANKS}: created {created:.1f}s, restarted {restarted:.1f}s, "
              f"stall named {named:.1f}s after the fault")  # fmt: skip
    finally:
        op.stop()
