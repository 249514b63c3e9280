"""targets.job_targets: the job's target steps when ranks disagree, and each rank's own."""

from __future__ import annotations

import math
from array import array

from gpujob_operator.monitoring.rows import R_STEPS, R_TARGET, R_WIDTH
from gpujob_operator.monitoring.verdicts.targets import MAX_LISTED, job_targets
from gpujob_operator.monitoring.window import RankSeries


def ranks(*targets: float | None, steps: float = 0.0) -> list[RankSeries]:
    out = []
    for rank, target in enumerate(targets):
        row = array("d", [math.nan]) * R_WIDTH
        row[0], row[R_STEPS] = 100.0, steps
        if target is not None:
            row[R_TARGET] = target
        out.append(RankSeries(f"pod-{rank}", "node", rank, rank, 0, rows=[row]))
    return out


def test_ranks_that_agree_give_their_target_and_no_note() -> None:
    t = job_targets(ranks(1000, 1000, None), fallback=5)
    assert (t.total, t.note) == (1000, "")
    assert job_targets(ranks(None, None), fallback=5).total == 5  # the spec's
    assert job_targets(ranks(None), fallback=None).total is None


def test_one_huge_target_neither_sets_the_total_nor_escapes_the_note() -> None:
    cases = (
        ((1000, 1000, 1000, 1e15), "rank 3: 1e+15"),  # beyond any job
        ((1000, 1e11), "rank 1: 1e+11"),  # far above the other rank's
        ((1000, 20000, 1000), "rank 1: 20000"),
    )
    for targets, said in cases:
        t = job_targets(ranks(*targets), fallback=None)
        assert t.total == 1000, targets
        assert t.note.endswith(f"(the job's is 1000): {said} (rejected)"), t.note
    # every rank's target implausible: none is believed, the spec's counts, and it is said
    t = job_targets(ranks(1e13, 1e13), fallback=500)
    assert t.total == 500 and t.note.startswith("rejected the target steps"), t.note


def test_slightly_different_targets_each_judge_their_own_rank() -> None:
    series = ranks(1000, 1001)
    t = job_targets(series, fallback=None)
    assert t.total == 1001  # a tie goes to the larger: 100 % only once a real end is reached
    assert [t.of(s) for s in series] == [1000, 1001]
    assert t.note == "ranks disagree on the target steps (the job's is 1001): rank 0: 1000"
    # the most common target wins over a larger one
    assert job_targets(ranks(1000, 1000, 1001), fallback=None).total == 1000


def test_finished_is_per_rank_against_its_own_target() -> None:
    done = ranks(100, 100, steps=100)
    assert job_targets(done, fallback=None).finished(done)
    uneven = ranks(100, 101, steps=100)  # rank 1 has a step to go
    assert not job_targets(uneven, fallback=None).finished(uneven)
    for s, steps in zip(uneven, (100, 101), strict=True):
        s.rows[-1][R_STEPS] = steps
    assert job_targets(uneven, fallback=None).finished(uneven)
    # a rank with a rejected (or no) target is finished at the job's
    huge = ranks(100, 100, 1e15, None, steps=100)
    assert job_targets(huge, fallback=None).finished(huge)
    # without any target nothing is finished
    none = ranks(None, steps=100)
    assert not job_targets(none, fallback=None).finished(none)


def test_the_note_is_bounded_whatever_the_ranks_report() -> None:
    t = job_targets(ranks(*(1000 + r for r in range(500))), fallback=None)
    assert t.note.count("rank ") == MAX_LISTED and "and 495 more" in t.note
    assert len(t.note) < 200, t.note


def test_a_target_below_its_own_ranks_steps_is_refused_and_cannot_sink_the_real_one() -> None:
    """A rank exporting its loader's length (10) while training 1000 steps: once it has
    passed 10 its figure is impossible; before, it pulled the median down, the real 1000
    was rejected as an outlier and the job judged finished at step 10."""
    series = ranks(10, 1000, steps=50)
    t = job_targets(series, fallback=None)
    assert t.total == 1000 and t.of(series[0]) == 1000
    assert not t.finished(series)
    assert "rank 0: 10 (rejected)" in t.note
    low = ranks(1000, 1000, 50, 50, steps=120)
    assert job_targets(low, fallback=None).total == 1000
    # A little past its own target (an off-by-one) is no reason to refuse it: finished.
    over = ranks(100, 100, steps=101)
    t = job_targets(over, fallback=None)
    assert t.total == 100 and t.finished(over)


def test_the_specs_figure_breaks_a_tie_between_ranks() -> None:
    assert job_targets(ranks(100, 120), fallback=120).total == 120
    assert job_targets(ranks(100, 120), fallback=None).total == 120  # else the larger
