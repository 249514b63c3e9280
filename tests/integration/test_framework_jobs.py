"""Hugging Face Trainer and Lightning jobs through the operator: the framework callbacks
alone (no wrap_model/wrap_loader in the script) give the status its steps, target and
throughput, and a Trainer resumed from its own checkpoint shows the run's global step.

The scripts are the trainer tier's (tests/trainer/hf_train.py, lightning_train.py): tiny
random models built from a config, two nodes of one CPU rank each, gloo.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.integration.conftest import job_status
from tests.integration.test_progress_verdicts import watch
from tests.support.jobs import REPO, script_job
from tests.support.kube import Kube
from tests.support.operator import OperatorProcess

pytest.importorskip("transformers")
pytest.importorskip("lightning")

pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.timeout(900)]

STEPS = 40
SCRIPTS = REPO / "tests" / "trainer"


LINGER = "--linger=8"
"""The run takes seconds: its ranks serve their final values for a few scrapes."""


def framework_job(name: str, script: str, args: list[str]) -> dict[str, Any]:
    return script_job(name, SCRIPTS / script, [*args, LINGER], training={"rdzvTimeoutSeconds": 180})


def ranks_report(out: Path) -> list[dict[str, Any]]:
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]


def assert_finished_at(kube: Kube, name: str, rows: list[dict[str, str]]) -> dict[str, Any]:
    status = job_status(kube, name)
    assert rows[-1]["STATUS"] == "Succeeded", (rows, status.get("failure"))
    progress = status["progress"]
    assert progress["step"] == STEPS and progress["totalSteps"] == STEPS, progress
    assert progress["percent"] == 100.0
    return status


def test_hugging_face_trainer_job_and_its_resume(
    kube: Kube, operator: OperatorProcess, tmp_path: Path
) -> None:
    first, second = tmp_path / "first", tmp_path / "second"
    kube.apply(framework_job("hf-first", "hf_train.py", [f"--steps={STEPS}", f"--out={first}"]))
    rows = watch(kube, "hf-first", timeout=600)
    assert_finished_at(kube, "hf-first", rows)
    # the target came from the Trainer (state.max_steps), not from the spec
    assert any(r["PROGRESS"].endswith("%") and r["STATUS"] == "Running" for r in rows), rows
    assert all(r["global_step"] == STEPS for r in ranks_report(first))

    checkpoint = first / "checkpoints" / "checkpoint-20"
    assert checkpoint.is_dir(), sorted(p.name for p in (first / "checkpoints").iterdir())
    args = [f"--steps={STEPS}", f"--out={second}", f"--resume={checkpoint}"]
    kube.apply(framework_job("hf-resumed", "hf_train.py", args))
    rows = watch(kube, "hf-resumed", timeout=600)
    status = assert_finished_at(kube, "hf-resumed", rows)
    assert status["progress"].get("resumedFromStep") == 20, status["progress"]
    # while it ran, the shown step was the run's global step: never below the resume point
    shown = [float(r["PROGRESS"].rstrip("%")) for r in rows if r["PROGRESS"].endswith("%")]
    assert shown and min(shown) >= 50.0, rows


def test_lightning_job_reaches_its_target_through_the_callback(
    kube: Kube, operator: OperatorProcess, tmp_path: Path
) -> None:
    out = tmp_path / "pl"
    kube.apply(framework_job("pl", "lightning_train.py", [f"--steps={STEPS}", f"--out={out}"]))
    rows = watch(kube, "pl", timeout=600)
    assert_finished_at(kube, "pl", rows)
    assert any(r["THROUGHPUT"].endswith("samples/s") for r in rows), rows
