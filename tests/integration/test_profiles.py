"""Profiles on demand through the operator: real torchrun ranks (gloo, CPU) on the local
control plane, rank 1 doing four times the others' work in the same operations.

- ``spec.monitoring.profileOnVerdict``: once a Warning verdict held, the operator profiles
  the job by itself; the status names rank 1 and the operation that differs (the matmuls).
- ``gpujob profile``: the CLI sets the request, the status acknowledges it, a second request
  while the capture runs is refused with the reason (the first goes on), and the capture's
  ConfigMap holds every chosen rank's summary.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

from tests.integration.conftest import job_status
from tests.integration.test_progress_verdicts import trainer_job
from tests.support.kube import Kube
from tests.support.operator import OperatorProcess
from tests.support.waiting import wait_until

MATMULS = ("aten::addmm", "aten::mm", "aten::matmul", "aten::linear")


def gpujob(kube: Kube, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """The user's ``gpujob`` command against the test cluster."""
    env = {**os.environ, "KUBECONFIG": str(kube.kubeconfig)}
    cmd = [sys.executable, "-m", "gpujob_operator.cli", *args, "-n", kube.namespace]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)


def gpujob_wait(kube: Kube, *args: str) -> subprocess.Popen[str]:
    """The same, left running (``--wait``) while the test goes on."""
    env = {**os.environ, "KUBECONFIG": str(kube.kubeconfig)}
    cmd = [sys.executable, "-m", "gpujob_operator.cli", *args, "-n", kube.namespace]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def profile_of(kube: Kube, name: str) -> dict[str, Any]:
    return dict(job_status(kube, name).get("profile") or {})


def test_a_profile_names_the_rank_that_does_more_work_and_its_operation(
    kube: Kube, operator: OperatorProcess
) -> None:
    body = trainer_job(
        "profiled",
        100_000,
        "--slow-rank", "1", "--slow-factor", "4", "--slow-input", "0.05",
        warmupSteps=3, profileOnVerdict=True,
    )  # fmt: skip
    kube.apply(body)
    try:

        def automatic() -> dict[str, Any] | None:
            p = profile_of(kube, "profiled")
            status = job_status(kube, "profiled")
            assert status.get("phase") not in ("Succeeded", "Failed"), status.get("failure")
            return p if p.get("auto") and p.get("state") in ("Captured", "Failed") else None

        auto = wait_until(automatic, 300, "the automatic profile", interval=1.0)
        assert auto["state"] == "Captured", auto
        assert auto["slowestRank"] == 1, auto
        assert auto["operation"] in MATMULS or "mm" in auto["operation"], auto
        assert auto["answer"].startswith("rank 1: "), auto
        # the verdict's advice now points at the profile
        wait_until(
            lambda: (
                "A profile of this attempt: rank 1: "
                in str((job_status(kube, "profiled").get("bottleneck") or {}).get("advice"))
            ),
            60,
            "the verdict's advice naming the profile",
            interval=1.0,
        )

        # A request from the CLI, long enough that a second one arrives while it runs.
        first = gpujob_wait(kube, "profile", "profiled", "--steps", "50", "--ranks", "all",
                            "--wait", "--timeout", "240")  # fmt: skip
        wait_until(
            lambda: profile_of(kube, "profiled").get("state") in ("Requested", "Capturing"),
            60,
            "the request acknowledged",
            interval=0.5,
        )
        taken = profile_of(kube, "profiled")
        second = gpujob(kube, "profile", "profiled", "--steps", "5")
        refused = profile_of(kube, "profiled")
        if second.returncode == 0:  # the CLI let it through: the operator refuses it
            refused = wait_until(
                lambda: (p := profile_of(kube, "profiled")).get("refused") and p,
                60,
                "the second request refused",
                interval=0.5,
            )
            assert "under way" in refused["refused"]["reason"], refused
        else:
            assert second.returncode == 2, second
            assert "under way" in second.stderr + second.stdout, second
        assert refused["id"] == taken["id"], (taken, refused)
        out, err = first.communicate(timeout=300)
        assert first.returncode == 0, out + err
        assert "rank 1: " in out, out
        print(out)  # what the user sees (the README shows one)
        final = profile_of(kube, "profiled")
        assert final["state"] == "Captured" and final["id"] == taken["id"], final
        assert sorted(final["ranks"]) == [0, 1], final
        assert final["slowestRank"] == 1, final
        cm = kube.run("get", "configmap", final["configMap"], "-o", "json", check=True)
        data = json.loads(cm.stdout)["data"]
        for rank in (0, 1):
            summary = json.loads(data[f"rank-{rank}.json"])
            parts = summary["parts"]
            assert (
                abs(sum(parts.values()) - summary["stepSeconds"]) <= 0.1 * summary["stepSeconds"]
            ), summary
            assert summary["top"], summary
        assert "rank 1" in data["summary"], data["summary"]
    finally:
        kube.run("delete", "gputrainingjob", "profiled", "--wait=false")
