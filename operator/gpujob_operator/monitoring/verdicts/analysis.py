"""From a window of scrapes to progress, ETA and bottleneck verdict candidates (pure).

Everything here is arithmetic on the window's rows: no clocks, no I/O. `analyze()` returns
the progress and GPU summary in the status' camelCase shape, and the verdict candidates
with the numbers behind them; `hysteresis` then applies hysteresis before publication.

`analyze()` asks each family of verdicts in turn and combines what they find: the device
verdicts (`device`: HardwareFault on every window, then MemoryPressure, Throttled and
GPUUnderutilized), the stall (`stall`), the step-time verdicts (`steptime`: Straggler,
InputBound, CheckpointBound, EvalBound, CommunicationBound),
then TransferBound (`transfer`), DataParallelImbalance (`dataparallel`) and ComputeBound
(`computebound`, graded by the MFU of `mfu`), and the progress (`progress`, with the step
latency of `latency`); the verdict names, priority and advice are in `verdict`, the settings
in `analysis_settings`.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from gpujob_operator.api import conditions as c
from gpujob_operator.monitoring.rows import R_T
from gpujob_operator.monitoring.verdicts.analysis_settings import Settings
from gpujob_operator.monitoring.verdicts.computebound import compute_bound
from gpujob_operator.monitoring.verdicts.dataparallel import data_parallel_imbalance
from gpujob_operator.monitoring.verdicts.device import device_verdicts, gpu_summary, hardware_fault
from gpujob_operator.monitoring.verdicts.formatting import pct
from gpujob_operator.monitoring.verdicts.latency import step_latency
from gpujob_operator.monitoring.verdicts.mfu import job_mfu
from gpujob_operator.monitoring.verdicts.progress import (
    ProgressMemory,
    progress_status,
    smoothed_step_rate,
)
from gpujob_operator.monitoring.verdicts.ranktimes import post_warmup
from gpujob_operator.monitoring.verdicts.stall import stall_verdict
from gpujob_operator.monitoring.verdicts.steptime import (
    StepTimeFindings,
    phase_ratios,
    step_time_verdicts,
)
from gpujob_operator.monitoring.verdicts.targets import job_targets
from gpujob_operator.monitoring.verdicts.transfer import transfer_bound
from gpujob_operator.monitoring.verdicts.verdict import (
    HEALTHY,
    INFO,
    PRIORITY,
    Verdict,
    clean_evidence,
)
from gpujob_operator.monitoring.window import Window


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
    target_note: str = ""
    """Which ranks report other target steps than the job's, or rejected ones ("": none)."""
    memory: ProgressMemory | None = None
    """What progress remembers for the next evaluation (None: as it was handed in)."""


def _latency(rank_rows: Iterable[Sequence[array[float]]]) -> dict[str, Any]:
    """Step time quantiles (status.progress fields); time per sample is computed where it is
    shown, from the throughput."""
    out: dict[str, Any] = {}
    p50, p95 = step_latency(rank_rows)
    if p50 is not None:
        out["stepSecondsP50"] = round(p50, 4)
    if p95 is not None:
        out["stepSecondsP95"] = round(p95, 4)
    return out


def analyze(
    window: Window, settings: Settings, now: float, memory: ProgressMemory | None = None
) -> Analysis:
    """Progress, GPU summary and verdict candidates of a job's window at time `now`; `memory`
    is what progress kept from the previous evaluation (the steps of earlier attempts, the
    ETA's basis), its successor is `Analysis.memory`."""
    every = list(window.ranks.values())
    # Each rank judged once (a membership test of one list in the other compared whole
    # series, quadratic in the ranks: 1.4 s of the event loop at 4,096 ranks).
    fresh = [bool(s.rows) and now - s.rows[-1][R_T] <= settings.window_seconds for s in every]
    series = [s for s, ok in zip(every, fresh, strict=True) if ok]
    missing = tuple(sorted((s.rank, s.pod) for s, ok in zip(every, fresh, strict=True) if not ok))
    if not series:
        stall, stalled_for, threshold, stall_reason, stall_note = (
            stall_verdict(window, every, settings, now)
            if every
            else (None, None, None, c.PROGRESSING, "")
        )
        return Analysis(
            {},
            gpu_summary(window, settings, None),
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
    ready_rows = {(s.pod, s.rank): post_warmup(s.rows, settings.warmup_steps) for s in series}
    ready = {k: r for k, r in ready_rows.items() if len(r) >= settings.min_scrapes}
    warm_t = min((r[0][R_T] for r in ready.values()), default=None)

    step_rate = smoothed_step_rate(series, ready_rows)
    targets = job_targets(series, settings.total_steps)
    progress, memory = progress_status(
        series, ready_rows, settings, now, step_rate, targets, memory
    )
    gpus = gpu_summary(window, settings, warm_t)

    candidates: list[Verdict] = []
    # A hardware fault and a stall are judged on every window; the other verdicts only on
    # ranks past warm-up that are not stalled.
    hw = hardware_fault(window)
    if hw is not None:
        candidates.append(hw)
    stall, stalled_for, threshold, stall_reason, stall_note = stall_verdict(
        window, every, settings, now
    )
    if stall is not None:
        candidates.append(stall)

    steps = StepTimeFindings()
    throttled_count = 0
    mfu = job_mfu(series, ready, settings.peak_tflops)
    if ready:
        progress.update(mfu.to_progress())
        progress.update(_latency(ready.values()))
    if ready and stall is None:
        th = settings.thresholds
        steps = step_time_verdicts(window, ready, th)
        candidates.extend(steps.candidates)
        progress.update(phase_ratios(steps.times))
        for found in (
            transfer_bound(steps.times, window, warm_t, th) if steps.times else None,
            data_parallel_imbalance(window, ready, warm_t, th),
        ):
            if found is not None:
                candidates.append(found)
        device, throttled_count = device_verdicts(
            window, ready, warm_t, settings, explained=bool(candidates)
        )
        candidates.extend(device)
        compute = compute_bound(steps.times, th, mfu) if steps.times else None
        if compute is not None:
            candidates.append(compute)
    breakdown, notes, evidence = steps.breakdown, steps.notes, steps.evidence
    if mfu.per_rank:
        breakdown = tuple(replace(b, mfu=mfu.per_rank.get(b.rank)) for b in breakdown)

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
            f"{label} {pct(float(evidence[key]))}"
            for key, label in (("dataWaitRatio", "data wait"), ("commWaitRatio", "comm wait"))
            if key in evidence and not math.isnan(float(evidence[key]))
        )
        if numbers:
            summary += f" ({numbers} of step time)"
        if notes:
            summary += "; note: " + "; ".join(notes)
        verdict = Verdict(HEALTHY, INFO, summary, clean_evidence(evidence), breakdown=breakdown)
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
        target_note=targets.note,
        memory=memory,
    )
