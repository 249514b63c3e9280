"""A job written by the previous version carries on under this one.

The status in tests/data/status/previous-shape.json (25 top-level fields, the operator's
bookkeeping among them) is written to a job while no operator runs, as a stored object looks
after an upgrade; then this version's operator starts. It must move every old field to its
new place once and delete it, and go on where the old status was: the attempt and restarts,
the progress and the ETA's basis, the backoff of the refused create (its run and its tries,
not a fresh start) and the goodput ledger (its seconds kept, its clock going on).
"""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from gpujob_operator.api.conditions import format_time, parse_time
from gpujob_operator.api.statusupgrade import MOVES
from tests.integration.conftest import apply_quota, job_status, wait_job_phase
from tests.support.jobs import REPO
from tests.support.jobs import python_job as job
from tests.support.kube import Kube
from tests.support.operator import OperatorProcess
from tests.support.waiting import wait_until

STORED = REPO / "tests" / "data" / "status" / "previous-shape.json"
STORED_NOW = datetime(2026, 1, 1, tzinfo=UTC)
_TIME = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$")


def shifted(value: Any, by: timedelta) -> Any:
    """``value`` with every RFC 3339 time moved by ``by``."""
    if isinstance(value, dict):
        return {k: shifted(v, by) for k, v in value.items()}
    if isinstance(value, list):
        return [shifted(v, by) for v in value]
    if isinstance(value, str) and _TIME.match(value):
        return format_time(parse_time(value) + by)
    return value


def present(status: dict[str, Any], path: tuple[str, ...]) -> bool:
    node: Any = status
    for key in path:
        if not isinstance(node, dict) or key not in node:
            return False
        node = node[key]
    return True


def wide_row(kube: Kube, name: str) -> dict[str, str]:
    """`kubectl get -o wide` of one job, parsed by column position (empty cells stay)."""
    header, *rows = kube.run(
        "get", "gputrainingjob", name, "-o", "wide", check=True
    ).stdout.splitlines()
    names = header.split()
    starts = [header.index(h) for h in names] + [10_000]
    line = rows[0]
    return {h: line[starts[i] : starts[i + 1]].strip() for i, h in enumerate(names)}


def test_a_job_written_by_the_previous_version_resumes_where_it_was(
    kube: Kube, crd: Path, tmp_path: Path
) -> None:
    apply_quota(kube, "gpus", {"requests.nvidia.com/gpu": "0"})
    kube.apply(job("upgraded", "print('ran')", nodes=2, gpus=1))
    old = shifted(json.loads(STORED.read_text()), datetime.now(UTC) - STORED_NOW)
    kube.run(
        "patch", "gputrainingjob", "upgraded", "--subresource=status", "--type=merge",
        "-p", json.dumps({"status": old}), check=True,
    )  # fmt: skip
    stored = job_status(kube, "upgraded")
    for path, _ in MOVES:  # the CRD keeps the old fields for one release: nothing pruned
        if present(old, path):
            assert present(stored, path), (path, stored)

    op = OperatorProcess(kube.kubeconfig, [kube.namespace], tmp_path / "operator.log").start()
    try:
        status = wait_until(
            lambda: "attempt" not in (s := job_status(kube, "upgraded")) and "gang" in s and s,
            60,
            "the status moved to this version's shape",
        )
        # Every old field left its old place.
        left = [path for path, _ in MOVES if present(status, path)]
        assert not left, (left, status)
        gang, state, progress = status["gang"], status["operatorState"], status["progress"]
        assert (gang["attempt"], gang["restarts"]) == (1, 1), gang
        assert gang["gpus"]["requested"] == 2 and gang["replicas"]["desired"] == 2, gang
        # Progress goes on: the step, the furthest step, the ETA's basis of this attempt.
        assert (progress["step"], progress["furthestStep"]) == (40, 40), progress
        assert state["rateSince"] == old["progress"]["rateSince"], state
        assert state["furthestStepAtAttemptStart"] == 40, state
        # The backoff goes on: the same run of refusals, its tries counted on from 3.
        backoff = state["createBackoff"]
        assert backoff["since"] == old["createBackoff"]["since"], backoff
        assert backoff["tries"] >= 3 and backoff["reason"] == "QuotaExceeded", backoff
        # Goodput goes on: since kept, its seconds kept and added to, its cursor moved.
        goodput, cursor = status["goodput"], state["goodput"]
        assert goodput["since"] == old["goodput"]["since"], goodput
        assert goodput["seconds"]["productive"] == 700.0, goodput
        assert goodput["seconds"]["restart"] >= 100.0, goodput
        assert parse_time(cursor["accountedUntil"]) >= parse_time(
            old["goodput"]["accountedUntil"]
        ), cursor
        for verdict, seconds in old["goodput"]["verdictSeconds"].items():
            assert cursor["verdictSeconds"][verdict] >= seconds, cursor
        assert [v["verdict"] for v in goodput["verdicts"]] == ["Healthy", "InputBound"], goodput
        # kubectl get shows what it showed: the GPUs and restarts columns read the new places.
        columns = wide_row(kube, "upgraded")
        assert columns["GPUS"] == "2" and columns["RESTARTS"] == "1", columns
        assert columns["PROGRESS"] == "40.0%", columns

        # The refused create is tried again on the old schedule, and counts on from there.
        wait_until(
            lambda: (
                int(
                    (job_status(kube, "upgraded").get("operatorState") or {})
                    .get("createBackoff", {})
                    .get("tries", 0)
                )
                >= 4
            ),
            90,
            "the refused create tried again, as try 4",
        )
        kube.run(
            "patch", "resourcequota", "gpus", "--type=merge",
            "-p", json.dumps({"spec": {"hard": {"requests.nvidia.com/gpu": "2"}}}), check=True,
        )  # fmt: skip
        final = wait_job_phase(kube, "upgraded", ("Succeeded", "Failed"), timeout=180)
        assert final["phase"] == "Succeeded", final
        assert (final["gang"]["attempt"], final["gang"]["restarts"]) == (1, 1), final["gang"]
        assert final["goodput"]["seconds"]["productive"] >= 700.0, final["goodput"]
        assert "createBackoff" not in final.get("operatorState", {}), final
        assert op.rbac_denials() == [], op.rbac_denials()
    finally:
        op.stop()
