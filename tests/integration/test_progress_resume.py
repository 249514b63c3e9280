"""A run that crashes once and resumes from its checkpoint, through the operator on the real
local control plane: the progress never falls below the resume point once the new attempt
stepped, no ETA while the gang restarts, and where it resumed and how far it got."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from gpujob_operator.api.conditions import parse_time
from gpujob_operator.api.status import attempt_of
from tests.integration.conftest import job_status
from tests.integration.test_progress_verdicts import job_events, trainer_job
from tests.support.jobs import REPO
from tests.support.kube import Kube
from tests.support.operator import OperatorProcess
from tests.support.waiting import wait_until

STEPS = 150
FAIL_AT = 90  # 60%
EVERY = 10


def test_a_crash_at_60_percent_resumes_from_the_checkpoint_with_true_progress(
    kube: Kube, operator: OperatorProcess, tmp_path: Path
) -> None:
    body = trainer_job(
        "resume",
        STEPS,
        "--checkpoint-dir", str(tmp_path / "checkpoints"),
        "--checkpoint-every", str(EVERY), "--checkpoint-seconds", "0",
        "--fail-rank", "1", "--fail-at-step", str(FAIL_AT),
        "--slow-input", "0.25",  # ~4 steps a second: several scrapes (every 2 s) an attempt
    )  # fmt: skip
    body["spec"]["runPolicy"] = {"backoffLimit": 2}
    # The ranks run this checkout's trainer (its checkpoint and crash switches), whatever
    # the venv has installed, as a pod that runs code nothing installs says in its own env.
    trainer = REPO / "trainer_image"
    body["spec"]["env"] = [{"name": "PYTHONPATH", "value": f"{trainer}{os.pathsep}{REPO}"}]
    kube.apply(body)
    seen: list[dict[str, Any]] = []

    def finished() -> dict[str, Any] | None:
        status = job_status(kube, "resume")
        if status:
            seen.append(status)
        return status if status.get("phase") in ("Succeeded", "Failed") else None

    final = wait_until(finished, 540, "the resumed job to finish", interval=0.5)
    assert final["phase"] == "Succeeded" and final["gang"]["restarts"] == 1, final.get("failure")
    assert final["gang"]["attempt"] == 1

    first = [s for s in seen if attempt_of(s) == 0 and (s.get("progress") or {}).get("step")]
    assert first, "attempt 0's progress was seen"
    reached = max(s["progress"]["step"] for s in first)
    assert FAIL_AT - 2 * EVERY <= reached <= FAIL_AT + 1, reached

    progress = final["progress"]
    resumed = progress["resumedFromStep"]
    assert resumed % EVERY == 0 and FAIL_AT - 2 * EVERY <= resumed <= FAIL_AT, progress
    assert progress["furthestStep"] == STEPS and progress["step"] == STEPS
    assert final["operatorState"]["furthestStepAtAttemptStart"] == reached
    assert "attemptsWithoutProgress" not in final["operatorState"], "attempt 0 made progress"

    # While the gang restarts: no ETA, a reason, the last step kept (not 0).
    restarting = [s for s in seen if s.get("phase") == "Restarting"]
    assert restarting, "the restart was seen"
    for s in restarting:
        p = s["progress"]
        assert "etaSeconds" not in p and "estimatedCompletionTime" not in p, p
        assert p["etaUnavailable"].startswith("restarting: the gang restarts as attempt 1"), p
        assert p["step"] == p["furthestStep"] == reached, p  # (the checkpoint may be newer)
        assert s["display"]["eta"] == "restarting", s["display"]

    # The new attempt: the last known step until its first step, then never below the resume
    # point; never 0; the furthest step kept.
    second = [s for s in seen if attempt_of(s) == 1 and s.get("progress")]
    steps = [s["progress"]["step"] for s in second]
    stepped = next(i for i, step in enumerate(steps) if step > resumed and step != reached)
    assert set(steps[:stepped]) <= {reached}, steps
    assert min(steps[stepped:]) > resumed, steps
    assert all(s["progress"]["furthestStep"] >= reached for s in second)
    own = [p for s in second if (p := s["progress"]).get("resumedFromStep") == resumed]
    assert own, "the resume point was shown while attempt 1 ran"
    running = [p for s in second if s["phase"] == "Running" and (p := s["progress"])]
    assert [p for p in running if "etaSeconds" not in p and not p.get("etaUnavailable")] == []
    assert any("etaSeconds" in p for p in running), "the ETA came back in the new attempt"

    reasons = [(e["type"], e["reason"], e["message"]) for e in job_events(kube, "resume")]
    restarts = [r for r in reasons if r[1] == "GangRestart"]
    assert len(restarts) == 1 and restarts[0][0] == "Warning", reasons
    assert "failed" in restarts[0][2] and "as attempt 1" in restarts[0][2], restarts
    assert all(r[1] != "NoProgressAcrossRestarts" for r in reasons), reasons

    # Goodput against the timeline: every second from creation to completion charged once,
    # the crash's cost (backoff, start-up of attempt 1, the steps redone from the checkpoint)
    # as restart, and the rest mostly steps. Tolerance: the planner's pass granularity.
    goodput = final["goodput"]
    created = parse_time(kube.get("gputrainingjob", "resume")["metadata"]["creationTimestamp"])
    wall = (parse_time(final["completionTime"]) - created).total_seconds()
    charged = sum(goodput["seconds"].values())
    assert abs(charged - wall) <= 5.0, (charged, wall, goodput)
    assert goodput["seconds"]["restart"] >= 1.0, goodput  # at least the restart's backoff
    assert goodput["seconds"]["productive"] > 0 and 0 < goodput["ratio"] < 1, goodput
    assert goodput["seconds"]["startup"] > 0, goodput  # attempt 0's pods to its first step
    assert goodput["gpuHours"] >= goodput["lostGPUHours"] >= 0, goodput
