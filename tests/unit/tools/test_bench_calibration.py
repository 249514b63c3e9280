"""The overhead bench's step-size search reaches its target on a launch-bound step too."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench"))

from trainer_overhead import next_batch, search_batch


@pytest.mark.parametrize(
    ("fixed", "per_sample"),
    [
        (0.0, 1e-4),  # a CPU step: time proportional to the batch
        (1.4e-3, 3.7e-8),  # a GPU step: 1.4 ms of launches, the batch hardly shows
        (5e-3, 1e-6),
    ],
)
def test_the_search_lands_within_five_percent(fixed: float, per_sample: float) -> None:
    batch, seconds = search_batch(lambda b: fixed + per_sample * b, 0.01)
    assert seconds == pytest.approx(0.01, rel=0.05), batch


def test_growth_is_capped_per_try() -> None:
    assert next_batch([(64, 1e-3)], 1.0) == 64 * 64
    assert next_batch([(64, 1e-3), (128, 1e-3)], 0.01) == 1280  # flat: no slope, scale up
