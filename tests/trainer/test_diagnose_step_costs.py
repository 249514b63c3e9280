"""`gpujob diagnose` on real 2-rank torchrun runs whose cost lies outside forward/backward.

A rank slow in its loss head or its on-device preprocessing (both outside the wrapped model)
must be named as the Straggler, with the breakdown that shows where its time goes; periodic
checkpoints and evaluations must read as CheckpointBound and EvalBound. The extra work is
sized at about twice a step's compute, so the verdicts hold when the two ranks contend for
two busy cores (a contended rank is ~1/3 slower than one alone).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from test_diagnose_runs import BASE, HEALTHY_ARGS, diagnose_until, urls, wait_warm
from trainer_harness import torchrun_example

from gpujob_operator.monitoring.verdicts.verdict import (
    CHECKPOINT_BOUND,
    COMMUNICATION_BOUND,
    EVAL_BOUND,
    STRAGGLER,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]


@pytest.mark.parametrize(
    ("name", "switches", "slow_rank"),
    [
        ("slow_loss", ["--slow-loss-rank=1", "--slow-loss-seconds=0.6"], 1),
        ("slow_preprocess", ["--slow-preprocess-rank=0", "--slow-preprocess-seconds=0.6"], 0),
    ],
)
def test_rank_slow_outside_the_model_is_the_straggler(
    name: str, switches: list[str], slow_rank: int, tmp_path: Path
) -> None:
    with torchrun_example([*BASE, *switches], tmp_path) as run:
        wait_warm(run)
        update, published = diagnose_until(run, STRAGGLER)
        b = update.bottleneck
        print(f"{name}: {b}")  # the figures, for a -s run
        assert b is not None and b["verdict"] == STRAGGLER, (published, update.analysis)
        assert b["rank"] == slow_rank and b["pod"] == urls(run)[slow_rank]
        ev = b["evidence"]
        assert ev["gapOutsideCompute"] == "true", ev
        # the asymmetry: the fast rank waits in all-reduce, the straggler hardly does
        assert ev["othersCommWaitSecondsPerStep"] > 2 * ev["commWaitSecondsPerStep"], ev
        rows = {r["rank"]: r for r in b["breakdown"]}
        assert rows[slow_rank]["role"] == "slowest" and rows[1 - slow_rank]["role"] == "fastest"
        assert rows[slow_rank]["otherSeconds"] > 0.3, rows
        assert COMMUNICATION_BOUND not in (ev.get("alsoDetected") or ""), ev


@pytest.mark.parametrize(
    ("name", "switches", "expected", "rank"),
    [
        (
            "checkpoint",
            ["--checkpoint-every=3", "--checkpoint-seconds=1.0", "--checkpoint-rank=0"],
            CHECKPOINT_BOUND,
            0,
        ),
        ("eval", ["--eval-every=3", "--eval-seconds=1.0"], EVAL_BOUND, None),
    ],
)
def test_periodic_phase_gets_its_verdict(
    name: str, switches: list[str], expected: str, rank: int | None, tmp_path: Path
) -> None:
    # The healthy run's size: gloo's all-reduce stays well under CommunicationBound's 15%.
    with torchrun_example([*HEALTHY_ARGS, *switches], tmp_path) as run:
        wait_warm(run)
        update, published = diagnose_until(run, expected)
        b = update.bottleneck
        print(f"{name}: {b}")  # the figures, for a -s run
        assert b is not None and b["verdict"] == expected, (published, update.analysis)
        assert b.get("rank") == rank, b
        assert b["advice"] and b["summary"]
        assert STRAGGLER not in published, published
        # waits caused by the save or the evaluation are not blamed on the network
        assert COMMUNICATION_BOUND not in (b["evidence"].get("alsoDetected") or ""), b
        phase = "checkpoint" if expected == CHECKPOINT_BOUND else "eval"
        assert b["evidence"][f"{phase}Ratio"] > 0.15, b["evidence"]
