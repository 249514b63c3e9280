"""The bottleneck verdicts: their names, priority, severities and advice, and `Verdict`.

A `Verdict` is one verdict with the numbers behind it (its evidence), the rank, pod, node
and GPU it names, and the per-step time split of a few ranks (`RankBreakdown`);
`to_status()` gives the status.bottleneck dict. When several verdicts hold, the first in
`PRIORITY` is published and the others are listed in its evidence.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Final

from gpujob_operator.monitoring.verdicts.formatting import iso, round4
from gpujob_operator.monitoring.verdicts.ranktimes import RankTimes

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
TRANSFER_BOUND: Final = "TransferBound"
COMPUTE_BOUND: Final = "ComputeBound"
DATA_PARALLEL_IMBALANCE: Final = "DataParallelImbalance"

PRIORITY: Final = (
    HARDWARE_FAULT,
    STALLED,
    STRAGGLER,
    DATA_PARALLEL_IMBALANCE,
    INPUT_BOUND,
    TRANSFER_BOUND,
    CHECKPOINT_BOUND,
    EVAL_BOUND,
    COMMUNICATION_BOUND,
    MEMORY_PRESSURE,
    THROTTLED,
    GPU_UNDERUTILIZED,
    COMPUTE_BOUND,
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
    TRANSFER_BOUND: "Copy less, and asynchronously: DataLoader(pin_memory=True) with "
    ".to(device, non_blocking=True), prefetch the next batch to the GPU on a side stream, "
    "send smaller dtypes (uint8 images, int32 token ids) and convert on the GPU, keep data "
    "that every step reuses on the GPU.",
    DATA_PARALLEL_IMBALANCE: "One process drives several GPUs with nn.DataParallel, which "
    "scatters, gathers, computes the loss and steps the optimizer on the first GPU: run one "
    "process per GPU with torchrun and DistributedDataParallel; until then, compute the loss "
    "inside forward() so only the loss is gathered.",
    COMPUTE_BOUND: "",  # graded by MFU: see compute.py
    HEALTHY: "",
}

Evidence = dict[str, float | int | str]


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
    h2d: float = 0.0
    mfu: float | None = None

    @classmethod
    def of(cls, t: RankTimes, role: str, mfu: float | None = None) -> RankBreakdown:
        def per(seconds: float) -> float:
            return round4(t.per_step(seconds))

        return cls(
            t.rank,
            t.pod,
            t.node,
            role,
            step=per(t.step),
            own=per(t.own),
            compute=per(t.compute),
            data_wait=per(t.data_wait),
            comm_wait=per(t.comm_wait),
            checkpoint=per(t.checkpoint),
            eval=per(t.eval),
            h2d=per(t.h2d),
            mfu=None if mfu is None else round4(mfu),
        )

    def to_status(self) -> dict[str, Any]:
        """camelCase dict matching api.RankBreakdown."""
        out: dict[str, Any] = {"rank": self.rank, "role": self.role}
        if self.pod:
            out["pod"] = self.pod
        if self.node:
            out["node"] = self.node
        other = max(0.0, self.own - self.compute - self.h2d)
        for key, value in (
            ("stepSeconds", self.step),
            ("ownSeconds", self.own),
            ("computeSeconds", self.compute),
            ("otherSeconds", round4(other)),
            ("dataWaitSeconds", self.data_wait),
            ("h2dSeconds", self.h2d),
            ("commWaitSeconds", self.comm_wait),
            ("checkpointSeconds", self.checkpoint),
            ("evalSeconds", self.eval),
        ):
            if math.isfinite(value):
                out[key] = value
        if self.mfu is not None and math.isfinite(self.mfu):
            out["mfu"] = self.mfu
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
            "evidence": clean_evidence(self.evidence),
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
            out["since"] = iso(since)
        return out


def clean_evidence(ev: Evidence) -> Evidence:
    """Evidence without NaN/Inf (status is JSON)."""
    return {k: v for k, v in ev.items() if not (isinstance(v, float) and not math.isfinite(v))}
