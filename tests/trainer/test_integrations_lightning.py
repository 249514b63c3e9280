"""`GPUJobCallback` in a real Lightning run: a tiny LightningModule, DDP over 2 CPU ranks
under torchrun (gloo), then a second run resumed from a checkpoint Lightning saved."""

from __future__ import annotations

import os
import tomllib
from pathlib import Path

import pytest
from integration_runs import RankReport, train

from gpujob_trainer import contract

pytest.importorskip("lightning")

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

STEPS = 40
BATCHES_PER_STEP = 2  # accumulate_grad_batches
BATCH = 4


@pytest.fixture(scope="module")
def first(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[RankReport]]:
    out = tmp_path_factory.mktemp("lightning-first")
    found, _ = train("lightning_train.py", [f"--steps={STEPS}"], out)
    return out, found


def test_steps_samples_epochs_and_busy_phases(first: tuple[Path, list[RankReport]]) -> None:
    _, found = first
    for rank, r in enumerate(found):
        labels = {"rank": str(rank), "local_rank": str(rank)}
        assert r.facts["global_step"] == STEPS
        # optimizer steps, not batches: accumulation makes two batches one step
        assert r.value("gpujob_train_steps_total", **labels) == STEPS
        assert r.value("gpujob_train_target_steps") == STEPS
        assert r.value("gpujob_train_start_step") == 0
        assert r.value("gpujob_train_samples_total") == STEPS * BATCHES_PER_STEP * BATCH
        assert r.value("gpujob_train_epoch") == 3  # 10 steps an epoch, 0-based
        assert r.value("gpujob_train_loss") > 0
        phases = r.scrape.phases()
        # validation at each epoch's end, saves every 10 steps (the last ones after step 40)
        assert phases["eval"] > 0 and phases["checkpoint"] > 0, phases
        for phase in ("forward", "backward", "optimizer", "comm_wait"):
            assert phases[phase] > 0, (phase, phases)
        step_sum = r.value("gpujob_train_step_duration_seconds_sum")
        assert sum(phases.values()) == pytest.approx(step_sum, rel=1e-6)


def test_resume_from_lightnings_checkpoint_continues_its_global_step(
    first: tuple[Path, list[RankReport]], tmp_path: Path
) -> None:
    out, _ = first
    checkpoint = out / "checkpoints" / "epoch=0-step=10.ckpt"
    assert checkpoint.is_file()
    found, _ = train("lightning_train.py", [f"--steps={STEPS}", f"--resume={checkpoint}"], tmp_path)
    for r in found:
        assert r.value("gpujob_train_start_step") == 10  # the checkpoint's step
        assert r.value("gpujob_train_steps_total") == STEPS - 10
        assert r.exported_global_step == r.facts["global_step"] == STEPS
        assert r.value("gpujob_train_epoch") == 3


def test_the_env_adds_the_callback_through_lightnings_entry_point(tmp_path: Path) -> None:
    """The entry point as pyproject.toml declares it, installed as a distribution's metadata
    on the ranks' path; the script passes no callback of its own."""
    project = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())
    group = "lightning.pytorch.callbacks_factory"
    (name, target), *_ = project["project"]["entry-points"][group].items()
    dist = tmp_path / "site" / "gpujob_entry_points-0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: gpujob-entry-points\nVersion: 0\n")
    (dist / "entry_points.txt").write_text(f"[{group}]\n{name} = {target}\n")
    env = {
        "PYTHONPATH": os.pathsep.join([os.environ.get("PYTHONPATH", ""), str(dist.parent)]),
        contract.ENV_FRAMEWORK_CALLBACK: "1",
    }
    found, _ = train("lightning_train.py", ["--steps=10", "--no-callback"], tmp_path, env=env)
    for r in found:
        assert r.value("gpujob_train_steps_total") == r.facts["global_step"] == 10
        assert r.value("gpujob_train_target_steps") == 10
