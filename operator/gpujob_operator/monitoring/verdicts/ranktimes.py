"""Per-rank statistics of a window: the rows past warm-up, and the phase seconds in them.

`post_warmup` keeps a rank's rows from the first one at or past the warm-up steps (cut at a
restart); `rank_times` sums a rank's phase seconds over those rows (counter increases) into
`RankTimes`, from which the step-time verdicts (`steptime`) and the per-rank breakdown
(`verdict.RankBreakdown`) are computed.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Sequence
from dataclasses import dataclass

from gpujob_operator.monitoring.rows import (
    R_COMPUTE,
    R_PHASE,
    R_STEP_COUNT,
    R_STEP_SUM,
    R_STEPS,
    increase,
    latest,
)
from gpujob_operator.monitoring.window import RankSeries
from gpujob_trainer import contract


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
    h2d: float = 0.0
    """Copying batches to the GPU: part of the rank's own time (it is its work)."""
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


def post_warmup(rows: Sequence[array[float]], warmup_steps: int) -> list[array[float]]:
    """Rows from the first one at or past the warm-up steps, cut at a restart below it."""
    out: list[array[float]] = []
    for row in rows:
        steps = row[R_STEPS]
        if math.isnan(steps) or steps < warmup_steps:
            out = []  # before warm-up ends, or a restarted rank warming up again
            continue
        out.append(row)
    return out


def rank_times(series: RankSeries, rows: Sequence[array[float]]) -> RankTimes | None:
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
        h2d=inc(R_PHASE[contract.PHASE_H2D]),
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
