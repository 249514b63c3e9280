"""Every verdict on synthetic windows (rank and fake NVML series written as exposition
text, parsed like a scrape), plus replay of payloads recorded from the example trainer."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest

from gpujob_operator import api
from gpujob_operator.monitoring.scrape import expfmt
from gpujob_operator.monitoring.scrape.frame import frame
from gpujob_operator.monitoring.verdicts.analysis import Analysis, analyze
from gpujob_operator.monitoring.verdicts.analysis_settings import Settings
from gpujob_operator.monitoring.verdicts.formatting import iso
from gpujob_operator.monitoring.verdicts.stall import median_step_seconds
from gpujob_operator.monitoring.verdicts.verdict import (
    COMMUNICATION_BOUND,
    CRITICAL,
    GPU_UNDERUTILIZED,
    HARDWARE_FAULT,
    HEALTHY,
    INFO,
    INPUT_BOUND,
    MEMORY_PRESSURE,
    STALLED,
    STRAGGLER,
    THROTTLED,
    WARNING,
    Verdict,
)
from gpujob_operator.monitoring.window import Window
from gpujob_trainer import contract

PAYLOADS = Path(__file__).resolve().parents[3] / "data" / "payloads"
T0 = 1_800_000_000.0
GIB = 2**30


@dataclass
class RankSim:
    """Cumulative counters of one synthetic rank, advanced step by step."""

    rank: int
    local_rank: int = 0
    node_rank: int = 0
    batch: int = 32
    phases: dict[str, float] = field(
        default_factory=lambda: {
            "data_wait": 0.01,
            "forward": 0.03,
            "backward": 0.05,
            "optimizer": 0.005,
            "comm_wait": 0.005,
            "other": 0.0,
        }
    )
    steps: int = 0
    total: dict[str, float] = field(default_factory=lambda: dict.fromkeys(contract.PHASES, 0.0))
    last_step: float = 0.0
    target: int | None = 1000
    reserved: float | None = None
    retries: int = 0
    uuid: str = "GPU-r"
    heartbeat: float | None = None
    """Exported when set; moves with every step (the trainer's liveness series)."""
    current: str | None = None
    """The phase exported as current, when set."""
    skew: float = 0.0
    """How far the rank's node clock runs ahead of the operator's (negative: behind)."""
    own_clock: bool = True
    """Exports its clock with its timestamps (False: an older trainer)."""
    clock: float = 0.0

    def advance(self, n: int, now: float) -> None:
        self.clock = now + self.skew
        for _ in range(n):
            self.steps += 1
            for p, s in self.phases.items():
                self.total[p] += s
        if n:
            self.last_step = self.clock
            if self.heartbeat is not None:
                self.heartbeat = self.clock

    def text(self) -> str:
        lab = f'local_rank="{self.local_rank}",node_rank="{self.node_rank}",rank="{self.rank}"'
        step_time = sum(self.total.values())
        compute = sum(self.total[p] for p in contract.COMPUTE_PHASES)
        lines = [
            f"# TYPE {contract.STEPS.name} counter",
            f"{contract.STEPS.name}{{{lab}}} {self.steps}",
            f"{contract.SAMPLES.name}{{{lab}}} {self.steps * self.batch}",
            f"{contract.EPOCH.name}{{{lab}}} {self.steps // 100}",
            f"{contract.LOSS.name}{{{lab}}} 1.5",
            f"{contract.STEP_DURATION.name}_count{{{lab}}} {self.steps}",
            f"{contract.STEP_DURATION.name}_sum{{{lab}}} {step_time}",
            f"{contract.COMPUTE_SECONDS.name}{{{lab}}} {compute}",
        ]
        per = sum(self.phases.values())
        for b in contract.STEP_DURATION_BUCKETS:
            lines.append(
                f'{contract.STEP_DURATION.name}_bucket{{le="{b!r}",{lab}}} '
                f"{self.steps if per <= b else 0}"
            )
        lines.append(f'{contract.STEP_DURATION.name}_bucket{{le="+Inf",{lab}}} {self.steps}')
        if self.target is not None:
            lines.append(f"{contract.TARGET_STEPS.name}{{{lab}}} {self.target}")
        for p in contract.PHASES:
            lines.append(f'{contract.PHASE_SECONDS.name}{{{lab},phase="{p}"}} {self.total[p]}')
        if self.last_step:
            lines.append(f"{contract.LAST_STEP_TIMESTAMP.name}{{{lab}}} {self.last_step}")
        if self.heartbeat is not None:
            lines.append(f"{contract.HEARTBEAT_TIMESTAMP.name}{{{lab}}} {self.heartbeat}")
        if self.own_clock and self.clock:
            lines.append(f"{contract.CLOCK_TIMESTAMP.name}{{{lab}}} {self.clock}")
        if self.current is not None:
            for p in contract.PHASES:
                on = int(p == self.current)
                lines.append(f'{contract.CURRENT_PHASE.name}{{{lab},phase="{p}"}} {on}')
        if self.reserved is not None:
            cl = f'{lab},UUID="{self.uuid}"'
            lines.append(f"{contract.CUDA_MEMORY_RESERVED.name}{{{cl}}} {self.reserved}")
            lines.append(f"{contract.CUDA_ALLOC_RETRIES.name}{{{cl}}} {self.retries}")
            lines.append(f"{contract.CUDA_OOMS.name}{{{cl}}} 0")
        return "\n".join(lines) + "\n"


@dataclass
class GPUSim:
    """Fake NVML series of one GPU, as local rank 0 exports them."""

    gpu: int
    uuid: str
    util: float = 0.9
    used: float = 10 * GIB
    total: float = 80 * GIB
    throttle: tuple[str, ...] = ()
    xid: int = 0
    ecc: int = 0

    def text(self, node_rank: int = 0) -> str:
        lab = f'node_rank="{node_rank}",gpu="{self.gpu}",UUID="{self.uuid}"'
        lines = [
            f"{contract.GPU_UTILIZATION.name}{{{lab}}} {self.util}",
            f"{contract.GPU_MEMORY_USED.name}{{{lab}}} {self.used}",
            f"{contract.GPU_MEMORY_TOTAL.name}{{{lab}}} {self.total}",
            f"{contract.GPU_POWER.name}{{{lab}}} 300",
            f"{contract.GPU_XID_ERRORS.name}{{{lab}}} {self.xid}",
            f"{contract.GPU_ECC_UNCORRECTED.name}{{{lab}}} {self.ecc}",
        ]
        for reason in contract.CLOCK_EVENT_REASONS:
            active = 1 if reason in self.throttle else 0
            lines.append(f'{contract.GPU_CLOCK_EVENT.name}{{{lab},reason="{reason}"}} {active}')
        return "\n".join(lines) + "\n"


def telemetry_text(ok: bool, node_rank: int = 0) -> str:
    reason = contract.TELEMETRY_OK if ok else contract.TELEMETRY_NVML_INIT_FAILED
    return (
        f'{contract.GPU_TELEMETRY_AVAILABLE.name}{{node_rank="{node_rank}",reason="{reason}"}} '
        f"{1 if ok else 0}\n"
    )


@dataclass
class Job:
    """A synthetic job: ranks (on one pod each) and GPUs on pod of rank 0."""

    ranks: list[RankSim]
    gpus: list[GPUSim] = field(default_factory=list)
    steps_per_scrape: int = 10
    interval: float = 15.0
    now: float = T0
    hooks: list[Callable[[Job, int], None]] = field(default_factory=list)

    def payloads(self) -> list[tuple[str, str]]:
        out = []
        for r in self.ranks:
            text = r.text()
            if r.local_rank == 0:
                text += telemetry_text(bool(self.gpus), r.node_rank)
                text += "".join(g.text(r.node_rank) for g in self.gpus)
            out.append((f"pod-{r.rank}", text))
        return out

    def round(self, i: int) -> list[tuple[str, str]]:
        self.now += self.interval
        for hook in self.hooks:
            hook(self, i)
        for r in self.ranks:
            r.advance(self.steps_per_scrape, self.now)
        return self.payloads()


def fill(window: Window, job: Job, rounds: int) -> float:
    """Feed `rounds` scrape rounds of the job into the window; returns the last time."""
    for i in range(rounds):
        for pod, text in job.round(i):
            window.add(job.now, pod, f"node-{pod}", frame(expfmt.parse(text), job.now))
        window.end_round(job.now, [p for p, _ in job.payloads()])
    return job.now


SETTINGS = Settings(warmup_steps=20, min_scrapes=3, total_steps=None)


def run(job: Job, rounds: int = 8, settings: Settings = SETTINGS) -> Analysis:
    window = Window(settings.max_points(), settings.window_seconds)
    now = fill(window, job, rounds)
    return analyze(window, settings, now)


def two_ranks(**kw: float) -> Job:
    return Job([RankSim(0, 0), RankSim(1, 1)], **kw)  # type: ignore[arg-type]


def verdict(a: Analysis) -> str | None:
    return a.verdict.verdict if a.verdict else None


# ---- progress -----------------------------------------------------------------------------


def test_progress_eta_and_throughput() -> None:
    job = two_ranks()
    a = run(job, rounds=6)
    p = a.progress
    assert p["step"] == 60 and p["totalSteps"] == 1000
    assert p["percent"] == pytest.approx(6.0)
    # 10 steps per 15 s; throughput sums both ranks' samples (32 per step each)
    assert a.step_rate == pytest.approx(10 / 15)
    assert p["samplesPerSecond"] == pytest.approx(2 * 32 * 10 / 15, rel=1e-3)
    assert p["etaSeconds"] == pytest.approx(940 / (10 / 15), rel=1e-3)
    assert p["estimatedCompletionTime"].endswith("Z")
    assert p["loss"] == 1.5 and p["epoch"] == 0
    api.Progress.model_validate(p)  # the status shape


def test_step_is_min_of_ranks_and_total_from_spec_when_not_exported() -> None:
    job = two_ranks()
    for r in job.ranks:
        r.target = None
    job.ranks[1].steps = 3  # rank 1 ahead by 3
    a = run(job, rounds=4, settings=Settings(total_steps=80))
    assert a.progress["step"] == 40 and a.progress["totalSteps"] == 80
    assert a.progress["percent"] == 50.0


def test_eta_smooths_a_slow_interval() -> None:
    job = two_ranks()

    def slow_once(j: Job, i: int) -> None:
        j.steps_per_scrape = 2 if i == 6 else 10

    job.hooks.append(slow_once)
    a = run(job, rounds=8)
    # EWMA: one interval at 1/5 of the rate moves the estimate less than proportionally
    assert 0.4 < a.step_rate < 10 / 15  # type: ignore[operator]


def test_counter_reset_counts_from_zero() -> None:
    job = two_ranks()

    def restart(j: Job, i: int) -> None:
        if i == 5:
            for r in j.ranks:
                r.steps = 0
                r.total = dict.fromkeys(contract.PHASES, 0.0)

    job.hooks.append(restart)
    a = run(job, rounds=7, settings=Settings(warmup_steps=0))
    assert a.step_rate == pytest.approx(10 / 15)
    assert a.progress["samplesPerSecond"] == pytest.approx(2 * 32 * 10 / 15, rel=1e-3)


# ---- verdicts --------------------------------------------------------------------------------


def test_healthy_cpu_job_and_telemetry_reason() -> None:
    a = run(two_ranks())
    assert verdict(a) == HEALTHY and a.candidates == ()
    assert a.gpus["telemetry"] == "Unavailable: no GPU telemetry: nvml_init_failed"
    api.GPUSummary.model_validate(a.gpus)


def test_warmup_gives_no_verdict() -> None:
    a = run(two_ranks(), rounds=3)  # steps 10, 20, 30: only 2 scrapes past step 20
    assert a.verdict is None and not a.ready and "warming up" in a.not_ready_reason


def test_input_bound_with_numbers() -> None:
    job = two_ranks()
    for r in job.ranks:
        r.phases["data_wait"] = 0.05  # 0.05 / 0.14 = 36%
    a = run(job)
    assert verdict(a) == INPUT_BOUND
    v = a.verdict
    assert v is not None and v.severity == WARNING
    assert v.evidence["dataWaitRatio"] == pytest.approx(0.05 / 0.14, abs=1e-3)
    assert v.summary == "data loading takes 36% of step time (warn > 5%, bound > 20%)"
    assert "DataLoader workers" in v.advice
    api.Bottleneck.model_validate(v.to_status(T0))


def test_input_warn_level_stays_healthy_with_a_note() -> None:
    job = two_ranks()
    for r in job.ranks:
        r.phases["data_wait"] = 0.012  # 12 / 102 ms = 12%
    a = run(job)
    assert verdict(a) == HEALTHY
    assert a.verdict is not None and "note: data loading takes 12%" in a.verdict.summary


def test_thresholds_come_from_the_spec() -> None:
    job = two_ranks()
    for r in job.ranks:
        r.phases["data_wait"] = 0.05
    th = api.Thresholds(input_bound_ratio=0.5, input_warn_ratio=0.4)
    assert verdict(run(job, settings=Settings(thresholds=th))) == HEALTHY


def test_communication_bound() -> None:
    job = two_ranks()
    for r in job.ranks:
        r.phases["comm_wait"] = 0.04  # 40 / 135 ms
    a = run(job)
    assert verdict(a) == COMMUNICATION_BOUND
    assert a.verdict is not None and a.verdict.evidence["commWaitRatio"] == pytest.approx(
        0.04 / 0.135, abs=1e-3
    )


def test_straggler_beats_communication_bound() -> None:
    job = two_ranks()
    slow = job.ranks[1]
    slow.phases.update(forward=0.09, backward=0.15)  # 3x the compute
    job.ranks[0].phases["comm_wait"] = 0.16  # the fast rank waits for it in all-reduce
    a = run(job)
    assert verdict(a) == STRAGGLER
    v = a.verdict
    assert v is not None and v.rank == 1 and v.pod == "pod-1" and v.node == "node-pod-1"
    assert v.evidence["stragglerScore"] == pytest.approx(0.085 / 0.245, abs=1e-3)
    assert COMMUNICATION_BOUND not in [c.verdict for c in a.candidates]


def test_memory_pressure_from_reserved_over_total() -> None:
    job = Job([RankSim(0, 0, reserved=76 * GIB, uuid="GPU-a")], [GPUSim(0, "GPU-a")])
    a = run(job)
    assert verdict(a) == MEMORY_PRESSURE
    assert a.verdict is not None and a.verdict.gpu_uuid == "GPU-a"
    assert a.verdict.evidence["reservedRatio"] == pytest.approx(0.95)


def test_memory_pressure_from_alloc_retries() -> None:
    job = Job([RankSim(0, 0, reserved=10 * GIB, uuid="GPU-a")], [GPUSim(0, "GPU-a")])

    def retry(j: Job, i: int) -> None:
        j.ranks[0].retries += 2

    job.hooks.append(retry)
    a = run(job)
    assert verdict(a) == MEMORY_PRESSURE
    assert a.verdict is not None and float(a.verdict.evidence["allocRetries"]) > 0


def test_gpu_underutilized_only_without_other_causes() -> None:
    gpus = [GPUSim(i, f"GPU-{i}", util=0.3) for i in range(8)]
    job = Job([RankSim(0, 0)], gpus)
    a = run(job)
    assert verdict(a) == GPU_UNDERUTILIZED
    assert a.gpus["observed"] == 8 and a.gpus["meanUtilizationRatio"] == pytest.approx(0.3)
    job2 = Job([RankSim(0, 0)], [GPUSim(i, f"GPU-{i}", util=0.3) for i in range(8)])
    job2.ranks[0].phases["data_wait"] = 0.2
    assert verdict(run(job2)) == INPUT_BOUND


def test_throttled_when_sustained_only() -> None:
    job = Job([RankSim(0, 0)], [GPUSim(0, "GPU-a", throttle=("sw_power_cap",)), GPUSim(1, "GPU-b")])
    a = run(job)
    assert verdict(a) == THROTTLED
    assert a.verdict is not None and a.verdict.gpu_uuid == "GPU-a"
    assert "sw_power_cap" in a.verdict.summary and a.throttled_gpus == 1

    flicker = Job([RankSim(0, 0)], [GPUSim(0, "GPU-a")])

    def toggle(j: Job, i: int) -> None:
        j.gpus[0].throttle = ("hw_slowdown",) if i % 2 else ()

    flicker.hooks.append(toggle)
    assert verdict(run(flicker)) == HEALTHY


def test_hardware_fault_on_xid_increase_is_critical() -> None:
    job = Job([RankSim(0, 0)], [GPUSim(0, "GPU-a"), GPUSim(1, "GPU-b")])

    def xid(j: Job, i: int) -> None:
        if i == 6:
            j.gpus[1].xid = 1

    job.hooks.append(xid)
    a = run(job)
    assert verdict(a) == HARDWARE_FAULT
    assert a.verdict is not None and a.verdict.severity == CRITICAL
    assert a.verdict.gpu_uuid == "GPU-b"


def test_ecc_counter_already_nonzero_is_no_fault() -> None:
    job = Job([RankSim(0, 0)], [GPUSim(0, "GPU-a", ecc=3)])
    assert verdict(run(job)) == HEALTHY


def live_ranks(**kw: float) -> Job:
    """Two ranks exporting the liveness series (heartbeat moving with steps, phase other)."""
    ranks = [RankSim(r, r, heartbeat=T0, current="other") for r in (0, 1)]
    return Job(ranks, **kw)  # type: ignore[arg-type]


def hang_at(round_: int) -> Callable[[Job, int], None]:
    def hook(j: Job, i: int) -> None:
        j.steps_per_scrape = 0 if i >= round_ else 10

    return hook


def test_a_hang_after_the_first_step_is_stalled_even_in_warmup() -> None:
    # Ten steps (inside warmupSteps 20), then nothing moves: the first step is done, so the
    # stall timeout applies (warm-up only delays the ratio verdicts), not the start-up one.
    st = Settings(stall_timeout_seconds=60)
    a = run(live_ranks(hooks=[hang_at(1)]), rounds=5, settings=st)  # 60 s: not yet
    assert verdict(a) != STALLED and a.stall_reason == "Progressing"
    a = run(live_ranks(hooks=[hang_at(1)]), rounds=6, settings=st)
    assert verdict(a) == STALLED and a.stall_reason == "StallDetected"
    assert a.verdict is not None and a.verdict.severity == CRITICAL
    assert a.stalled_for == pytest.approx(75) and a.verdict.evidence["step"] == 10
    assert a.verdict.evidence["currentPhases"] == "other"


def test_no_stall_before_the_first_step_until_the_startup_timeout() -> None:
    # compilation, FSDP init, a data download: no step at all for minutes
    st = Settings(stall_timeout_seconds=60, startup_timeout_seconds=300)
    a = run(live_ranks(steps_per_scrape=0), rounds=20, settings=st)  # 285 s after first sight
    assert verdict(a) != STALLED
    assert a.stall_reason == "StartingUp" and "no step yet" in a.stall_note
    assert a.stall_threshold == 300
    a = run(live_ranks(steps_per_scrape=0), rounds=22, settings=st)  # 315 s
    assert verdict(a) == STALLED
    assert a.verdict is not None and "first step" in a.verdict.summary
    # the start-up timeout never shortens the stall timeout
    long = Settings(stall_timeout_seconds=600, startup_timeout_seconds=300)
    assert verdict(run(live_ranks(steps_per_scrape=0), rounds=22, settings=long)) != STALLED


def test_no_stall_after_the_last_step() -> None:
    # the README's example saves its final checkpoint after the last step, unwrapped
    job = live_ranks(hooks=[hang_at(10)])
    for r in job.ranks:
        r.target = 100
    a = run(job, rounds=40, settings=Settings(stall_timeout_seconds=60))
    assert a.progress["step"] == 100 and verdict(a) != STALLED
    assert a.stall_reason == "RanksFinished"
    # one rank short of the target is not finished: that one can hang
    job = live_ranks(hooks=[hang_at(10)])
    for r in job.ranks:
        r.target = 101
    assert verdict(run(job, rounds=40, settings=Settings(stall_timeout_seconds=60))) == STALLED


def test_each_rank_is_finished_at_its_own_target_and_a_huge_one_is_ignored() -> None:
    st = Settings(stall_timeout_seconds=60)
    # a rank with a slightly larger target runs one more step than the other, then both end
    job = live_ranks(hooks=[hang_at(10)])
    job.ranks[0].target, job.ranks[1].target = 100, 101

    def last_step_of_rank_1(j: Job, i: int) -> None:
        if i == 10:
            j.ranks[1].steps += 1

    job.hooks.append(last_step_of_rank_1)
    a = run(job, rounds=40, settings=st)
    assert verdict(a) != STALLED and a.stall_reason == "RanksFinished"
    assert a.stall_note == "every rank reached its own last step 100-101"
    # a third rank exports an absurd target: the job's is the others', and it is finished
    job = Job([RankSim(r, r, heartbeat=T0, target=100) for r in range(3)], hooks=[hang_at(10)])
    job.ranks[2].target = 10**15
    a = run(job, rounds=40, settings=st)
    assert a.progress["totalSteps"] == 100 and a.progress["percent"] == 100.0
    assert verdict(a) != STALLED and a.stall_reason == "RanksFinished"
    assert "rank 2: 1e+15 (rejected)" in a.target_note


@pytest.mark.parametrize("phase", ["checkpoint", "eval"])
def test_a_rank_in_a_checkpoint_or_an_evaluation_is_busy_until_the_busy_timeout(
    phase: str,
) -> None:
    def enter(j: Job, i: int) -> None:
        if i == 2:  # rank 0 starts saving; rank 1 waits for it in its next all-reduce
            j.steps_per_scrape = 0
            j.ranks[0].current, j.ranks[0].heartbeat = phase, j.now
            j.ranks[1].current, j.ranks[1].heartbeat = "comm_wait", j.now

    st = Settings(stall_timeout_seconds=60, busy_timeout_seconds=600)
    a = run(live_ranks(hooks=[enter]), rounds=30, settings=st)  # 7 min without a step
    assert verdict(a) != STALLED and a.stall_reason == "RanksBusy"
    assert f"rank 0 is in {phase} for" in a.stall_note
    a = run(live_ranks(hooks=[enter]), rounds=45, settings=st)  # 10.75 min: past the bound
    assert verdict(a) == STALLED
    assert a.verdict is not None
    assert a.verdict.evidence["currentPhases"] == ",".join(sorted(["comm_wait", phase]))


def test_a_rank_whose_heartbeat_moves_is_not_hung() -> None:
    # an evaluation without phase("eval"): no step, but the forward hooks keep marking
    def busy(j: Job, i: int) -> None:
        if i >= 2:
            j.steps_per_scrape = 0
            j.ranks[0].heartbeat = j.now
            j.ranks[0].current = "forward" if i % 2 else "other"

    st = Settings(stall_timeout_seconds=60)
    a = run(live_ranks(hooks=[busy]), rounds=20, settings=st)
    assert verdict(a) != STALLED and a.stall_reason == "RanksBusy"
    assert "rank 0 changed phase 0s ago" in a.stall_note


def test_heartbeat_age_is_timed_by_the_operator_clock() -> None:
    # a trainer whose clock runs an hour behind: its heartbeat still counts as fresh when it
    # changes, and a frozen one goes stale after the threshold as the operator sees it
    def skewed(j: Job, i: int) -> None:
        j.steps_per_scrape = 0 if i >= 2 else 10
        if i < 8:
            j.ranks[0].heartbeat = j.now - 3600 + i

    st = Settings(stall_timeout_seconds=60)
    a = run(live_ranks(hooks=[skewed]), rounds=10, settings=st)
    assert verdict(a) != STALLED and a.stall_reason == "RanksBusy"
    a = run(live_ranks(hooks=[skewed]), rounds=14, settings=st)
    assert verdict(a) == STALLED


def seen_fresh(job: Job, unseen: int, rounds: int, settings: Settings) -> list[Analysis]:
    """The job runs `unseen` rounds before the operator looks (a restart, a handover, a spec
    edit), then a fresh window watches it for `rounds`: the analysis after each."""
    for i in range(unseen):
        job.round(i)
    window = Window(settings.max_points(), settings.window_seconds)
    out = []
    for i in range(unseen, unseen + rounds):
        for pod, text in job.round(i):
            window.add(job.now, pod, f"node-{pod}", frame(expfmt.parse(text), job.now))
        window.end_round(job.now, [p for p, _ in job.payloads()])
        out.append(analyze(window, settings, job.now))
    return out


def slow_steps(skew: float, own_clock: bool = True) -> Job:
    """Two healthy ranks whose 40 s steps span three scrapes, on a node clock `skew` off."""
    job = live_ranks()
    for r in job.ranks:
        r.phases["forward"] = 40.0
        r.skew, r.own_clock, r.heartbeat = skew, own_clock, T0 + skew

    def one_step_in_three(j: Job, i: int) -> None:
        j.steps_per_scrape = 1 if i % 3 == 0 else 0

    job.hooks.append(one_step_in_three)
    return job


@pytest.mark.parametrize("own_clock", [True, False], ids=["clock", "older-trainer"])
@pytest.mark.parametrize("skew", [-1200.0, 1200.0], ids=["node-behind", "node-ahead"])
def test_a_healthy_job_seen_fresh_on_a_skewed_node_is_not_stalled(
    skew: float, own_clock: bool
) -> None:
    # The operator restarts mid-step (the last step ended two scrapes ago): the last step's
    # age is taken on the node's own clock, or counted from first sight, never 20 minutes
    # of skew read as 20 minutes without a step.
    st = Settings(stall_timeout_seconds=60)
    for a in seen_fresh(slow_steps(skew, own_clock), unseen=5, rounds=12, settings=st):
        assert verdict(a) != STALLED and a.stall_reason == "Progressing", a.stall_note
        assert a.stalled_for is not None and a.stalled_for < 60
    # the status' last step time is on the operator's clock when the rank exports its own
    a = seen_fresh(slow_steps(skew), unseen=5, rounds=1, settings=st)[0]
    assert a.progress["lastStepTime"] == iso(T0 + 4 * 15)


@pytest.mark.parametrize("skew", [-1200.0, 0.0, 1200.0])
def test_a_hung_job_seen_fresh_is_stalled_at_once_by_its_own_clock(skew: float) -> None:
    # two rounds of steps, then a hang 5 minutes before the operator first looks
    job = live_ranks(hooks=[hang_at(2)])
    for r in job.ranks:
        r.skew, r.heartbeat = skew, T0 + skew
    st = Settings(stall_timeout_seconds=60)
    a = seen_fresh(job, unseen=22, rounds=1, settings=st)[0]
    assert verdict(a) == STALLED and a.stall_reason == "StallDetected"
    assert a.stalled_for == pytest.approx(23 * 15 - 2 * 15)
    # an older trainer (no clock) is judged from first sight: stalled once the timeout passed
    job = live_ranks(hooks=[hang_at(2)])
    for r in job.ranks:
        r.skew, r.heartbeat, r.own_clock = skew, T0 + skew, False
    seen = seen_fresh(job, unseen=22, rounds=6, settings=st)
    assert [verdict(a) == STALLED for a in seen] == [False] * 5 + [True]


def test_stall_threshold_scales_with_step_time() -> None:
    job = two_ranks()
    for r in job.ranks:
        r.phases["forward"] = 20.0  # 20 s steps: 10 x median >> timeout

    def hang(j: Job, i: int) -> None:
        j.steps_per_scrape = 1 if i == 0 else 0

    job.hooks.append(hang)
    a = run(job, rounds=8, settings=Settings(stall_timeout_seconds=30))
    assert verdict(a) != STALLED
    assert a.stall_threshold is not None and a.stall_threshold > 100


def test_median_step_seconds_interpolates_buckets() -> None:
    job = two_ranks()
    window = Window(10, 1000)
    fill(window, job, 2)
    median = median_step_seconds(list(window.ranks.values()))
    # every step took 0.1 s: all in the (0.05, 0.1] bucket, interpolated to its middle
    assert median == pytest.approx(0.075)


# ---- replay of recorded trainer payloads ------------------------------------------------------


def replay(condition: str, settings: Settings) -> Analysis:
    times = json.loads((PAYLOADS / "times.json").read_text())
    window = Window(settings.max_points(), settings.window_seconds)
    now = 0.0
    for i in range(3):
        for r in range(2):
            name = f"{condition}-scrape{i}-rank{r}.prom"
            now = times[name]
            samples = expfmt.parse((PAYLOADS / name).read_bytes())
            window.add(now, f"pod-r{r}", "node", frame(samples, now))
        window.end_round(now)
    return analyze(window, settings, now)


REPLAY = Settings(warmup_steps=0, min_scrapes=3, window_seconds=10, scrape_interval_seconds=1)
# The recorded comm-heavy run is short (2 s) and its ranks' compute differs by 1.4x under
# contention (score 0.72): with the default straggler bound it reads as a mild straggler.
LENIENT = api.Thresholds(straggler_score=0.6)


@pytest.mark.parametrize(
    ("condition", "thresholds", "expected"),
    [
        ("slow_input", api.Thresholds(), INPUT_BOUND),
        ("comm_heavy", LENIENT, COMMUNICATION_BOUND),
        ("slow_rank", api.Thresholds(), STRAGGLER),
    ],
)
def test_recorded_windows(condition: str, thresholds: api.Thresholds, expected: str) -> None:
    a = replay(condition, replace(REPLAY, thresholds=thresholds))
    assert verdict(a) == expected, [c.summary for c in a.candidates]
    assert a.progress["samplesPerSecond"] > 0 and a.progress["step"] > 0
    assert a.gpus["telemetry"].startswith("Unavailable")
    if expected == STRAGGLER:
        assert a.verdict is not None and a.verdict.rank == 1


def test_verdict_status_has_no_nan() -> None:
    v = Verdict("X", INFO, "s", {"a": math.nan, "b": 1.0})
    assert v.to_status()["evidence"] == {"b": 1.0}


def _names(seq: Sequence[Verdict]) -> list[str]:
    return [v.verdict for v in seq]


def test_priority_lists_the_others_in_evidence() -> None:
    job = Job([RankSim(0, 0, reserved=79 * GIB, uuid="GPU-a")], [GPUSim(0, "GPU-a")])
    job.ranks[0].phases["data_wait"] = 0.2
    a = run(job)
    assert _names(a.candidates) == [INPUT_BOUND, MEMORY_PRESSURE]
    assert a.verdict is not None and a.verdict.evidence["alsoDetected"] == MEMORY_PRESSURE
