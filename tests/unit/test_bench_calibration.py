"""The overhead bench's step-size search reaches its target on a launch-bound step too."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from trainer_overhead import next_batch


def search(
    step_seconds: Callable[[int], float], target: float, tries: int = 12
) -> tuple[int, float]:
    seen = [(64, step_seconds(64))]
    for _ in range(tries - 1):
        if abs(seen[-1][1] / target - 1) < 0.05:
            break
        batch = next_batch(seen, target)
        seen.append((batch, step_seconds(batch)))
    return seen[-1]


@pytest.mark.parametrize(
    ("fixed", "per_sample"),
    [
        (0.0, 1e-4),  # a CPU step: time proportional to the batch
        (1.4e-3, 3.7e-8),  # a GPU step: 1.4 ms of launches, the batch hardly shows
        (5e-3, 1e-6),
    ],
)
def test_the_search_lands_within_five_percent(fixed: float, per_sample: float) -> None:
    batch, seconds = search(lambda b: fixed + per_sample * b, 0.01)
    assert seconds == pytest.approx(0.01, rel=0.05), batch


def test_growth_is_capped_per_try() -> None:
    assert next_batch([(64, 1e-3)], 1.0) == 64 * 64
    assert next_batch([(64, 1e-3), (128, 1e-3)], 0.01) == 1280  # flat: no slope, scale up
