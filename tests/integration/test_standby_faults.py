"""Two replicas with kopf peering, as local processes, the active one behind a fault proxy.

The faults the standby guard must live through: its reads of the peering object cut by a
reset (a failover, an API server restart: not an ``ApiException``), and the active replica
frozen (SIGSTOP, a paused VM) long enough for the standby to take over, then thawed. The
proxy sees every request of the active replica, so the test reads from it whether the
thawed replica wrote anything (it must not: its write fence is shut until its guard has
looked, and the guard then restarts it). Its successor may restart too, should its guard
look while the thawed replica's fresh keep-alive outranks it; the test then starts it again,
as its pod would, and the job must still end with one restart and no rank doubled.
"""

from __future__ import annotations

import os
import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpujob_operator import api
from tests.integration.conftest import job_status, wait_job_phase
from tests.support.faultproxy import RESET, Fault, FaultProxy
from tests.support.incluster import PodCensus, sleeper_job
from tests.support.kube import Kube
from tests.support.operator import OperatorProcess
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

PEERING = "gpujob-standby-test"
LIFETIME = 10
PEERING_CRDS = Path(__file__).parents[2] / "charts" / "gpujob" / "crds" / "kopf.dev-peerings.yaml"


@pytest.fixture
def peering(kube: Kube, crd: Path) -> Iterator[str]:
    """kopf's peering CRDs (as the chart ships them) and a namespaced peering object."""
    kube.run("apply", "-f", str(PEERING_CRDS), ns=False, check=True)
    kube.run(
        "wait", "--for=condition=Established", "crd/kopfpeerings.kopf.dev", "--timeout=60s",
        ns=False, check=True, timeout=90,
    )  # fmt: skip
    kube.apply(
        {
            "apiVersion": "kopf.dev/v1",
            "kind": "KopfPeering",
            "metadata": {"name": PEERING, "namespace": kube.namespace},
        }
    )
    yield PEERING


def replica(kubeconfig: Path, kube: Kube, log: Path, ident: str) -> OperatorProcess:
    env = {
        "GPUJOB_PEERING": PEERING,
        "GPUJOB_PEERING_LIFETIME": str(LIFETIME),
        "POD_ID": ident,
        "GPUJOB_RESTART_BACKOFF_BASE_SECONDS": "1",
        "GPUJOB_RESTART_BACKOFF_MAX_SECONDS": "2",
    }
    return OperatorProcess(kubeconfig, [kube.namespace], log, extra_env=env)


def test_the_guard_outlives_reset_reads_and_a_thawed_replica_writes_nothing(
    kube: Kube, peering: str, tmp_path: Path
) -> None:
    ns = kube.namespace
    guard_reads = Fault("GET", re.compile(rf"/apis/kopf\.dev/v1/namespaces/{ns}/kopfpeerings/{peering}"), [])  # fmt: skip
    writes = [
        Fault("POST", re.compile(rf"/api/v1/namespaces/{ns}/pods"), []),
        Fault("DELETE", re.compile(rf"/api/v1/namespaces/{ns}/pods/.+"), []),
        Fault(
            "PATCH",
            re.compile(rf"/apis/{api.GROUP}/{api.VERSION}/namespaces/{ns}/{api.PLURAL}/.+"),
            [],
        ),
    ]
    proxy = FaultProxy(kube.kubeconfig, [guard_reads, *writes]).start()
    a = replica(proxy.kubeconfig(tmp_path / "proxy.kubeconfig"), kube, tmp_path / "a.log", "a")
    b = replica(kube.kubeconfig, kube, tmp_path / "b.log", "b")
    census: PodCensus | None = None
    working: list[OperatorProcess] = [b]
    try:
        a.start()
        kube.apply(sleeper_job("thaw", 45))
        census = PodCensus(kube.cluster, ns, "thaw")
        wait_job_phase(kube, "thaw", ("Running",), timeout=120)
        b.start()  # younger: it stands by

        # 1. Two of the active replica's peering reads are cut (urllib3 tries each 4 times):
        # the guard logs and reads again.
        guard_reads.codes = [RESET] * 8
        wait_until(lambda: len([c for _, c in guard_reads.seen if c == RESET]) == 8, 60, "cuts")
        cut_at = max(t for t, c in guard_reads.seen if c == RESET)
        wait_until(
            lambda: sum(1 for t, c in guard_reads.seen if c == 0 and t > cut_at) >= 3,
            60,
            "the guard reading again after the cuts (before, a reset ended it silently)",
        )
        assert "standby guard could not read the peering object" in a.log_tail(400)

        # 2. The active replica freezes; a rank is lost; the standby takes over and restarts.
        assert a.proc is not None and b.proc is not None
        os.kill(a.proc.pid, signal.SIGSTOP)
        try:
            kube.run("delete", "pod", "thaw-node-1", "--wait=false", check=True)
            wait_until(
                lambda: (
                    (job_status(kube, "thaw") or {}).get("gang", {}).get("restarts") == 1
                    and (job_status(kube, "thaw") or {}).get("phase") == "Running"
                ),
                180,
                "the standby restarting the gang",
            )
        finally:
            thawed_at = time.time()
            os.kill(a.proc.pid, signal.SIGCONT)

        # 3. Thawed, the old active replica writes nothing and restarts itself.
        wait_until(lambda: a.proc is not None and a.proc.poll() is not None, 90, "a's exit")
        log = a.log_path.read_text(errors="replace")
        assert "may have taken over" in log, a.log_tail(60)
        late = [(f.method, f.path.pattern) for f in writes for t, _ in f.seen if t > thawed_at]
        assert not late, f"the thawed replica wrote: {late}"

        # 4. The job finishes under the replica that took over. Its guard may have looked in
        # the moment the thawed replica's fresh keep-alive outranked it (priority goes by age)
        # and restarted to drop its caches; its pod would start it again, and so does the
        # test, once. Before, an exit here left the job with no operator until the deadline.

        def finished() -> dict[str, Any] | None:
            op = working[-1]
            if op.proc is not None and op.proc.poll() is not None and len(working) < 2:
                text = op.log_path.read_text(errors="replace")
                assert "restarting to drop its caches" in text, op.log_tail(60)
                working.append(replica(kube.kubeconfig, kube, tmp_path / "b2.log", "b2").start())
            status = job_status(kube, "thaw") or {}
            return status if status.get("phase") in ("Succeeded", "Failed") else None

        try:
            status = wait_until(finished, 180, "job thaw to finish", interval=0.5)
        except AssertionError as e:
            tails = "\n".join(f"{op.log_path.name}: {op.log_tail(60)}" for op in working)
            raise AssertionError(f"{e}\n{tails}\nstatus: {job_status(kube, 'thaw')}") from e
        census.stop()
        assert status["phase"] == "Succeeded", (status, working[-1].log_tail(60))
        assert status["gang"]["restarts"] == 1, status
        assert census.per_rank_max == 1 and len(census.uids) == 4, vars(census)
        last = working[-1].proc
        assert last is not None and last.poll() is None, "the replica that took over keeps working"
        for op in working:
            assert "Traceback" not in op.log_path.read_text(errors="replace"), op.log_tail(80)
    finally:
        if census is not None:
            census.stop()
        if a.proc is not None and a.proc.poll() is None:
            os.kill(a.proc.pid, signal.SIGCONT)
        a.stop()
        for op in working:
            op.stop()
        proxy.stop()
