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
- Straggler is decided before CommunicationBound, from each rank's own compute time per
  step: a slow rank makes the fast ones wait inside all-reduce, which would otherwise
  read as communication;
- exposed communication is judged on the rank that waits least for it (the critical
  path): if even that rank spends >15% in comm_wait, the network is the limit.
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
from gpujob_operator.conditions import format_time
from gpujob_operator.display import format_duration
from gpujob_operator.window import (
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
    STRAGGLER: "One rank computes slower than the others and everyone waits for it: check "
    "its GPU (clocks, errors), its node (CPU, noisy neighbours) and uneven batch sizes.",
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


@dataclass(frozen=True)
class Settings:
    """What the analysis needs from the job's spec (defaults are the API's)."""

    total_steps: int | None = None
    warmup_steps: int = 20
    min_scrapes: int = 3
    window_seconds: float = 120.0
    scrape_interval_seconds: float = 15.0
    stall_timeout_seconds: float = 300.0
    hysteresis_windows: int = 3
    gpus_requested: int | None = None
    thresholds: api.Thresholds = field(default_factory=api.Thresholds)

    @classmethod
    def from_spec(cls, spec: api.GPUTrainingJobSpec | Mapping[str, Any]) -> Settings:
        """Settings of a job spec (a model or its camelCase dict)."""
        s = api.parse_spec(spec)
        m = s.monitoring
        return cls(
            total_steps=s.training.total_steps,
            warmup_steps=m.warmup_steps,
            min_scrapes=m.window.min_scrapes,
            window_seconds=float(m.window.duration_seconds),
            scrape_interval_seconds=float(m.scrape_interval_seconds),
            stall_timeout_seconds=float(m.stall_timeout_seconds),
            hysteresis_windows=m.hysteresis_windows,
            gpus_requested=s.total_gpus or None,
            thresholds=m.thresholds,
        )

    def max_points(self) -> int:
        """Rows a window keeps per series: the window's scrapes plus one for the deltas."""
        return (
            max(self.min_scrapes, math.ceil(self.window_seconds / self.scrape_interval_seconds)) + 1
        )


Evidence = dict[str, float | int | str]


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

    def to_status(self, since: float | None = None) -> dict[str, Any]:
        """camelCase dict matching api.Bottleneck (None fields omitted)."""
        out: dict[str, Any] = {
            "verdict": self.verdict,
            "severity": self.severity,
            "summary": self.summary,
            "evidence": _clean(self.evidence),
        }
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
    throttled_gpus: int = 0
    step_rate: float | None = None
    """Smoothed job steps per second."""


# ---- entry point -----------------------------------------------------------------------------


def analyze(window: Window, settings: Settings, now: float) -> Analysis:
    """Progress, GPU summary and verdict candidates of a job's window at time `now`."""
    series = list(window.ranks.values())
    if not series:
        return Analysis(
            {}, _gpu_summary(window, settings, None), None, not_ready_reason="no rank scraped yet"
        )
    th = settings.thresholds
    ready_rows = {
        key: _post_warmup(s.rows, settings.warmup_steps) for key, s in window.ranks.items()
    }
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
    stall, stalled_for, threshold = _stall(window, series, settings, now)
    if stall is not None:
        candidates.append(stall)

    throttled_count = 0
    if ready and stall is None:
        keys = list(ready)
        per: dict[Any, dict[str, float]] = {}
        for k in keys:
            nums = _rank_numbers(ready[k])
            if nums is not None:
                per[k] = nums
        if per:
            step_total = sum(v["step_sum"] for v in per.values())
            data_ratio = (
                sum(v["data_wait"] for v in per.values()) / step_total
                if step_total > 0
                else math.nan
            )
            comm = {k: v["comm_wait"] / v["step_sum"] for k, v in per.items() if v["step_sum"] > 0}
            evidence["dataWaitRatio"] = _r(data_ratio)
            if comm:
                evidence["commWaitRatio"] = _r(min(comm.values()))
            evidence["stepSeconds"] = _r(step_total / sum(v["step_count"] for v in per.values()))
            strag = _straggler(window, per, th.straggler_score)
            if strag is not None:
                candidates.append(strag)
            elif len(per) > 1:
                cps = [v["compute_per_step"] for v in per.values()]
                if max(cps) > 0:
                    evidence["stragglerScore"] = _r(min(cps) / max(cps))
            if data_ratio > th.input_bound_ratio:
                candidates.append(_input_bound(data_ratio, per, th))
            elif data_ratio > th.input_warn_ratio:
                notes.append(_input_text(data_ratio, th))
            if strag is None and comm:
                worst_key = min(comm, key=lambda k: comm[k])
                exposed = comm[worst_key]
                if exposed > th.comm_bound_ratio:
                    candidates.append(_comm_bound(exposed, comm, th))
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
        verdict = top
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
        verdict = Verdict(HEALTHY, INFO, summary, _clean(evidence))
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
        throttled_gpus=throttled_count,
        step_rate=step_rate,
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


def _rank_numbers(rows: Sequence[array[float]]) -> dict[str, float] | None:
    """Per-rank increases over rows; None when no step was attributed in between."""
    count = increase(rows, R_STEP_COUNT)
    step_sum = increase(rows, R_STEP_SUM)
    if math.isnan(count) or count < 1 or math.isnan(step_sum) or step_sum <= 0:
        return None
    data = increase(rows, R_PHASE[contract.PHASE_DATA_WAIT])
    comm = increase(rows, R_PHASE[contract.PHASE_COMM_WAIT])
    compute = increase(rows, R_COMPUTE)
    return {
        "step_count": count,
        "step_sum": step_sum,
        "data_wait": 0.0 if math.isnan(data) else data,
        "comm_wait": 0.0 if math.isnan(comm) else comm,
        "compute_per_step": (0.0 if math.isnan(compute) else compute) / count,
    }


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


def _input_bound(ratio: float, per: dict[Any, dict[str, float]], th: api.Thresholds) -> Verdict:
    worst = max(per.items(), key=lambda kv: kv[1]["data_wait"] / kv[1]["step_sum"])
    ev: Evidence = {
        "dataWaitRatio": _r(ratio),
        "maxRankDataWaitRatio": _r(worst[1]["data_wait"] / worst[1]["step_sum"]),
        "maxRank": worst[0][1],
        "boundRatio": th.input_bound_ratio,
        "warnRatio": th.input_warn_ratio,
    }
    return Verdict(INPUT_BOUND, WARNING, _input_text(ratio, th), ev, ADVICE[INPUT_BOUND])


def _comm_bound(exposed: float, comm: dict[Any, float], th: api.Thresholds) -> Verdict:
    mean = statistics.fmean(comm.values())
    summary = (
        f"exposed communication takes {_pct(exposed)} of step time even on the rank that "
        f"waits least (mean {_pct(mean)}; bound > {_pct(th.comm_bound_ratio)})"
    )
    ev: Evidence = {
        "commWaitRatio": _r(exposed),
        "meanCommWaitRatio": _r(mean),
        "boundRatio": th.comm_bound_ratio,
    }
    return Verdict(COMMUNICATION_BOUND, WARNING, summary, ev, ADVICE[COMMUNICATION_BOUND])


def _straggler(window: Window, per: dict[Any, dict[str, float]], bound: float) -> Verdict | None:
    if len(per) < 2:
        return None
    fastest_key = min(per, key=lambda k: per[k]["compute_per_step"])
    slowest_key = max(per, key=lambda k: per[k]["compute_per_step"])
    fast = per[fastest_key]["compute_per_step"]
    slow = per[slowest_key]["compute_per_step"]
    if slow <= 0:
        return None
    score = fast / slow
    if score >= bound:
        return None
    s = window.ranks[slowest_key]
    others = [per[k]["comm_wait"] / per[k]["step_sum"] for k in per if k != slowest_key]
    summary = (
        f"rank {s.rank} (pod {s.pod}) computes {slow / fast if fast > 0 else math.inf:.1f}x "
        f"as long per step as the fastest rank {fastest_key[1]}: score {score:.2f} "
        f"(bound < {bound:.2f}); the others wait for it in all-reduce"
    )
    ev: Evidence = {
        "stragglerScore": _r(score),
        "computeSecondsPerStep": _r(slow),
        "fastestComputeSecondsPerStep": _r(fast),
        "fastestRank": fastest_key[1],
        "othersCommWaitRatio": _r(statistics.fmean(others)) if others else 0.0,
        "boundScore": bound,
    }
    return Verdict(
        STRAGGLER,
        WARNING,
        summary,
        ev,
        ADVICE[STRAGGLER],
        rank=s.rank,
        pod=s.pod,
        node=s.node or None,
        gpu_uuid=s.uuid or None,
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


def _stall(
    window: Window, series: Sequence[RankSeries], settings: Settings, now: float
) -> tuple[Verdict | None, float | None, float | None]:
    if math.isnan(window.progress_time):
        return None, None, None
    median = median_step_seconds(series)
    threshold = settings.stall_timeout_seconds
    if median is not None:
        threshold = max(threshold, STALL_STEP_FACTOR * median)
    idle = max(0.0, now - window.progress_time)
    if idle <= threshold:
        return None, idle, threshold
    steps = {s.rank: latest(s.rows, R_STEPS) for s in series}
    step = int(min(v for v in steps.values() if not math.isnan(v))) if steps else 0
    behind = min(series, key=lambda s: latest(s.rows, R_STEPS))
    how = f"stall timeout {settings.stall_timeout_seconds:.0f}s"
    if median is not None:
        how = f"max({STALL_STEP_FACTOR:.0f} x median step {median:.3g}s, {how})"
    summary = (
        f"no rank finished a step for {format_duration(idle)} (threshold "
        f"{format_duration(threshold)} = {how}); stuck at step {step}"
    )
    ev: Evidence = {
        "secondsSinceLastStep": _r(idle),
        "thresholdSeconds": _r(threshold),
        "step": step,
    }
    if median is not None:
        ev["medianStepSeconds"] = _r(median)
    lagging = len({v for v in steps.values()}) > 1
    return (
        Verdict(
            STALLED,
            CRITICAL,
            summary,
            ev,
            ADVICE[STALLED],
            rank=behind.rank if lagging else None,
            pod=behind.pod if lagging else None,
            node=(behind.node or None) if lagging else None,
        ),
        idle,
        threshold,
    )


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
