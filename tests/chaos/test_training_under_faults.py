"""A real training job (the example trainer under torchrun) while the control plane restarts.

Here a real trainer matters: its ranks serve /metrics, the operator scrapes them and writes
progress into status. After the API server restarts, and again after etcd does, progress must
move on (scrapes and status writes resumed), the job must succeed without a restart and with
its two pods only. Needs torch; run it alone (torchrun's store binds a fixed port).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.chaos.harness import ChaosOperator, PodRecorder
from tests.chaos.ledger import Ledger
from tests.integration.conftest import job_status, wait_job_phase
from tests.support.jobs import example_job
from tests.support.kube import Kube
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.timeout(900), pytest.mark.slow]

STEPS = 600


def trainer_job(name: str) -> dict[str, Any]:
    # Input-bound on purpose: a steady 10 steps/s whatever the machine's load.
    args = [
        *("--hidden", "32", "--layers", "2", "--batch-size", "16"),
        *("--slow-input", "0.1", "--log-every", "100"),
    ]
    return example_job(
        name,
        args,
        STEPS,
        gpusPerNode=0,
        training={"rdzvTimeoutSeconds": 300},
        monitoring={"stallTimeoutSeconds": 300},
    )


def step(kube: Kube, name: str) -> int:
    return int((job_status(kube, name).get("progress") or {}).get("step") or 0)


def test_training_progress_survives_control_plane_restarts(
    kube: Kube,
    chaos_operator: ChaosOperator,
    pods: PodRecorder,
    ledger: Ledger,
    tmp_path: Path,
) -> None:
    name = "trainer"
    op = chaos_operator.start()
    kube.apply(trainer_job(name))
    wait_until(lambda: step(kube, name) >= 20, 420, "progress from the trainer's /metrics")
    cp = kube.cluster.cp
    assert cp is not None
    problems: list[str] = []
    for component in ("kube-apiserver", "etcd"):
        before = step(kube, name)
        assert before < STEPS - 100, f"the job is too far along ({before}) to test {component}"
        fault = ledger.inject(f"{component} restarted under a training job")
        known = len(op.tracebacks())
        cp.restart_component(component)
        wait_until(
            lambda before=before: step(kube, name) >= before + 30,  # type: ignore[misc]
            120,
            f"progress to move on after the {component} restart (was {before})",
        )
        # Each fault is judged on its own: a traceback it caused fails it, not the other.
        if fresh := op.tracebacks()[known:]:
            fault.survived = False
            fault.detail = f"traceback in the operator log: {fresh[0].splitlines()[0][:200]}"
            problems.append(f"{component}: {fresh[0]}")
        else:
            fault.survived = True  # settled here: a later fault's failure is not this one's
    status = wait_job_phase(kube, name, ("Succeeded", "Failed"), timeout=300)
    ledger.job_ended(name, "Succeeded", status.get("phase"))
    assert status["phase"] == "Succeeded" and status["gang"]["restarts"] == 0, status
    assert status["progress"]["step"] == STEPS and status["progress"]["percent"] == 100.0
    assert sorted((p.attempt, p.rank) for p in pods.created(name)) == [(0, 0), (0, 1)]
    assert op.alive()
    assert not problems, problems
