"""Own time, the per-rank breakdown, CheckpointBound and EvalBound on synthetic windows.

The windows are written as exposition text and parsed like a scrape (the helpers of
test_analysis); each case sets per-step phase seconds the way a real DDP loop spends them:
the rank with more own work hardly waits, the others wait for it in all-reduce.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from gpujob_operator import api
from gpujob_operator.monitoring.verdicts.analysis import Analysis
from gpujob_operator.monitoring.verdicts.verdict import (
    CHECKPOINT_BOUND,
    COMMUNICATION_BOUND,
    EVAL_BOUND,
    HEALTHY,
    STRAGGLER,
    VERDICTS,
)
from gpujob_operator.observability import opfamilies
from tests.unit.operator.monitoring.test_analysis import (
    GIB,
    SETTINGS,
    Job,
    RankSim,
    run,
    two_ranks,
    verdict,
)


def _names(a: Analysis) -> list[str]:
    return [c.verdict for c in a.candidates]


def _lockstep(job: Job, slow: int, extra: float, phase: str = "other") -> None:
    """Rank `slow` spends `extra` more seconds per step in `phase`; the others wait for it."""
    for r in job.ranks:
        if r.rank == slow:
            r.phases[phase] = r.phases.get(phase, 0.0) + extra
        else:
            r.phases["comm_wait"] += extra


def test_straggler_in_loss_outside_the_model_is_named() -> None:
    # The old score looked at forward/backward/optimizer only: equal on both ranks here.
    job = Job([RankSim(0, 0), RankSim(1, 1, reserved=GIB, uuid="GPU-b")])
    _lockstep(job, slow=1, extra=0.2)
    a = run(job)
    assert verdict(a) == STRAGGLER, [c.summary for c in a.candidates]
    v = a.verdict
    assert v is not None
    assert (v.rank, v.pod, v.node, v.gpu_uuid) == (1, "pod-1", "node-pod-1", "GPU-b")
    ev = v.evidence
    assert ev["gapOutsideCompute"] == "true"
    assert ev["computeSecondsPerStep"] == pytest.approx(ev["othersComputeSecondsPerStep"])
    assert ev["ownSecondsPerStep"] == pytest.approx(0.285, abs=1e-3)
    assert ev["othersOwnSecondsPerStep"] == pytest.approx(0.085, abs=1e-3)
    # the asymmetry: the fast rank waits the straggler's extra work, the slow one does not
    assert ev["waitExplainedRatio"] == pytest.approx(1.0, abs=1e-3)
    assert float(ev["othersCommWaitSecondsPerStep"]) > 10 * float(ev["commWaitSecondsPerStep"])
    assert "outside forward/backward/optimizer" in v.summary
    assert COMMUNICATION_BOUND not in _names(a)


def test_straggler_in_preprocessing_among_eight_ranks() -> None:
    job = Job([RankSim(i, i % 4, node_rank=i // 4) for i in range(8)])
    _lockstep(job, slow=5, extra=0.1)
    a = run(job)
    assert verdict(a) == STRAGGLER and a.verdict is not None and a.verdict.rank == 5
    assert a.verdict.evidence["stragglerScore"] == pytest.approx(0.085 / 0.185, abs=1e-3)


def test_straggler_in_compute_still_named() -> None:
    job = two_ranks()
    _lockstep(job, slow=0, extra=0.1, phase="backward")
    a = run(job)
    assert verdict(a) == STRAGGLER and a.verdict is not None and a.verdict.rank == 0
    assert a.verdict.evidence["gapOutsideCompute"] == "false"


def test_mild_imbalance_is_healthy_with_the_score_in_evidence() -> None:
    job = two_ranks()
    _lockstep(job, slow=1, extra=0.02)  # 0.085 vs 0.105 s: score 0.81 >= 0.75
    a = run(job)
    assert verdict(a) == HEALTHY, [c.summary for c in a.candidates]
    assert a.verdict is not None
    assert a.verdict.evidence["stragglerScore"] == pytest.approx(0.085 / 0.105, abs=1e-3)


def test_symmetric_waits_stay_communication_bound() -> None:
    job = two_ranks()
    for r in job.ranks:
        r.phases["comm_wait"] = 0.06
    a = run(job)
    assert verdict(a) == COMMUNICATION_BOUND
    assert a.verdict is not None and a.verdict.evidence["commWaitSymmetry"] == 1.0


def test_asymmetric_waits_are_not_blamed_on_the_network() -> None:
    # Rank 0 waits 45% of its step, but only because rank 1 works 0.1 s longer.
    job = two_ranks()
    _lockstep(job, slow=1, extra=0.1, phase="forward")
    a = run(job)
    assert verdict(a) == STRAGGLER
    assert COMMUNICATION_BOUND not in _names(a)


def test_breakdown_is_bounded_and_validates() -> None:
    job = Job([RankSim(i, i % 8, node_rank=i // 8) for i in range(64)])
    for i, r in enumerate(job.ranks):
        r.phases["other"] = 0.001 * i  # rank 63 slowest, rank 0 fastest
    _lockstep(job, slow=63, extra=0.2)
    a = run(job)
    assert a.verdict is not None
    rows = a.verdict.to_status()["breakdown"]
    assert [(b["rank"], b["role"]) for b in rows] == [
        (63, "slowest"),
        (62, "slowest"),
        (61, "slowest"),
        (31, "median"),
        (0, "fastest"),
    ]
    top = rows[0]
    parts = ("ownSeconds", "dataWaitSeconds", "commWaitSeconds", "checkpointSeconds")
    assert sum(top[k] for k in (*parts, "evalSeconds")) == pytest.approx(top["stepSeconds"])
    assert top["otherSeconds"] == pytest.approx(top["ownSeconds"] - top["computeSeconds"])
    b = api.Bottleneck.model_validate(a.verdict.to_status())
    assert b.breakdown is not None and b.breakdown[0].own_seconds == top["ownSeconds"]


def test_healthy_has_a_breakdown_too() -> None:
    a = run(two_ranks())
    assert verdict(a) == HEALTHY and a.verdict is not None
    assert {b.role for b in a.verdict.breakdown} == {"slowest", "fastest"}


def test_checkpoint_on_rank_zero_is_checkpoint_bound_not_a_straggler() -> None:
    job = Job([RankSim(0, 0, reserved=GIB, uuid="GPU-a"), RankSim(1, 1)])
    _lockstep(job, slow=0, extra=0.06, phase="checkpoint")  # 0.06 / 0.16 = 38%
    a = run(job)
    assert verdict(a) == CHECKPOINT_BOUND, [c.summary for c in a.candidates]
    v = a.verdict
    assert v is not None and (v.rank, v.pod, v.gpu_uuid) == (0, "pod-0", "GPU-a")
    assert v.evidence["checkpointRatio"] == pytest.approx(0.06 / 0.16, abs=1e-3)
    assert v.evidence["othersCheckpointRatio"] == 0.0
    assert "async" in v.advice and "interval" in v.advice
    assert STRAGGLER not in _names(a) and COMMUNICATION_BOUND not in _names(a)


def test_sharded_checkpoint_names_no_rank() -> None:
    job = two_ranks()
    for r in job.ranks:
        r.phases["checkpoint"] = 0.05
    a = run(job)
    assert verdict(a) == CHECKPOINT_BOUND and a.verdict is not None
    assert a.verdict.rank is None and a.verdict.pod is None


def test_checkpoint_below_or_above_a_job_threshold() -> None:
    job = two_ranks()
    for r in job.ranks:
        r.phases["checkpoint"] = 0.008  # 8.6%: below the 10% default
    assert verdict(run(job)) == HEALTHY
    job = two_ranks()
    for r in job.ranks:
        r.phases["checkpoint"] = 0.05
    lenient = replace(SETTINGS, thresholds=api.Thresholds(checkpoint_bound_ratio=0.5))
    assert verdict(run(job, settings=lenient)) == HEALTHY


def _evaluating() -> Job:
    job = two_ranks()
    for r in job.ranks:
        r.phases["eval"] = 0.04  # 0.04 / 0.14 = 29%
    return job


def test_eval_between_steps_is_eval_bound() -> None:
    a = run(_evaluating())
    assert verdict(a) == EVAL_BOUND, [c.summary for c in a.candidates]
    v = a.verdict
    assert v is not None and v.evidence["evalRatio"] == pytest.approx(0.04 / 0.14, abs=1e-3)
    assert "less often" in v.advice
    strict = replace(SETTINGS, thresholds=api.Thresholds(eval_bound_ratio=0.3))
    assert verdict(run(_evaluating(), settings=strict)) == HEALTHY


def test_ratios_are_shares_of_training_time() -> None:
    # A comm-bound job that also evaluates: the comm ratio is judged on its steps alone.
    job = two_ranks()
    for r in job.ranks:
        r.phases["comm_wait"] = 0.04
        r.phases["eval"] = 0.135
    a = run(job)
    assert _names(a) == [EVAL_BOUND, COMMUNICATION_BOUND]
    assert a.verdict is not None
    assert a.verdict.evidence["alsoDetected"] == COMMUNICATION_BOUND
    comm = next(c for c in a.candidates if c.verdict == COMMUNICATION_BOUND)
    assert comm.evidence["commWaitRatio"] == pytest.approx(0.04 / 0.135, abs=1e-3)


def test_operator_metrics_know_every_verdict() -> None:
    assert set(opfamilies.VERDICTS) == set(VERDICTS)


def _long_run(steps: int = 10_000) -> Job:
    """Two ranks that already ran `steps` steps of the default phases."""
    job = two_ranks()
    for r in job.ranks:
        r.steps = steps
        for p, v in r.phases.items():
            r.total[p] = v * steps
    return job


def test_a_rare_checkpoint_in_the_window_is_judged_over_the_run() -> None:
    job = _long_run()  # 1,000 s of steps so far

    def save(j: Job, i: int) -> None:
        if i == 5:  # one 20 s save by rank 0, its peer waiting in all-reduce
            j.ranks[0].total["checkpoint"] += 20.0
            j.ranks[1].total["comm_wait"] += 20.0

    job.hooks.append(save)
    a = run(job)
    assert verdict(a) == HEALTHY, [c.summary for c in a.candidates]


def test_frequent_checkpoints_outside_the_window_still_count() -> None:
    job = _long_run()
    job.ranks[0].total["checkpoint"] = 500.0  # a third of the run so far, none in the window
    a = run(job)
    assert verdict(a) == CHECKPOINT_BOUND, [c.summary for c in a.candidates]
    assert a.verdict is not None
    assert a.verdict.evidence["checkpointRatio"] == pytest.approx(
        500 / 1508, abs=1e-3
    )  # 80 steps since
    assert a.verdict.evidence["windowCheckpointRatio"] == 0.0


def test_diagnose_prints_the_breakdown() -> None:
    from gpujob_operator.monitoring import diagnose

    job = two_ranks()
    _lockstep(job, slow=1, extra=0.2)
    a = run(job)
    assert a.verdict is not None
    lines = [diagnose._breakdown_line(r) for r in a.verdict.to_status()["breakdown"]]
    assert lines[0] == (
        "rank 1 slowest (pod-1): step 0.3s = own 0.285 (compute 0.085, other 0.2) "
        "+ data 0.01 + comm 0.005"
    )
    assert lines[1].startswith("rank 0 fastest (pod-0): step 0.3s = own 0.085")
