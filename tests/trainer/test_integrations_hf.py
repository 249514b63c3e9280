"""`GPUJobCallback` in a real `transformers.Trainer` run: a tiny random GPT-2, 2 CPU ranks
under torchrun (gloo), then a second run resumed from a checkpoint the Trainer saved."""

from __future__ import annotations

from pathlib import Path

import pytest
from integration_runs import RankReport, train

pytest.importorskip("transformers")

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

STEPS = 40
SAMPLES_PER_STEP = 4 * 2  # per-device batch x gradient accumulation
SEQ = 16


@pytest.fixture(scope="module")
def first(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[RankReport]]:
    out = tmp_path_factory.mktemp("hf-first")
    found, _ = train("hf_train.py", [f"--steps={STEPS}"], out)
    return out, found


def test_steps_samples_epochs_and_busy_phases(first: tuple[Path, list[RankReport]]) -> None:
    _, found = first
    for rank, r in enumerate(found):
        labels = {"rank": str(rank), "local_rank": str(rank)}
        assert r.facts["global_step"] == STEPS
        assert r.value("gpujob_train_steps_total", **labels) == STEPS
        assert r.value("gpujob_train_target_steps") == r.facts["max_steps"] == STEPS
        assert r.value("gpujob_train_start_step") == 0
        assert r.value("gpujob_train_samples_total") == STEPS * SAMPLES_PER_STEP
        # the Trainer's token count (all ranks) shared out: every rank saw full sequences
        assert r.value("gpujob_train_tokens_total") == STEPS * SAMPLES_PER_STEP * SEQ
        assert r.value("gpujob_train_epoch") == 1  # 20 steps an epoch, 0-based
        assert 0 < r.value("gpujob_train_loss") < 10
        phases = r.scrape.phases()
        # evaluation after step 20 and saves after 10, 20, 30, each in the next step's span
        assert phases["eval"] > 0 and phases["checkpoint"] > 0, phases
        for phase in ("forward", "backward", "optimizer", "comm_wait"):
            assert phases[phase] > 0, (phase, phases)
        step_sum = r.value("gpujob_train_step_duration_seconds_sum")
        assert sum(phases.values()) == pytest.approx(step_sum, rel=1e-6)


def test_resume_from_the_trainers_checkpoint_continues_its_global_step(
    first: tuple[Path, list[RankReport]], tmp_path: Path
) -> None:
    out, _ = first
    checkpoint = out / "checkpoints" / "checkpoint-20"
    assert checkpoint.is_dir()
    found, diagnosis = train(
        "hf_train.py", [f"--steps={STEPS}", f"--resume={checkpoint}"], tmp_path, diagnose=True
    )
    for r in found:
        assert r.value("gpujob_train_start_step") == 20  # the checkpoint's step
        assert r.value("gpujob_train_steps_total") == STEPS - 20  # this process's own
        assert r.exported_global_step == r.facts["global_step"] == STEPS
        assert r.value("gpujob_train_samples_total") == (STEPS - 20) * SAMPLES_PER_STEP
    # `gpujob diagnose` read rank 0's live endpoint while it waited after training
    assert diagnosis is not None and diagnosis["failures"] == [], diagnosis
    progress = diagnosis["progress"]
    assert progress["totalSteps"] == STEPS, progress
    assert progress["step"] in (STEPS - 20, STEPS), progress  # own steps, or the global step
