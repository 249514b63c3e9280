"""status.progress across resumes and attempts: the run's step, the ETA's basis, the furthest
step, and why there is no ETA, on scripted series of scrapes fed to the pure analysis."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import pytest

from gpujob_operator import api
from gpujob_operator.api.display import render_display
from gpujob_operator.monitoring.monitor import JobMonitor
from gpujob_operator.monitoring.scrape import expfmt
from gpujob_operator.monitoring.scrape.frame import frame
from gpujob_operator.monitoring.scrape.result import ScrapeResult, ScrapeTarget
from gpujob_operator.monitoring.verdicts.analysis import analyze
from gpujob_operator.monitoring.verdicts.analysis_settings import Settings
from gpujob_operator.monitoring.verdicts.formatting import iso
from gpujob_operator.monitoring.verdicts.progress import ProgressMemory, smoothed_step_rate
from gpujob_operator.monitoring.window import Window
from gpujob_trainer import contract
from tests.support.fakekube import apply_merge_patch

T0 = 1_800_000_000.0
INTERVAL = 15.0
SETTINGS = Settings(warmup_steps=20, min_scrapes=3, scrape_interval_seconds=INTERVAL)
SPEC: dict[str, Any] = {
    "image": "trainer:1",
    "command": ["python", "-m", "train"],
    "nodes": 2,
    "training": {"totalSteps": 1000},
    "monitoring": {"warmupSteps": 20},
}
"""The job the monitor tests watch (the metrics task seeds its monitor with `carry`)."""


@dataclass
class Rank:
    """One rank's process: its own step counter and where the process started from."""

    rank: int
    steps: int = 0
    start: int | None = 0
    """None: an older trainer that exports no start step."""
    target: int = 1000
    last: float = 0.0

    def text(self, now: float) -> str:
        lab = f'local_rank="0",node_rank="{self.rank}",rank="{self.rank}"'
        lines = [
            f"{contract.STEPS.name}{{{lab}}} {self.steps}",
            f"{contract.TARGET_STEPS.name}{{{lab}}} {self.target}",
            f"{contract.CLOCK_TIMESTAMP.name}{{{lab}}} {now}",
        ]
        if self.start is not None:
            lines.append(f"{contract.START_STEP.name}{{{lab}}} {self.start}")
        if self.last:
            lines.append(f"{contract.LAST_STEP_TIMESTAMP.name}{{{lab}}} {self.last}")
        return "\n".join(lines) + "\n"


class Run:
    """Scrapes of a job's ranks every INTERVAL seconds into one attempt's window, progress
    carried from scrape to scrape by its memory (as the monitor does)."""

    def __init__(
        self,
        ranks: Sequence[Rank],
        memory: ProgressMemory | None = None,
        settings: Settings = SETTINGS,
        now: float = T0,
    ) -> None:
        self.ranks = list(ranks)
        self.settings = settings
        self.window = Window(settings.max_points(), settings.window_seconds)
        self.memory = memory or ProgressMemory()
        self.now = now

    def scrape(self, steps: int | Callable[[Rank], int] = 10) -> dict[str, Any]:
        """Advance every rank by `steps` (per rank when a function), scrape, analyse."""
        self.now += INTERVAL
        for r in self.ranks:
            n = steps(r) if callable(steps) else steps
            r.steps += n
            if n:
                r.last = self.now
            text = r.text(self.now)
            self.window.add(self.now, f"pod-{r.rank}", "node", frame(expfmt.parse(text), self.now))
        self.window.end_round(self.now, [f"pod-{r.rank}" for r in self.ranks])
        a = analyze(self.window, self.settings, self.now, self.memory)
        assert a.memory is not None
        self.memory = a.memory
        api.Progress.model_validate(a.progress)  # the status shape
        return a.progress


def two(start: int | None = 0) -> list[Rank]:
    return [Rank(0, start=start), Rank(1, start=start)]


# ---- the run's step -----------------------------------------------------------------------


def test_the_step_is_the_start_plus_the_process_steps_min_over_ranks() -> None:
    run = Run([Rank(0, start=400), Rank(1, start=400, steps=3)])
    p = run.scrape(10)
    assert p["step"] == 410 and p["resumedFromStep"] == 400
    assert p["percent"] == 41.0 and p["furthestStep"] == 410


def test_an_older_trainer_without_a_start_step_counts_its_steps_as_before() -> None:
    run = Run(two(start=None))
    p = run.scrape(10)
    # its steps restart from 0 with each process: no furthest step to judge restarts by
    assert p["step"] == 10 and "resumedFromStep" not in p and "furthestStep" not in p


def test_a_resumed_rank_near_its_target_is_finished_by_its_run_step() -> None:
    # 990 resumed + 10 own steps = the target 1000: done, though the counter reads 10.
    run = Run(two(start=990))
    p = run.scrape(10)
    assert p["step"] == 1000 and p["percent"] == 100.0 and p["etaSeconds"] == 0.0
    # done stepping: its GPUs free up now, which a waiting job's start forecast counts on
    assert p["estimatedCompletionTime"] and "etaUnavailable" not in p


# ---- the ETA: warm-up, basis, pauses ------------------------------------------------------


def test_no_eta_while_warming_up_then_the_ewma_then_the_average_since_the_basis() -> None:
    run = Run(two())
    p = run.scrape(5)
    assert "etaSeconds" not in p and p["etaUnavailable"] == "measuring: 15 more steps of warm-up"
    assert render_display({"phase": "Running", "progress": p})["eta"] == "measuring"
    run.scrape(10)
    p = run.scrape(10)  # 25 steps: warm-up is over at this scrape, the basis is taken here
    assert p["rateSince"] == {"time": iso(run.now), "step": 25, "attempt": 0}
    # A basis of age 0 measures nothing yet: the EWMA of the recent rate stands in.
    assert p["etaSeconds"] == pytest.approx((1000 - 25) / (10 / INTERVAL), rel=1e-3)
    p = run.scrape(10)
    assert p["etaSeconds"] == pytest.approx((1000 - 35) / (10 / INTERVAL), rel=1e-3)
    assert "etaUnavailable" not in p
    run.scrape(20)
    p = run.scrape(20)  # two intervals old: (65 - 25) steps over 45 s
    assert p["etaSeconds"] == pytest.approx((1000 - 75) / (50 / 45), rel=1e-3)
    assert p["rateSince"]["step"] == 25, "the basis stays where it was taken"


def test_recurring_checkpoints_and_evals_do_not_saw_tooth_the_completion_time() -> None:
    # 10 steps a scrape, and every sixth scrape none (a checkpoint or an eval as long as a
    # scrape interval): the real rate is 50 steps per 90 s.
    run = Run([Rank(0, target=3000), Rank(1, target=3000)])
    since_basis, ewma = [], []
    for i in range(120):
        p = run.scrape(0 if i % 6 == 5 else 10)
        if i >= 60:
            since_basis.append(run.now + p["etaSeconds"])
            # What an EWMA of the recent rate alone would say (the ETA before the basis).
            rate = smoothed_step_rate(list(run.window.ranks.values()), {})
            assert rate is not None
            ewma.append(run.now + (3000 - p["step"]) / rate)

    def swing(values: Sequence[float]) -> float:
        return max(values) - min(values)

    # The average since the basis counts each pause as often as it recurs: its completion time
    # settles (each cycle swings less than the one before), while the EWMA's saw-tooths.
    assert swing(since_basis[-30:]) < swing(since_basis[:30])
    assert swing(since_basis[-30:]) < 5 * INTERVAL
    assert swing(ewma[-30:]) > 10 * swing(since_basis[-30:])
    truth = run.now + (3000 - p["step"]) * 90 / 50
    assert since_basis[-1] - T0 == pytest.approx(truth - T0, rel=0.01)


def test_a_process_restart_within_the_attempt_measures_afresh() -> None:
    run = Run(two())
    for _ in range(6):
        p = run.scrape(10)
    assert p["rateSince"]["step"] == 20
    for r in run.ranks:  # torchrun restarted the processes; they resume from step 50
        r.steps, r.start = 0, 50
    p = run.scrape(0)
    assert p["step"] == 50 and p["resumedFromStep"] == 50 and "rateSince" not in p
    assert p["etaUnavailable"].startswith("measuring: 20 more steps")
    assert p["furthestStep"] == 60, "the furthest step never goes down"
    run.scrape(10)
    p = run.scrape(10)
    assert p["rateSince"] == {"time": iso(run.now), "step": 70, "attempt": 0}


# ---- across attempts and operator restarts ------------------------------------------------


def old_attempt_status() -> dict[str, Any]:
    """status.progress as attempt 1 left it at step 600 (its ETA removed by the planner)."""
    return {
        "step": 600,
        "furthestStep": 600,
        "totalSteps": 1000,
        "percent": 60.0,
        "etaUnavailable": "restarting: the gang restarts as attempt 2; ...",
    }


def test_a_new_attempt_shows_the_last_step_until_its_first_step_then_never_below_the_resume() -> (
    None
):
    run = Run(two(start=400), ProgressMemory.from_status(old_attempt_status(), attempt=2))
    p = run.scrape(0)  # the ranks are up, loaded step 400, made no step yet
    assert p["step"] == 600, "the last known step, not 0 nor a jump back before a step"
    assert p["furthestStep"] == 600 and p["resumedFromStep"] == 400
    assert "etaSeconds" not in p and "rateSince" not in p
    assert p["etaUnavailable"].startswith("resuming: attempt 2 resumed from step 400")
    assert render_display({"phase": "Running", "progress": p})["eta"] == "resuming"
    seen = []
    for _ in range(30):
        p = run.scrape(10)
        seen.append(p)
    assert seen[0]["step"] == 410 and min(q["step"] for q in seen) >= 400
    assert all(q["furthestStep"] == max(600, q["step"]) for q in seen)
    assert seen[-1]["step"] == 700 and seen[-1]["furthestStep"] == 700
    assert seen[-1]["rateSince"] == {"time": iso(T0 + 3 * INTERVAL), "step": 420, "attempt": 2}
    assert "etaSeconds" in seen[-1] and "etaUnavailable" not in seen[-1]


def test_a_basis_of_an_earlier_attempt_is_not_used() -> None:
    rate_since = {"time": iso(T0), "step": 100, "attempt": 1}  # status.operatorState.rateSince
    mon = JobMonitor(SPEC)
    mon.carry(old_attempt_status(), 2, rate_since)
    assert mon.progress_memory.basis is None
    mon.carry(old_attempt_status(), 1, rate_since)
    kept = mon.progress_memory.basis
    assert kept is not None and (kept.time, kept.step) == (T0, 100)


def test_an_operator_restart_keeps_the_basis_and_the_furthest_step() -> None:
    # The status as the last operator wrote it: basis at step 100 five minutes earlier.
    status = {
        "progress": {"step": 300, "furthestStep": 900, "totalSteps": 1000},
        "operatorState": {"rateSince": {"time": iso(T0 - 300), "step": 100, "attempt": 3}},
    }
    mon = JobMonitor(SPEC)
    mon.carry(status["progress"], 3, status["operatorState"]["rateSince"])
    run = Run([Rank(0, steps=300), Rank(1, steps=300)], mon.progress_memory)
    p = run.scrape(10)  # the first scrape of the new operator: 310 steps at T0 + 15
    assert p["rateSince"]["step"] == 100 and p["furthestStep"] == 900
    assert p["etaSeconds"] == pytest.approx((1000 - 310) / (210 / 315), rel=1e-3)


def test_the_monitor_carries_the_status_into_a_new_attempt_and_writes_what_it_finds() -> None:
    # The metrics task makes a monitor per attempt and seeds it from status (`carry`).
    status: dict[str, Any] = {"progress": old_attempt_status()}
    mon = JobMonitor(SPEC)
    mon.carry(status["progress"], 2, (status.get("operatorState") or {}).get("rateSince"))
    ranks, now = two(start=400), T0

    def observe(steps: int) -> dict[str, Any]:
        nonlocal now, status
        now += INTERVAL
        results = []
        for r in ranks:
            r.steps += steps
            r.last = now if steps else r.last
            target = ScrapeTarget(f"http://127.0.0.1:{9400 + r.rank}/metrics", f"p{r.rank}", "n")
            results.append(ScrapeResult(target, now, samples=expfmt.parse(r.text(now))))
        patch = mon.observe(results, now).status_patch(status)
        if patch:
            status = apply_merge_patch(status, patch)
        return dict(status["progress"])

    p = observe(0)
    assert p["step"] == 600 and p["etaUnavailable"].startswith("resuming:")
    assert status["display"]["eta"] == "resuming"
    steps = [observe(10)["step"] for _ in range(8)]
    assert steps == [410, 420, 430, 440, 450, 460, 470, 480]
    p = dict(status["progress"])
    assert p["resumedFromStep"] == 400 and p["furthestStep"] == 600
    assert "etaUnavailable" not in p and p["etaSeconds"] > 0
    assert status["operatorState"]["rateSince"]["attempt"] == 2 and "rateSince" not in p
