"""What one scrape may put into a job's window: the edge where untrusted payloads are checked.

Every trainer endpoint runs code the operator does not control, so a frame is admitted only
after three checks (pure, no I/O):

- identity: a rank row counts only when its `rank` label is the rank the target should be
  (node_rank x procsPerNode + local_rank); any other rank a payload claims is dropped;
- size: at most `MAX_GPUS_PER_ENDPOINT` GPU rows per endpoint (the window caps the job);
- values: each field has a plausible range; NaN, infinities and absurd numbers (a target of
  2^63 steps, a last-step time in milliseconds, GPU utilization in percent) become NaN,
  the window's "absent", so the analysis skips them instead of raising on them.

What was dropped is counted and described (`Admitted.notes`), so the monitor can report it
once and the operator's metrics can count it.
"""

from __future__ import annotations

import math
from array import array
from dataclasses import dataclass, replace
from typing import Final

from gpujob_operator.monitoring import rows
from gpujob_operator.monitoring.scrape.frame import Frame
from gpujob_trainer import contract

MAX_GPUS_PER_ENDPOINT: Final = 64
"""GPU rows kept from one endpoint (a node has at most 16 GPUs today)."""
KIND_RANK: Final = "rank"
KIND_GPUS: Final = "gpus"
KIND_VALUES: Final = "values"
MAX_NOTES: Final = 4
"""Dropped-value descriptions kept per scrape (the counts are exact)."""

_EXACT: Final = float(2**53)
"""Step and epoch counts beyond this are not exact in a float: none is real."""
_COUNT: Final = 1e18
_SECONDS: Final = 1e12
_BYTES: Final = float(2**60)
_FLOPS: Final = 1e40
"""Model FLOPs a run may report (an exaflop machine for a billion years is ~3e34)."""
_PEAK: Final = 1e18
"""Peak FLOP/s of one GPU (today's largest are near 1e16)."""
_CLOCK_SKEW: Final = 86400.0
"""A trainer's timestamp may run this far ahead of the operator's clock (skew), no more."""
_TIMESTAMPS: Final = (
    (rows.R_LAST_STEP, contract.LAST_STEP_TIMESTAMP.name),
    (rows.R_CLOCK, contract.CLOCK_TIMESTAMP.name),
)
"""Unix times on the trainer's clock: within a day of the operator's (seconds, not ms)."""

# field index -> (name for messages, low, high); low/high inclusive.
_RANK_LIMITS: Final[dict[int, tuple[str, float, float]]] = {
    rows.R_STEPS: (contract.STEPS.name, 0.0, _EXACT),
    rows.R_START_STEP: (contract.START_STEP.name, 0.0, _EXACT),
    rows.R_TARGET: (contract.TARGET_STEPS.name, 0.0, _EXACT),
    rows.R_SAMPLES: (contract.SAMPLES.name, 0.0, _COUNT),
    rows.R_TOKENS: (contract.TOKENS.name, 0.0, _COUNT),
    rows.R_EPOCH: (contract.EPOCH.name, 0.0, _EXACT),
    rows.R_LOSS: (contract.LOSS.name, -1e30, 1e30),
    rows.R_STEP_COUNT: (contract.STEP_DURATION.name + "_count", 0.0, _COUNT),
    rows.R_STEP_SUM: (contract.STEP_DURATION.name + "_sum", 0.0, _SECONDS),
    rows.R_COMPUTE: (contract.COMPUTE_SECONDS.name, 0.0, _SECONDS),
    rows.R_CUDA_RESERVED: (contract.CUDA_MEMORY_RESERVED.name, 0.0, _BYTES),
    rows.R_CUDA_RETRIES: (contract.CUDA_ALLOC_RETRIES.name, 0.0, _COUNT),
    rows.R_CUDA_OOMS: (contract.CUDA_OOMS.name, 0.0, _COUNT),
    rows.R_FLOPS: (contract.MODEL_FLOPS.name, 0.0, _FLOPS),
    rows.R_PEAK: (contract.PEAK_FLOPS.name, 0.0, _PEAK),
    **{
        i: (f'{contract.PHASE_SECONDS.name}{{phase="{p}"}}', 0.0, _SECONDS)
        for p, i in rows.R_PHASE.items()
    },
    **{
        rows.R_BUCKET0 + i: (contract.STEP_DURATION.name + "_bucket", 0.0, _COUNT)
        for i in range(rows.N_BUCKETS)
    },
}
_GPU_LIMITS: Final[dict[int, tuple[str, float, float]]] = {
    rows.G_UTIL: (contract.GPU_UTILIZATION.name, 0.0, 1.0),
    rows.G_MEM_USED: (contract.GPU_MEMORY_USED.name, 0.0, _BYTES),
    rows.G_MEM_TOTAL: (contract.GPU_MEMORY_TOTAL.name, 0.0, _BYTES),
    rows.G_POWER: (contract.GPU_POWER.name, 0.0, 1e6),
    rows.G_POWER_LIMIT: (contract.GPU_POWER_LIMIT.name, 0.0, 1e6),
    rows.G_TEMP: (contract.GPU_TEMPERATURE.name, -273.15, 1000.0),
    rows.G_SM_CLOCK: (contract.GPU_SM_CLOCK.name, 0.0, 1e11),
    rows.G_XID: (contract.GPU_XID_ERRORS.name, 0.0, _COUNT),
    rows.G_ECC: (contract.GPU_ECC_UNCORRECTED.name, 0.0, _COUNT),
    rows.G_PCIE_RX: (contract.GPU_PCIE_RX.name, 0.0, 1e13),
    rows.G_PCIE_TX: (contract.GPU_PCIE_TX.name, 0.0, 1e13),
    rows.G_SM_ACTIVE: (contract.GPU_SM_ACTIVE.name, 0.0, 1.0),
    rows.G_TENSOR_ACTIVE: (contract.GPU_TENSOR_ACTIVE.name, 0.0, 1.0),
}


@dataclass(frozen=True, slots=True)
class Admitted:
    """A frame fit for the window, and what was taken out of it."""

    frame: Frame
    dropped_series: int = 0
    dropped_values: int = 0
    notes: tuple[tuple[str, str], ...] = ()
    """(kind, words) of what was dropped, e.g. (KIND_RANK, "rank label(s) 7 are not ...")."""


def admit(fr: Frame, rank: int | None, t: float) -> Admitted:
    """The part of `fr` (scraped at `t`) that rank `rank` may speak for (None: any rank)."""
    notes: list[tuple[str, str]] = []
    dropped_series = 0
    if rank is not None and any(r != rank for r in fr.ranks):
        others = sorted(r for r in fr.ranks if r != rank)
        dropped_series += len(others)
        shown = ",".join(str(r) for r in others[:5]) + ("..." if len(others) > 5 else "")
        notes.append((KIND_RANK, f"rank label(s) {shown} are not this endpoint's rank {rank}"))
        fr = replace(
            fr,
            ranks={r: v for r, v in fr.ranks.items() if r == rank},
            cuda_uuid={r: v for r, v in fr.cuda_uuid.items() if r == rank},
            local_rank={r: v for r, v in fr.local_rank.items() if r == rank},
            node_rank={r: v for r, v in fr.node_rank.items() if r == rank},
            devices={r: v for r, v in (fr.devices or {}).items() if r == rank},
            device_names={r: v for r, v in (fr.device_names or {}).items() if r == rank},
        )
    if len(fr.gpus) > MAX_GPUS_PER_ENDPOINT:
        keep = sorted(fr.gpus)[:MAX_GPUS_PER_ENDPOINT]
        dropped_series += len(fr.gpus) - len(keep)
        notes.append((KIND_GPUS, f"{len(fr.gpus)} GPUs exceed the cap of {MAX_GPUS_PER_ENDPOINT}"))
        fr = replace(fr, gpus={g: fr.gpus[g] for g in keep})
    bad: list[str] = []
    dropped_values = 0
    for row in fr.ranks.values():
        dropped_values += _check(row, _RANK_LIMITS, bad)
        for i, name in _TIMESTAMPS:
            stamp = row[i]
            if stamp == stamp and not (0.0 <= stamp <= t + _CLOCK_SKEW):
                bad.append(f"{name}={_show(stamp)}")
                row[i] = math.nan
                dropped_values += 1
    for _uuid, grow in fr.gpus.values():
        dropped_values += _check(grow, _GPU_LIMITS, bad)
    if bad:
        notes.append((KIND_VALUES, "implausible values " + ", ".join(bad[:MAX_NOTES])))
    if not notes:
        return Admitted(fr)
    return Admitted(fr, dropped_series, dropped_values, tuple(notes))


def _check(row: array[float], limits: dict[int, tuple[str, float, float]], bad: list[str]) -> int:
    dropped = 0
    for i, (name, lo, hi) in limits.items():
        v = row[i]
        # NaN is "absent" and fine; `lo <= v <= hi` is False for NaN, so test it first.
        if v != v or lo <= v <= hi:
            continue
        if len(bad) < MAX_NOTES:
            bad.append(f"{name}={_show(v)}")
        row[i] = math.nan
        dropped += 1
    return dropped


def _show(v: float) -> str:
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    return f"{v:.6g}"
