"""The cluster under the operator fails: the API server or etcd restarts, the node agent dies.

Each fault lands while a job runs, and something happens during the outage that the operator
must not lose: the ranks exit while the API server is down (their exits reach the API only
when it is back), or the node dies with its pods. Afterwards the job must end right, with its
restarts counted as the fault deserves, no pod created twice, the same operator process still
up (its watches recovered), and a job created after the fault must run its whole life.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gpujob_localcluster.processes import pid_alive
from tests.chaos.harness import ChaosOperator, PodRecorder, gated_script, shell_job
from tests.chaos.ledger import Ledger
from tests.integration.conftest import wait_job_phase
from tests.support.kube import Kube
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.timeout(600)]


def after_fault_job_runs(kube: Kube, pods: PodRecorder, ledger: Ledger, tmp_path: Path) -> None:
    """A job created after the fault goes from nothing to Succeeded: the job watch is back."""
    kube.apply(shell_job("after", "print('after the fault')"))
    status = wait_job_phase(kube, "after", ("Succeeded", "Failed"), timeout=120)
    ledger.job_ended("after", "Succeeded", status.get("phase"))
    assert status["phase"] == "Succeeded" and status["gang"]["restarts"] == 0, status
    assert len(pods.created("after")) == 2


@pytest.mark.parametrize("component", ["kube-apiserver", "etcd"])
def test_control_plane_component_restarts_mid_job(
    component: str,
    kube: Kube,
    chaos_operator: ChaosOperator,
    pods: PodRecorder,
    ledger: Ledger,
    tmp_path: Path,
) -> None:
    release = tmp_path / "release"
    op = chaos_operator.start()
    kube.apply(shell_job("steady", gated_script(release)))
    wait_job_phase(kube, "steady", ("Running",), timeout=120)
    cp = kube.cluster.cp
    assert cp is not None

    ledger.inject(f"{component} killed and restarted mid-job")
    cp.stop_component(component)
    # The ranks finish while the component is down: their exits must not be lost.
    release.write_text("go")
    cp.start_component(component)

    status = wait_job_phase(kube, "steady", ("Succeeded", "Failed"), timeout=180)
    ledger.job_ended("steady", "Succeeded", status.get("phase"))
    assert status["phase"] == "Succeeded" and status["gang"]["restarts"] == 0, status
    assert op.alive(), f"the operator died: {op.proc.log_tail() if op.proc else ''}"
    after_fault_job_runs(kube, pods, ledger, tmp_path)
    assert sorted((p.attempt, p.rank) for p in pods.created("steady")) == [(0, 0), (0, 1)]
    assert not pods.violations, pods.violations
    assert op.alive() and op.proc is not None and op.proc.healthy()
    assert not op.tracebacks(), op.tracebacks()[0]


def test_node_agent_killed_with_its_pods_and_brought_back(
    kube: Kube,
    chaos_operator: ChaosOperator,
    pods: PodRecorder,
    ledger: Ledger,
    tmp_path: Path,
) -> None:
    release = tmp_path / "release"
    op = chaos_operator.start()
    kube.apply(shell_job("lost", gated_script(release), runPolicy={"backoffLimit": 2}))
    wait_job_phase(kube, "lost", ("Running",), timeout=120)

    ledger.inject("node agent killed with its pods, then restarted")
    killed = kube.cluster.kill_agent()
    assert killed, "the agent had no pod processes to lose"
    assert not [p for p in killed if pid_alive(p)]
    kube.cluster.start_agent()

    # The restarted agent reports the lost pods Failed; the gang restarts once, then runs.
    wait_until(
        lambda: (
            (s := kube.get("gputrainingjob", "lost") or {})
            .get("status", {})
            .get("gang", {})
            .get("restarts")
            == 1
            and s["status"].get("phase") == "Running"
            and s
        ),
        180,
        "one gang restart and Running again",
    )
    release.write_text("go")
    status = wait_job_phase(kube, "lost", ("Succeeded", "Failed"), timeout=180)
    ledger.job_ended("lost", "Succeeded", status.get("phase"))
    assert status["phase"] == "Succeeded", status
    assert status["gang"]["restarts"] == 1 and status["gang"]["attempt"] == 1, status
    created = sorted((p.attempt, p.rank) for p in pods.created("lost"))
    assert created == [(0, 0), (0, 1), (1, 0), (1, 1)], created
    assert not pods.violations, pods.violations
    assert op.alive()
    after_fault_job_runs(kube, pods, ledger, tmp_path)
    assert not op.tracebacks(), op.tracebacks()[0]
