"""A job is its UID, not its name; a loop ends with its job; scrapes never delay a lifecycle.

Real control plane, real operator process (or, for the missed-DELETED case, a real JobLoop
in this process with no kopf to tell it), real pods run by the node agent.
"""

from __future__ import annotations

import asyncio
import socket
import time
from typing import Any

from kubernetes import config

from gpujob_operator.runtime.jobloop import JobLoop
from gpujob_operator.runtime.kube import Kube as ApiKube
from tests.integration.conftest import job_status, wait_job_phase
from tests.integration.test_operator_lifecycle import job_pods
from tests.support.events import wait_event
from tests.support.jobs import python_job as job
from tests.support.kube import Kube
from tests.support.operator import OperatorProcess
from tests.support.waiting import wait_until


def version_job(name: str, version: str, **spec: Any) -> dict[str, Any]:
    """A one-node job whose pod says which version it is (in its command) and exits 0."""
    return job(name, f"print('run {version}')", nodes=2, **spec)


def owners(pods: list[dict[str, Any]]) -> set[str]:
    return {ref["uid"] for p in pods for ref in p["metadata"].get("ownerReferences") or []}


def commands(pods: list[dict[str, Any]]) -> set[str]:
    return {" ".join(p["spec"]["containers"][0]["command"]) for p in pods}


def test_a_job_deleted_and_applied_again_at_once_runs_its_own_pods(
    kube: Kube, operator: OperatorProcess
) -> None:
    kube.apply(version_job("rerun", "v1", runPolicy={"cleanPodPolicy": "None"}))
    assert wait_job_phase(kube, "rerun", ("Succeeded", "Failed"))["phase"] == "Succeeded"
    old_uid = kube.get("gputrainingjob", "rerun")["metadata"]["uid"]  # type: ignore[index]
    # The old pods linger (cleanPodPolicy None, then the garbage collector's delay) while
    # the new job, same name, is created.
    kube.run("delete", "gputrainingjob", "rerun", "--wait=false", check=True)
    kube.apply(version_job("rerun", "v2"))
    new_uid = wait_until(
        lambda: (
            (j := kube.get("gputrainingjob", "rerun"))
            and j["metadata"]["uid"] != old_uid
            and j["metadata"]["uid"]
        ),
        30,
        "the re-applied job",
    )
    status = wait_job_phase(kube, "rerun", ("Succeeded", "Failed"), timeout=120)
    assert status["phase"] == "Succeeded" and status["gang"]["restarts"] == 0, status
    pods = job_pods(kube, "rerun")
    assert owners(pods) == {new_uid}, "the new job was judged on pods it did not create"
    assert all("v2" in cmd for cmd in commands(pods)), commands(pods)
    assert status["gang"]["replicas"]["succeeded"] == 2


def test_a_pod_orphaned_by_the_old_job_is_never_adopted(
    kube: Kube, operator: OperatorProcess
) -> None:
    kube.apply(version_job("orphans", "v1", runPolicy={"cleanPodPolicy": "None"}))
    assert wait_job_phase(kube, "orphans", ("Succeeded", "Failed"))["phase"] == "Succeeded"
    kube.run("delete", "gputrainingjob", "orphans", "--cascade=orphan", check=True)
    wait_until(
        lambda: all(not owners([p]) for p in job_pods(kube, "orphans")),
        30,
        "the garbage collector to orphan the pods",
    )
    kube.apply(version_job("orphans", "v2"))

    def blocked() -> dict[str, Any] | None:
        s = job_status(kube, "orphans")
        running = next((c for c in s.get("conditions", []) if c["type"] == "Running"), {})
        return s if running.get("reason") == "PodNameTaken" else None

    status = wait_until(blocked, 60, "the new job to wait for the orphans' names")
    assert status["phase"] == "Pending" and status["gang"]["restarts"] == 0, status
    assert (
        status["gang"]["replicas"]["created"] == 0 and status["gang"]["replicas"]["succeeded"] == 0
    )
    running = next(c for c in status["conditions"] if c["type"] == "Running")
    assert "orphans-node-0" in running["message"] and "orphaned" in running["message"]
    wait_event(kube, "orphans", "PodNameTaken")
    # The user removes the orphans; the job then runs pods of its own.
    kube.run("delete", "pods", "-l", "gpujob.dev/job-name=orphans", check=True)
    status = wait_job_phase(kube, "orphans", ("Succeeded", "Failed"), timeout=120)
    assert status["phase"] == "Succeeded" and status["gang"]["restarts"] == 0, status
    uid = kube.get("gputrainingjob", "orphans")["metadata"]["uid"]  # type: ignore[index]
    pods = job_pods(kube, "orphans")
    assert owners(pods) == {uid} and all("v2" in cmd for cmd in commands(pods))


def test_a_loop_that_misses_the_deleted_event_ends_on_the_404(kube: Kube) -> None:
    """No kopf here: nothing tells the loop about the deletion but the API server itself."""
    kube.apply(version_job("missed", "v1", runPolicy={"suspend": True}))
    body = kube.get("gputrainingjob", "missed")
    assert body is not None
    ended: list[JobLoop] = []

    async def main() -> None:
        api = ApiKube(config.new_client_from_config(str(kube.kubeconfig)))
        loop = JobLoop(
            api,
            lambda *_: None,
            None,
            on_exit=ended.append,
            resync_seconds=0.5,
            recheck_seconds=0.5,
        )
        loop.start(body, lambda: [])
        deadline = time.monotonic() + 60
        while (job_status(kube, "missed").get("phase")) != "Suspended":
            assert time.monotonic() < deadline and not ended, "the loop never wrote status"
            await asyncio.sleep(0.2)
        kube.run("delete", "gputrainingjob", "missed", check=True)
        deadline = time.monotonic() + 30
        while not ended:
            assert time.monotonic() < deadline, "the loop outlived its job"
            await asyncio.sleep(0.1)
        assert ended == [loop] and loop.ended
        assert loop._task is not None and loop._scrape_task is not None
        await asyncio.wait_for(asyncio.gather(loop._task, loop._scrape_task,
                                              return_exceptions=True), 10)  # fmt: skip
        assert loop._task.done() and loop._scrape_task.done()

    asyncio.run(main())


DEAF = """
import os, socket, time
# A metrics endpoint that accepts connections and never answers.
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((os.environ["GPUJOB_METRICS_ADDR"], int(os.environ["GPUJOB_METRICS_PORT"])))
s.listen(64)
held = []
while True:
    conn, _ = s.accept()
    held.append(conn)
"""


def test_dead_endpoints_of_one_job_never_delay_another_jobs_restart(
    kube: Kube, crd: Any, tmp_path: Any
) -> None:
    # Two scrape slots; each scrape of the deaf job's two ranks holds one for two minutes.
    env = {"GPUJOB_SCRAPE_CONCURRENCY": "2", "GPUJOB_SCRAPE_TIMEOUT": "120"}
    op = OperatorProcess(kube.kubeconfig, [kube.namespace], tmp_path / "op.log", env).start()
    try:
        # Scraped only once both endpoints listen (a round with one refused rank would hold
        # a single slot for the whole test). Its ranks never step: past the 2 s start-up
        # timeout its goodput is unobserved, with no ratio (checked at the end, for free).
        monitoring = {"scrapeIntervalSeconds": 1, "enabled": False, "startupTimeoutSeconds": 2}
        kube.apply(job("deaf", DEAF, nodes=2, monitoring=monitoring))
        wait_job_phase(kube, "deaf", ("Running",), timeout=60)

        def listening() -> bool:
            ips = [p["status"].get("podIP") for p in job_pods(kube, "deaf")]
            for ip in ips:
                try:
                    socket.create_connection((ip, 9400), timeout=1).close()
                except OSError:
                    return False
            return len(ips) == 2

        wait_until(listening, 60, "the deaf endpoints to accept connections")
        # From here on every scrape round of the deaf job hangs until its timeout.
        on = '{"spec": {"monitoring": {"enabled": true}}}'
        kube.run("patch", "gputrainingjob", "deaf", "--type=merge", "-p", on, check=True)
        crash = "import time, sys; time.sleep(8); sys.exit(3)"
        kube.apply(
            job(
                "crash",
                crash,
                nodes=1,
                monitoring={"scrapeIntervalSeconds": 2},
                runPolicy={"backoffLimit": 1},
            )
        )
        wait_job_phase(kube, "crash", ("Running",), timeout=60)

        def failed() -> bool:
            # Its pod ends, or restarts in place (the exit is then the last state).
            return any(
                (cs.get("state") or {}).get("terminated")
                or (cs.get("lastState") or {}).get("terminated")
                for p in job_pods(kube, "crash")
                for cs in p.get("status", {}).get("containerStatuses") or []
            )

        wait_until(failed, 60, "the crash job's rank to fail")
        # Handled at once: a restart waiting behind the deaf job's scrapes would take minutes.
        status = wait_until(
            lambda: (s := job_status(kube, "crash")).get("gang", {}).get("restarts", 0) >= 1 and s,
            20,
            "the crash job's gang restart",
        )
        assert status["gang"]["restarts"] == 1, status
        assert job_status(kube, "deaf")["phase"] == "Running"
        # Never seen stepping (monitoring off, then a deaf endpoint): neither 0 % nor lost.
        deaf = wait_until(
            lambda: (
                (((s := job_status(kube, "deaf")).get("goodput") or {}).get("seconds", {})).get(
                    "unobserved", 0
                )
                > 0
                and s
            ),
            45,
            "the deaf job's goodput to count unobserved time",
        )
        assert "ratio" not in deaf["goodput"] and "lostGPUHours" not in deaf["goodput"], deaf
        assert deaf["operatorState"]["goodput"]["cause"] == "unobserved", deaf
    finally:
        op.stop()
