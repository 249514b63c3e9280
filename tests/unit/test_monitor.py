"""JobMonitor: targets from pods, conditions, Events and rate-limited status patches."""

from __future__ import annotations

from typing import Any

from gpujob_operator import analysis as an
from gpujob_operator import api, expfmt
from gpujob_operator import conditions as c
from gpujob_operator.monitor import JobMonitor, MonitorUpdate, scrape_targets
from gpujob_operator.scrape import ErrorKind, ScrapeResult, ScrapeTarget
from tests.unit.test_analysis import Job, RankSim

SPEC = {
    "image": "trainer:1",
    "command": ["python", "-m", "train"],
    "nodes": 2,
    "gpusPerNode": 2,
    "training": {"metricsPort": 9400, "totalSteps": 1000},
    "monitoring": {"warmupSteps": 20, "hysteresisWindows": 2, "stallTimeoutSeconds": 60},
}


def pod(name: str, rank: int, ip: str | None, phase: str = "Running") -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {"gpujob.dev/node-rank": str(rank)}},
        "spec": {"nodeName": f"node-{rank}"},
        "status": {"phase": phase, "podIP": ip},
    }


def test_scrape_targets_one_per_rank_of_running_pods() -> None:
    pods = [
        pod("j-node-0", 0, "10.0.0.5"),
        pod("j-node-1", 1, "10.0.0.6"),
        pod("j-node-2", 2, None, "Pending"),
    ]
    got = scrape_targets(SPEC, pods)
    assert [(t.url, t.pod, t.node, t.node_rank, t.local_rank, t.rank) for t in got] == [
        ("http://10.0.0.5:9400/metrics", "j-node-0", "node-0", 0, 0, 0),
        ("http://10.0.0.5:9401/metrics", "j-node-0", "node-0", 0, 1, 1),
        ("http://10.0.0.6:9400/metrics", "j-node-1", "node-1", 1, 0, 2),
        ("http://10.0.0.6:9401/metrics", "j-node-1", "node-1", 1, 1, 3),
    ]


def results_of(job: Job, i: int, fail: set[int] = frozenset()) -> list[ScrapeResult]:  # type: ignore[assignment]
    out = []
    for (pod_name, text), r in zip(job.round(i), job.ranks, strict=True):
        target = ScrapeTarget(f"http://127.0.0.1:{9400 + r.rank}/metrics", pod_name, "node-a")
        if r.rank in fail:
            out.append(ScrapeResult(target, job.now, error=ErrorKind.REFUSED, message="refused"))
        else:
            out.append(ScrapeResult(target, job.now, samples=expfmt.parse(text)))
    return out


def cond(update: MonitorUpdate, type_: str) -> dict[str, Any]:
    found = c.find(update.conditions, type_)
    assert found is not None
    return dict(found)


def test_healthy_then_input_bound_with_events_and_conditions() -> None:
    job = Job([RankSim(0, 0), RankSim(1, 1)])
    mon = JobMonitor(SPEC, generation=3)
    updates = [mon.observe(results_of(job, i), job.now) for i in range(4)]
    assert cond(updates[0], c.BOTTLENECK_DETECTED)["reason"] == c.WARMING_UP
    u = updates[-1]
    assert u.bottleneck is not None and u.bottleneck["verdict"] == an.HEALTHY
    assert cond(u, c.METRICS_AVAILABLE)["status"] == c.TRUE
    assert cond(u, c.STALLED)["status"] == c.FALSE
    assert cond(u, c.BOTTLENECK_DETECTED)["reason"] == c.NO_BOTTLENECK
    assert cond(u, c.BOTTLENECK_DETECTED)["observedGeneration"] == 3
    assert [e.reason for e in u.events] == [c.BOTTLENECK_CHANGED]
    for r in job.ranks:
        r.phases["data_wait"] = 0.1
    seen = [mon.observe(results_of(job, i), job.now) for i in range(4, 8)]
    published = [s.bottleneck["verdict"] for s in seen if s.bottleneck]
    assert published[-1] == an.INPUT_BOUND and published[0] == an.HEALTHY  # hysteresis
    changes = [e for s in seen for e in s.events]
    assert len(changes) == 1 and changes[0].type == "Warning"
    assert changes[0].message.startswith("InputBound (was Healthy): data loading takes")
    last = seen[-1]
    assert cond(last, c.BOTTLENECK_DETECTED)["status"] == c.TRUE
    assert cond(last, c.BOTTLENECK_DETECTED)["reason"] == an.INPUT_BOUND
    api.GPUTrainingJobStatus.model_validate(
        {
            "progress": last.progress,
            "bottleneck": last.bottleneck,
            "gpus": last.gpus,
            "conditions": last.conditions,
        }
    )


def test_metrics_lost_and_recovered() -> None:
    job = Job([RankSim(0, 0), RankSim(1, 1)])
    mon = JobMonitor(SPEC)
    mon.observe(results_of(job, 0), job.now)
    lost = mon.observe(results_of(job, 1, fail={1}), job.now)
    m = cond(lost, c.METRICS_AVAILABLE)
    assert m["status"] == c.FALSE and m["reason"] == c.SCRAPE_FAILED
    assert "1/2 rank(s) failed: pod-1 http://127.0.0.1:9401/metrics: refused" in m["message"]
    assert [(e.type, e.reason) for e in lost.events] == [("Warning", c.SCRAPE_FAILED)]
    back = mon.observe(results_of(job, 2), job.now)
    assert [e.reason for e in back.events] == [c.METRICS_RECOVERED]
    none = mon.observe([], job.now + 1)
    assert cond(none, c.METRICS_AVAILABLE)["reason"] == c.NO_RANKS_TO_SCRAPE


def test_ranks_not_up_yet_are_waited_for_without_a_warning() -> None:
    job = Job([RankSim(0, 0), RankSim(1, 1)])
    mon = JobMonitor(SPEC)
    starting = mon.observe(results_of(job, 0, fail={0, 1}), job.now)
    m = cond(starting, c.METRICS_AVAILABLE)
    assert m["status"] == c.UNKNOWN and m["reason"] == c.WAITING_FOR_RANKS
    assert starting.events == []
    up = mon.observe(results_of(job, 1), job.now)
    assert cond(up, c.METRICS_AVAILABLE)["status"] == c.TRUE


def test_ranks_that_never_come_up_are_reported_after_the_grace() -> None:
    job = Job([RankSim(0, 0), RankSim(1, 1)])
    mon = JobMonitor(SPEC)
    mon.observe(results_of(job, 0, fail={0, 1}), job.now)
    late = mon.observe(results_of(job, 1, fail={0, 1}), job.now + 181)
    assert cond(late, c.METRICS_AVAILABLE)["reason"] == c.SCRAPE_FAILED
    assert [e.reason for e in late.events] == [c.SCRAPE_FAILED]


def test_ranks_exiting_after_the_last_step_are_not_a_fault() -> None:
    job = Job([RankSim(0, 0, target=30), RankSim(1, 1, target=30)])
    mon = JobMonitor(SPEC)
    for i in range(4):
        mon.observe(results_of(job, i), job.now)
    gone = mon.observe(results_of(job, 4, fail={0, 1}), job.now)
    m = cond(gone, c.METRICS_AVAILABLE)
    assert m["status"] == c.TRUE and m["reason"] == c.RANKS_FINISHED
    assert gone.events == []


def test_stall_sets_the_condition_and_posts_an_event_at_once() -> None:
    job = Job([RankSim(0, 0), RankSim(1, 1)])
    mon = JobMonitor(SPEC)
    job.steps_per_scrape = 0
    updates = [mon.observe(results_of(job, i), job.now) for i in range(6)]
    stalled = [u for u in updates if cond(u, c.STALLED)["status"] == c.TRUE]
    assert stalled, [cond(u, c.STALLED) for u in updates]
    first = stalled[0]
    assert cond(first, c.STALLED)["reason"] == c.STALL_DETECTED
    assert [e.reason for e in first.events] == [c.STALL_DETECTED]
    assert first.bottleneck is not None and first.bottleneck["verdict"] == an.STALLED


def test_status_patch_only_on_meaningful_change_or_refresh() -> None:
    job = Job([RankSim(0, 0), RankSim(1, 1)], steps_per_scrape=1, interval=1.0)
    mon = JobMonitor(SPEC, refresh_seconds=60)
    status: dict[str, Any] = {
        "phase": "Running",
        "conditions": [
            {
                "type": "Running",
                "status": "True",
                "reason": "AllRanksRunning",
                "message": "",
                "lastTransitionTime": "2027-01-01T00:00:00Z",
            }
        ],
    }
    writes = 0
    for i in range(40):
        patch = mon.observe(results_of(job, i), job.now).status_patch(status)
        if patch is not None:
            writes += 1
            status = merge(status, patch)
    # 40 scrapes, steps 1..40 of 1000: percent moves 0.1 points per scrape, but one write per
    # scrape would be 40; writes follow meaningful moves only (first ones, verdict, ...)
    assert writes < 40
    assert status["progress"]["step"] >= 30
    assert c.find(status["conditions"], "Running") is not None  # kept
    assert status["display"]["progress"].endswith("%")
    # nothing new: no patch; after the refresh interval a noisy difference is written once
    u = mon.observe(results_of(job, 40), job.now)
    assert u.status_patch(merge(status, u.status_patch(status) or {})) is None


def test_removed_keys_become_null_in_the_patch() -> None:
    job = Job([RankSim(0, 0)])
    mon = JobMonitor(SPEC)
    u = mon.observe(results_of(job, 0), job.now)
    old = {"progress": {"step": 1, "tokensPerSecond": 5.0}}
    patch = u.status_patch(old)
    assert patch is not None and patch["progress"]["tokensPerSecond"] is None


def merge(old: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return patch
    out = dict(old) if isinstance(old, dict) else {}
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = merge(out.get(k), v)
    return out
