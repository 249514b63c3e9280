"""Hollow ranks: what they answer (parsed by the operator's own parser and hang reducer), the
fault file, and the pod projection and status the hollow kubelet writes."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from gpujob_localcluster.cluster import HOLLOW_NODE_GRACE_SECONDS, HollowConfig
from gpujob_localcluster.controlplane import ControlPlane
from gpujob_localcluster.hollow import faults, payloads
from gpujob_localcluster.hollow.endpoints import Add, Endpoints, Fault, Remove
from gpujob_localcluster.hollow.kubelet import (
    HollowKubelet,
    ended_status,
    hollow_addresses,
    marks,
    project,
    running_status,
)
from gpujob_localcluster.processes import wait_for
from gpujob_operator.monitoring.hang import hangdump
from gpujob_operator.monitoring.hang.hang import RankAnswer, reduce
from gpujob_operator.monitoring.scrape import expfmt
from gpujob_trainer import contract


def values(text: str, name: str) -> dict[str, float]:
    out = {}
    for s in expfmt.parse(text, None):
        if s.name == name:
            out[",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))] = s.value
    return out


def one(text: str, name: str) -> float:
    (v,) = values(text, name).values()
    return v


# ---- payloads ---------------------------------------------------------------------------------


def test_a_rank_payload_advances_with_its_steps_and_keeps_the_recorded_phase_shares() -> None:
    t = payloads.Template.recorded("healthy", 1)
    clock = payloads.StepClock(started=1000.0, step_seconds=2.0, total_steps=50)
    labels = payloads.RankLabels(rank=13, local_rank=5, node_rank=1)
    early = t.render(labels, clock, 1010.5, "forward")
    late = t.render(labels, clock, 1040.5, "forward")
    assert one(early, contract.STEPS.name) == 5 and one(late, contract.STEPS.name) == 20
    assert one(late, contract.TARGET_STEPS.name) == 50
    assert one(late, contract.LAST_STEP_TIMESTAMP.name) == 1040.0
    assert one(late, contract.CLOCK_TIMESTAMP.name) == 1040.5
    phases = values(late, contract.PHASE_SECONDS.name)
    assert sum(phases.values()) == pytest.approx(20 * 2.0, rel=0.02)  # the phases partition steps
    assert all("rank=13" in k and "local_rank=5" in k and "node_rank=1" in k for k in phases)
    # Every step lands in the first bucket that holds the step time.
    buckets = values(late, contract.STEP_DURATION.name + "_bucket")
    assert buckets["le=1.0,local_rank=5,node_rank=1,rank=13"] == 0
    assert buckets["le=2.5,local_rank=5,node_rank=1,rank=13"] == 20
    assert one(clock_done := t.render(labels, clock, 5000.0, "forward"), contract.STEPS.name) == 50
    assert clock_done


def test_a_stalled_clock_stops_the_steps_and_the_heartbeat() -> None:
    t = payloads.Template.recorded("healthy", 0)
    clock = payloads.StepClock(started=0.0, step_seconds=1.0, frozen_at=30.5)
    text = t.render(payloads.RankLabels(0, 0, 0), clock, 100.0, "comm_wait")
    assert one(text, contract.STEPS.name) == 30
    assert one(text, contract.HEARTBEAT_TIMESTAMP.name) == 30.5
    phase = values(text, contract.CURRENT_PHASE.name)
    assert phase["local_rank=0,node_rank=0,phase=comm_wait,rank=0"] == 1.0
    assert sum(phase.values()) == 1.0


def test_the_gpu_series_name_each_gpu_of_the_node() -> None:
    text = payloads.gpu_series(8, node_rank=3)
    util = values(text, contract.GPU_UTILIZATION.name)
    assert len(util) == 8 and all("node_rank=3" in k for k in util)


def test_the_evidence_of_a_stall_names_the_rank_in_its_loader() -> None:
    answers = []
    for rank in range(8):
        kind = "loader" if rank == 5 else "collective"
        dump = hangdump.parse(payloads.evidence(kind, rank, 100 + rank, 1.0))
        answers.append(RankAnswer(rank=rank, pod=f"p-{rank // 4}", dump=dump, answered=True))
    report = reduce(answers)
    assert report.culprits == [5], report.summary


# ---- faults -----------------------------------------------------------------------------------


def test_the_fault_file_round_trips_and_refuses_a_bad_entry_by_index() -> None:
    fs = [faults.RankFault("ns", "big", 13, "stall"), faults.RankFault("ns", "big", 2, "fail", "1")]
    assert faults.parse(faults.render(fs)) == fs
    with pytest.raises(ValueError, match=r"faults\[1\]: kind 'melt'"):
        faults.parse(json.dumps({"faults": [{"namespace": "a", "job": "b", "rank": 0, "kind": "fail"}, {"namespace": "a", "job": "b", "rank": 0, "kind": "melt"}]}))  # fmt: skip
    with pytest.raises(ValueError, match=r"faults\[0\]: 'rank'"):
        faults.parse(json.dumps({"faults": [{"namespace": "a", "job": "b", "kind": "fail"}]}))
    assert faults.parse("") == []


def test_a_fault_holds_for_the_attempt_it_is_bound_to() -> None:
    stall = faults.RankFault("ns", "big", 13, "stall")
    fail = faults.RankFault("ns", "big", 13, "fail")
    fs = [stall, fail]
    bound = {stall.key: "2", fail.key: "2"}
    assert faults.job_mode(fs, bound, "ns", "big", "2") == ("stall", 13)
    assert faults.job_mode(fs, bound, "ns", "big", "3") == (None, None)  # the restart cleared it
    assert faults.job_mode(fs, bound, "ns", "other", "2") == (None, None)
    # Rank 13 at 8 ranks a pod lives in node rank 1's pod, and only that pod fails.
    assert faults.fails(fs, bound, "ns", "big", "2", node_rank=1, nproc=8) == fail
    assert faults.fails(fs, bound, "ns", "big", "2", node_rank=0, nproc=8) is None
    assert faults.fails(fs, bound, "ns", "big", "3", node_rank=1, nproc=8) is None
    assert sorted(["10", "9", "x"], key=faults.attempt_order) == ["x", "9", "10"]


# ---- the kubelet's pure parts --------------------------------------------------------------------


def pod(**env: str) -> dict[str, Any]:
    return {
        "metadata": {
            "uid": "u1",
            "namespace": "ns",
            "name": "big-worker-3",
            "labels": {"gpujob.dev/job-name": "big", contract.LABEL_ATTEMPT: "4"},
        },
        "spec": {
            "nodeName": "hollow-node-7",
            "initContainers": [{"name": "prep", "image": "x"}],
            "containers": [
                {"name": "sidecar", "image": "s"},
                {
                    "name": "trainer",
                    "image": "t",
                    "env": [{"name": k, "value": v} for k, v in env.items()],
                },
            ],
        },
        "status": {"startTime": "2026-12-07T00:00:00Z"},
    }


def test_a_pod_is_projected_from_its_trainer_containers_env() -> None:
    hp = project(
        pod(PET_NPROC_PER_NODE="8", PET_NODE_RANK="3", GPUJOB_METRICS_PORT="9500",
            GPUJOB_TOTAL_STEPS="40", GPUJOB_HOLLOW_STEP_SECONDS="0.5"),
        "127.201.0.9",
    )  # fmt: skip
    assert (hp.job, hp.attempt, hp.node_rank, hp.nproc, hp.port) == ("big", "4", 3, 8, 9500)
    assert (hp.total_steps, hp.step_seconds, hp.ip) == (40, 0.5, "127.201.0.9")
    assert hp.started == 1796601600.0
    assert hp.containers == (("sidecar", "s"), ("trainer", "t"))
    plain = project(pod(), "127.201.0.10")
    assert (plain.nproc, plain.port, plain.step_seconds) == (1, contract.DEFAULT_METRICS_PORT, 1.0)


def test_the_status_says_running_and_ready_then_how_it_ended() -> None:
    p = pod(PET_NPROC_PER_NODE="8")
    st = running_status(p, "127.201.0.9", "127.254.0.8", "2026-12-07T00:00:00Z")["status"]
    assert st["phase"] == "Running" and st["podIP"] == "127.201.0.9"
    assert {c["type"] for c in st["conditions"] if c["status"] == "True"} >= {
        "Ready",
        "ContainersReady",
    }
    assert [c["name"] for c in st["containerStatuses"]] == ["sidecar", "trainer"]
    assert all(c["ready"] and "running" in c["state"] for c in st["containerStatuses"])
    assert st["initContainerStatuses"][0]["state"]["terminated"]["exitCode"] == 0
    failed = ended_status(project(p, "127.201.0.9"), 1, "hollow fault: rank 13 failed")["status"]
    assert failed["phase"] == "Failed"
    trainer = failed["containerStatuses"][1]["state"]["terminated"]
    assert trainer["exitCode"] == 1 and "rank 13" in trainer["message"]


def test_a_restart_in_place_reads_to_the_operator_as_the_kubelets_own_would() -> None:
    """The contract of an in-place restart, through the operator's own reading of a pod: a
    failed rank ends the attempt's run in place (not the pod); the operator's move holds the
    pod at the barrier; its release lets the ranks run."""
    from gpujob_operator.lifecycle.observations import observe_pod

    p = pod(PET_NPROC_PER_NODE="8")
    p["metadata"]["labels"][contract.LABEL_ATTEMPT] = "0"
    p["spec"]["containers"][1]["restartPolicyRules"] = [
        {"action": "RestartAllContainers", "exitCodes": {"operator": "NotIn", "values": [0, 86]}}
    ]
    p["status"] = running_status(p, "127.201.0.9", "127.254.0.8", "2026-12-07T00:00:00Z")["status"]
    hp = project(p, "127.201.0.9")
    assert hp.restarts_all(1) and hp.restarts_all(87) and not hp.restarts_all(0)
    assert not hp.held() and observe_pod(p).phase == "Running"

    p["status"].update(
        hp.restart_in_place(1, "hollow fault: rank 3 failed", "2026-12-07T00:01:00Z")["status"]
    )
    seen = observe_pod(p)
    assert seen.ended_in_place and seen.phase == "Failed" and seen.exit_code == 1, seen
    assert hp.waiting and hp.restarts == 1
    assert hp.released != hp.attempt  # it waits: for its move, then for the release

    # The operator moves it to attempt 1 (its run already ended: it begins at 1 restart).
    p["metadata"]["labels"][contract.LABEL_ATTEMPT] = "1"
    p["metadata"]["annotations"] = {contract.ANNOTATION_RESTARTS_BASE: "1"}
    hp.attempt, hp.base, hp.released, hp.hold = marks(p)
    assert hp.restarts == hp.base and hp.held()  # no second restart, waits for the release
    seen = observe_pod(p)
    assert seen.at_barrier and seen.phase == "Pending" and not seen.ended_in_place, seen
    assert project(p, "127.201.0.9").restarts == 1  # a restarted kubelet reads it back

    # A peer still running attempt 0 when moved: its supervisor exits 87, no failure.
    peer = project(p, "127.201.0.10")
    peer.restarts, peer.base = 0, 1
    p["status"].update(
        peer.restart_in_place(87, "restart requested", "2026-12-07T00:01:01Z")["status"]
    )
    seen = observe_pod(p)
    assert seen.at_barrier and seen.phase == "Pending" and not seen.ended_in_place, seen

    p["metadata"]["annotations"][contract.ANNOTATION_RELEASED] = "1"
    hp.attempt, hp.base, hp.released, hp.hold = marks(p)
    assert not hp.held() and not observe_pod(p).at_barrier and hp.may_resume()
    hp.waiting, hp.ran = False, hp.attempt  # what the kubelet's resume does

    # It fails again in attempt 1: it waits for attempt 2, not for attempt 1 once more.
    p["status"].update(
        hp.restart_in_place(1, "rank 3 failed again", "2026-12-07T00:02:00Z")["status"]
    )
    assert observe_pod(p).ended_in_place and not hp.may_resume()
    p["metadata"]["labels"][contract.LABEL_ATTEMPT] = "2"
    p["metadata"]["annotations"][contract.ANNOTATION_RESTARTS_BASE] = "2"
    hp.attempt, hp.base, hp.released, hp.hold = marks(p)
    assert not hp.may_resume()  # moved, not released
    p["metadata"]["annotations"][contract.ANNOTATION_RELEASED] = "2"
    hp.attempt, hp.base, hp.released, hp.hold = marks(p)
    assert hp.may_resume()


def test_hollow_node_addresses_are_distinct_and_stay_in_127_254() -> None:
    ips = hollow_addresses(2048, 3)
    assert len(set(ips)) == 2048 and ips[0] == "127.254.3.1" and ips[254] == "127.254.4.1"
    with pytest.raises(ValueError):
        hollow_addresses(2048, 250)


# ---- the light server, on loopback -----------------------------------------------------------------


async def get(ip: str, port: int, path: str, timeout: float = 5.0) -> bytes:
    reader, writer = await asyncio.open_connection(ip, port)
    try:
        writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout)
        length = int(
            next(
                ln for ln in head.split(b"\r\n") if ln.lower().startswith(b"content-length")
            ).split(b":")[1]
        )
        return await asyncio.wait_for(reader.readexactly(length), timeout)
    finally:
        writer.close()


def free_loopback_port(ip: str) -> int:
    with socket.socket() as s:
        s.bind((ip, 0))
        return int(s.getsockname()[1])


async def serving(
    ip: str, nproc: int, node_rank: int, total_steps: int, gpus: int
) -> tuple[Endpoints, int]:
    """An endpoint process's state serving pod ``u1`` (started at the epoch) on ``ip``."""
    ep = Endpoints(asyncio.get_running_loop())
    port = free_loopback_port(ip)
    add = Add("u1", ip, port, nproc, node_rank, 0.0, 1.0, total_steps, gpus)
    await ep.apply(add)
    return ep, port


def test_one_process_serves_each_rank_where_the_pod_says_and_obeys_faults() -> None:
    async def scenario() -> None:
        ip = "127.203.7.9"
        ep, port = await serving(ip, nproc=2, node_rank=3, total_steps=10**6, gpus=8)
        zero = (await get(ip, port, "/metrics")).decode()
        first = (await get(ip, port + 1, "/metrics")).decode()
        assert one(first, contract.STEPS.name) > 1000  # started at the epoch
        assert "rank=7" in next(iter(values(first, contract.STEPS.name)))
        assert len(values(zero, contract.GPU_UTILIZATION.name)) == 8  # local rank 0 serves the GPUs
        assert not values(first, contract.GPU_UTILIZATION.name)
        # Rank 7 (node rank 3, local rank 1) stalls: it waits in its loader, the others not.
        await ep.apply(Fault("u1", "stall", 7, since=100.0))
        assert one((await get(ip, port, "/metrics")).decode(), contract.STEPS.name) == 100
        assert json.loads(await get(ip, port + 1, "/debug/evidence"))["rank"] == 7
        culprit = hangdump.parse(await get(ip, port + 1, "/debug/evidence"))
        other = hangdump.parse(await get(ip, port, "/debug/evidence"))
        assert culprit != other
        # Silent: the rank takes the connection and never answers.
        await ep.apply(Fault("u1", "silent", 7, since=0.0))
        with pytest.raises(asyncio.TimeoutError):
            await get(ip, port + 1, "/metrics", timeout=0.3)
        assert await get(ip, port, "/metrics")
        assert (await get(ip, port, "/nothing")) == b"not found\n"
        await ep.apply(Remove("u1"))
        await asyncio.sleep(0)  # let the listeners close
        with pytest.raises(OSError):
            await get(ip, port, "/metrics")

    asyncio.run(scenario())


def test_a_pod_restarted_in_place_is_served_afresh_not_by_its_old_connections() -> None:
    """A scraper's keep-alive connection to a pod's old run ends with it: the restarted run
    (a new clock, its own faults) answers the next connection."""

    async def scenario() -> None:
        ip = "127.203.7.10"
        ep, port = await serving(ip, nproc=1, node_rank=0, total_steps=10**9, gpus=0)
        reader, writer = await asyncio.open_connection(ip, port)
        writer.write(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        assert b"200 OK" in await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        await ep.apply(Remove("u1"))
        await ep.apply(
            Add("u1", ip, port, 1, 0, started=1e12, step_seconds=1.0, total_steps=10, gpus=0)
        )
        assert await asyncio.wait_for(reader.read(), 5) is not None  # drained to EOF: closed
        assert reader.at_eof()
        writer.close()
        fresh = (await get(ip, port, "/metrics")).decode()
        assert one(fresh, contract.STEPS.name) == 0  # the new run, which starts in the future
        await ep.apply(Remove("u1"))

    asyncio.run(scenario())


# ---- node liveness ------------------------------------------------------------------------------


def test_a_hollow_cluster_gives_its_nodes_several_lease_intervals_of_grace() -> None:
    assert ControlPlane(Path("/x")).node_grace() == []  # a plain cluster keeps the default
    assert HollowConfig(count=8, lease_seconds=15).node_grace_seconds == HOLLOW_NODE_GRACE_SECONDS
    assert HollowConfig(count=8, lease_seconds=60).node_grace_seconds == 240
    assert ControlPlane(Path("/x"), node_grace_seconds=180).node_grace() == [
        "--node-monitor-grace-period",
        "180s",
    ]


class _SlowLeases:
    """Lease renewals that wait until released, counted per node."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.renewed: list[str] = []

    def renew_lease(self, name: str) -> None:
        assert self.release.wait(10)
        self.renewed.append(name)


def test_a_nodes_renewal_still_waiting_is_not_queued_again() -> None:
    kubelet = object.__new__(HollowKubelet)
    leases = _SlowLeases()
    kubelet.nodes = leases  # type: ignore[assignment]
    kubelet.renewals = ThreadPoolExecutor(1)
    kubelet._renewing, kubelet._renewing_lock = set(), threading.Lock()
    try:
        for name in ("a", "a", "b", "a", "b"):
            kubelet._renew(name)  # "a" waits in the one thread, "b" in the queue
        leases.release.set()
        wait_for(lambda: not kubelet._renewing, 10, "the renewals")
        assert sorted(leases.renewed) == ["a", "b"]  # stale repeats were never queued
        kubelet._renew("a")  # renewed: the next round renews it again
        wait_for(lambda: leases.renewed.count("a") == 2, 10, "the next renewal")
    finally:
        kubelet.renewals.shutdown(wait=True)
