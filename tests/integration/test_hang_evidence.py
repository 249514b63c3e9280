"""A hung job comes with its evidence: real torchrun ranks (gloo, CPU) on the local control
plane, one rank hung four ways; the operator must name that rank and its place in the status,
an Event and a ConfigMap readable with kubectl. A healthy run never captures anything (see
test_progress_verdicts.py, whose healthy job asserts no hangEvidence)."""

from __future__ import annotations

import json
import urllib.request
from typing import Any

import pytest

from tests.integration.conftest import delete_job, job_status
from tests.integration.test_progress_verdicts import job_events, trainer_job
from tests.support.kube import Kube
from tests.support.operator import OperatorProcess
from tests.support.waiting import wait_until

SMALL = ["--hidden", "64", "--layers", "1", "--batch-size", "64"]
"""Steps of a few milliseconds: the stall threshold is the 10 s stallTimeoutSeconds."""


PORTS = {"loader": 29610, "collective": 29620, "gil": 29630, "sleep": 29640}
"""A rendezvous port per job: a previous test's pods may still be going away."""


def hung_job(name: str, how: str, rank: int = 1, **spec: Any) -> dict[str, Any]:
    body = trainer_job(
        name,
        100_000,
        *SMALL,
        "--hang-rank", str(rank), "--hang-after", "20", "--hang-how", how,
        stallTimeoutSeconds=10,
    )  # fmt: skip
    body["spec"]["template"] = {"terminationGracePeriodSeconds": 2}
    body["spec"]["training"]["masterPort"] = PORTS[how]
    body["spec"].update(spec)
    return body


def evidence(kube: Kube, name: str) -> dict[str, Any]:
    def taken() -> dict[str, Any] | None:
        return job_status(kube, name).get("hangEvidence") or None

    return wait_until(taken, 240, f"{name}'s hang evidence", interval=1.0)


def captures(op: OperatorProcess, result: str) -> float:
    """The operator's gpujob_operator_hang_captures_total for ``result``."""
    url = f"http://127.0.0.1:{op.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=5) as r:
        text = r.read().decode()
    line = f'gpujob_operator_hang_captures_total{{result="{result}"}} '
    return float(next(x for x in text.splitlines() if x.startswith(line)).split()[-1])


def configmap(kube: Kube, name: str) -> dict[str, str]:
    out = kube.run("get", "configmap", name, "-o", "jsonpath={.data}", check=True).stdout
    return dict(json.loads(out))


@pytest.mark.parametrize(
    ("how", "place"),
    [
        ("loader", "it is in the data loader: example.py:"),
        ("collective", "it waits in all_reduce #1 of group 1 at example.py:"),
    ],
)
def test_the_rank_that_is_not_where_the_others_are_is_named_with_its_place(
    kube: Kube, operator: OperatorProcess, how: str, place: str
) -> None:
    name = f"hung-{how}"
    kube.apply(hung_job(name, how))
    ev = evidence(kube, name)
    assert ev["culprits"] == [1] and ev["silent"] == [], ev
    assert ev["summary"].startswith(f"rank 1 (pod {name}-node-1, node "), ev
    assert "is not in all_reduce #" in ev["summary"] and "where rank 0 waits" in ev["summary"]
    assert place in ev["summary"], ev
    assert ev["configMap"] == f"{name}-hang-0" and ev["attempt"] == 0, ev

    data = configmap(kube, ev["configMap"])
    assert set(data) == {"summary.txt", "rank-0.txt", "rank-1.txt"}, data.keys()
    assert "PENDING" in data["rank-0.txt"] and "example.py" in data["rank-1.txt"]

    status = job_status(kube, name)
    stalled = next(c for c in status["conditions"] if c["type"] == "Stalled")
    assert stalled["status"] == "True" and "; evidence: rank 1 (pod " in stalled["message"]
    b = status["bottleneck"]
    assert b["verdict"] == "Stalled" and b["rank"] == 1 and b["pod"] == f"{name}-node-1", b
    said = wait_until(  # posted after the status that holds the evidence
        lambda: [e for e in job_events(kube, name) if e["reason"] == "HangEvidence"],
        30,
        "the HangEvidence Event",
    )
    assert len(said) == 1 and f"kubectl get configmap {name}-hang-0" in said[0]["message"]
    assert captures(operator, "complete") == 1 and captures(operator, "partial") == 0
    delete_job(kube, name)


def test_a_rank_whose_python_holds_the_gil_is_named_as_silent(
    kube: Kube, operator: OperatorProcess
) -> None:
    kube.apply(hung_job("hung-gil", "gil"))
    ev = evidence(kube, "hung-gil")
    try:
        assert ev["culprits"] == [1] and ev["silent"] == [1], ev
        assert "rank 1 (pod hung-gil-node-1" in ev["summary"] and "did not answer" in ev["summary"]
        assert (
            "hold the GIL" in ev["summary"]
            and "while rank 0 waits in all_reduce #" in (ev["summary"])
        )
        assert "did not answer" in configmap(kube, ev["configMap"])["rank-1.txt"]
        assert captures(operator, "partial") == 1
    finally:  # its rank spins a core until killed
        delete_job(kube, "hung-gil")


def test_four_ranks_one_asleep_and_restart_on_stall_restarts_only_after_the_evidence(
    kube: Kube, operator: OperatorProcess
) -> None:
    body = hung_job(
        "hung-four",
        "sleep",
        rank=2,
        runPolicy={"backoffLimit": 1, "restartOnStall": True},
    )
    body["spec"]["training"]["procsPerNode"] = 2
    kube.apply(body)

    def restarted() -> dict[str, Any] | None:
        status = job_status(kube, "hung-four")
        return status if status.get("gang", {}).get("restarts", 0) >= 1 else None

    status = wait_until(restarted, 300, "a gang restart", interval=1.0)
    ev = status["hangEvidence"]
    assert ev["attempt"] == 0 and ev["culprits"] == [2], ev
    assert ev["summary"].startswith("rank 2 (pod hung-four-node-1, node "), ev
    assert "where ranks 0-1,3 wait; it is in example.py:" in ev["summary"], ev
    message = status["failure"]["message"]
    assert status["failure"]["reason"] == "Stalled" and "; evidence: rank 2 (pod " in message
    assert "configmap/hung-four-hang-0" in message
    data = configmap(kube, "hung-four-hang-0")
    assert set(data) == {"summary.txt", *(f"rank-{r}.txt" for r in range(4))}
    names = wait_until(  # the restart's Event is posted after its status write
        lambda: (lambda n: n if "GangRestart" in n else None)(
            [e["reason"] for e in job_events(kube, "hung-four")]
        ),
        30,
        "the GangRestart Event",
    )
    assert names.index("HangEvidence") < names.index("GangRestart"), names
    assert names.count("GangRestart") == 1
    delete_job(kube, "hung-four")
