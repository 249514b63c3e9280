"""The device verdicts and the GPU summary: memory, clocks, utilization, hardware errors.

HardwareFault (a new XID or uncorrected ECC error on any GPU) is judged on every window;
MemoryPressure (the caching allocator's share of GPU memory, allocation retries, OOMs),
Throttled (a GPU held below its clocks for the whole window) and GPUUnderutilized (a low
median utilization that no other verdict explains) only once the ranks are past warm-up.
`gpu_summary` is status.gang.gpus: requested and observed GPUs, mean utilization, the fullest
GPU's memory, and whether telemetry is available.
"""

from __future__ import annotations

import math
import statistics
from array import array
from typing import Any, Final

from gpujob_operator.monitoring.rows import (
    G_ECC,
    G_MEM_TOTAL,
    G_MEM_USED,
    G_T,
    G_THROTTLE,
    G_UTIL,
    G_XID,
    R_CUDA_OOMS,
    R_CUDA_RESERVED,
    R_CUDA_RETRIES,
    increase,
    latest,
    throttle_reasons,
)
from gpujob_operator.monitoring.verdicts.analysis_settings import Settings
from gpujob_operator.monitoring.verdicts.formatting import pct, round4
from gpujob_operator.monitoring.verdicts.verdict import (
    ADVICE,
    CRITICAL,
    GPU_UNDERUTILIZED,
    HARDWARE_FAULT,
    MEMORY_PRESSURE,
    THROTTLED,
    WARNING,
    Evidence,
    Verdict,
)
from gpujob_operator.monitoring.window import GPUSeries, RankSeries, Window
from gpujob_trainer import contract

MEMORY_CRITICAL_RATIO: Final = 0.98
MAX_REASONS_SHOWN: Final = 5
"""Distinct telemetry reasons status.gang.gpus.telemetry names (each pod may send its own)."""


def device_verdicts(
    window: Window,
    ready: dict[Any, list[array[float]]],
    warm_t: float | None,
    settings: Settings,
    *,
    explained: bool,
) -> tuple[list[Verdict], int]:
    """MemoryPressure and Throttled, then GPUUnderutilized when no verdict explains the GPUs'
    idle time (`explained`: another family found one); and how many GPUs are throttled."""
    th = settings.thresholds
    candidates: list[Verdict] = []
    mem = _memory_pressure(window, ready, th.memory_pressure_ratio)
    if mem is not None:
        candidates.append(mem)
    thr, throttled_count = _throttled(window, warm_t, settings.min_scrapes)
    if thr is not None:
        candidates.append(thr)
    if not explained and not candidates:
        under = _underutilized(window, warm_t, th.gpu_underutilized_ratio)
        if under is not None:
            candidates.append(under)
    return candidates, throttled_count


def hardware_fault(window: Window) -> Verdict | None:
    """HardwareFault on the first GPU with a new XID or uncorrected ECC error in the window."""
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
            return _on_gpu(HARDWARE_FAULT, CRITICAL, summary, ev, g)
    return None


def _on_gpu(kind: str, severity: str, summary: str, ev: Evidence, g: GPUSeries) -> Verdict:
    """A verdict that names one GPU: its pod, node and UUID."""
    return Verdict(
        kind,
        severity,
        summary,
        ev,
        ADVICE[kind],
        pod=g.pod,
        node=g.node or None,
        gpu_uuid=g.uuid or None,
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
        parts.append(f"the caching allocator holds {pct(ratio)} of GPU memory")
    elif not math.isnan(used_ratio):
        parts.append(f"GPU memory is {pct(used_ratio)} used")
    if retries > 0:
        parts.append(f"{retries:.0f} allocation retries in the window")
    if ooms > 0:
        parts.append(f"{ooms:.0f} out-of-memory errors")
    where = ""
    if worst is not None:
        where = f" on rank {worst[1].rank} (pod {worst[1].pod})"
    summary = "; ".join(parts) + where + f" (bound > {pct(bound)}, retries > 0)"
    ev: Evidence = {"allocRetries": retries, "ooms": ooms, "boundRatio": bound}
    if not math.isnan(ratio):
        ev["reservedRatio"] = round4(ratio)
    if not math.isnan(used_ratio):
        ev["maxMemoryUsedRatio"] = round4(used_ratio)
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


def gpu_rows(window: Window, warm_t: float | None) -> dict[Any, list[array[float]]]:
    """Each GPU series' rows from `warm_t` on (all of them while no rank is warm)."""
    return {
        k: [r for r in g.rows if warm_t is None or r[G_T] >= warm_t] for k, g in window.gpus.items()
    }


def _throttled(
    window: Window, warm_t: float | None, min_scrapes: int
) -> tuple[Verdict | None, int]:
    hits = []
    for key, rows in gpu_rows(window, warm_t).items():
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
    return _on_gpu(THROTTLED, WARNING, summary, ev, g), len(hits)


def _underutilized(window: Window, warm_t: float | None, bound: float) -> Verdict | None:
    utils = [
        r[G_UTIL]
        for rows in gpu_rows(window, warm_t).values()
        for r in rows
        if not math.isnan(r[G_UTIL])
    ]
    if not utils:
        return None
    p50 = statistics.median(utils)
    if p50 >= bound:
        return None
    summary = (
        f"median GPU utilization is {pct(p50)} (bound < {pct(bound)}) with no input, "
        "communication, straggler or memory bottleneck"
    )
    ev: Evidence = {"p50UtilizationRatio": round4(p50), "boundRatio": bound, "samples": len(utils)}
    return Verdict(GPU_UNDERUTILIZED, WARNING, summary, ev, ADVICE[GPU_UNDERUTILIZED])


def gpu_summary(window: Window, settings: Settings, warm_t: float | None) -> dict[str, Any]:
    """status.gang.gpus (camelCase, matching api.GPUSummary), from the rows past warm-up when
    any."""
    out: dict[str, Any] = {}
    if settings.gpus_requested:
        out["requested"] = settings.gpus_requested
    if window.gpus:
        out["observed"] = len(window.gpus)
        rows = gpu_rows(window, warm_t)
        utils = [r[G_UTIL] for rs in rows.values() for r in rs if not math.isnan(r[G_UTIL])]
        if not utils:  # all rows before warm-up: use what there is
            utils = [
                r[G_UTIL] for g in window.gpus.values() for r in g.rows if not math.isnan(r[G_UTIL])
            ]
        if utils:
            out["meanUtilizationRatio"] = round4(statistics.fmean(utils))
        ratios = []
        for g in window.gpus.values():
            used, total = latest(g.rows, G_MEM_USED), latest(g.rows, G_MEM_TOTAL)
            if total > 0 and not math.isnan(used):
                ratios.append(used / total)
        if ratios:
            out["maxMemoryUsedRatio"] = round4(max(ratios))
        out["telemetry"] = "Available"
    else:
        reasons = sorted({r for r in window.telemetry.values() if r != contract.TELEMETRY_OK})
        # Each reason is an endpoint's label (clipped by `frame`); a few of them say enough.
        why = ", ".join(reasons[:MAX_REASONS_SHOWN]) if reasons else "no GPU series exported"
        if len(reasons) > MAX_REASONS_SHOWN:
            why += f" and {len(reasons) - MAX_REASONS_SHOWN} more"
        out["observed"] = 0
        out["telemetry"] = f"Unavailable: no GPU telemetry: {why}"
    return out
