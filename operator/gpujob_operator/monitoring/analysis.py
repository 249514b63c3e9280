"""From a window of scrapes to progress, ETA and bottleneck verdict candidates (pure).

Everything here is arithmetic on the window's rows: no clocks, no I/O. `analyze()` returns
the progress and GPU summary in the status' camelCase shape, and the verdict candidates
with the numbers behind them; `verdicts.py` then applies hysteresis before publication.

Choices worth knowing:
- progress `step` is the minimum over ranks: the step every rank has completed (in DDP the
  ranks move in lockstep, so it differs from rank 0 by at most one);
- throughput sums the ranks' rates: in DDP each rank counts only its own samples;
- the ETA divides the remaining steps by an EWMA of the recent step rate, so one slow
  scrape interval does not swing it;
- a rank's *own* time is its whole step minus its waits (data_wait, exposed comm_wait) and
  minus checkpoint and eval: forward/backward/optimizer plus everything the loop does
  around them (a loss head outside the model, augmentation on the GPU, metrics, clipping).
  Straggler compares the slowest rank's own time with the other ranks' median, so a rank
  that is slow anywhere in its step is named; the asymmetry it leaves (the others wait in
  all-reduce, it hardly waits) is published as evidence;
- exposed communication is judged on the rank that waits least for it (the critical
  path): the part of the others' wait that one slower rank explains never counts, so
  CommunicationBound means the wait is there on every rank (symmetric);
- data and comm ratios are shares of *training* time (step time minus checkpoint and
  eval), so a job that also checkpoints is judged on its steps; checkpoint and eval have
  verdicts of their own, as shares of the whole time between steps;
- Stalled means hung, not slow: no step for the threshold *and* no rank busy. Before the first
  step the threshold is the start-up timeout; after the last step there is no stall; a rank
  that changed phase within the threshold (its heartbeat moved) or sits in a checkpoint or an
  evaluation (up to the busy timeout) is busy. The heartbeat is timed by the operator's own
  clock (when it saw the value change), so clock skew between nodes does not matter.
"""

from __future__ import annotations

import math
import statistics
from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any, Final

from gpujob_operator import api
from gpujob_operator.api import conditions as c
from gpujob_operator.api.conditions import format_time
from gpujob_operator.api.display import format_duration
from gpujob_operator.monitoring.window import (
    G_ECC,
    G_MEM_TOTAL,
    G_MEM_USED,
    G_T,
    G_THROTTLE,
    G_UTIL,
    G_XID,
    R_COMPUTE,
    R_CUDA_OOMS,
    R_CUDA_RESERVED,
    R_CUDA_RETRIES,
    R_CURRENT_PHASE,
    R_EPOCH,
    R_LAST_STEP,
    R_LOSS,
    R_PHASE,
    R_SAMPLES,
    R_STEP_COUNT,
    R_STEP_SUM,
    R_STEPS,
    R_T,
    R_TARGET,
    R_TOKENS,
    RankSeries,
    Window,
    increase,
    latest,
    rate,
    throttle_reasons,
)
from gpujob_trainer import contract

# ---- verdicts ------------------------------------------------------------------------------
HEALTHY: Final = "Healthy"
INPUT_BOUND: Final = "InputBound"
COMMUNICATION_BOUND: Final = "CommunicationBound"
STRAGGLER: Final = "Straggler"
CHECKPOINT_BOUND: Final = "CheckpointBound"
EVAL_BOUND: Final = "EvalBound"
MEMORY_PRESSURE: Final = "MemoryPressure"
GPU_UNDERUTILIZED: Final = "GPUUnderutilized"
THROTTLED: Final = "Throttled"
STALLED: Final = "Stalled"
HARDWARE_FAULT: Final = "HardwareFault"

PRIORITY: Final = (
    HARDWARE_FAULT,
    STALLED,
    STRAGGLER,
    INPUT_BOUND,
    CHECKPOINT_BOUND,
    EVAL_BOUND,
    COMMUNICATION_BOUND,
    MEMORY_PRESSURE,
    THROTTLED,
    GPU_UNDERUTILIZED,
)
"""When several hold, the first is published (the others are listed in its evidence)."""
VERDICTS: Final = (*PRIORITY, HEALTHY)

INFO: Final = "Info"
WARNING: Final = "Warning"
CRITICAL: Final = "Critical"

ADVICE: Final = {
    INPUT_BOUND: "Feed the GPUs faster: more DataLoader workers, pin_memory=True, a larger "
    "prefetch_factor, cache or pre-process the dataset.",
    COMMUNICATION_BOUND: "Overlap or shrink gradient traffic: tune DDP bucket_cap_mb, "
    "accumulate gradients under no_sync(), compress gradients, check the network (NCCL "
    "transport, NIC, topology).",
    STRAGGLER: "One rank takes longer for its own part of the step and everyone waits for it "
    "in all-reduce: check its GPU (clocks, errors) and its node (CPU, noisy neighbours), "
    "uneven batch or sequence sizes, and rank-specific work in the loop (loss, augmentation, "
    "metrics, logging on one rank).",
    CHECKPOINT_BOUND: "Checkpoint less often or faster: save asynchronously "
    "(torch.distributed.checkpoint async_save) or sharded across ranks instead of from "
    "rank 0, write to faster storage, and lengthen the checkpoint interval.",
    EVAL_BOUND: "Evaluate less often or on fewer batches (a fixed eval subset), run "
    "evaluation under torch.no_grad()/inference_mode with a larger batch, or move it to a "
    "separate job on saved checkpoints.",
    MEMORY_PRESSURE: "Relieve GPU memory: activation checkpointing, mixed precision (AMP), "
    "a smaller micro-batch with gradient accumulation.",
    GPU_UNDERUTILIZED: "Give the GPU more work per launch: a bigger batch, CUDA graphs or "
    "torch.compile, and remove host synchronisations (.item(), .cpu()) from the step.",
    THROTTLED: "Infrastructure: the GPU runs below its clocks (power cap, cooling or a "
    "hardware slowdown); check power limits and cooling of the node.",
    STALLED: "No rank finishes steps: look for a hang (NCCL watchdog, a dead or blocked "
    "rank, a deadlocked DataLoader); runPolicy.restartOnStall can restart the gang.",
    HARDWARE_FAULT: "The GPU reported an XID or uncorrected ECC error: drain the node and "
    "restart the job elsewhere.",
    HEALTHY: "",
}

STALL_STEP_FACTOR: Final = 10.0
"""Stalled after max(this x the median step time, stallTimeoutSeconds) without a step."""
EWMA_ALPHA: Final = 0.3
"""Weight of the newest scrape interval in the smoothed step rate."""
MEMORY_CRITICAL_RATIO: Final = 0.98
MAX_ETA_SECONDS: Final = 100 * 365 * 86400.0
"""No estimated completion date beyond a century (a datetime ends at year 9999)."""


@dataclass(frozen=True)
class Settings:
    """What the analysis needs from the job's spec (defaults are the API's)."""

    total_steps: int | None = None
    warmup_steps: int = 20
    min_scrapes: int = 3
    window_seconds: float = 120.0
    scrape_interval_seconds: float = 15.0
    stall_timeout_seconds: float = 300.0
    startup_timeout_seconds: float = 1800.0
    busy_timeout_seconds: float = 1800.0
    hysteresis_windows: int = 3
    gpus_requested: int | None = None
    thresholds: api.Thresholds = field(default_factory=api.Thresholds)

    @classmethod
    def from_spec(cls, spec: api.GPUTrainingJobSpec | Mapping[str, Any]) -> Settings:
        """Settings of a job spec (a model or its camelCase dict)."""
        s = api.parse_spec(spec)
        return cls.from_monitoring(s.monitoring, s.training.total_steps, s.total_gpus or None)

    @classmethod
    def from_monitoring(
        cls, m: api.Monitoring, total_steps: int | None = None, gpus: int | None = None
    ) -> Settings:
        """Settings of a spec's `monitoring` section (`gpujob diagnose` starts from one)."""
        return cls(
            total_steps=total_steps,
            warmup_steps=m.warmup_steps,
            min_scrapes=m.window.min_scrapes,
            window_seconds=float(m.window.duration_seconds),
            scrape_interval_seconds=float(m.scrape_interval_seconds),
            stall_timeout_seconds=float(m.stall_timeout_seconds),
            startup_timeout_seconds=float(m.startup_timeout_seconds),
            busy_timeout_seconds=float(m.busy_timeout_seconds),
            hysteresis_windows=m.hysteresis_windows,
            gpus_requested=gpus,
            thresholds=m.thresholds,
        )

    def max_points(self) -> int:
        """Rows a window keeps per series: the window's scrapes plus one for the deltas."""
        return (
            max(self.min_scrapes, math.ceil(self.window_seconds / self.scrape_interval_seconds)) + 1
        )


Evidence = dict[str, float | int | str]

BREAKDOWN_WORST: Final = 3
"""Slowest ranks listed in status.bottleneck.breakdown (plus the median and the fastest)."""


@dataclass(frozen=True, slots=True)
class RankTimes:
    """One rank's phase seconds summed over the window (counter increases)."""

    rank: int
    pod: str
    node: str
    steps: float
    step: float
    uuid: str = ""
    data_wait: float = 0.0
    comm_wait: float = 0.0
    checkpoint: float = 0.0
    eval: float = 0.0
    compute: float = 0.0
    run_step: float = 0.0
    """Cumulative totals since the rank (re)started: a checkpoint every hour is judged on
    the run, not on whether the last few minutes happened to contain one."""
    run_checkpoint: float = 0.0
    run_eval: float = 0.0

    @property
    def training(self) -> float:
        """Step time spent training: everything but checkpoint and eval."""
        return max(0.0, self.step - self.checkpoint - self.eval)

    @property
    def own(self) -> float:
        """Training time minus the waits: the rank's own work, wherever in the step."""
        return max(0.0, self.training - self.data_wait - self.comm_wait)

    def per_step(self, seconds: float) -> float:
        return seconds / self.steps


@dataclass(frozen=True, slots=True)
class RankBreakdown:
    """Mean seconds per step of one rank, split the way the verdicts reason about it."""

    rank: int
    pod: str
    node: str
    role: str
    """slowest, median or fastest by own time (the slowest few are all `slowest`)."""
    step: float
    own: float
    compute: float
    data_wait: float
    comm_wait: float
    checkpoint: float
    eval: float

    @classmethod
    def of(cls, t: RankTimes, role: str) -> RankBreakdown:
        return cls(
            t.rank,
            t.pod,
            t.node,
            role,
            *(
                _r(t.per_step(v))
                for v in (t.step, t.own, t.compute, t.data_wait, t.comm_wait, t.checkpoint, t.eval)
            ),
        )

    def to_status(self) -> dict[str, Any]:
        """camelCase dict matching api.RankBreakdown."""
        out: dict[str, Any] = {"rank": self.rank, "role": self.role}
        if self.pod:
            out["pod"] = self.pod
        if self.node:
            out["node"] = self.node
        other = max(0.0, self.own - self.compute)
        for key, value in (
            ("stepSeconds", self.step),
            ("ownSeconds", self.own),
            ("computeSeconds", self.compute),
            ("otherSeconds", _r(other)),
            ("dataWaitSeconds", self.data_wait),
            ("commWaitSeconds", self.comm_wait),
            ("checkpointSeconds", self.checkpoint),
            ("evalSeconds", self.eval),
        ):
            if math.isfinite(value):
                out[key] = value
        return out


@dataclass(frozen=True)
class Verdict:
    """A verdict with its numbers; `to_status()` gives the status.bottleneck dict."""

    verdict: str
    severity: str
    summary: str
    evidence: Evidence = field(default_factory=dict)
    advice: str = ""
    rank: int | None = None
    pod: str | None = None
    node: str | None = None
    gpu_uuid: str | None = None
    breakdown: tuple[RankBreakdown, ...] = ()
    """Per-step time split of a few ranks (the slowest, the median, the fastest)."""

    def to_status(self, since: float | None = None) -> dict[str, Any]:
        """camelCase dict matching api.Bottleneck (None fields omitted)."""
        out: dict[str, Any] = {
            "verdict": self.verdict,
            "severity": self.severity,
            "summary": self.summary,
            "evidence": _clean(self.evidence),
        }
        if self.breakdown:
            out["breakdown"] = [b.to_status() for b in self.breakdown]
        if self.advice:
            out["advice"] = self.advice
        for key, value in (
            ("rank", self.rank),
            ("pod", self.pod),
            ("node", self.node),
            ("gpuUUID", self.gpu_uuid),
        ):
            if value is not None and value != "":
                out[key] = value
        if since is not None:
            out["since"] = _iso(since)
        return out


@dataclass(frozen=True)
class Analysis:
    """The outcome of one evaluation of a job's window."""

    progress: dict[str, Any]
    """camelCase, matching api.Progress; empty when no rank was scraped yet."""
    gpus: dict[str, Any]
    """camelCase, matching api.GPUSummary."""
    verdict: Verdict | None
    """The top candidate, Healthy when none, None while warming up (no evaluation)."""
    candidates: tuple[Verdict, ...] = ()
    """Every verdict that holds now, in PRIORITY order."""
    ready: bool = False
    """Enough post-warm-up scrapes for the ratio verdicts."""
    not_ready_reason: str = ""
    stalled_for: float | None = None
    """Seconds since the last step anywhere (None before any rank was seen)."""
    stall_threshold: float | None = None
    stall_reason: str = c.PROGRESSING
    """Why there is no stall (a `conditions` reason: Progressing, StartingUp, RanksBusy,
    RanksFinished), or StallDetected."""
    stall_note: str = ""
    """The Stalled condition's message: what the ranks are doing, or why they look hung."""
    throttled_gpus: int = 0
    step_rate: float | None = None
    """Smoothed job steps per second."""
    missing_ranks: tuple[tuple[int, str], ...] = ()
    """(rank, pod) of the ranks whose newest row is older than the window: they do not
    speak for the present (progress and throughput come from the others)."""


# ---- entry point -----------------------------------------------------------------------------


def analyze(window: Window, settings: Settings, now: float) -> Analysis:
    """Progress, GPU summary and verdict candidates of a job's window at time `now`."""
    every = list(window.ranks.values())
    series = [s for s in every if s.rows and now - s.rows[-1][R_T] <= settings.window_seconds]
    missing = tuple(sorted((s.rank, s.pod) for s in every if not s.rows or s not in series))
    if not series:
        stall, stalled_for, threshold, stall_reason, stall_note = (
            _stall(window, every, settings, now) if every else (None, None, None, c.PROGRESSING, "")
        )
        return Analysis(
            {},
            _gpu_summary(window, settings, None),
            stall,
            candidates=(stall,) if stall is not None else (),
            not_ready_reason="no rank answered within the window"
            if every
            else "no rank scraped yet",
            stalled_for=stalled_for,
            stall_threshold=threshold,
            stall_reason=stall_reason,
            stall_note=stall_note,
            missing_ranks=missing,
        )
    th = settings.thresholds
    ready_rows = {(s.pod, s.rank): _post_warmup(s.rows, settings.warmup_steps) for s in series}
    ready = {k: r for k, r in ready_rows.items() if len(r) >= settings.min_scrapes}
    warm_t = min((r[0][R_T] for r in ready.values()), default=None)

    step_rate = _step_rate(series, ready_rows)
    progress = _progress(series, ready_rows, settings, now, step_rate)
    gpus = _gpu_summary(window, settings, warm_t)

    candidates: list[Verdict] = []
    notes: list[str] = []
    evidence: Evidence = {}

    hw = _hardware_fault(window)
    if hw is not None:
        candidates.append(hw)
    stall, stalled_for, threshold, stall_reason, stall_note = _stall(window, every, settings, now)
    if stall is not None:
        candidates.append(stall)

    throttled_count = 0
    breakdown: tuple[RankBreakdown, ...] = ()
    if ready and stall is None:
        per = {}
        for k, rows in ready.items():
            t = _rank_times(window.ranks[k], rows)
            if t is not None:
                per[k] = t
        if per:
            breakdown = _breakdown(per)
            training = sum(t.training for t in per.values())
            data_ratio = (
                sum(t.data_wait for t in per.values()) / training if training > 0 else math.nan
            )
            comm = {k: t.comm_wait / t.training for k, t in per.items() if t.training > 0}
            evidence["dataWaitRatio"] = _r(data_ratio)
            if comm:
                evidence["commWaitRatio"] = _r(min(comm.values()))
            evidence["stepSeconds"] = _r(
                sum(t.step for t in per.values()) / sum(t.steps for t in per.values())
            )
            strag = _straggler(per, th.straggler_score)
            if strag is not None:
                candidates.append(strag)
            elif len(per) > 1:
                score = _own_score(per)
                if score is not None:
                    evidence["stragglerScore"] = _r(score[0])
            if data_ratio > th.input_bound_ratio:
                candidates.append(_input_bound(data_ratio, per, th))
            elif data_ratio > th.input_warn_ratio:
                notes.append(_input_text(data_ratio, th))
            for phase_bound in (
                _phase_bound(per, CHECKPOINT_BOUND, th.checkpoint_bound_ratio),
                _phase_bound(per, EVAL_BOUND, th.eval_bound_ratio),
            ):
                if phase_bound is not None:
                    candidates.append(phase_bound)
            if comm:
                exposed = min(comm.values())
                if exposed > th.comm_bound_ratio:
                    candidates.append(_comm_bound(exposed, comm, per, th))
        mem = _memory_pressure(window, ready, th.memory_pressure_ratio)
        if mem is not None:
            candidates.append(mem)
        thr, throttled_count = _throttled(window, warm_t, settings.min_scrapes)
        if thr is not None:
            candidates.append(thr)
        if not candidates:
            under = _underutilized(window, warm_t, th.gpu_underutilized_ratio)
            if under is not None:
                candidates.append(under)

    candidates.sort(key=lambda v: PRIORITY.index(v.verdict))
    verdict: Verdict | None
    if candidates:
        top = candidates[0]
        if len(candidates) > 1:
            also = ",".join(c.verdict for c in candidates[1:])
            top = replace(top, evidence={**top.evidence, "alsoDetected": also})
        verdict = replace(top, breakdown=breakdown) if breakdown else top
    elif ready:
        summary = "no bottleneck"
        numbers = ", ".join(
            f"{label} {_pct(float(evidence[key]))}"
            for key, label in (("dataWaitRatio", "data wait"), ("commWaitRatio", "comm wait"))
            if key in evidence and not math.isnan(float(evidence[key]))
        )
        if numbers:
            summary += f" ({numbers} of step time)"
        if notes:
            summary += "; note: " + "; ".join(notes)
        verdict = Verdict(HEALTHY, INFO, summary, _clean(evidence), breakdown=breakdown)
    else:
        verdict = None

    reason = ""
    if not ready:
        reason = (
            f"warming up: waiting for {settings.min_scrapes} scrapes after step "
            f"{settings.warmup_steps}"
        )
    return Analysis(
        progress=progress,
        gpus=gpus,
        verdict=verdict,
        candidates=tuple(candidates),
        ready=bool(ready),
        not_ready_reason=reason,
        stalled_for=stalled_for,
        stall_threshold=threshold,
        stall_reason=stall_reason,
        stall_note=stall_note,
        throttled_gpus=throttled_count,
        step_rate=step_rate,
        missing_ranks=missing,
    )


# ---- helpers: rows -----------------------------------------------------------------------


def _post_warmup(rows: Sequence[array[float]], warmup_steps: int) -> list[array[float]]:
    """Rows from the first one at or past the warm-up steps, cut at a restart below it."""
    out: list[array[float]] = []
    for row in rows:
        steps = row[R_STEPS]
        if math.isnan(steps) or steps < warmup_steps:
            out = []  # before warm-up ends, or a restarted rank warming up again
            continue
        out.append(row)
    return out


def _rank_times(series: RankSeries, rows: Sequence[array[float]]) -> RankTimes | None:
    """Per-rank increases over rows; None when no step was attributed in between."""
    count = increase(rows, R_STEP_COUNT)
    step_sum = increase(rows, R_STEP_SUM)
    if math.isnan(count) or count < 1 or math.isnan(step_sum) or step_sum <= 0:
        return None

    def inc(index: int) -> float:
        v = increase(rows, index)
        return 0.0 if math.isnan(v) else max(0.0, v)

    return RankTimes(
        rank=series.rank,
        pod=series.pod,
        node=series.node,
        steps=count,
        step=step_sum,
        uuid=series.uuid,
        data_wait=inc(R_PHASE[contract.PHASE_DATA_WAIT]),
        comm_wait=inc(R_PHASE[contract.PHASE_COMM_WAIT]),
        checkpoint=inc(R_PHASE[contract.PHASE_CHECKPOINT]),
        eval=inc(R_PHASE[contract.PHASE_EVAL]),
        compute=inc(R_COMPUTE),
        run_step=_total(rows, R_STEP_SUM),
        run_checkpoint=_total(rows, R_PHASE[contract.PHASE_CHECKPOINT]),
        run_eval=_total(rows, R_PHASE[contract.PHASE_EVAL]),
    )


def _total(rows: Sequence[array[float]], index: int) -> float:
    v = latest(rows, index)
    return 0.0 if math.isnan(v) else max(0.0, v)


def _breakdown(per: Mapping[Any, RankTimes]) -> tuple[RankBreakdown, ...]:
    """The slowest few ranks by own time, the median one and the fastest (bounded)."""
    order = sorted(per.values(), key=lambda t: (-t.per_step(t.own), t.rank))
    roles: dict[int, str] = {len(order) - 1: "fastest", 0: "slowest"}
    roles.setdefault(len(order) // 2, "median")
    for i in range(1, min(BREAKDOWN_WORST, len(order))):
        roles.setdefault(i, "slowest")
    chosen = [(order[i], role) for i, role in sorted(roles.items())]
    return tuple(RankBreakdown.of(t, role) for t, role in chosen)


def _ewma_rate(rows: Sequence[array[float]]) -> float:
    """EWMA of the step rate over successive scrape intervals (resets count from 0)."""
    est = math.nan
    prev: array[float] | None = None
    for row in rows:
        if math.isnan(row[R_STEPS]):
            continue
        if prev is not None and row[R_T] > prev[R_T]:
            d = row[R_STEPS] - prev[R_STEPS]
            d = d if d >= 0 else row[R_STEPS]
            r = d / (row[R_T] - prev[R_T])
            est = r if math.isnan(est) else EWMA_ALPHA * r + (1 - EWMA_ALPHA) * est
        prev = row
    return est


def _step_rate(
    series: Sequence[RankSeries], ready_rows: dict[Any, list[array[float]]]
) -> float | None:
    rates = []
    for s in series:
        rows = ready_rows.get((s.pod, s.rank)) or []
        r = _ewma_rate(rows if len(rows) >= 2 else s.rows)
        if not math.isnan(r):
            rates.append(r)
    return statistics.median(rates) if rates else None


def _progress(
    series: Sequence[RankSeries],
    ready_rows: dict[Any, list[array[float]]],
    settings: Settings,
    now: float,
    step_rate: float | None,
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    steps = [v for s in series if not math.isnan(v := latest(s.rows, R_STEPS))]
    if not steps:
        return out
    step = int(min(steps))
    out["step"] = step
    targets = [v for s in series if not math.isnan(v := latest(s.rows, R_TARGET)) and v > 0]
    total = int(max(targets)) if targets else settings.total_steps
    if total:
        out["totalSteps"] = total
        out["percent"] = round(min(100.0, 100.0 * step / total), 2)
    epochs = [v for s in series if not math.isnan(v := latest(s.rows, R_EPOCH))]
    if epochs:
        out["epoch"] = max(epochs)

    def throughput(index: int) -> float | None:
        vals = []
        for s in series:
            rows = ready_rows.get((s.pod, s.rank)) or []
            r = rate(rows if len(rows) >= 2 else s.rows, index)
            if not math.isnan(r):
                vals.append(r)
        return round(sum(vals), 3) if vals else None

    sps = throughput(R_SAMPLES)
    if sps is not None:
        out["samplesPerSecond"] = sps
    tps = throughput(R_TOKENS)
    if tps is not None:
        out["tokensPerSecond"] = tps
    if total and step_rate is not None and step_rate > 0:
        eta = max(0.0, (total - step) / step_rate)
        out["etaSeconds"] = round(eta, 1)
        if eta <= MAX_ETA_SECONDS:  # beyond, a date means nothing (and may not exist)
            out["estimatedCompletionTime"] = _iso(now + eta)
    elif total and step >= total:
        out["etaSeconds"] = 0.0
    last = [v for s in series if not math.isnan(v := latest(s.rows, R_LAST_STEP)) and v > 0]
    if last:
        out["lastStepTime"] = _iso(max(last))
    losses = [v for s in series if math.isfinite(v := latest(s.rows, R_LOSS))]
    if losses:
        out["loss"] = round(statistics.fmean(losses), 6)
    return out


# ---- helpers: verdicts ----------------------------------------------------------------------


def _input_text(ratio: float, th: api.Thresholds) -> str:
    return (
        f"data loading takes {_pct(ratio)} of step time "
        f"(warn > {_pct(th.input_warn_ratio)}, bound > {_pct(th.input_bound_ratio)})"
    )


def _input_bound(ratio: float, per: Mapping[Any, RankTimes], th: api.Thresholds) -> Verdict:
    worst = max(per.values(), key=lambda t: t.data_wait / t.training if t.training > 0 else 0.0)
    ev: Evidence = {
        "dataWaitRatio": _r(ratio),
        "maxRankDataWaitRatio": _r(worst.data_wait / worst.training if worst.training else 0.0),
        "maxRank": worst.rank,
        "boundRatio": th.input_bound_ratio,
        "warnRatio": th.input_warn_ratio,
    }
    return Verdict(INPUT_BOUND, WARNING, _input_text(ratio, th), ev, ADVICE[INPUT_BOUND])


def _comm_bound(
    exposed: float, comm: Mapping[Any, float], per: Mapping[Any, RankTimes], th: api.Thresholds
) -> Verdict:
    mean = statistics.fmean(comm.values())
    waits = [t.per_step(t.comm_wait) for t in per.values()]
    symmetry = min(waits) / max(waits) if max(waits) > 0 else 1.0
    summary = (
        f"exposed communication takes {_pct(exposed)} of step time even on the rank that "
        f"waits least (mean {_pct(mean)}; bound > {_pct(th.comm_bound_ratio)}): every rank "
        "waits, so no slower rank explains it"
    )
    ev: Evidence = {
        "commWaitRatio": _r(exposed),
        "meanCommWaitRatio": _r(mean),
        "commWaitSymmetry": _r(symmetry),
        "boundRatio": th.comm_bound_ratio,
    }
    return Verdict(COMMUNICATION_BOUND, WARNING, summary, ev, ADVICE[COMMUNICATION_BOUND])


def _named(t: RankTimes) -> dict[str, Any]:
    """The Verdict fields that name one rank: rank, pod, node and GPU UUID (when known)."""
    return {"rank": t.rank, "pod": t.pod, "node": t.node or None, "gpu_uuid": t.uuid or None}


def _own_score(per: Mapping[Any, RankTimes]) -> tuple[float, RankTimes, list[RankTimes]] | None:
    """(the others' median own time / the slowest rank's, the slowest, the others)."""
    if len(per) < 2:
        return None
    slowest = max(per.values(), key=lambda t: (t.per_step(t.own), -t.rank))
    slow = slowest.per_step(slowest.own)
    if slow <= 0:
        return None
    others = [t for t in per.values() if t is not slowest]
    typical = statistics.median(t.per_step(t.own) for t in others)
    return typical / slow, slowest, others


def _straggler(per: Mapping[Any, RankTimes], bound: float) -> Verdict | None:
    scored = _own_score(per)
    if scored is None:
        return None
    score, s, others = scored
    if score >= bound:
        return None
    slow_own = s.per_step(s.own)
    typical_own = statistics.median(t.per_step(t.own) for t in others)
    typical_compute = statistics.median(t.per_step(t.compute) for t in others)
    others_wait = statistics.median(t.per_step(t.comm_wait) for t in others)
    own_wait = s.per_step(s.comm_wait)
    gap = slow_own - typical_own
    compute_gap = s.per_step(s.compute) - typical_compute
    outside = gap > 0 and compute_gap < gap / 2
    where = (
        "mostly outside forward/backward/optimizer (loss, preprocessing, metrics, logging…)"
        if outside
        else "mostly in forward/backward/optimizer"
    )
    summary = (
        f"rank {s.rank} (pod {s.pod}) takes {slow_own / typical_own if typical_own > 0 else math.inf:.1f}x "
        f"as long for its own work per step as the other ranks' median "
        f"({slow_own:.3g}s vs {typical_own:.3g}s; {where}): score {score:.2f} "
        f"(bound < {bound:.2f}); the others wait {others_wait:.3g}s per step for it in "
        f"all-reduce, it waits {own_wait:.3g}s"
    )
    ev: Evidence = {
        "stragglerScore": _r(score),
        "ownSecondsPerStep": _r(slow_own),
        "othersOwnSecondsPerStep": _r(typical_own),
        "computeSecondsPerStep": _r(s.per_step(s.compute)),
        "othersComputeSecondsPerStep": _r(typical_compute),
        "commWaitSecondsPerStep": _r(own_wait),
        "othersCommWaitSecondsPerStep": _r(others_wait),
        "othersCommWaitRatio": _r(
            statistics.median(t.comm_wait / t.training for t in others if t.training > 0)
        )
        if any(t.training > 0 for t in others)
        else 0.0,
        "gapOutsideCompute": "true" if outside else "false",
        "boundScore": bound,
    }
    if gap > 0:
        # In lockstep DDP the others' extra wait matches the straggler's extra work.
        ev["waitExplainedRatio"] = _r(max(0.0, others_wait - own_wait) / gap)
    return Verdict(
        STRAGGLER,
        WARNING,
        summary,
        ev,
        ADVICE[STRAGGLER],
        **_named(s),
    )


_PHASE_OF: Final = {CHECKPOINT_BOUND: "checkpoint", EVAL_BOUND: "eval"}
_PHASE_WORDS: Final = {CHECKPOINT_BOUND: "checkpointing", EVAL_BOUND: "evaluation"}


def _phase_bound(per: Mapping[Any, RankTimes], verdict: str, bound: float) -> Verdict | None:
    """CheckpointBound/EvalBound: that phase's share of the time between steps.

    The share is taken over the rank's whole run (its cumulative counters), since both come
    in bursts that a short window may or may not contain, and on the rank that spends most
    in it: when rank 0 alone saves, the others wait for it in their next all-reduce, so the
    whole gang loses that share.
    """
    attr = _PHASE_OF[verdict]

    def share(t: RankTimes) -> float:
        if t.run_step > 0:
            return getattr(t, "run_" + attr) / t.run_step
        return getattr(t, attr) / t.step if t.step > 0 else 0.0

    shares = {k: share(t) for k, t in per.items()}
    if not shares:
        return None
    worst_key = max(shares, key=lambda k: shares[k])
    worst = shares[worst_key]
    if worst <= bound:
        return None
    t = per[worst_key]
    others = [v for k, v in shares.items() if k != worst_key]
    median = statistics.median(others) if others else worst
    one_rank = bool(others) and median < worst / 2
    window_share = getattr(t, attr) / t.step if t.step > 0 else 0.0
    who = f" on rank {t.rank} (pod {t.pod}), the others waiting for it" if one_rank else ""
    summary = (
        f"{_PHASE_WORDS[verdict]} takes {_pct(worst)} of the time between steps{who} since "
        f"the rank started ({_pct(window_share)} in the window; bound > {_pct(bound)})"
    )
    cap = attr[0].upper() + attr[1:]
    ev: Evidence = {
        f"{attr}Ratio": _r(worst),
        f"others{cap}Ratio": _r(median),
        f"window{cap}Ratio": _r(window_share),
        f"{attr}SecondsPerStep": _r(t.per_step(getattr(t, attr))),
        "maxRank": t.rank,
        "boundRatio": bound,
    }
    return Verdict(
        verdict,
        WARNING,
        summary,
        ev,
        ADVICE[verdict],
        **(_named(t) if one_rank else {}),
    )


def _memory_pressure(
    window: Window, ready: dict[Any, list[array[float]]], bound: float
) -> Verdict | None:
    totals = {g.uuid: latest(g.rows, G_MEM_TOTAL) for g in window.gpus.values() if g.uuid}
    worst: tuple[float, RankSeries] | None = None
    retries = 0.0
    ooms = 0.0
    for key, rows in ready.items():
        s = window.ranks[key]
        reserved = latest(rows, R_CUDA_RESERVED)
        total = totals.get(s.uuid, math.nan)
        if not math.isnan(reserved) and total > 0:
            ratio = reserved / total
            if worst is None or ratio > worst[0]:
                worst = (ratio, s)
        r = increase(rows, R_CUDA_RETRIES)
        retries += 0.0 if math.isnan(r) else r
        o = increase(rows, R_CUDA_OOMS)
        ooms += 0.0 if math.isnan(o) else o
    used_ratio = math.nan
    used_gpu = None
    for g in window.gpus.values():
        used, total = latest(g.rows, G_MEM_USED), latest(g.rows, G_MEM_TOTAL)
        if (
            total > 0
            and not math.isnan(used)
            and (math.isnan(used_ratio) or used / total > used_ratio)
        ):
            used_ratio, used_gpu = used / total, g
    ratio = worst[0] if worst is not None else math.nan
    high = (not math.isnan(ratio) and ratio > bound) or (
        worst is None and not math.isnan(used_ratio) and used_ratio > bound
    )
    if not high and retries <= 0 and ooms <= 0:
        return None
    parts = []
    if not math.isnan(ratio):
        parts.append(f"the caching allocator holds {_pct(ratio)} of GPU memory")
    elif not math.isnan(used_ratio):
        parts.append(f"GPU memory is {_pct(used_ratio)} used")
    if retries > 0:
        parts.append(f"{retries:.0f} allocation retries in the window")
    if ooms > 0:
        parts.append(f"{ooms:.0f} out-of-memory errors")
    where = ""
    if worst is not None:
        where = f" on rank {worst[1].rank} (pod {worst[1].pod})"
    summary = "; ".join(parts) + where + f" (bound > {_pct(bound)}, retries > 0)"
    ev: Evidence = {"allocRetries": retries, "ooms": ooms, "boundRatio": bound}
    if not math.isnan(ratio):
        ev["reservedRatio"] = _r(ratio)
    if not math.isnan(used_ratio):
        ev["maxMemoryUsedRatio"] = _r(used_ratio)
    severity = (
        CRITICAL
        if ooms > 0 or (not math.isnan(ratio) and ratio > MEMORY_CRITICAL_RATIO)
        else WARNING
    )
    rs = worst[1] if worst is not None else None
    return Verdict(
        MEMORY_PRESSURE,
        severity,
        summary,
        ev,
        ADVICE[MEMORY_PRESSURE],
        rank=rs.rank if rs else None,
        pod=rs.pod if rs else (used_gpu.pod if used_gpu else None),
        node=(rs.node if rs else (used_gpu.node if used_gpu else None)) or None,
        gpu_uuid=(rs.uuid if rs else (used_gpu.uuid if used_gpu else None)) or None,
    )


def _gpu_rows(window: Window, warm_t: float | None) -> dict[Any, list[array[float]]]:
    return {
        k: [r for r in g.rows if warm_t is None or r[G_T] >= warm_t] for k, g in window.gpus.items()
    }


def _throttled(
    window: Window, warm_t: float | None, min_scrapes: int
) -> tuple[Verdict | None, int]:
    hits = []
    for key, rows in _gpu_rows(window, warm_t).items():
        if len(rows) < min_scrapes:
            continue
        masks = [r[G_THROTTLE] for r in rows]
        if any(math.isnan(m) or int(m) == 0 for m in masks):
            continue
        union = 0
        for m in masks:
            union |= int(m)
        hits.append((window.gpus[key], throttle_reasons(float(union))))
    if not hits:
        return None, 0
    g, reasons = hits[0]
    summary = (
        f"{len(hits)} GPU(s) throttled throughout the window, e.g. GPU {g.gpu} ({g.uuid}) on "
        f"{g.node or g.pod} by {', '.join(reasons)}"
    )
    ev: Evidence = {"throttledGPUs": len(hits), "reasons": ",".join(reasons), "gpu": g.gpu}
    verdict = Verdict(
        THROTTLED,
        WARNING,
        summary,
        ev,
        ADVICE[THROTTLED],
        pod=g.pod,
        node=g.node or None,
        gpu_uuid=g.uuid or None,
    )
    return verdict, len(hits)


def _underutilized(window: Window, warm_t: float | None, bound: float) -> Verdict | None:
    utils = [
        r[G_UTIL]
        for rows in _gpu_rows(window, warm_t).values()
        for r in rows
        if not math.isnan(r[G_UTIL])
    ]
    if not utils:
        return None
    p50 = statistics.median(utils)
    if p50 >= bound:
        return None
    summary = (
        f"median GPU utilization is {_pct(p50)} (bound < {_pct(bound)}) with no input, "
        "communication, straggler or memory bottleneck"
    )
    ev: Evidence = {"p50UtilizationRatio": _r(p50), "boundRatio": bound, "samples": len(utils)}
    return Verdict(GPU_UNDERUTILIZED, WARNING, summary, ev, ADVICE[GPU_UNDERUTILIZED])


def _hardware_fault(window: Window) -> Verdict | None:
    for g in window.gpus.values():
        xid = increase(g.rows, G_XID)
        ecc = increase(g.rows, G_ECC)
        xid = 0.0 if math.isnan(xid) else xid
        ecc = 0.0 if math.isnan(ecc) else ecc
        if xid > 0 or ecc > 0:
            summary = (
                f"GPU {g.gpu} ({g.uuid}) on {g.node or g.pod}: {xid:.0f} new XID error(s), "
                f"{ecc:.0f} new uncorrected ECC error(s) in the window"
            )
            ev: Evidence = {"xidErrors": xid, "eccUncorrectedErrors": ecc, "gpu": g.gpu}
            return Verdict(
                HARDWARE_FAULT,
                CRITICAL,
                summary,
                ev,
                ADVICE[HARDWARE_FAULT],
                pod=g.pod,
                node=g.node or None,
                gpu_uuid=g.uuid or None,
            )
    return None


def median_step_seconds(series: Sequence[RankSeries]) -> float | None:
    """Median step time of the run so far, from the ranks' cumulative histograms."""
    bounds = (*contract.STEP_DURATION_BUCKETS, math.inf)
    merged = [0.0] * len(bounds)
    for s in series:
        if s.buckets is None:
            continue
        for i, v in enumerate(s.buckets):
            if not math.isnan(v):
                merged[i] += v
    total = merged[-1]
    if total <= 0:
        return None
    half = total / 2
    prev_bound, prev_count = 0.0, 0.0
    for bound, count in zip(bounds, merged, strict=True):
        if count >= half:
            if math.isinf(bound):
                return prev_bound
            inside = count - prev_count
            frac = (half - prev_count) / inside if inside > 0 else 1.0
            return prev_bound + (bound - prev_bound) * frac
        prev_bound, prev_count = bound, count
    return None


_StallOutcome = tuple[Verdict | None, float | None, float | None, str, str]


def _stall(
    window: Window, series: Sequence[RankSeries], settings: Settings, now: float
) -> _StallOutcome:
    """(Stalled or None, seconds without a step, threshold, condition reason, message)."""
    if math.isnan(window.progress_time):
        return None, None, None, c.PROGRESSING, ""
    steps = {s.rank: latest(s.rows, R_STEPS) for s in series}
    known = [v for v in steps.values() if not math.isnan(v)]
    median = median_step_seconds(series)
    threshold = settings.stall_timeout_seconds
    if median is not None:
        threshold = max(threshold, STALL_STEP_FACTOR * median)
    starting = not known or max(known) <= 0
    if starting:
        threshold = max(threshold, settings.startup_timeout_seconds)
    idle = max(0.0, now - window.progress_time)
    targets = [v for s in series if not math.isnan(v := latest(s.rows, R_TARGET)) and v > 0]
    total = max(targets) if targets else settings.total_steps
    if total and known and min(known) >= total:
        return (
            None,
            idle,
            threshold,
            c.RANKS_FINISHED,
            f"every rank reached the last step {total:.0f}",
        )
    if idle <= threshold:
        if starting:
            note = (
                f"no step yet after {format_duration(idle)} (start-up: compilation, init, data; "
                f"stalled after {format_duration(threshold)})"
            )
            return None, idle, threshold, c.STARTING_UP, note
        note = f"steps advance (stall after {threshold:.0f}s without one)"
        return None, idle, threshold, c.PROGRESSING, note
    busy = _busy_ranks(series, settings, now, threshold)
    if busy:
        note = f"no step for {format_duration(idle)}, but not hung: " + "; ".join(busy)
        return None, idle, threshold, c.RANKS_BUSY, note
    step = int(min(known)) if known else 0  # every step value may have been refused
    behind = min(series, key=lambda s: latest(s.rows, R_STEPS))
    if starting:
        how = f"startup timeout {settings.startup_timeout_seconds:.0f}s"
        what = f"no rank finished a first step in {format_duration(idle)}"
    else:
        how = f"stall timeout {settings.stall_timeout_seconds:.0f}s"
        if median is not None:
            how = f"max({STALL_STEP_FACTOR:.0f} x median step {median:.3g}s, {how})"
        what = f"no rank finished a step for {format_duration(idle)}"
    summary = (
        f"{what} (threshold {format_duration(threshold)} = {how}) and no rank is busy; "
        f"stuck at step {step}"
    )
    ev: Evidence = {
        "secondsSinceLastStep": _r(idle),
        "thresholdSeconds": _r(threshold),
        "step": step,
    }
    if median is not None:
        ev["medianStepSeconds"] = _r(median)
    phases = sorted({p for s in series if (p := _current_phase(s))})
    if phases:
        ev["currentPhases"] = ",".join(phases)
    lagging = len(set(steps.values())) > 1
    verdict = Verdict(
        STALLED,
        CRITICAL,
        summary,
        ev,
        ADVICE[STALLED],
        rank=behind.rank if lagging else None,
        pod=behind.pod if lagging else None,
        node=(behind.node or None) if lagging else None,
    )
    return verdict, idle, threshold, c.STALL_DETECTED, summary


def _current_phase(s: RankSeries) -> str:
    """The phase the rank last said it is in ("" when it does not export one)."""
    index = latest(s.rows, R_CURRENT_PHASE)
    if math.isnan(index) or not 0 <= index < len(contract.PHASES):
        return ""
    return contract.PHASES[int(index)]


def _busy_ranks(
    series: Sequence[RankSeries], settings: Settings, now: float, threshold: float
) -> list[str]:
    """What each busy rank is doing: in a checkpoint or an evaluation for at most the busy
    timeout, or changing phase within the threshold (its heartbeat moved)."""
    out = []
    for s in series:
        if math.isnan(s.beat_since):
            continue
        age = max(0.0, now - s.beat_since)
        phase = _current_phase(s)
        if phase in contract.BUSY_PHASES and age <= max(settings.busy_timeout_seconds, threshold):
            out.append(f"rank {s.rank} is in {phase} for {format_duration(age)}")
        elif age <= threshold:
            where = f" (now {phase})" if phase else ""
            out.append(f"rank {s.rank} changed phase {format_duration(age)} ago{where}")
    return out


def _gpu_summary(window: Window, settings: Settings, warm_t: float | None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if settings.gpus_requested:
        out["requested"] = settings.gpus_requested
    if window.gpus:
        out["observed"] = len(window.gpus)
        rows = _gpu_rows(window, warm_t)
        utils = [r[G_UTIL] for rs in rows.values() for r in rs if not math.isnan(r[G_UTIL])]
        if not utils:  # all rows before warm-up: use what there is
            utils = [
                r[G_UTIL] for g in window.gpus.values() for r in g.rows if not math.isnan(r[G_UTIL])
            ]
        if utils:
            out["meanUtilizationRatio"] = _r(statistics.fmean(utils))
        ratios = []
        for g in window.gpus.values():
            used, total = latest(g.rows, G_MEM_USED), latest(g.rows, G_MEM_TOTAL)
            if total > 0 and not math.isnan(used):
                ratios.append(used / total)
        if ratios:
            out["maxMemoryUsedRatio"] = _r(max(ratios))
        out["telemetry"] = "Available"
    else:
        reasons = sorted({r for r in window.telemetry.values() if r != contract.TELEMETRY_OK})
        why = ", ".join(reasons) if reasons else "no GPU series exported"
        out["observed"] = 0
        out["telemetry"] = f"Unavailable: no GPU telemetry: {why}"
    return out


# ---- formatting ---------------------------------------------------------------------------


def _pct(ratio: float) -> str:
    return f"{100 * ratio:.0f}%" if ratio >= 0.01 or ratio == 0 else f"{100 * ratio:.1f}%"


def _r(value: float) -> float:
    return round(value, 4) if math.isfinite(value) else value


def _clean(ev: Evidence) -> Evidence:
    """Evidence without NaN/Inf (status is JSON)."""
    return {k: v for k, v in ev.items() if not (isinstance(v, float) and not math.isfinite(v))}


def _iso(t: float) -> str:
    return format_time(datetime.fromtimestamp(t, UTC))
