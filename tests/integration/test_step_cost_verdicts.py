"""Through the operator: what a step's time goes to reaches status with its numbers.

- The example's rank 1 spends 0.5 s per step in its loss head, outside the wrapped model;
  the operator must name it (rank, pod, node) in status.bottleneck with the per-rank
  breakdown, and `kubectl get` must show Straggler(r1).
- Every rank's batches take 0.3 s to copy to the device (inside `tracker.transfer()`): the
  operator must publish TransferBound with the copy's share, and show MFU (against the job's
  peakTFLOPSPerGPU, a CPU having none) and the step latency in `kubectl get`.
"""

from __future__ import annotations

import re
from typing import Any

from tests.integration.conftest import delete_job, job_status
from tests.integration.test_progress_verdicts import get_row, trainer_job
from tests.support.kube import Kube
from tests.support.operator import OperatorProcess
from tests.support.waiting import wait_until


def test_rank_slow_in_its_loss_is_published_as_the_straggler(
    kube: Kube, operator: OperatorProcess
) -> None:
    body = trainer_job(
        "lossy", 90, "--slow-loss-rank", "1", "--slow-loss-seconds", "0.5", warmupSteps=3
    )
    kube.apply(body)
    seen: dict[str, Any] = {}

    def straggler() -> dict[str, Any] | None:
        status = job_status(kube, "lossy")
        bottleneck = status.get("bottleneck") or {}
        if bottleneck.get("verdict") == "Straggler":
            seen["row"] = get_row(kube, "lossy")
            return bottleneck
        assert status.get("phase") not in ("Succeeded", "Failed"), f"no Straggler: {status}"
        return None

    b = wait_until(straggler, 300, "the Straggler verdict", interval=1.0)
    assert seen["row"]["BOTTLENECK"] == "Straggler(r1)"
    assert b["rank"] == 1 and b["pod"].startswith("lossy-") and b["node"].startswith("gpu-node-")
    assert b["evidence"]["gapOutsideCompute"] == "true", b
    rows = {r["rank"]: r for r in b["breakdown"]}
    assert rows[1]["role"] == "slowest" and rows[1]["otherSeconds"] > 0.3, rows
    assert rows[0]["commWaitSeconds"] > 0.3, rows  # the fast rank waits for it
    delete_job(kube, "lossy")  # the verdict is what this test is about, not the job's end


def test_slow_copies_are_transfer_bound_with_mfu_and_latency_in_kubectl_get(
    kube: Kube, operator: OperatorProcess
) -> None:
    body = trainer_job("copier", 90, "--slow-copy", "0.3", warmupSteps=3, peakTFLOPSPerGPU=0.2)
    kube.apply(body)
    seen: dict[str, Any] = {}

    def transfer_bound() -> dict[str, Any] | None:
        status = job_status(kube, "copier")
        bottleneck = status.get("bottleneck") or {}
        if bottleneck.get("verdict") == "TransferBound" and "mfu" in status["progress"]:
            seen["row"] = get_row(kube, "copier")
            seen["progress"] = status["progress"]
            seen["wide"] = kube.run("get", "gputrainingjob", "copier", "-o", "wide").stdout
            return bottleneck
        assert status.get("phase") not in ("Succeeded", "Failed"), f"no TransferBound: {status}"
        return None

    b = wait_until(transfer_bound, 300, "the TransferBound verdict", interval=1.0)
    assert b["severity"] == "Warning" and b["evidence"]["h2dRatio"] > 0.4, b
    assert all(r["h2dSeconds"] >= 0.25 for r in b["breakdown"]), b["breakdown"]
    assert seen["row"]["BOTTLENECK"] == "TransferBound"
    p = seen["progress"]
    assert 0 < p["mfu"] < 1 and p["peakTFLOPSPerGPU"] == 0.2, p
    assert seen["row"]["MFU"].endswith("%") and float(seen["row"]["MFU"][:-1]) > 0, seen["row"]
    # a step is the 0.3 s copy plus its compute: both quantiles sit above the copy
    assert 0.3 <= p["stepSecondsP50"] <= p["stepSecondsP95"], p
    header, row = seen["wide"].splitlines()[:2]
    assert "STEP" in header.split(), seen["wide"]
    assert re.search(r" \d+(\.\d+)?m?s/\d+(\.\d+)?m?s ", row), seen["wide"]
    delete_job(kube, "copier")
