"""JobMonitor: targets from pods, conditions, Events and rate-limited status patches."""

from __future__ import annotations

from typing import Any

from gpujob_operator import api
from gpujob_operator.api import conditions as c
from gpujob_operator.api.children import LABEL_NODE_RANK
from gpujob_operator.monitoring.monitor import JobMonitor, exited_ranks, scrape_targets
from gpujob_operator.monitoring.scrape import expfmt
from gpujob_operator.monitoring.scrape.result import ErrorKind, ScrapeResult, ScrapeTarget
from gpujob_operator.monitoring.update import MonitorUpdate
from gpujob_operator.monitoring.verdicts.verdict import HEALTHY, INPUT_BOUND, STALLED
from tests.unit.operator.monitoring.test_analysis import T0, Job, RankSim, slow_steps

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
    assert u.bottleneck is not None and u.bottleneck["verdict"] == HEALTHY
    assert cond(u, c.METRICS_AVAILABLE)["status"] == c.TRUE
    assert cond(u, c.STALLED)["status"] == c.FALSE
    assert cond(u, c.BOTTLENECK_DETECTED)["reason"] == c.NO_BOTTLENECK
    assert cond(u, c.BOTTLENECK_DETECTED)["observedGeneration"] == 3
    assert [e.reason for e in u.events] == [c.BOTTLENECK_CHANGED]
    for r in job.ranks:
        r.phases["data_wait"] = 0.1
    seen = [mon.observe(results_of(job, i), job.now) for i in range(4, 8)]
    published = [s.bottleneck["verdict"] for s in seen if s.bottleneck]
    assert published[-1] == INPUT_BOUND and published[0] == HEALTHY  # hysteresis
    changes = [e for s in seen for e in s.events]
    assert len(changes) == 1 and changes[0].type == "Warning"
    assert changes[0].message.startswith("InputBound (was Healthy): data loading takes")
    last = seen[-1]
    assert cond(last, c.BOTTLENECK_DETECTED)["status"] == c.TRUE
    assert cond(last, c.BOTTLENECK_DETECTED)["reason"] == INPUT_BOUND
    progress = dict(last.progress)
    rate = progress.pop("rateSince", None)  # the ETA's basis: status.operatorState.rateSince
    api.GPUTrainingJobStatus.model_validate(
        {
            "progress": progress,
            "bottleneck": last.bottleneck,
            "gang": {"gpus": last.gpus},
            "conditions": last.conditions,
            "operatorState": {"rateSince": rate} if rate is not None else None,
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


def test_a_round_after_every_rank_succeeded_is_not_a_fault() -> None:
    """The last steps can fall between two scrapes: the next round finds no running pod and
    never saw the final step, but the pods' Succeeded phase tells the story."""
    job = Job([RankSim(0, 0, target=1000), RankSim(1, 1, target=1000)])
    mon = JobMonitor(SPEC)
    for i in range(3):
        mon.observe(results_of(job, i), job.now)
    pods = [
        {"metadata": {"ownerReferences": [{"controller": True, "uid": "u1"}]}, "status": s}
        for s in ({"phase": "Succeeded"}, {"phase": "Succeeded"})
    ]
    stranger = {"metadata": {"ownerReferences": [{"controller": True, "uid": "u0"}]}}
    assert exited_ranks([*pods, {**stranger, "status": {"phase": "Succeeded"}}], "u1") == 2
    assert exited_ranks([{**pods[0], "status": {"phase": "Running"}}], "u1") == 0
    done = mon.observe([], job.now + 1, exited=2)
    m = cond(done, c.METRICS_AVAILABLE)
    assert m["status"] == c.TRUE and m["reason"] == c.RANKS_FINISHED, m
    assert "2 pod(s) succeeded" in m["message"] and done.events == []
    # Without exited pods the same empty round is a fault (pods gone or not running).
    assert cond(mon.observe([], job.now + 2), c.METRICS_AVAILABLE)["status"] == c.FALSE


def test_ranks_exiting_after_the_last_step_are_not_a_fault() -> None:
    job = Job([RankSim(0, 0, target=30), RankSim(1, 1, target=30)])
    mon = JobMonitor(SPEC)
    for i in range(4):
        mon.observe(results_of(job, i), job.now)
    gone = mon.observe(results_of(job, 4, fail={0, 1}), job.now)
    m = cond(gone, c.METRICS_AVAILABLE)
    assert m["status"] == c.TRUE and m["reason"] == c.RANKS_FINISHED
    assert gone.events == []
    # ...and so is the round after their pods stopped running (CI once saw NoRanksToScrape).
    after = cond(mon.observe([], job.now + 1), c.METRICS_AVAILABLE)
    assert after["status"] == c.TRUE and after["reason"] == c.RANKS_FINISHED, after


def test_stall_sets_the_condition_at_once_and_confirms_it_on_the_next_scrape() -> None:
    job = Job([RankSim(0, 0, heartbeat=T0), RankSim(1, 1, heartbeat=T0)])
    mon = JobMonitor(SPEC)
    updates = [mon.observe(results_of(job, 0), job.now)]
    job.steps_per_scrape = 0
    updates += [mon.observe(results_of(job, i), job.now) for i in range(1, 8)]
    stalled = [u for u in updates if cond(u, c.STALLED)["status"] == c.TRUE]
    assert stalled, [cond(u, c.STALLED) for u in updates]
    first, second = stalled[0], stalled[1]
    assert cond(first, c.STALLED)["reason"] == c.STALL_DETECTED
    assert [e.reason for e in first.events] == [c.STALL_DETECTED]
    assert first.bottleneck is not None and first.bottleneck["verdict"] == STALLED
    assert cond(second, c.STALLED)["reason"] == c.STALL_CONFIRMED
    assert "2 consecutive scrapes" in cond(second, c.STALLED)["message"]
    # a round that reached no rank neither confirms nor clears; a step clears at once
    mon = JobMonitor(SPEC)
    job = Job([RankSim(0, 0, heartbeat=T0), RankSim(1, 1, heartbeat=T0)])
    mon.observe(results_of(job, 0), job.now)
    job.steps_per_scrape = 0
    reasons = []
    for i in range(1, 12):
        u = mon.observe(results_of(job, i, fail={0, 1} if i == 6 else set()), job.now)
        reasons.append(next((x["reason"] for x in u.conditions if x["type"] == c.STALLED), None))
    assert reasons[4:7] == [c.STALL_DETECTED, None, c.STALL_CONFIRMED], reasons
    job.steps_per_scrape = 10
    u = mon.observe(results_of(job, 12), job.now)
    assert cond(u, c.STALLED)["status"] == c.FALSE
    job.steps_per_scrape = 0
    later = [mon.observe(results_of(job, i), job.now) for i in range(13, 19)]
    got = [cond(u, c.STALLED)["reason"] for u in later]
    assert (
        c.STALL_DETECTED in got and got.index(c.STALL_CONFIRMED) == got.index(c.STALL_DETECTED) + 1
    )


def test_an_operator_restart_beside_a_node_20_minutes_behind_stalls_nothing() -> None:
    # 40 s steps, longer than a scrape; the new operator (a restart, a handover) first looks
    # two scrapes after a step, at a node whose clock runs 20 minutes behind its own
    job = slow_steps(-1200.0)
    for i in range(5):
        job.round(i)
    mon = JobMonitor(SPEC)
    updates = [mon.observe(results_of(job, i), job.now) for i in range(5, 17)]
    assert {cond(u, c.STALLED)["reason"] for u in updates} == {c.PROGRESSING}
    assert all(e.reason != c.STALL_DETECTED for u in updates for e in u.events)


def test_no_step_yet_is_starting_up_not_stalled() -> None:
    job = Job([RankSim(0, 0, heartbeat=T0), RankSim(1, 1, heartbeat=T0)], steps_per_scrape=0)
    mon = JobMonitor(SPEC)  # stallTimeoutSeconds 60, startupTimeoutSeconds 1800 by default
    updates = [mon.observe(results_of(job, i), job.now) for i in range(20)]
    assert {cond(u, c.STALLED)["reason"] for u in updates} == {c.STARTING_UP}
    assert all(u.bottleneck is None for u in updates)


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


# ---- untrusted payloads: absurd values, lying ranks, silent ranks ----------------------------


def hostile(job: Job, i: int, edits: dict[int, dict[str, str]]) -> list[ScrapeResult]:
    """Round i with some ranks' series set to other values; the targets know their ranks."""
    import re

    out = []
    for (pod_name, text), r in zip(job.round(i), job.ranks, strict=True):
        for metric, value in edits.get(r.rank, {}).items():
            text = re.sub(rf"(?m)^({metric}{{[^}}]*}}) .*$", rf"\g<1> {value}", text)
        target = ScrapeTarget(
            f"http://127.0.0.1:{9400 + r.rank}/metrics", pod_name, "node-a", 0, r.rank, r.rank
        )
        out.append(ScrapeResult(target, job.now, samples=expfmt.parse(text)))
    return out


def test_absurd_values_are_dropped_reported_once_and_analysis_goes_on() -> None:
    import json

    job = Job([RankSim(0, 0), RankSim(1, 1)])
    mon = JobMonitor(SPEC)
    status: dict[str, Any] = {}
    updates = []
    for i in range(8):
        edits = {}
        if i >= 2:  # the ranks turn hostile after two good rounds
            edits[0] = {
                "gpujob_train_target_steps": "9223372036854775808",  # 2^63
                "gpujob_train_loss": "NaN",
                "gpujob_train_last_step_timestamp_seconds": f"{(job.now + 15) * 1000:.0f}",  # ms
            }
            edits[1] = {"gpujob_train_target_steps": "+Inf", "gpujob_train_epoch": "+Inf"}
        u = mon.observe(hostile(job, i, edits), job.now)
        updates.append(u)
        patch = u.status_patch(status)
        if patch:
            json.dumps(patch, allow_nan=False)  # the API server refuses NaN and Infinity
            status = merge(status, patch)
    last = updates[-1]
    # Progress and ETA keep coming from the sane values (the spec's totalSteps: 1000).
    assert last.progress["totalSteps"] == 1000 and last.progress["step"] >= 60
    assert "etaSeconds" in last.progress and last.progress["epoch"] < 1e6
    assert last.bottleneck is not None and last.bottleneck["verdict"] == HEALTHY
    m = cond(last, c.METRICS_AVAILABLE)
    assert m["status"] == c.TRUE and "rejected 4 value(s)" in m["message"]
    assert "gpujob_train_target_steps=+Inf" in m["message"]
    assert "gpujob_train_last_step_timestamp_seconds=1.8" in m["message"]
    rejected = [e for u in updates for e in u.events if e.reason == c.METRICS_REJECTED]
    assert len(rejected) == 1 and rejected[0].type == "Warning"
    assert updates[2].dropped_values == 4 and updates[1].dropped_values == 0
    # Then every rank's step counter turns absurd: nothing to go on, but nothing raises.
    edits = {r: {"gpujob_train_steps_total": "+Inf"} for r in (0, 1)}
    later = [mon.observe(hostile(job, i, edits), job.now) for i in range(8, 22)]
    assert all(u.dropped_values == 2 for u in later)
    assert "gpujob_train_steps_total=+Inf" in cond(later[-1], c.METRICS_AVAILABLE)["message"]


def test_a_series_claiming_another_rank_is_not_counted_for_it() -> None:
    job = Job([RankSim(0, 0), RankSim(1, 1)])
    mon = JobMonitor(SPEC)
    # rank 1's endpoint also claims rank 0 is at step 0 (it would drag progress to 0).
    lie = expfmt.parse('gpujob_train_steps_total{local_rank="0",node_rank="0",rank="0"} 0\n')
    for i in range(5):
        results = hostile(job, i, {})
        results[1].samples.extend(lie)
        u = mon.observe(results, job.now)
    assert u.progress["step"] == 50 and u.dropped_series == 1
    assert "not this endpoint's rank 1" in cond(u, c.METRICS_AVAILABLE)["message"]
    assert set(mon.window.ranks) == {("pod-0", 0), ("pod-1", 1)}


def test_a_silent_rank_stops_speaking_for_progress_and_throughput_after_the_window() -> None:
    job = Job([RankSim(0, 0), RankSim(1, 1)])
    mon = JobMonitor(SPEC)  # window 120 s, scrapes every 15 s
    for i in range(4):
        both = mon.observe(results_of(job, i), job.now)
    assert both.progress["step"] == 40
    sps = both.progress["samplesPerSecond"]
    for i in range(4, 16):  # rank 1 stops answering (its pod still runs), rank 0 trains on
        u = mon.observe(results_of(job, i, fail={1}), job.now)
    assert u.progress["step"] == 160, "the silent rank's old step must not freeze progress"
    assert u.progress["samplesPerSecond"] < 0.6 * sps, "nor its old rate add to throughput"
    m = cond(u, c.METRICS_AVAILABLE)
    assert m["status"] == c.FALSE and "rank(s) 1 (pod-1) sent nothing for over 120s" in m["message"]


def test_a_huge_but_finite_target_gives_an_eta_without_a_date() -> None:
    job = Job([RankSim(0, 0), RankSim(1, 1)])
    mon = JobMonitor(SPEC)
    for i in range(4):
        huge = {"gpujob_train_target_steps": "1e11"}  # every rank's: the job's target
        u = mon.observe(hostile(job, i, {0: huge, 1: huge}), job.now)
    assert u.progress["totalSteps"] == 10**11 and u.progress["etaSeconds"] > 1e10
    assert "estimatedCompletionTime" not in u.progress
    patch = u.status_patch({})
    assert patch is not None and patch["display"]["eta"]


def test_ranks_that_disagree_on_the_target_are_named_and_the_end_is_no_stall() -> None:
    # rank 1 exports an absurd target: the percent still moves, MetricsAvailable says so,
    # and once both ranks ran the job's 100 steps the silence after is no stall
    job = Job([RankSim(0, 0, heartbeat=T0, target=100), RankSim(1, 1, heartbeat=T0)])
    mon = JobMonitor(SPEC)
    huge = {1: {"gpujob_train_target_steps": "1e15"}}
    updates = []
    for i in range(20):
        job.steps_per_scrape = 10 if i < 10 else 0
        updates.append(mon.observe(hostile(job, i, huge), job.now))
    assert updates[4].progress["totalSteps"] == 100 and updates[4].progress["percent"] == 50.0
    m = cond(updates[-1], c.METRICS_AVAILABLE)
    assert m["status"] == c.TRUE and m["reason"] == c.ALL_RANKS_SCRAPED
    assert m["message"] == (
        "scraped 2 rank(s); ranks disagree on the target steps (the job's is 100): "
        "rank 1: 1e+15 (rejected)"
    )
    assert {cond(u, c.STALLED)["reason"] for u in updates[10:]} == {c.RANKS_FINISHED}
    assert all(e.reason != c.STALL_DETECTED for u in updates for e in u.events)


def test_compute_bound_is_published_but_detects_no_bottleneck_and_warns_nobody() -> None:
    heavy = {"data_wait": 0.001, "forward": 0.03, "backward": 0.05, "optimizer": 0.005}
    job = Job([RankSim(0, 0, phases={**heavy, "comm_wait": 0.001, "other": 0.0})])
    mon = JobMonitor(SPEC, generation=1)
    updates = [mon.observe(results_of(job, i), job.now) for i in range(5)]
    u = updates[-1]
    assert u.bottleneck is not None and u.bottleneck["verdict"] == "ComputeBound"
    detected = cond(u, c.BOTTLENECK_DETECTED)
    assert (detected["status"], detected["reason"]) == (c.FALSE, "ComputeBound")
    assert all(e.type == "Normal" for up in updates for e in up.events), [
        e for up in updates for e in up.events
    ]


def test_endpoint_words_cannot_push_metrics_available_past_the_crds_limit() -> None:
    """Seven ranks fail with 100 KB of an endpoint's words each (a reason phrase, a label value
    or list) and one payload's notes are as long: the message stays within the CRD's maxLength
    and still names each listed rank's pod and why it failed."""
    from gpujob_operator.api.status import Condition

    job = Job([RankSim(0, 0), RankSim(1, 1)])
    words = "w" * 100_000
    results = []
    for r in range(7):
        target = ScrapeTarget(f"http://10.0.0.{r}:9400/metrics", f"pod-{r}", "node-a", rank=r)
        kind = ErrorKind.HTTP_STATUS if r % 2 else ErrorKind.MISSING_RANK
        results.append(ScrapeResult(target, job.now, error=kind, message=f"HTTP 503 {words}"))
    target = ScrapeTarget("http://10.0.0.9:9400/metrics", "pod-9", "node-a", rank=9)
    results.append(
        ScrapeResult(
            target, job.now, error=ErrorKind.PARSE, dropped_series=1, notes=(("rank", words),)
        )
    )
    update = JobMonitor(SPEC).observe(results, job.now)
    m = cond(update, c.METRICS_AVAILABLE)
    assert m["reason"] == c.SCRAPE_FAILED
    assert len(m["message"]) <= c.MESSAGE_MAX_LENGTH
    Condition.model_validate(m)
    for r in range(5):  # the listed ones (MAX_FAILURES_LISTED)
        kind = "http_status" if r % 2 else "missing_rank"
        assert f"pod-{r} http://10.0.0.{r}:9400/metrics: {kind}: HTTP 503 www" in m["message"]
    assert "and 3 more" in m["message"] and "rejected 1 series" in m["message"]
    patch = update.status_patch({})
    assert patch is not None
    for written in patch["conditions"]:
        Condition.model_validate(written)


# ---- host network: only the ports the job was given --------------------------------------


def _host_spec(mode: str, metrics_port: int = 9400) -> dict[str, Any]:
    return {
        "image": "t:1",
        "command": ["python"],
        "gpusPerNode": 2,
        "template": {"hostNetwork": True},
        "training": {"hostNetworkPorts": mode, "metricsPort": metrics_port},
    }


def _host_pod(ports: dict[int, int], host: bool = True) -> dict[str, Any]:
    from gpujob_operator.api.hostports import metrics_port_name

    return {
        "metadata": {
            "name": "j-0",
            "labels": {LABEL_NODE_RANK: "0"},
            "ownerReferences": [{"uid": "uid-1", "controller": True}],
        },
        "spec": {
            "hostNetwork": host,
            "containers": [
                {
                    "ports": [
                        {"name": metrics_port_name(r), "containerPort": p} for r, p in ports.items()
                    ]
                }
            ],
        },
        "status": {"phase": "Running", "podIP": "192.168.0.7"},
    }


def test_a_spec_mode_host_job_outside_the_allowed_range_is_refused_naming_the_field() -> None:
    from gpujob_operator import api
    from gpujob_operator.api.hostports import RANGE, host_port_refusal

    kubelet = api.parse_spec(_host_spec("Spec", 10250))
    why = host_port_refusal(kubelet)
    assert why is not None and why.startswith("spec.training.metricsPort")
    assert "10250-10251" in why and "20000-29999" in why
    assert host_port_refusal(api.parse_spec(_host_spec("Spec", 29999))) is not None, "rank 1"
    assert host_port_refusal(api.parse_spec(_host_spec("Spec", 29998))) is None
    assert host_port_refusal(api.parse_spec(_host_spec("Auto", 10250))) is None, "own block"
    assert host_port_refusal(kubelet, (10000, 11000)) is None, "the operator's setting"
    pod_net = {**_host_spec("Spec", 10250), "template": {}}
    assert host_port_refusal(api.parse_spec(pod_net)) is None, "a pod's own ports"
    assert RANGE == (20000, 30000)


def test_a_host_network_pod_is_scraped_only_on_the_ports_the_job_was_given() -> None:
    from gpujob_operator import api
    from gpujob_operator.api.hostports import rank_ports

    # Spec mode, metricsPort 9100 (node exporter): never scraped on the node.
    assert scrape_targets(_host_spec("Spec", 9100), [_host_pod({0: 9100, 1: 9101})], None) == []
    inside = scrape_targets(_host_spec("Spec", 25000), [_host_pod({0: 25000, 1: 25001})], None)
    assert [t.url for t in inside] == [
        "http://192.168.0.7:25000/metrics",
        "http://192.168.0.7:25001/metrics",
    ]
    # Auto: the job's own block only; a pod that declares another port is not followed.
    spec = _host_spec("Auto")
    block = rank_ports(api.parse_spec(spec), "uid-1").metrics
    pod = _host_pod({0: block, 1: 10250})
    urls = [t.url for t in scrape_targets(spec, [pod], "uid-1")]
    assert urls == [f"http://192.168.0.7:{block}/metrics"]
    # A pod on the host network that the spec does not put there: its ports must be in range.
    off = {**_host_spec("Spec", 9100), "template": {}}
    assert scrape_targets(off, [_host_pod({0: 9100, 1: 9101})], None) == []
    assert len(scrape_targets(off, [_host_pod({0: 9100, 1: 9101}, host=False)], None)) == 2
