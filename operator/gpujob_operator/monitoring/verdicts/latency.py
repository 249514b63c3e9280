"""Step latency of a job's window: the median and p95 step time from the ranks' histograms.

Each rank exports a cumulative step time histogram; its bucket counts sit in the rank rows
(`rows.R_BUCKET0`…) as counters, so the window's distribution is their increase over the
rows past warm-up, pooled over the ranks. A quantile is interpolated linearly within its
bucket, as Prometheus' `histogram_quantile` does, so the figures agree with the dashboards.
"""

from __future__ import annotations

import itertools
import math
import operator
from array import array
from collections.abc import Iterable, Sequence
from typing import Final

from gpujob_operator.monitoring.rows import N_BUCKETS, R_BUCKET0, increase
from gpujob_trainer import contract

BOUNDS: tuple[float, ...] = tuple(float(b) for b in contract.STEP_DURATION_BUCKETS)


_LAST: Final = R_BUCKET0 + N_BUCKETS


def window_counts(rank_rows: Iterable[Sequence[array[float]]]) -> list[float]:
    """Steps per bucket (cumulative, then +Inf) added over the rows, summed over ranks.

    Every bucket's `increase` for every rank, every round: 57,000 calls a round at 4,096
    ranks. A rank whose buckets all carry values and never drop from row to row (no restart
    in the window: the common case) has last minus first for each, compared and subtracted
    slice by slice in C; any other rank takes `increase` bucket by bucket.
    """
    total = [0.0] * N_BUCKETS
    for rows in rank_rows:
        if len(rows) < 2:
            continue  # no increase without two rows
        slices = [row[R_BUCKET0:_LAST] for row in rows]
        # NaN compares false, so a missing value takes the general path too.
        if all(all(map(operator.le, a, b)) for a, b in itertools.pairwise(slices)):
            total = list(map(operator.add, total, map(operator.sub, slices[-1], slices[0])))
            continue
        for i in range(N_BUCKETS):
            v = increase(rows, R_BUCKET0 + i)
            if not math.isnan(v) and v > 0:
                total[i] += v
    return total


def quantile(q: float, cumulative: Sequence[float]) -> float | None:
    """The q-quantile of a cumulative histogram over `BOUNDS` (+Inf last); None if empty.

    Counts are made monotone first (a rank restarted between two rows can leave a bucket's
    increase below its neighbour's). Past the last finite bound the answer is that bound.
    """
    counts: list[float] = []
    running = 0.0
    for c in cumulative:
        running = max(running, c)
        counts.append(running)
    total = counts[-1] if counts else 0.0
    if total <= 0:
        return None
    rank = q * total
    lower_bound, lower_count = 0.0, 0.0
    for bound, count in zip(BOUNDS, counts, strict=False):
        if count >= rank:
            if count == lower_count:
                return bound
            return lower_bound + (bound - lower_bound) * (rank - lower_count) / (
                count - lower_count
            )
        lower_bound, lower_count = bound, count
    return BOUNDS[-1]


def step_latency(rank_rows: Iterable[Sequence[array[float]]]) -> tuple[float | None, float | None]:
    """(median, p95) step seconds of the window's steps, every rank pooled."""
    counts = window_counts(rank_rows)
    return quantile(0.5, counts), quantile(0.95, counts)
