"""In-place gang restarts on the real API server, scheduler, node agent and operator.

The local nodes declare RestartAllContainersOnContainerExits, so a job with a command restarts
in place by default. Each rank is a plain Python process under the restart supervisor; it
learns its attempt from GPUJOB_ATTEMPT (set by the supervisor from the pod's label), so the
ranks of attempt 0 fail or wait as the test says and those of attempt 1 finish.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gpujob_operator.api import conditions as c
from tests.integration.conftest import job_status, wait_job_phase
from tests.support.jobs import python_job
from tests.support.kube import Kube
from tests.support.operator import OperatorProcess
from tests.support.waiting import wait_until

RANKS = """
    import os, pathlib, sys, time
    attempt, rank = int(os.environ["GPUJOB_ATTEMPT"]), int(os.environ["RANK"])
    print(f"rank {rank} runs attempt {attempt}", flush=True)
    box = pathlib.Path(DIR)
    (box / f"started-{rank}-{attempt}").touch()
    if attempt == 0:
        while not (box / "fail").exists():
            time.sleep(0.1)
        if rank == FAILING:
            sys.exit(3)
        time.sleep(600)  # the others wait until the operator stops their run
    print(f"rank {rank} done", flush=True)
"""


def ranks_job(name: str, box: Path, failing: int, **spec: Any) -> dict[str, Any]:
    script = RANKS.replace("DIR", repr(str(box))).replace("FAILING", str(failing))
    return python_job(name, script, nodes=2, gpus=1, **spec)


def pods_by_name(kube: Kube, name: str) -> dict[str, dict[str, Any]]:
    return {
        p["metadata"]["name"]: p
        for p in kube.list("pods")
        if p["metadata"]["name"].startswith(f"{name}-node-")
    }


def trainer_status(pod: dict[str, Any]) -> dict[str, Any]:
    statuses = pod["status"].get("containerStatuses") or []
    return next(s for s in statuses if s["name"] == "trainer")


def running_attempt_0(kube: Kube, name: str, box: Path) -> dict[str, str]:
    """Wait for both ranks of attempt 0 to run; their pods' UIDs."""
    wait_until(
        lambda: all((box / f"started-{r}-0").exists() for r in (0, 1)), 120, "attempt 0 running"
    )
    wait_job_phase(kube, name, ("Running",), 60)
    return {n: p["metadata"]["uid"] for n, p in pods_by_name(kube, name).items()}


def warnings_of(kube: Kube, reason: str) -> list[dict[str, Any]]:
    return [e for e in kube.list("events") if e.get("reason") == reason]


def test_a_failed_rank_restarts_every_pod_in_place_and_the_job_finishes(
    kube: Kube, operator: OperatorProcess, tmp_path: Path
) -> None:
    box = tmp_path / "box"
    box.mkdir()
    kube.apply(ranks_job("inplace", box, failing=1, runPolicy={"backoffLimit": 2}))
    uids = running_attempt_0(kube, "inplace", box)
    status = job_status(kube, "inplace")
    strategy = status["gang"]["restartStrategy"]
    assert (strategy["strategy"], strategy["reason"]) == ("InPlace", "NodesDeclareIt"), strategy

    (box / "fail").touch()
    done = wait_job_phase(kube, "inplace", ("Succeeded", "Failed"), 180)
    assert done["phase"] == "Succeeded", (done.get("failure"), done.get("conditions"))
    gang = done["gang"]
    assert (gang["attempt"], gang["restarts"], gang["inPlaceRestarts"]) == (1, 1, 1), gang
    assert done["failure"]["exitCode"] == 3 and done["failure"]["pod"] == "inplace-node-1"
    pods = pods_by_name(kube, "inplace")
    # The same pods (UIDs, nodes), each restarted once, now of attempt 1.
    assert {n: p["metadata"]["uid"] for n, p in pods.items()} == uids
    for pod in pods.values():
        assert pod["metadata"]["labels"]["gpujob.dev/attempt"] == "1"
        assert trainer_status(pod)["restartCount"] == 1, trainer_status(pod)
    last = {n: trainer_status(p)["lastState"]["terminated"]["exitCode"] for n, p in pods.items()}
    # Rank 1 failed; rank 0's run was stopped by its supervisor once the pod was moved.
    assert last == {"inplace-node-0": 87, "inplace-node-1": 3}, last
    assert all((box / f"started-{r}-1").exists() for r in (0, 1))
    wait_until(lambda: warnings_of(kube, c.RESTARTED_IN_PLACE), 30, "the RestartedInPlace Event")
    assert not warnings_of(kube, c.IN_PLACE_FALLBACK)


def test_a_pod_lost_during_the_run_is_recreated_while_the_other_restarts_in_place(
    kube: Kube, operator: OperatorProcess, tmp_path: Path
) -> None:
    box = tmp_path / "box"
    box.mkdir()
    kube.apply(ranks_job("lost", box, failing=-1, runPolicy={"backoffLimit": 2}))
    uids = running_attempt_0(kube, "lost", box)
    kube.run("delete", "pod", "lost-node-0", "--wait=false", check=True)
    done = wait_job_phase(kube, "lost", ("Succeeded", "Failed"), 180)
    assert done["phase"] == "Succeeded", (done.get("failure"), done.get("conditions"))
    pods = pods_by_name(kube, "lost")
    assert pods["lost-node-1"]["metadata"]["uid"] == uids["lost-node-1"]
    assert trainer_status(pods["lost-node-1"])["restartCount"] == 1
    assert pods["lost-node-0"]["metadata"]["uid"] != uids["lost-node-0"]
    assert trainer_status(pods["lost-node-0"])["restartCount"] == 0
    assert done["gang"]["inPlaceRestarts"] == 1
    fallback = wait_until(
        lambda: warnings_of(kube, c.IN_PLACE_FALLBACK), 30, "the InPlaceFallback Warning"
    )
    assert fallback and "lost-node-0" in fallback[0]["message"], fallback
