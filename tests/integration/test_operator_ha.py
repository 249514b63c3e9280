"""Two operator replicas with kopf peering, as the chart deploys them: one works, one stands by.

The active replica is taken away mid-job (SIGKILL of its process; its pod deleted; a
``helm upgrade`` that rolls both pods) and the job still ends Succeeded with no pod doubled and each restart
counted once. How fast the standby takes over is measured by ``bench/takeover.py``, not here.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.conftest import wait_job_phase
from tests.support.incluster import ChartOperator, PodCensus, sleeper_job
from tests.support.kube import Kube
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

HA = {
    "replicaCount": 2,
    "peering": {"enabled": True},
    # The hand-over is under test, not the 10 s back-off before each Recreate restart.
    "operator": {
        "extraEnv": [
            {"name": "GPUJOB_RESTART_BACKOFF_BASE_SECONDS", "value": "1"},
            {"name": "GPUJOB_RESTART_BACKOFF_MAX_SECONDS", "value": "2"},
        ]
    },
}


@pytest.fixture
def ha(kube: Kube, crd: Path, tmp_path: Path) -> Iterator[ChartOperator]:
    op = ChartOperator(kube.cluster, kube.namespace, tmp_path / "helm")
    op.install(HA, "--skip-crds")
    yield op
    op.uninstall()


def active(op: ChartOperator) -> str:
    return wait_until(op.active_pod, 60, "an active replica")


def wait_running(kube: Kube, job: str) -> None:
    wait_job_phase(kube, job, ("Running",), timeout=120)


def test_sigkill_of_the_active_replica_mid_job_hands_over_once(
    kube: Kube, ha: ChartOperator
) -> None:
    kube.apply(sleeper_job("ha-kill", 40))
    census = PodCensus(kube.cluster, kube.namespace, "ha-kill")
    wait_running(kube, "ha-kill")
    victim = active(ha)
    os.kill(ha.main_pid(victim), signal.SIGKILL)
    # A rank is lost while no replica works: the next active one must restart the gang once.
    kube.run("delete", "pod", "ha-kill-node-1", "--wait=false", check=True)
    status = wait_job_phase(kube, "ha-kill", ("Succeeded", "Failed"), timeout=300)
    census.stop()
    assert status["phase"] == "Succeeded", (status, ha.logs())
    assert status["gang"]["restarts"] == 1, (status, ha.logs(), ha.logs(previous=True))
    assert census.per_rank_max == 1 and census.max_live <= 2, vars(census)
    assert len(census.uids) == 4, census.uids  # two attempts x two ranks, nothing more
    # The killed container was restarted by its pod (restartPolicy Always) and stands by.
    restarted = next(p for p in ha.pods() if p["metadata"]["name"] == victim)
    assert restarted["status"]["containerStatuses"][0]["restartCount"] >= 1
    assert active(ha) != victim
    assert not ha.rbac_denials(), ha.logs()


def test_deleting_the_active_replicas_pod_mid_job_hands_over_once(
    kube: Kube, ha: ChartOperator
) -> None:
    kube.apply(sleeper_job("ha-delete", 30))
    census = PodCensus(kube.cluster, kube.namespace, "ha-delete")
    wait_running(kube, "ha-delete")
    victim = active(ha)
    ha.kubectl("delete", "pod", victim, "--wait=false")  # a clean exit: kopf withdraws it
    kube.run("delete", "pod", "ha-delete-node-0", "--wait=false", check=True)
    status = wait_job_phase(kube, "ha-delete", ("Succeeded", "Failed"), timeout=300)
    census.stop()
    assert status["phase"] == "Succeeded", (status, ha.logs())
    assert status["gang"]["restarts"] == 1, (status, ha.logs())
    assert census.per_rank_max == 1 and len(census.uids) == 4, vars(census)
    assert victim not in {p["metadata"]["name"] for p in ha.pods()}
    ha.wait_available()  # the Deployment replaced the deleted replica
    assert not ha.rbac_denials(), ha.logs()


def test_helm_upgrade_mid_job_rolls_the_replicas_without_a_restart(
    kube: Kube, ha: ChartOperator
) -> None:
    kube.apply(sleeper_job("ha-upgrade", 40))
    census = PodCensus(kube.cluster, kube.namespace, "ha-upgrade")
    wait_running(kube, "ha-upgrade")
    before = {p["metadata"]["name"] for p in ha.pods()}
    ha.upgrade({**HA, "operator": {**HA["operator"], "verbose": True}}, "--skip-crds")
    ha.wait_available()
    wait_until(
        lambda: not before & {p["metadata"]["name"] for p in ha.pods()}, 120, "old pods gone"
    )
    status = wait_job_phase(kube, "ha-upgrade", ("Succeeded", "Failed"), timeout=300)
    census.stop()
    assert status["phase"] == "Succeeded", (status, ha.logs())
    assert status["gang"]["restarts"] == 0, status
    assert census.per_rank_max == 1 and len(census.uids) == 2, vars(census)
    assert not ha.rbac_denials(), ha.logs()
