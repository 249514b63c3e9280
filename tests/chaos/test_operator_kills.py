"""The operator dies at each write boundary of a gang restart; its successor finishes the job.

A gang restart is three kinds of writes: the status (restarts+1, attempt+1), the deletes of
the old gang, the creates of the new one. (And apart from a restart: the operator dies
between taking a stall's hang evidence and recording it.) ``GPUJOB_FAULT_EXIT_AT`` makes the operator exit
137 exactly at one boundary (``gpujob_operator.runtime.faults``), so the kill lands where a crash
hurts most, not wherever a timer happened to fire. The job is brought to Running by one
operator; a second one, armed with the fault, takes over and dies in the restart; a third
finishes it. What must hold: every pod was created once (2 + 2), no pod of the new attempt
was created while one of the old existed, the restart is counted once, the job Succeeds.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gpujob_operator.runtime.faults import (
    BEFORE_EVIDENCE_RECORD,
    ENV,
    EXIT_CODE,
    IN_PLACE_BOUNDARIES,
)
from tests.chaos.harness import ChaosOperator, PodRecorder, gated_script, shell_job
from tests.chaos.ledger import Ledger
from tests.integration.conftest import job_status, wait_job_phase
from tests.integration.test_progress_verdicts import job_events, trainer_job
from tests.support.kube import Kube
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.timeout(600)]

BOUNDARIES = ("after-status-write", "between-pod-deletes", "between-pod-creates")


def live_pods(kube: Kube, job: str) -> list[dict]:
    return kube.list("pods", f"gpujob.dev/job-name={job}")


def killed_in_a_restart(
    kube: Kube,
    chaos_operator: ChaosOperator,
    ledger: Ledger,
    tmp_path: Path,
    name: str,
    strategy: str,
    boundary: str,
) -> tuple[ChaosOperator, Path]:
    """A gated 2-rank job brought to Running by one operator, then handed to one armed with
    the fault at ``boundary``, which dies in the restart rank 1's failure causes. Returns the
    operator (stopped) and the file that releases the ranks."""
    fail, marker, release = tmp_path / "fail", tmp_path / "failed-once", tmp_path / "release"
    op = chaos_operator.start()
    kube.apply(
        shell_job(
            name,
            gated_script(release, fail, marker),
            runPolicy={"backoffLimit": 3, "restartStrategy": strategy},
        )
    )
    status = wait_job_phase(kube, name, ("Running",), timeout=120)
    assert status["gang"]["attempt"] == 0 and status["gang"]["restarts"] == 0, status
    assert status["gang"]["restartStrategy"]["strategy"] == strategy, status["gang"]
    # Hand the job to an operator armed with the fault; it must be idle until rank 1 fails.
    op.kill()
    op.start(**{ENV: boundary})
    ledger.inject(f"operator killed {boundary} ({strategy} gang restart)")
    fail.write_text("x")
    try:
        code = op.wait_exit(120)
    except Exception as e:
        raise AssertionError(
            f"the armed operator never reached {boundary}: {e}; log: {op.proc.log_tail() if op.proc else ''}"
        ) from e
    assert code == EXIT_CODE, f"the armed operator exited {code}, not at the fault point"
    return op, release


@pytest.mark.parametrize("boundary", BOUNDARIES)
def test_operator_killed_at_a_gang_restart_boundary(
    boundary: str,
    kube: Kube,
    chaos_operator: ChaosOperator,
    pods: PodRecorder,
    ledger: Ledger,
    tmp_path: Path,
) -> None:
    name = "gang"
    op, release = killed_in_a_restart(
        kube, chaos_operator, ledger, tmp_path, name, "Recreate", boundary
    )

    # Where exactly did it die? The API shows the half-done restart.
    status = job_status(kube, name)
    left = live_pods(kube, name)
    assert status["gang"]["restarts"] == 1 and status["gang"]["attempt"] == 1, status
    if boundary == "after-status-write":
        assert not [p for p in left if p["metadata"].get("deletionTimestamp")], left
    if boundary == "between-pod-deletes":
        untouched = [
            p
            for p in left
            if not p["metadata"].get("deletionTimestamp")
            and p["metadata"]["labels"]["gpujob.dev/attempt"] == "0"
        ]
        assert len(untouched) == 1, f"expected one old pod left undeleted: {left}"
    if boundary == "between-pod-creates":
        new = [p for p in left if p["metadata"]["labels"]["gpujob.dev/attempt"] == "1"]
        assert len(new) == 1, f"expected one pod of attempt 1: {[p['metadata'] for p in left]}"

    # A fresh operator finishes the restart and the job.
    op.start()
    release.write_text("go")
    status = wait_job_phase(kube, name, ("Succeeded", "Failed"), timeout=180)
    ledger.job_ended(name, "Succeeded", status.get("phase"))
    assert status["phase"] == "Succeeded", status
    assert status["gang"]["restarts"] == 1 and status["gang"]["attempt"] == 1, status
    final = live_pods(kube, name)
    assert {p["metadata"]["labels"]["gpujob.dev/attempt"] for p in final} == {"1"}, final
    names = sorted(p["metadata"]["name"] for p in final)
    assert names == [f"{name}-node-0", f"{name}-node-1"], names
    wait_until(lambda: len(pods.created(name)) >= 4, 10, "the recorder to see 4 pods")
    created = sorted((p.attempt, p.rank) for p in pods.created(name))
    assert created == [(0, 0), (0, 1), (1, 0), (1, 1)], f"pods created: {created}"
    assert not pods.violations, pods.violations
    assert not op.tracebacks(), op.tracebacks()[0]


@pytest.mark.parametrize("boundary", IN_PLACE_BOUNDARIES)
def test_operator_killed_in_an_in_place_restart_and_its_successor_finishes_it(
    boundary: str,
    kube: Kube,
    chaos_operator: ChaosOperator,
    pods: PodRecorder,
    ledger: Ledger,
    tmp_path: Path,
) -> None:
    """The same, restarting in place: the successor moves the pods its predecessor did not
    (none, or one), releases the gang, and no pod is created again."""
    name = "inplace"
    op, release = killed_in_a_restart(
        kube, chaos_operator, ledger, tmp_path, name, "InPlace", boundary
    )
    status = job_status(kube, name)
    assert status["gang"]["restarts"] == 1 and status["gang"]["attempt"] == 1, status
    moved = [
        p for p in live_pods(kube, name) if p["metadata"]["labels"]["gpujob.dev/attempt"] == "1"
    ]
    assert len(moved) == (0 if boundary == "after-status-write" else 1), moved

    op.start()
    # Released: both pods restarted in place and run attempt 1 (then the ranks may end).
    wait_until(
        lambda: (
            (st := job_status(kube, name)).get("phase") == "Running" and st["gang"]["attempt"] == 1
        ),
        120,
        "attempt 1 running",
    )
    release.write_text("go")
    status = wait_job_phase(kube, name, ("Succeeded", "Failed"), timeout=180)
    ledger.job_ended(name, "Succeeded", status.get("phase"))
    assert status["phase"] == "Succeeded", status
    gang = status["gang"]
    assert (gang["restarts"], gang["attempt"], gang["inPlaceRestarts"]) == (1, 1, 1), gang
    assert {p["metadata"]["labels"]["gpujob.dev/attempt"] for p in live_pods(kube, name)} == {"1"}
    created = sorted((p.attempt, p.rank) for p in pods.created(name))
    assert created == [(0, 0), (0, 1)], f"pods created: {created}"
    assert not pods.violations, pods.violations
    assert not op.tracebacks(), op.tracebacks()[0]


def test_operator_killed_while_taking_hang_evidence_restarts_the_hung_gang_once(
    kube: Kube,
    chaos_operator: ChaosOperator,
    pods: PodRecorder,
    ledger: Ledger,
) -> None:
    """A real hung rank (torchrun, gloo) and restartOnStall: the operator that takes the
    evidence dies before recording it, so nothing may restart yet; its successor takes the
    evidence again (the stall is still there), records it, and only then restarts the gang,
    once. The second attempt hangs the same way and fails the job at backoffLimit 1."""
    name = "hung"
    op = chaos_operator.start(**{ENV: BEFORE_EVIDENCE_RECORD})
    body = trainer_job(
        name,
        100_000,
        "--hidden", "64", "--layers", "1", "--batch-size", "64",
        "--hang-rank", "1", "--hang-after", "20",
        stallTimeoutSeconds=10,
    )  # fmt: skip
    # Recreate: every pod created once per attempt proves the restart happened once.
    body["spec"]["runPolicy"] = {
        "backoffLimit": 1,
        "restartOnStall": True,
        "restartStrategy": "Recreate",
    }
    body["spec"]["template"] = {"terminationGracePeriodSeconds": 2}
    kube.apply(body)
    try:
        code = op.wait_exit(240)
    except Exception as e:
        raise AssertionError(f"the armed operator never took evidence: {e}") from e
    assert code == EXIT_CODE
    ledger.inject("operator killed before-evidence-record (hung rank 1)")
    status = job_status(kube, name)
    assert status["gang"]["restarts"] == 0 and "hangEvidence" not in status, status
    # What it wrote before dying is there to read.
    data = kube.run("get", "configmap", f"{name}-hang-0", "-o", "jsonpath={.data}", check=True)
    assert "rank 1 (pod hung-node-1" in data.stdout

    op.start()
    status = wait_job_phase(kube, name, ("Failed",), timeout=300)
    ledger.job_ended(name, "Failed", status.get("phase"))
    assert status["gang"]["restarts"] == 1, status
    assert status["failure"]["reason"] == "Stalled" and status["failure"]["attempt"] == 1
    ev = status["hangEvidence"]
    assert ev["attempt"] == 1 and ev["culprits"] == [1], ev
    reasons = [e["reason"] for e in job_events(kube, name)]
    assert reasons.count("GangRestart") == 1, reasons
    assert reasons.count("HangEvidence") == 2, "one per stall, none lost to the kill"
    assert reasons.index("HangEvidence") < reasons.index("GangRestart"), reasons
    created = sorted((p.attempt, p.rank) for p in pods.created(name))
    assert created == [(0, 0), (0, 1), (1, 0), (1, 1)], f"pods created: {created}"
    assert not pods.violations, pods.violations
    assert not op.tracebacks(), op.tracebacks()[0]
