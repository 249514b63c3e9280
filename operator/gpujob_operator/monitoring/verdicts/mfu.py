"""Model FLOPs utilisation of a job's window: achieved model FLOP/s over the GPUs' peak.

Per rank: the increase of its model FLOPs counter over the rows past warm-up, per second
of wall time, over its peak (the job's `peakTFLOPSPerGPU`, else what the trainer's table
gave for its GPU and precision) times the GPUs it drives. The job's figure is the median
rank's, as the ranks of a data-parallel gang do the same work. When there is none, `why`
says what is missing instead of guessing a number.
"""

from __future__ import annotations

import math
import statistics
from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from gpujob_operator.monitoring.rows import R_FLOPS, R_PEAK, R_PEAK_REASON, latest, rate
from gpujob_operator.monitoring.verdicts.formatting import sig4
from gpujob_operator.monitoring.window import RankSeries
from gpujob_trainer import contract

MIN_PEAK: Final = 1e9
"""A peak below a GFLOP/s is no GPU's (an endpoint's mistake): treated as unknown."""
MAX_MFU: Final = 1.2
"""Above it the count or the peak is wrong (a count per batch taken as per sample, a peak
for the wrong precision): the figure is withheld and said so, not published."""
_FP8: Final = float(contract.PEAK_REASONS.index(contract.PEAK_FP8))


@dataclass(frozen=True)
class Mfu:
    """The job's MFU (None with `why` when unknown) and each rank's."""

    mfu: float | None = None
    achieved: float | None = None
    """Model FLOP/s per GPU (median rank)."""
    peak: float | None = None
    """Peak FLOP/s per GPU it is taken against (median rank)."""
    why: str = ""
    per_rank: dict[int, float] = field(default_factory=dict)

    def to_progress(self) -> dict[str, Any]:
        """The status.progress fields (camelCase)."""
        out: dict[str, Any] = {}
        if self.mfu is not None:
            out["mfu"] = round(self.mfu, 4)
        if self.achieved is not None:
            out["achievedTFLOPSPerGPU"] = sig4(self.achieved / 1e12)
        if self.peak is not None:
            out["peakTFLOPSPerGPU"] = sig4(self.peak / 1e12)
        if self.why:
            out["mfuUnavailable"] = self.why
        return out


_OVERRIDE = "set spec.monitoring.peakTFLOPSPerGPU"


def _why_no_peak(series: Sequence[RankSeries], rows: Mapping[Any, Sequence[array[float]]]) -> str:
    reasons = []
    for s in series:
        code = latest(rows.get((s.pod, s.rank)) or s.rows, R_PEAK_REASON)
        if not math.isnan(code) and 0 <= code < len(contract.PEAK_REASONS):
            reasons.append((contract.PEAK_REASONS[int(code)], s.device_name))
    if not reasons:
        return f"the trainer exports no peak FLOP/s: {_OVERRIDE}"
    reason, device = reasons[0]
    if reason == contract.PEAK_FP8:
        return "FP8 training: no single dense peak is honest for it, so no MFU"
    if reason == contract.PEAK_UNKNOWN_DEVICE:
        return f"no peak FLOP/s known for {device or 'this GPU'}: {_OVERRIDE}"
    return f"the ranks train on no GPU: {_OVERRIDE} to measure against"


def job_mfu(
    series: Sequence[RankSeries],
    ready_rows: Mapping[Any, Sequence[array[float]]],
    peak_override: float | None,
) -> Mfu:
    """The window's MFU from the ranks past warm-up (`ready_rows`, keyed (pod, rank))."""
    achieved: dict[int, float] = {}
    peaks: dict[int, float] = {}
    counted = False
    for s in series:
        rows = ready_rows.get((s.pod, s.rank)) or []
        if len(rows) < 2:
            continue
        flops = rate(rows, R_FLOPS)
        if math.isnan(flops):
            continue
        counted = True
        if latest(rows, R_PEAK_REASON) == _FP8:
            continue  # no honest single peak for FP8, the job's own included
        gpus = max(1, len(s.devices))
        peak = peak_override * 1e12 if peak_override else latest(rows, R_PEAK)
        if math.isnan(peak) or peak < MIN_PEAK:
            continue
        achieved[s.rank] = flops / gpus
        peaks[s.rank] = peak
    if not achieved:
        if not counted:
            ready = any(len(ready_rows.get((s.pod, s.rank)) or []) >= 2 for s in series)
            why = (
                "the trainer exports no model FLOP count: let gpujob_trainer count one step "
                "(wrap_model) or give flops_per_sample"
                if ready
                else ""
            )
            return Mfu(why=why)
        return Mfu(why=_why_no_peak(series, ready_rows))
    per_rank = {r: achieved[r] / peaks[r] for r in achieved}
    job = statistics.median(per_rank.values())
    if job > MAX_MFU:
        return Mfu(
            why=f"implausible: {job:.3g} times the peak (check the FLOP count, e.g. "
            "flops_per_sample, and the peak, e.g. spec.monitoring.peakTFLOPSPerGPU)"
        )
    return Mfu(
        mfu=job,
        achieved=statistics.median(achieved.values()),
        peak=statistics.median(peaks.values()),
        per_rank=per_rank,
    )
