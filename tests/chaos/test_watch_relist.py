"""A pod watch cut while the failed gang's pods go: their DELETED events are never seen.

The operator talks to the API server through the fault proxy. Right after it deletes the
failed gang's pods for a restart, its pod watch is cut and every pod read refused (429, so
the watch keeps trying) until those pods are gone from the API server; then reads pass
again and the watch re-lists. kopf's re-list dropped nothing that vanished in the gap, and
the planner waited for those ghosts for ever (WaitingForOldPods, the GPUs idle). The
operator's own watch replaces the index with the listing, and a 404 on a delete still
proves a pod gone: the restart goes on.
"""

from __future__ import annotations

import re
import time
import urllib.request
from pathlib import Path

from tests.chaos.harness import ChaosOperator
from tests.chaos.ledger import Ledger
from tests.integration.conftest import wait_job_phase
from tests.support.faultproxy import Fault, FaultProxy
from tests.support.jobs import python_job
from tests.support.kube import Kube
from tests.support.waiting import wait_until

SCRIPT = """
import os, sys, time
attempt, rank = os.environ["ATTEMPT"], os.environ.get("RANK", "0")
if attempt == "0":
    if rank == "1":
        time.sleep(2)
        sys.exit(1)
    time.sleep(600)
time.sleep(2)
"""


def watch_errors(op: ChaosOperator) -> float:
    """The pod watch's failures the operator counted (cut streams, refused listings)."""
    assert op.proc is not None
    url = f"http://127.0.0.1:{op.proc.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=5) as r:
        text = r.read().decode()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith('gpujob_operator_api_errors_total{call="watch_pods"')
    )


def test_a_relist_that_lost_the_old_gangs_deletes_does_not_stall_the_restart(
    kube: Kube, crd: Path, tmp_path: Path, ledger: Ledger
) -> None:
    ns = kube.namespace
    pods_path = re.compile(rf"/api/v1/namespaces/{ns}/pods")
    reads = Fault("GET", pods_path, [])
    deletes = Fault("DELETE", re.compile(rf"/api/v1/namespaces/{ns}/pods/.+"), [])
    proxy = FaultProxy(kube.kubeconfig, [reads, deletes]).start()

    dark: list[float] = []

    def go_dark() -> None:
        """At the operator's first delete of the failed gang, before it reaches the API
        server: the pod watch is cut and every pod read refused (429: the watch keeps
        trying)."""
        if not dark:
            dark.append(time.time())
            reads.codes, reads.forever = [429], True
            proxy.cut_now(pods_path)

    deletes.before = go_dark
    op = ChaosOperator(ledger, proxy.kubeconfig(tmp_path / "proxy.kubeconfig"), [ns], tmp_path)
    try:
        op.start(GPUJOB_RESTART_BACKOFF_BASE_SECONDS="1", GPUJOB_RESTART_BACKOFF_MAX_SECONDS="2")
        env = [
            {
                "name": "ATTEMPT",
                "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['gpujob.dev/attempt']"}},
            }
        ]
        # Recreate: the old gang's deletes are what the relist must not lose.
        policy = {"backoffLimit": 2, "restartStrategy": "Recreate"}
        body = python_job("relist", SCRIPT, nodes=2, env=env, runPolicy=policy)
        body["spec"]["template"] = {"terminationGracePeriodSeconds": 1}
        kube.apply(body)
        wait_until(lambda: deletes.seen, 120, "the operator deleting the failed gang's pods")
        # The pod watch went dark as the old pods go: their DELETED never reaches it.
        ledger.inject("pod watch re-listed after losing the old gang's DELETED events")
        wait_until(
            lambda: (
                not [
                    p
                    for p in kube.list("pods", "gpujob.dev/job-name=relist")
                    if p["metadata"]["labels"].get("gpujob.dev/attempt") == "0"
                ]
            ),
            120,
            "the old gang's pods gone from the API server",
        )
        reads.codes, reads.forever = [], False  # reads pass again: the watch re-lists

        status = wait_job_phase(kube, "relist", ("Succeeded", "Failed"), timeout=300)
        ledger.job_ended("relist", "Succeeded", status.get("phase"))
        assert status["phase"] == "Succeeded", (status, op.proc.log_tail(60) if op.proc else "")
        assert status["gang"]["restarts"] == 1, status
        assert watch_errors(op) >= 1, "the pod watch was never cut: the scenario proved nothing"
        assert not op.tracebacks(), op.tracebacks()[0]
    finally:
        op.stop()
        proxy.stop()
