"""ComputeBound: the GPUs' own work fills the step; MFU says whether it is done efficiently.

Info, not a warning: a job whose steps are all forward, backward and optimizer is what a
healthy job looks like. The advice is graded by MFU: well below the hardware's peak there
is headroom in precision, kernels and batch size; near it, only less work per sample or
more GPUs make the job faster.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from gpujob_operator import api
from gpujob_operator.monitoring.verdicts.formatting import pct, round4, sig4
from gpujob_operator.monitoring.verdicts.mfu import Mfu
from gpujob_operator.monitoring.verdicts.ranktimes import RankTimes
from gpujob_operator.monitoring.verdicts.verdict import COMPUTE_BOUND, INFO, Evidence, Verdict

MFU_LOW: Final = 0.30
"""Below it the GPU is busy but inefficient: well-tuned bf16 transformer training reaches
35-55% on A100/H100 (what torchtitan and Megatron-LM report); fp32, small kernels and
unfused attention sit far below."""
MFU_HIGH: Final = 0.50
"""At or above it the job is near what the hardware gives."""

_FASTER_KERNELS = (
    "train in bf16 with torch.autocast (TF32 for what stays fp32), compile the model "
    "(torch.compile), use fused or flash attention (scaled_dot_product_attention) and fused "
    "optimizers (fused=True), and give each GPU a larger batch"
)
_LESS_WORK = (
    "only less work per sample (a smaller or cheaper architecture, pruning, quantization, "
    "distillation) or more GPUs will make it faster"
)


def advice(mfu: Mfu) -> str:
    """What to try, graded by MFU."""
    if mfu.mfu is None:
        why = f" ({mfu.why})" if mfu.why else ""
        return f"MFU is unknown{why}. If it is low: {_FASTER_KERNELS}; if it is high, {_LESS_WORK}."
    if mfu.mfu < MFU_LOW:
        return f"MFU {pct(mfu.mfu)} is low, so the GPU works inefficiently: {_FASTER_KERNELS}."
    if mfu.mfu >= MFU_HIGH:
        return f"MFU {pct(mfu.mfu)} is near what the hardware gives: {_LESS_WORK}."
    return f"MFU {pct(mfu.mfu)} leaves some headroom: {_FASTER_KERNELS}; beyond that, {_LESS_WORK}."


def compute_bound(per: Mapping[Any, RankTimes], th: api.Thresholds, mfu: Mfu) -> Verdict | None:
    """ComputeBound when forward, backward and optimizer exceed `computeBoundRatio` of
    training time (all ranks pooled)."""
    training = sum(t.training for t in per.values())
    if training <= 0:
        return None
    ratio = sum(t.compute for t in per.values()) / training
    if ratio <= th.compute_bound_ratio:
        return None
    ev: Evidence = {"computeRatio": round4(ratio), "boundRatio": th.compute_bound_ratio}
    summary = f"forward, backward and optimizer take {pct(ratio)} of step time"
    if mfu.mfu is not None and mfu.peak is not None and mfu.achieved is not None:
        ev["mfu"] = round4(mfu.mfu)
        ev["achievedTFLOPSPerGPU"] = sig4(mfu.achieved / 1e12)
        ev["peakTFLOPSPerGPU"] = sig4(mfu.peak / 1e12)
        summary += (
            f" at MFU {pct(mfu.mfu)} ({mfu.achieved / 1e12:.3g} of "
            f"{mfu.peak / 1e12:.4g} TFLOP/s per GPU)"
        )
    else:
        summary += "; MFU unknown" + (f": {mfu.why}" if mfu.why else "")
        if mfu.why:
            ev["mfuUnavailable"] = mfu.why
    return Verdict(COMPUTE_BOUND, INFO, summary, ev, advice(mfu))
