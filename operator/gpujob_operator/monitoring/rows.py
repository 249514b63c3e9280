"""The fixed-position rows a scrape is boiled down to, and reset-aware counter arithmetic.

The operator holds a window for every job it watches (a thousand jobs of eight ranks must
fit in well under 150 MB), so a scrape is boiled down at once to fixed-position rows of
floats (`array('d')`), one per (pod, rank) and one per GPU; label strings live once per
series, never per point. Absent values are NaN. This module is the layout of those rows
(which field sits where) and the arithmetic the analysis does along a series of them
(counter increases across resets, rates, the latest value).
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Sequence
from typing import Final

from gpujob_trainer import contract

NAN: Final = math.nan

# ---- rank rows: one per scrape of a rank ------------------------------------------------
R_T: Final = 0
"""Scrape time, seconds since the epoch."""
R_STEPS, R_TARGET, R_SAMPLES, R_TOKENS, R_EPOCH, R_LOSS = 1, 2, 3, 4, 5, 6
R_STEP_COUNT, R_STEP_SUM, R_COMPUTE, R_LAST_STEP = 7, 8, 9, 10
R_CUDA_RESERVED, R_CUDA_RETRIES, R_CUDA_OOMS = 11, 12, 13
R_PHASE0: Final = 14
R_PHASE: Final = {name: R_PHASE0 + i for i, name in enumerate(contract.PHASES)}
R_HEARTBEAT: Final = R_PHASE0 + len(contract.PHASES)
"""Unix time the rank last changed phase (its liveness between steps)."""
R_CURRENT_PHASE: Final = R_HEARTBEAT + 1
"""Index in `contract.PHASES` of the phase the rank is in (NaN: not exported)."""
R_FLOPS: Final = R_CURRENT_PHASE + 1
"""Model FLOPs of the work done (a counter)."""
R_PEAK: Final = R_FLOPS + 1
"""Dense peak FLOP/s of the rank's GPU at its precision (0: unknown, see R_PEAK_REASON)."""
R_PEAK_REASON: Final = R_PEAK + 1
"""Index in `contract.PEAK_REASONS` of why the peak is (not) known."""
R_DTYPE: Final = R_PEAK_REASON + 1
"""Index in `contract.PEAK_DTYPES` of the rank's training precision."""
R_CLOCK: Final = R_DTYPE + 1
"""Unix time on the rank's own clock when it answered: R_LAST_STEP and R_HEARTBEAT are
on that clock, so their ages are taken against it, never against the operator's clock."""
R_BUCKET0: Final = R_CLOCK + 1
"""The step time histogram's cumulative counts, one field per contract bound, then +Inf:
counters, so a window's quantiles come from their increases."""
N_BUCKETS: Final = len(contract.STEP_DURATION_BUCKETS) + 1
R_START_STEP: Final = R_BUCKET0 + N_BUCKETS
"""The run's step the rank's process started (or resumed) from: its global step is this plus
R_STEPS (NaN: an older trainer, whose R_STEPS is the global step)."""
R_WIDTH: Final = R_START_STEP + 1

# ---- GPU rows: one per scrape of a GPU (exported by local rank 0 of its node) ----------
G_T, G_UTIL, G_MEM_USED, G_MEM_TOTAL, G_POWER, G_POWER_LIMIT = 0, 1, 2, 3, 4, 5
G_TEMP, G_SM_CLOCK, G_THROTTLE, G_XID, G_ECC = 6, 7, 8, 9, 10
G_PCIE_RX, G_PCIE_TX, G_SM_ACTIVE, G_TENSOR_ACTIVE = 11, 12, 13, 14
G_WIDTH: Final = 15
"""G_THROTTLE is a bit mask of the active `contract.THROTTLE_REASONS` (bit i = reason i)."""

THROTTLE_BIT: Final = {name: 1 << i for i, name in enumerate(contract.THROTTLE_REASONS)}


def throttle_reasons(mask: float) -> list[str]:
    """The throttle reason names set in a G_THROTTLE mask."""
    if math.isnan(mask):
        return []
    m = int(mask)
    return [name for name, bit in THROTTLE_BIT.items() if m & bit]


# ---- counter arithmetic ------------------------------------------------------------------


def increase(rows: Sequence[array[float]], index: int) -> float:
    """Increase of a counter over rows, like Prometheus' increase(): a drop is a reset,
    after which the counter counts from zero. NaN when fewer than two rows carry it."""
    total = 0.0
    prev = NAN
    seen = 0
    for row in rows:
        v = row[index]
        if math.isnan(v):
            continue
        if seen:
            total += v - prev if v >= prev else v
        prev = v
        seen += 1
    return total if seen >= 2 else NAN


def span(rows: Sequence[array[float]], index: int) -> float:
    """Seconds between the first and last rows that carry the field (NaN if < 2)."""
    first = last = NAN
    for row in rows:
        if not math.isnan(row[index]):
            if math.isnan(first):
                first = row[0]
            last = row[0]
    return last - first if not math.isnan(first) and last > first else NAN


def rate(rows: Sequence[array[float]], index: int) -> float:
    """Per-second increase over rows (NaN if not computable)."""
    inc = increase(rows, index)
    dt = span(rows, index)
    return inc / dt if not math.isnan(inc) and not math.isnan(dt) else NAN


def mean(rows: Sequence[array[float]], index: int) -> float:
    """The mean of a field over rows, absent values skipped (NaN if none)."""
    values = [row[index] for row in rows if not math.isnan(row[index])]
    return math.fsum(values) / len(values) if values else NAN


def latest(rows: Sequence[array[float]], index: int) -> float:
    """The most recent non-NaN value of a field (NaN if none)."""
    for row in reversed(rows):
        v = row[index]
        if not math.isnan(v):
            return v
    return NAN


def global_step(rows: Sequence[array[float]]) -> float:
    """The run's step of a rank: its newest step counter plus the step its process started
    from (resumed checkpoints count; a start absent or refused counts as 0). NaN without a
    step counter."""
    for row in reversed(rows):
        steps = row[R_STEPS]
        if math.isnan(steps):
            continue
        start = row[R_START_STEP]
        if math.isnan(start):
            start = latest(rows, R_START_STEP)
        return steps + (start if not math.isnan(start) else 0.0)
    return NAN


def own_clock_age(rows: Sequence[array[float]], index: int) -> tuple[float, float]:
    """(scrape time, age) of a timestamp field (R_LAST_STEP, R_HEARTBEAT) in the newest row
    that carries it, the age taken on the rank's own clock (R_CLOCK of that row), so a node
    whose clock is off by minutes ages nothing wrongly. (NaN, NaN) without the field, and a
    NaN age without the clock (an older trainer): its node's clock is not the operator's."""
    for row in reversed(rows):
        stamp = row[index]
        if math.isnan(stamp) or stamp <= 0:
            continue
        clock = row[R_CLOCK]
        return row[R_T], max(0.0, clock - stamp) if not math.isnan(clock) else NAN
    return NAN, NAN
