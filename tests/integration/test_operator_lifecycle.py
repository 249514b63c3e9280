"""The operator drives real processes through a job's whole life on the local control plane."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gpujob_operator.runtime import faults
from tests.integration.conftest import job_status, wait_job_phase
from tests.support.events import wait_event
from tests.support.jobs import python_job as job
from tests.support.kube import Kube
from tests.support.operator import OperatorProcess
from tests.support.waiting import wait_until


def job_pods(kube: Kube, name: str) -> list[dict[str, Any]]:
    return kube.list("pods", f"gpujob.dev/job-name={name}")


def test_job_succeeds_with_the_torchrun_env_contract(kube: Kube, operator: OperatorProcess) -> None:
    script = """
        import json, os
        keys = ["MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "PET_NNODES", "PET_NPROC_PER_NODE",
                "PET_NODE_RANK", "PET_MASTER_ADDR", "PET_MASTER_PORT", "PYTHONUNBUFFERED", "GPUJOB_METRICS_PORT"]
        print(json.dumps({k: os.environ.get(k) for k in keys}))
    """
    kube.apply(job("ok", script))
    status = wait_job_phase(kube, "ok", ("Succeeded", "Failed"))
    assert status["phase"] == "Succeeded", status
    assert status["gang"]["replicas"]["succeeded"] == 2 and status["gang"]["restarts"] == 0
    assert status.get("completionTime") and status.get("startTime")
    svc = kube.get("service", "ok")
    assert svc is not None and svc["spec"]["clusterIP"] == "None"
    pods = job_pods(kube, "ok")
    assert sorted(p["metadata"]["name"] for p in pods) == ["ok-node-0", "ok-node-1"]
    for p in pods:
        assert p["metadata"]["ownerReferences"][0]["kind"] == "GPUTrainingJob"
        assert p["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "1"
        assert p["spec"]["hostname"] == p["metadata"]["name"] and p["spec"]["subdomain"] == "ok"
    env = {e["name"]: e.get("value") for e in pods[0]["spec"]["containers"][0]["env"]}
    assert (
        env["MASTER_ADDR"] == "ok-node-0.ok"
        and env["WORLD_SIZE"] == "2"
        and env["PET_NNODES"] == "2"
    )
    wait_event(kube, "ok", "AllRanksSucceeded")


def test_torchrun_gang_rendezvous_across_pods(kube: Kube, operator: OperatorProcess) -> None:
    script = """
        import torch, torch.distributed as dist
        dist.init_process_group("gloo")
        t = torch.tensor([float(dist.get_rank() + 1)])
        dist.all_reduce(t)
        print("world", dist.get_world_size(), "sum", t.item(), flush=True)
        assert t.item() == sum(range(1, dist.get_world_size() + 1))
        dist.destroy_process_group()
    """
    body = job("gang", script, gpus=0)
    body["spec"]["training"] = {
        "launcher": "torchrun",
        "procsPerNode": 2,
        "rdzvTimeoutSeconds": 120,
    }
    kube.apply(body)
    status = wait_job_phase(kube, "gang", ("Succeeded", "Failed"), timeout=180)
    assert status["phase"] == "Succeeded", status
    cmd = job_pods(kube, "gang")[0]["spec"]["containers"][0]["command"]
    # Under the in-place restart supervisor (the local nodes support it), up to its "--".
    assert cmd[1:3] == ["-m", "gpujob_trainer.supervisor"], cmd
    cmd = cmd[cmd.index("--") + 1 :]
    assert cmd[0] == "torchrun" and "--nnodes=2" in cmd and "--nproc-per-node=2" in cmd


def test_insufficient_gpus_stay_pending_with_the_schedulers_reason(
    kube: Kube, operator: OperatorProcess
) -> None:
    kube.apply(job("greedy", "print('never')", gpus=16))

    def unschedulable() -> dict | None:
        s = job_status(kube, "greedy")
        cond = next(
            (c for c in s.get("conditions", []) if c.get("reason") == "Unschedulable"), None
        )
        return s if cond else None

    status = wait_until(unschedulable, 60, "an Unschedulable condition")
    assert status["phase"] == "Pending"
    cond = next(c for c in status["conditions"] if c.get("reason") == "Unschedulable")
    assert "Insufficient nvidia.com/gpu" in cond["message"]


def test_failed_rank_restarts_the_whole_gang(
    kube: Kube, operator: OperatorProcess, tmp_path: Path
) -> None:
    marker = tmp_path / "failed-once"
    script = f"""
        import os, pathlib, sys
        m = pathlib.Path({str(marker)!r})
        if os.environ["RANK"] == "1" and not m.exists():
            m.write_text("x"); print("rank 1 fails once"); sys.exit(3)
    """
    kube.apply(job("retry", script, runPolicy={"backoffLimit": 2}))
    status = wait_job_phase(kube, "retry", ("Succeeded", "Failed"), timeout=120)
    assert status["phase"] == "Succeeded", status
    assert status["gang"]["restarts"] == 1
    pods = job_pods(kube, "retry")
    assert {p["metadata"]["labels"]["gpujob.dev/attempt"] for p in pods} == {"1"}
    wait_event(kube, "retry", "GangRestart")


def test_an_evicted_pod_restarts_the_gang_as_a_disruption_not_a_failure(
    kube: Kube, operator: OperatorProcess, tmp_path: Path
) -> None:
    # Each rank trains until it is stopped once; SIGTERM gets a short save, as real trainers
    # do. backoffLimit 0: an eviction counted as a failure would fail the job.
    script = f"""
        import os, pathlib, signal, sys, time
        m = pathlib.Path({str(tmp_path)!r}) / ("ran-" + os.environ["RANK"])
        if m.exists():
            sys.exit(0)
        def save_and_exit(*_):
            time.sleep(3)
            sys.exit(143)
        signal.signal(signal.SIGTERM, save_and_exit)
        m.write_text("x")
        time.sleep(300)
    """
    kube.apply(
        job(
            "evicted",
            script,
            runPolicy={"backoffLimit": 0},
            template={"terminationGracePeriodSeconds": 30},
        )
    )
    wait_job_phase(kube, "evicted", ("Running",), timeout=60)
    # evict only once both ranks run the script (marker written, SIGTERM handler set)
    wait_until(lambda: len(list(tmp_path.glob("ran-*"))) == 2, 60, "both ranks started")
    pod = "evicted-node-1"
    eviction = {
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": pod, "namespace": kube.namespace},
    }
    kube.run(
        "create",
        "--raw",
        f"/api/v1/namespaces/{kube.namespace}/pods/{pod}/eviction",
        "-f",
        "-",
        input=json.dumps(eviction),
        ns=False,
        check=True,
    )
    status = wait_job_phase(kube, "evicted", ("Succeeded", "Failed"), timeout=120)
    assert status["phase"] == "Succeeded", status
    assert status["gang"]["restarts"] == 0 and status["gang"]["preemptions"] == 1, status
    reasons = wait_event(kube, "evicted", "Evicted")
    assert "Evicted" in reasons and "GangRestart" not in reasons, reasons


def test_backoff_limit_fails_with_the_root_cause(kube: Kube, operator: OperatorProcess) -> None:
    script = """
        import os, sys
        if os.environ["RANK"] == "1":
            print("CUDA error: an illegal memory access was encountered"); sys.exit(3)
        import time; time.sleep(30)
    """
    kube.apply(job("doomed", script, runPolicy={"backoffLimit": 1}))
    status = wait_job_phase(kube, "doomed", ("Failed",), timeout=120)
    assert status["gang"]["restarts"] == 1
    failure = status["failure"]
    assert (
        failure["pod"] == "doomed-node-1"
        and failure["exitCode"] == 3
        and failure["reason"] == "Error"
    )
    assert "illegal memory access" in failure.get("logTail", "") + failure.get("message", "")
    failed = next(c for c in status["conditions"] if c["type"] == "Failed")
    assert failed["reason"] == "BackoffLimitExceeded"
    # cleanPodPolicy Running (default): the still-running rank 0 is deleted at the end.
    wait_until(
        lambda: all(
            p["metadata"]["name"] != "doomed-node-0" or p["metadata"].get("deletionTimestamp")
            for p in job_pods(kube, "doomed")
        ),
        30,
        "rank 0 cleaned up",
    )


def test_non_retryable_exit_code_fails_at_once(kube: Kube, operator: OperatorProcess) -> None:
    kube.apply(
        job(
            "fatal",
            "import sys; sys.exit(3)",
            nodes=1,
            runPolicy={"backoffLimit": 5, "retryableExitCodes": [42]},
        )
    )
    status = wait_job_phase(kube, "fatal", ("Failed",), timeout=60)
    assert status["gang"]["restarts"] == 0
    assert (
        next(c for c in status["conditions"] if c["type"] == "Failed")["reason"]
        == "NonRetryableExitCode"
    )


def test_suspend_stops_pods_and_resume_starts_them(kube: Kube, operator: OperatorProcess) -> None:
    kube.apply(job("pausable", "import time; time.sleep(120)"))
    wait_job_phase(kube, "pausable", ("Running",), timeout=60)
    kube.run(
        "patch",
        "gtj",
        "pausable",
        "--type=merge",
        "-p",
        json.dumps({"spec": {"runPolicy": {"suspend": True}}}),
        check=True,
    )
    wait_job_phase(kube, "pausable", ("Suspended",), timeout=60)
    wait_until(lambda: not job_pods(kube, "pausable"), 60, "pods deleted on suspend")
    kube.run(
        "patch",
        "gtj",
        "pausable",
        "--type=merge",
        "-p",
        json.dumps({"spec": {"runPolicy": {"suspend": False}}}),
        check=True,
    )
    status = wait_job_phase(kube, "pausable", ("Running",), timeout=60)
    assert status["gang"]["restarts"] == 0
    assert len(job_pods(kube, "pausable")) == 2
    assert "Suspended" in wait_event(kube, "pausable", "Resumed")


def test_active_deadline_fails_the_job(kube: Kube, operator: OperatorProcess) -> None:
    kube.apply(
        job("slowpoke", "import time; time.sleep(300)", runPolicy={"activeDeadlineSeconds": 3})
    )
    status = wait_job_phase(kube, "slowpoke", ("Failed",), timeout=60)
    assert (
        next(c for c in status["conditions"] if c["type"] == "Failed")["reason"]
        == "DeadlineExceeded"
    )
    wait_until(
        lambda: (
            not [
                p for p in job_pods(kube, "slowpoke") if not p["metadata"].get("deletionTimestamp")
            ]
        ),
        30,
        "pods deleted after the deadline",
    )


def test_ttl_deletes_a_finished_job_and_its_children(kube: Kube, operator: OperatorProcess) -> None:
    kube.apply(
        job(
            "ephemeral",
            "print('done')",
            runPolicy={"ttlSecondsAfterFinished": 2, "cleanPodPolicy": "None"},
        )
    )
    wait_job_phase(kube, "ephemeral", ("Succeeded",), timeout=60)
    kube.wait_gone("gputrainingjob", "ephemeral", timeout=60)
    wait_until(lambda: not job_pods(kube, "ephemeral"), 60, "pods garbage-collected")


def test_clean_pod_policy_all_removes_finished_pods(kube: Kube, operator: OperatorProcess) -> None:
    kube.apply(job("tidy", "print('done')", runPolicy={"cleanPodPolicy": "All"}))
    wait_job_phase(kube, "tidy", ("Succeeded",), timeout=60)
    wait_until(lambda: not job_pods(kube, "tidy"), 60, "every pod deleted")
    kube.apply(job("keep", "print('done')", runPolicy={"cleanPodPolicy": "None"}))
    wait_job_phase(kube, "keep", ("Succeeded",), timeout=60)
    assert len(job_pods(kube, "keep")) == 2


def test_deleting_a_job_removes_its_children(kube: Kube, operator: OperatorProcess) -> None:
    kube.apply(job("doomed-parent", "import time; time.sleep(300)"))
    wait_job_phase(kube, "doomed-parent", ("Running",), timeout=60)
    kube.run("delete", "gtj", "doomed-parent", "--wait=false", check=True)
    kube.wait_gone("gputrainingjob", "doomed-parent", timeout=60)
    wait_until(
        lambda: (
            not job_pods(kube, "doomed-parent") and kube.get("service", "doomed-parent") is None
        ),
        60,
        "pods and service garbage-collected",
    )


@pytest.mark.parametrize("boundary", [faults.BETWEEN_POD_CREATES])
def test_operator_killed_at_a_write_boundary_of_a_gang_restart_counts_it_once(
    kube: Kube, operator: OperatorProcess, tmp_path: Path, boundary: str
) -> None:
    fail, once, release = tmp_path / "fail", tmp_path / "failed-once", tmp_path / "release"
    script = f"""
        import os, pathlib, sys, time
        fail, once = pathlib.Path({str(fail)!r}), pathlib.Path({str(once)!r})
        while not pathlib.Path({str(release)!r}).exists():
            if os.environ["RANK"] == "1" and fail.exists() and not once.exists():
                once.write_text("x"); sys.exit(3)
            time.sleep(0.1)
    """
    # One of a Recreate restart's boundaries, so that `make test` alone kills an operator
    # mid-restart; the chaos tier kills one at each of them, and in an in-place restart.
    kube.apply(
        job("survivor", script, runPolicy={"backoffLimit": 3, "restartStrategy": "Recreate"})
    )
    wait_job_phase(kube, "survivor", ("Running",), timeout=90)
    operator.stop()
    # An operator that dies the first time it reaches `boundary` (only a gang restart has
    # a status write followed by pod writes once the gang runs, or two deletes, or two creates).
    faulty = OperatorProcess(
        operator.kubeconfig,
        operator.namespaces,
        tmp_path / "faulty.log",
        extra_env={faults.ENV: boundary},
    ).start()
    wait_until(lambda: faulty.reconciled(kube.namespace, "survivor"), 60, "faulty operator up")
    fail.write_text("go")
    code = faulty.wait_exit(120)
    assert code == faults.EXIT_CODE, f"{boundary}: exited {code}: {faulty.log_tail()}"
    assert f"exiting at {boundary}" in faulty.log_path.read_text()
    assert job_status(kube, "survivor")["gang"]["restarts"] == 1, "the restart was written first"

    fresh = OperatorProcess(operator.kubeconfig, operator.namespaces, tmp_path / "fresh.log")
    fresh.start()
    try:
        wait_until(lambda: fresh.reconciled(kube.namespace, "survivor"), 60, "fresh operator up")
        wait_until(
            lambda: (
                {p["metadata"]["labels"]["gpujob.dev/attempt"] for p in job_pods(kube, "survivor")}
                == {"1"}
                and len(job_pods(kube, "survivor")) == 2
                and job_status(kube, "survivor").get("phase") == "Running"
            ),
            120,
            "the new gang (attempt 1) running",
        )
        release.write_text("go")
        status = wait_job_phase(kube, "survivor", ("Succeeded", "Failed"), timeout=90)
        assert status["phase"] == "Succeeded", status
        assert status["gang"]["restarts"] == 1 and status["gang"]["attempt"] == 1
        pods = job_pods(kube, "survivor")
        names = [p["metadata"]["name"] for p in pods]
        assert sorted(names) == ["survivor-node-0", "survivor-node-1"], names
        assert {p["metadata"]["labels"]["gpujob.dev/attempt"] for p in pods} == {"1"}
    finally:
        fresh.stop()
