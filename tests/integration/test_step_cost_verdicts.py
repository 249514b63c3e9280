"""Through the operator: a rank slow outside its model reaches status as the Straggler.

The example's rank 1 spends 0.5 s per step in its loss head, outside the wrapped model; the
operator must name it (rank, pod, node) in status.bottleneck with the per-rank breakdown,
and `kubectl get` must show Straggler(r1).
"""

from __future__ import annotations

from typing import Any

from tests.integration.conftest import job_status
from tests.integration.test_progress_verdicts import get_row, trainer_job, watch
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
    final = watch(kube, "lossy", timeout=300)[-1]
    assert final["STATUS"] == "Succeeded", final
