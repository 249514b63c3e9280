"""TransferBound: the step waits for host-to-device copies of its batches.

Two signals, either enough: the `h2d` phase (the trainer times the copies it makes in
`wrap_loader(device=...)` or inside `tracker.transfer()`) over the ranks' training time, and,
for copies the trainer does not see, the GPUs' PCIe receive traffic while their SMs are
mostly idle (GPM's SM activity; without GPM this second signal is not judged) and the ranks
do not wait for all-reduce (network traffic to the GPU crosses PCIe too).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping
from typing import Any, Final

from gpujob_operator import api
from gpujob_operator.monitoring.rows import G_PCIE_RX, G_SM_ACTIVE, mean
from gpujob_operator.monitoring.verdicts.device import gpu_rows
from gpujob_operator.monitoring.verdicts.formatting import pct, round4
from gpujob_operator.monitoring.verdicts.ranktimes import RankTimes
from gpujob_operator.monitoring.verdicts.verdict import (
    ADVICE,
    TRANSFER_BOUND,
    WARNING,
    Evidence,
    Verdict,
)
from gpujob_operator.monitoring.window import Window

PCIE_BUSY_BYTES: Final = 4e9
"""Receive traffic that counts as heavy: about a third of a PCIe 4.0 x16 link's usable
~25 GB/s (a sixth of 5.0's), sustained over the window; model weights and gradients never
cross PCIe in steady-state DDP, so this much is batches (or host offload)."""
SM_IDLE_RATIO: Final = 0.30
"""SM activity below which the GPU is mostly waiting while the bytes arrive."""


def pcie_and_sm(window: Window, since: float | None) -> tuple[float, float]:
    """(median GPU's mean PCIe receive bytes/s, median GPU's mean SM activity) in the window
    since `since` (NaN where no GPU exports it)."""
    rx: list[float] = []
    sm: list[float] = []
    for rows in gpu_rows(window, since).values():
        rx.append(mean(rows, G_PCIE_RX))
        sm.append(mean(rows, G_SM_ACTIVE))
    rx = [v for v in rx if not math.isnan(v)]
    sm = [v for v in sm if not math.isnan(v)]
    return (
        statistics.median(rx) if rx else math.nan,
        statistics.median(sm) if sm else math.nan,
    )


def h2d_ratio(per: Mapping[Any, RankTimes]) -> float:
    training = sum(t.training for t in per.values())
    return sum(t.h2d for t in per.values()) / training if training > 0 else math.nan


def transfer_bound(
    per: Mapping[Any, RankTimes], window: Window, since: float | None, th: api.Thresholds
) -> Verdict | None:
    """TransferBound when copies take over `transferBoundRatio` of training time, or PCIe
    receive traffic is heavy while the SMs idle."""
    ratio = h2d_ratio(per)
    rx, sm = pcie_and_sm(window, since)
    by_share = not math.isnan(ratio) and ratio > th.transfer_bound_ratio
    # GPUDirect RDMA and NCCL's peer-to-peer traffic cross PCIe too, with few SMs busy:
    # the PCIe signal speaks for batches only where the ranks do not wait for their peers.
    comm = min((t.comm_wait / t.training for t in per.values() if t.training > 0), default=0.0)
    by_pcie = not math.isnan(rx) and rx >= PCIE_BUSY_BYTES and not math.isnan(sm)
    by_pcie = by_pcie and sm < SM_IDLE_RATIO and comm <= th.comm_bound_ratio
    if not (by_share or by_pcie):
        return None
    worst = max(per.values(), key=lambda t: t.h2d / t.training if t.training > 0 else 0.0)
    parts = []
    if not math.isnan(ratio):
        parts.append(
            f"copying batches to the GPU takes {pct(ratio)} of step time "
            f"(bound > {pct(th.transfer_bound_ratio)})"
        )
    if not math.isnan(rx):
        idle = f" while the SMs are active {pct(sm)} of the time" if not math.isnan(sm) else ""
        parts.append(f"PCIe receives {rx / 1e9:.1f} GB/s per GPU{idle}")
    ev: Evidence = {
        "h2dRatio": round4(ratio),
        "maxRankH2dRatio": round4(worst.h2d / worst.training if worst.training else 0.0),
        "maxRank": worst.rank,
        "h2dSecondsPerStep": round4(worst.per_step(worst.h2d)),
        "boundRatio": th.transfer_bound_ratio,
    }
    if not math.isnan(rx):
        ev["pcieRxBytesPerSecond"] = round(rx)
    if not math.isnan(sm):
        ev["smActiveRatio"] = round4(sm)
    return Verdict(TRANSFER_BOUND, WARNING, "; ".join(parts), ev, ADVICE[TRANSFER_BOUND])
