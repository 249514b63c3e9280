"""The goodput ledger over a scripted run with known answers, and what it tells of the run.

Every pass reads the ledger back from its status form (as an operator does after a restart),
so nothing but the status carries the accounting from one pass to the next.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from gpujob_operator import api
from gpujob_operator.api import conditions as c
from gpujob_operator.lifecycle import goodput as g

T0 = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)
GPUS = 16
PASS = 30.0
"""Seconds between planning passes (the job loop's resync)."""
TOLERANCE = 120.0
"""Seconds each bucket may be off: a change is charged from the first pass that sees it (at
most one pass late), and the run has a dozen changes; two minutes bounds it with room."""
RATE = 100.0
CKPT, EVAL = 0.05, 0.02


@dataclass
class Segment:
    """Minutes of one kind of state in the scripted run."""

    minutes: float
    kind: str
    """queued, startup, step (steps advance), restarting, pending, nostep (pods run, no
    step yet), stall; a new attempt begins with `restarting`."""
    verdict: str | None = None
    rank: int | None = None


def script() -> list[Segment]:
    """50 min queued, 30 min startup, then 10 h of running with 3 restarts, each costing 10
    minutes until the new attempt's first step and 40 minutes of recomputed steps, and one
    20-minute stall."""
    run: list[Segment] = [Segment(50, "queued"), Segment(30, "startup")]
    run.append(Segment(120, "step", "InputBound", 3))
    for productive in (100, 100, 50):
        run += [
            Segment(2, "restarting"),
            Segment(3, "pending"),
            Segment(5, "nostep"),
            Segment(40, "step", "Healthy"),  # resumed 40 minutes of steps back
        ]
        if productive == 100 and not any(s.kind == "stall" for s in run):
            run += [
                Segment(productive, "step", "Straggler", 7),
                Segment(20, "stall", "Stalled"),
                Segment(60, "step", "Healthy"),
            ]
        else:
            run.append(Segment(productive, "step", "Healthy"))
    return run


EXPECTED_MIN = {
    "queued": 50.0,
    "startup": 30.0,
    "restart": 150.0,
    "stall": 20.0,
    "checkpoint": 430 * CKPT,
    "eval": 430 * EVAL,
    "productive": 430 * (1 - CKPT - EVAL),
}


class Run:
    """Plays the script second by second and the planner every PASS seconds."""

    def __init__(self, segments: list[Segment]) -> None:
        self.segments = segments
        self.stored: tuple[dict[str, Any], dict[str, Any]] | None = None
        """``status.goodput`` and ``status.operatorState.goodput`` as last written."""
        self.writes = 0

    def states(self) -> list[tuple[float, g.JobState]]:
        """(seconds after T0, state) at each pass, and a few passes after the end."""
        out: list[tuple[float, g.JobState]] = []
        t, attempt, step, furthest = 0.0, 0, 0, 0
        last: datetime | None = None
        for seg in self.segments:
            if seg.kind == "restarting":
                attempt += 1
                step = max(0, step - 40 * 60)  # resumes from a checkpoint 40 minutes back
            n = int(seg.minutes * 60 / PASS)
            for i in range(n):
                now = t + i * PASS
                if seg.kind == "step":
                    step += int(PASS)
                    furthest = max(furthest, step)
                    last = T0 + timedelta(seconds=now)
                shown = step if seg.kind in ("step", "stall") else None
                out.append((now, self.state(seg, attempt, shown, furthest, last)))
            t += n * PASS
        self.end = t
        done = g.JobState(
            phase=c.PHASE_SUCCEEDED,
            placed=True,
            attempt=attempt,
            step=step,
            completion_time=T0 + timedelta(seconds=t),
        )
        out += [(t + k * PASS, done) for k in range(4)]
        return out

    def state(
        self, seg: Segment, attempt: int, step: int | None, furthest: int, last: datetime | None
    ) -> g.JobState:
        phase = {
            "queued": c.PHASE_PENDING,
            "restarting": c.PHASE_RESTARTING,
            "pending": c.PHASE_PENDING,
        }.get(seg.kind, c.PHASE_RUNNING)
        stepping = seg.kind == "step"
        return g.JobState(
            phase=phase,
            placed=seg.kind not in ("queued", "pending", "restarting"),
            stalled=seg.kind == "stall",
            attempt=attempt,
            step=step,
            furthest_step=furthest if step is not None else None,
            last_step_time=last,
            checkpoint_ratio=CKPT if stepping else None,
            eval_ratio=EVAL if stepping else None,
            verdict=seg.verdict,
            rank=seg.rank,
            samples_per_second=RATE if stepping else None,
        )

    def read(self) -> g.Ledger | None:
        return g.from_status(*self.stored) if self.stored is not None else None

    def account(self, now: datetime, state: g.JobState) -> None:
        old = self.read()
        new = g.advance(old, state, now, T0)
        if old is None or g.due(old, new):
            self.stored = g.to_status(new, GPUS)
            self.writes += 1

    def play(self, skip: tuple[float, float] | None = None) -> g.Ledger:
        for at, state in self.states():
            if skip is not None and skip[0] <= at < skip[1]:
                continue  # the operator is down: nobody accounts
            self.account(T0 + timedelta(seconds=at), state)
        ledger = self.read()
        assert ledger is not None
        return ledger


def assert_buckets(ledger: g.Ledger) -> None:
    for cause, minutes in EXPECTED_MIN.items():
        got = ledger.seconds.get(cause, 0.0)
        assert got == pytest.approx(minutes * 60, abs=TOLERANCE), cause


def test_a_scripted_run_lands_in_each_bucket() -> None:
    run = Run(script())
    ledger = run.play()
    assert_buckets(ledger)
    total = sum(EXPECTED_MIN.values()) * 60
    assert ledger.total == pytest.approx(total, abs=1.0), "every second counted once"
    assert ledger.ratio == pytest.approx(EXPECTED_MIN["productive"] * 60 / total, abs=0.005)
    assert ledger.cause is None and ledger.until == T0 + timedelta(seconds=run.end)
    status, _ = g.to_status(ledger, GPUS)
    lost = (total - EXPECTED_MIN["productive"] * 60) * GPUS / 3600
    assert status["lostGPUHours"] == pytest.approx(lost, abs=6 * TOLERANCE * GPUS / 3600)
    # The ledger is written on changes and every REFRESH_SECONDS, not on every pass.
    passes = run.end / PASS
    assert run.writes < passes / 4


def test_an_operator_restart_continues_from_the_status() -> None:
    """A 15-minute outage while the job steps (in the 100 minutes after the first restart's
    recompute): the ledger in the status picks up, and the gap is charged to the state found
    after it, which is what it was."""
    start = (50 + 30 + 120 + 10 + 40 + 20) * 60.0
    ledger = Run(script()).play(skip=(start, start + 15 * 60))
    assert_buckets(ledger)


def test_a_short_outage_is_charged_to_the_cause_before_it() -> None:
    """A 3-minute gap (shorter than GAP_SECONDS) starting 1 minute before the first failure:
    charged to what the job did when last accounted (productive); the buckets stay within
    the tolerance plus the gap."""
    fail = (50 + 30 + 120) * 60.0
    ledger = Run(script()).play(skip=(fail - 60, fail + 120))
    assert ledger.seconds["restart"] == pytest.approx(150 * 60 - 120, abs=TOLERANCE)


def test_a_long_gap_is_charged_to_the_state_after_it() -> None:
    running = g.JobState(
        phase=c.PHASE_RUNNING, placed=True, step=10, last_step_time=T0 + timedelta(seconds=5)
    )
    pending = g.JobState(phase=c.PHASE_PENDING, placed=False)
    ledger = g.advance(None, pending, T0, T0)
    ledger = g.advance(ledger, running, T0 + timedelta(seconds=10), T0)
    assert ledger.cause == g.PRODUCTIVE and ledger.seconds == {"queued": 10.0}
    restarting = replace(running, phase=c.PHASE_RESTARTING, attempt=1)
    after = g.advance(ledger, restarting, T0 + timedelta(seconds=10 + 3600), T0)
    assert after.seconds["restart"] == 3600.0, "the operator was away: the state it finds"
    short = g.advance(ledger, restarting, T0 + timedelta(seconds=10 + 60), T0)
    assert short.seconds["productive"] == 60.0 and short.cause == g.RESTART


def test_verdict_shares_and_the_worst_rank() -> None:
    ledger = Run(script()).play()
    shares = {v["verdict"]: v for v in g.verdict_shares(ledger.verdict_seconds)}
    published = (120 + 100 + 20 + 60 + 3 * 40 + 100 + 50) * 60  # stepping and stalled
    assert sum(ledger.verdict_seconds.values()) == pytest.approx(published, abs=TOLERANCE)
    assert shares["InputBound"]["seconds"] == pytest.approx(120 * 60, abs=TOLERANCE)
    assert shares["Straggler"]["seconds"] == pytest.approx(100 * 60, abs=TOLERANCE)
    assert shares["Stalled"]["share"] == pytest.approx(20 * 60 / published, abs=0.005)
    order = [v["verdict"] for v in g.verdict_shares(ledger.verdict_seconds)]
    assert order[:3] == ["Healthy", "InputBound", "Straggler"], "longest first"
    assert g.worst_rank(ledger.rank_seconds) == (3, pytest.approx(7200, abs=120))


def test_what_the_goodput_tells_of_a_finished_run() -> None:
    run = Run(script())
    ledger = run.play()
    s, cursor = g.to_status(ledger, GPUS)
    since = c.parse_time(s["since"])
    assert since is not None
    wall = (T0 + timedelta(seconds=run.end) - since).total_seconds()  # completionTime - since
    assert wall == pytest.approx(run.end)
    assert s["ratio"] == round(ledger.ratio or 0, 4)
    assert s["meanSamplesPerSecond"] == pytest.approx(RATE, rel=0.01)
    assert "meanTokensPerSecond" not in s, "no token count was exported"
    assert s["worstRank"] == 3
    assert s["gpuHours"] == pytest.approx(sum(EXPECTED_MIN.values()) * 60 * GPUS / 3600, abs=1)
    api.Goodput.model_validate(s)
    api.parse_status({"goodput": s, "operatorState": {"goodput": cursor}})


def test_the_ledger_is_bounded() -> None:
    state = g.JobState(phase=c.PHASE_RUNNING, placed=True, last_step_time=T0)
    ledger = g.advance(None, state, T0 - timedelta(seconds=1), None)
    now = T0
    for i in range(40):
        now += timedelta(seconds=10 + i)
        ledger = g.advance(ledger, replace(state, verdict=f"V{i}", rank=i), now, None)
    assert len(ledger.verdict_seconds) == g.MAX_VERDICTS
    assert len(ledger.rank_seconds) == g.MAX_RANKS
    assert min(int(r) for r in ledger.rank_seconds) >= 40 - 1 - g.MAX_RANKS, "longest kept"
    public, cursor = g.to_status(ledger, 8)
    again = g.from_status(public, cursor)
    assert again is not None and again.verdict_seconds == pytest.approx(ledger.verdict_seconds)
    assert len(public["verdicts"]) <= g.MAX_VERDICTS


def test_a_job_seen_first_while_running_is_accounted_from_then() -> None:
    running = g.JobState(phase=c.PHASE_RUNNING, placed=True, last_step_time=T0)
    ledger = g.advance(None, running, T0 + timedelta(days=3), T0)
    assert ledger.since == T0 + timedelta(days=3) and ledger.total == 0.0


def test_unreadable_status_starts_afresh() -> None:
    until = {"accountedUntil": "2026-03-01T12:00:00Z"}
    assert g.from_status({"since": "yesterday"}, until) is None
    assert g.from_status(None, None) is None
    since = {"since": "2026-03-01T12:00:00Z"}
    odd = {**since, "seconds": {"queued": "x", "nap": 4}}
    ledger = g.from_status(odd, {**until, "cause": "nap"})
    assert ledger is not None and ledger.cause is None and ledger.seconds == {}


def test_suspended_time_is_queued_and_a_finished_ledger_stays() -> None:
    pending = g.JobState(phase=c.PHASE_SUSPENDED, placed=False)
    ledger = g.advance(None, replace(pending, phase=c.PHASE_PENDING), T0, T0)
    ledger = g.advance(ledger, pending, T0 + timedelta(seconds=60), T0)
    ledger = g.advance(ledger, pending, T0 + timedelta(seconds=120), T0)
    assert ledger.seconds == {"queued": 120.0}
    done = g.JobState(
        phase=c.PHASE_FAILED, placed=False, completion_time=T0 + timedelta(seconds=150)
    )
    ledger = g.advance(ledger, done, T0 + timedelta(seconds=400), T0)
    assert ledger.seconds == {"queued": 150.0} and ledger.cause is None
    assert g.advance(ledger, done, T0 + timedelta(hours=2), T0) == ledger


# ---- through the planner ----------------------------------------------------------------


def test_the_planner_accounts_a_job_and_keeps_what_it_tells_of_the_run() -> None:
    from tests.unit.operator.lifecycle.test_planner import Sim, make_job

    job = make_job(nodes=2, gpusPerNode=8)
    job["metadata"]["creationTimestamp"] = c.format_time(T0)
    sim = Sim(job)
    sim.reconcile()
    assert sim.status["operatorState"]["goodput"]["cause"] == "queued"
    sim.now += timedelta(minutes=10)
    for pod in sim.pods.values():
        pod["spec"]["nodeName"] = "gpu-a"
    sim.run_all()
    sim.reconcile()
    goodput = sim.status["goodput"]
    assert goodput["seconds"]["queued"] == 600.0
    assert sim.status["operatorState"]["goodput"]["cause"] == "startup"
    # The monitor's write: the first step, a verdict naming a rank, the phase shares.
    sim.now += timedelta(minutes=5)
    sim.status["progress"] = {
        "step": 10,
        "lastStepTime": c.format_time(sim.now),
        "samplesPerSecond": 50.0,
        "checkpointRatio": 0.1,
        "mfu": 0.41,
    }
    sim.status["bottleneck"] = {"verdict": "Straggler", "rank": 3}
    sim.reconcile()
    assert sim.status["operatorState"]["goodput"]["cause"] == "productive"
    assert sim.status["goodput"]["seconds"]["startup"] == 300.0
    sim.now += timedelta(minutes=60)
    sim.succeed_all()
    sim.reconcile()
    st = sim.status
    assert st["phase"] == "Succeeded" and "bottleneck" not in st
    assert st["goodput"]["seconds"]["productive"] == pytest.approx(3600 * 0.9)
    assert st["goodput"]["seconds"]["checkpoint"] == pytest.approx(360)
    assert 0 < st["goodput"]["ratio"] <= 1 and "cause" not in st["operatorState"]["goodput"]
    assert st["display"]["goodput"] == f"{100 * st['goodput']['ratio']:.1f}%", "kubectl get -o wide"
    summary = st["goodput"]
    done, since = c.parse_time(st["completionTime"]), c.parse_time(summary["since"])
    assert done is not None and since is not None
    assert (done - since).total_seconds() == 75 * 60, "the wall time: completionTime - since"
    assert summary["verdicts"] == [{"verdict": "Straggler", "seconds": 3600.0, "share": 1.0}]
    assert summary["worstRank"] == 3 and summary["meanSamplesPerSecond"] == 50.0
    assert summary["lostGPUHours"] == pytest.approx((900 + 360) * 16 / 3600, abs=0.01)
    # The run's last MFU, its steps and its restarts stay where they always are.
    assert st["progress"]["mfu"] == 0.41 and st["progress"]["step"] == 10
    assert st["gang"]["restarts"] == 0
    api.GPUTrainingJobStatus.model_validate(st)
    sim.now += timedelta(hours=5)
    sim.reconcile()
    assert sim.status["goodput"] == summary
    assert sim.status["operatorState"]["goodput"] == st["operatorState"]["goodput"]


def test_a_quiet_pass_writes_no_ledger_until_it_is_due() -> None:
    from tests.unit.operator.lifecycle.test_planner import Sim, make_job

    sim = Sim(make_job(nodes=1))
    sim.reconcile()
    sim.reconcile()  # the pods exist: nothing changes from here
    first = dict(sim.status["goodput"])
    cursor = dict(sim.status["operatorState"]["goodput"])
    sim.now += timedelta(seconds=g.REFRESH_SECONDS - 1)
    quiet = sim.plan().status
    assert quiet["goodput"] == first, "nothing changed: no write"
    assert quiet["operatorState"]["goodput"] == cursor, "nor of the cursor"
    sim.now += timedelta(seconds=1)
    assert sim.plan().status["goodput"]["seconds"]["queued"] == g.REFRESH_SECONDS


def test_the_last_published_shares_split_a_run_that_ends_between_writes() -> None:
    """A short run: its shares and throughput appear after the ledger was last written, and
    the pass that sees the end (a finished job keeps its progress) still splits with them."""
    running = g.JobState(phase=c.PHASE_RUNNING, placed=True, last_step_time=T0)
    ledger = g.advance(None, running, T0 - timedelta(seconds=1), None)
    ledger = g.advance(ledger, running, T0 + timedelta(seconds=1), None)
    assert ledger.cause == g.PRODUCTIVE and ledger.samples_per_second == 0.0
    done = replace(
        running,
        phase=c.PHASE_SUCCEEDED,
        checkpoint_ratio=0.25,
        samples_per_second=10.0,
        completion_time=T0 + timedelta(seconds=101),
    )
    ledger = g.advance(ledger, done, T0 + timedelta(seconds=130), None)
    assert ledger.seconds["checkpoint"] == pytest.approx(25.0)
    assert ledger.samples == pytest.approx(1000.0)


def test_the_monitor_publishes_the_checkpoint_and_eval_shares_of_the_rank_that_spends_most() -> (
    None
):
    from gpujob_operator.monitoring.verdicts.ranktimes import RankTimes
    from gpujob_operator.monitoring.verdicts.steptime import phase_ratios

    def rank(r: int, run_ckpt: float, run_eval: float) -> RankTimes:
        return RankTimes(
            rank=r,
            pod=f"p{r}",
            node="n",
            steps=10,
            step=10.0,
            checkpoint=0.0,
            eval=0.0,
            run_step=100.0,
            run_checkpoint=run_ckpt,
            run_eval=run_eval,
        )

    shares = phase_ratios({0: rank(0, 12.0, 1.0), 1: rank(1, 2.0, 3.0)})
    assert shares == {"checkpointRatio": 0.12, "evalRatio": 0.03}
    assert phase_ratios({}) == {}
    api.Progress.model_validate(shares)


# ---- jobs whose steps the operator cannot see ---------------------------------------------


def _never_steps(monitored: bool, timeout: float = 120.0) -> g.JobState:
    return g.JobState(
        phase=c.PHASE_RUNNING, placed=True, monitored=monitored, startup_timeout=timeout
    )


@pytest.mark.parametrize("monitored", [False, True], ids=["monitoring-off", "never-a-step"])
def test_past_the_startup_timeout_a_job_never_seen_stepping_is_unobserved(monitored: bool) -> None:
    """Monitoring off (or a trainer the operator never saw step): the first 120 s (the
    start-up timeout) are start-up, the rest unobserved, and no ratio or loss is claimed."""
    state = _never_steps(monitored)
    ledger = g.advance(None, g.JobState(phase=c.PHASE_PENDING, placed=False), T0, T0)
    for s in range(30, 601, 30):
        ledger = g.advance(ledger, state, T0 + timedelta(seconds=s), T0)
    assert ledger.seconds == {"queued": 30.0, "startup": 120.0, "unobserved": 450.0}
    assert ledger.cause == g.UNOBSERVED
    assert ledger.ratio is None
    public, cursor = g.to_status(ledger, GPUS)
    assert "ratio" not in public and "lostGPUHours" not in public, "not 0 % nor all lost"
    assert public["gpuHours"] == pytest.approx(600 * GPUS / 3600, abs=0.001)
    assert public["seconds"]["unobserved"] == 450.0
    api.Goodput.model_validate(public)
    again = g.from_status(public, cursor)
    assert again is not None and again.cause == g.UNOBSERVED and again.unobserved == 450.0


def test_one_long_pass_splits_startup_and_unobserved_at_the_timeout() -> None:
    ledger = g.advance(None, _never_steps(False), T0, None)
    ledger = g.advance(ledger, _never_steps(False), T0 + timedelta(seconds=1000), None)
    assert ledger.seconds == {"startup": 120.0, "unobserved": 880.0}


def test_a_late_first_step_turns_the_unobserved_time_into_startup() -> None:
    """A slow start (a long compile) outlived the timeout: once a step is seen, what looked
    unobserved was start-up, and the ratio is back."""
    state = _never_steps(True)
    ledger = g.advance(None, state, T0, None)
    ledger = g.advance(ledger, state, T0 + timedelta(seconds=300), None)
    assert ledger.seconds == {"startup": 120.0, "unobserved": 180.0}
    stepped = replace(state, step=1, last_step_time=T0 + timedelta(seconds=310))
    ledger = g.advance(ledger, stepped, T0 + timedelta(seconds=320), None)
    assert ledger.seconds["startup"] == 320.0 and "unobserved" not in ledger.seconds
    assert ledger.cause == g.PRODUCTIVE
    ledger = g.advance(ledger, stepped, T0 + timedelta(seconds=400), None)
    assert ledger.ratio == pytest.approx(80 / 400)


def test_monitoring_turned_off_after_steps_counts_unobserved_not_productive() -> None:
    on = g.JobState(phase=c.PHASE_RUNNING, placed=True, step=5, last_step_time=T0)
    ledger = g.advance(None, on, T0 - timedelta(seconds=1), None)
    ledger = g.advance(ledger, on, T0 + timedelta(seconds=60), None)
    off = replace(on, monitored=False, startup_timeout=120.0)
    ledger = g.advance(ledger, off, T0 + timedelta(seconds=61), None)
    ledger = g.advance(ledger, off, T0 + timedelta(seconds=661), None)
    assert ledger.seconds["unobserved"] == 600.0 and ledger.ratio is None


def test_the_planner_publishes_no_ratio_for_an_unmonitored_job_past_the_startup_timeout() -> None:
    from tests.unit.operator.lifecycle.test_planner import Sim, make_job

    job = make_job(nodes=1, gpusPerNode=8, monitoring={"enabled": False})
    job["spec"]["monitoring"]["startupTimeoutSeconds"] = 120
    job["metadata"]["creationTimestamp"] = c.format_time(T0)
    sim = Sim(job)
    sim.reconcile()
    for pod in sim.pods.values():
        pod["spec"]["nodeName"] = "gpu-a"
    sim.run_all()
    sim.reconcile()
    assert sim.status["operatorState"]["goodput"]["cause"] == "startup"
    sim.now += timedelta(seconds=100)
    sim.reconcile()
    assert sim.status["operatorState"]["goodput"]["cause"] == "startup", "within the timeout"
    sim.now += timedelta(seconds=500)
    sim.reconcile()
    st = sim.status
    assert st["operatorState"]["goodput"]["cause"] == "unobserved"
    assert "ratio" not in st["goodput"] and "lostGPUHours" not in st["goodput"]
    assert st["goodput"]["seconds"]["unobserved"] == pytest.approx(480.0)
    assert "goodput" not in st.get("display", {}), "kubectl get shows no 0.0 %"
    api.GPUTrainingJobStatus.model_validate(st)
