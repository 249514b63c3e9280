"""`gpujob diagnose` judges by the job's own settings: --job, flags over it, refusals."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpujob_operator import api, cli
from gpujob_operator.monitoring.diagnose import SettingsError, add_arguments, settings_from_args
from gpujob_operator.monitoring.verdicts.analysis_settings import Settings

MINIMAL = Path(__file__).resolve().parents[4] / "crds" / "samples" / "minimal.yaml"


def parse(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_arguments(p)
    return p.parse_args(["127.0.0.1:1", *argv])


def job_file(tmp_path: Path, **monitoring: Any) -> Path:
    doc = yaml.safe_load(MINIMAL.read_text())
    doc["spec"]["training"] = {**doc["spec"].get("training", {}), "totalSteps": 5000}
    doc["spec"]["monitoring"] = monitoring
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_without_a_job_the_settings_are_the_apis_defaults() -> None:
    s = settings_from_args(parse("--window=10", "--interval=1"))
    d = Settings.from_monitoring(api.Monitoring())
    assert s.thresholds == d.thresholds == api.Thresholds()
    assert (s.warmup_steps, s.stall_timeout_seconds, s.startup_timeout_seconds) == (
        d.warmup_steps,
        d.stall_timeout_seconds,
        d.startup_timeout_seconds,
    )
    assert (s.window_seconds, s.scrape_interval_seconds) == (10, 1)


def test_the_jobs_monitoring_is_used_and_flags_override_it(tmp_path: Path) -> None:
    path = job_file(
        tmp_path,
        warmupSteps=7,
        stallTimeoutSeconds=600,
        busyTimeoutSeconds=900,
        thresholds={"commBoundRatio": 0.1, "checkpointBoundRatio": 0.3},
    )
    s = settings_from_args(parse(f"--job={path}"))
    assert s.total_steps == 5000 and s.warmup_steps == 7
    assert s.stall_timeout_seconds == 600 and s.busy_timeout_seconds == 900
    assert s.thresholds.comm_bound_ratio == 0.1 and s.thresholds.checkpoint_bound_ratio == 0.3

    s = settings_from_args(
        parse(
            f"--job={path}",
            "--warmup-steps=2",
            "--busy-timeout=60",
            "--startup-timeout=120",
            "--threshold=commBoundRatio=0.2",
        )
    )
    assert s.warmup_steps == 2 and s.busy_timeout_seconds == 60
    assert s.startup_timeout_seconds == 120 and s.stall_timeout_seconds == 600
    assert s.thresholds.comm_bound_ratio == 0.2 and s.thresholds.checkpoint_bound_ratio == 0.3


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--threshold=commBoundRatoi=0.1"], "--threshold commBoundRatoi: unknown"),
        (["--threshold=commBoundRatio"], "expected NAME=VALUE"),
        (["--threshold=commBoundRatio=lots"], "commBoundRatio"),
        (["--threshold=inputWarnRatio=0.9"], "inputWarnRatio"),  # warn >= bound
        (["--busy-timeout=-1"], "--busy-timeout: must be >= 0"),
    ],
)
def test_a_bad_option_is_refused_naming_it(argv: list[str], words: str) -> None:
    with pytest.raises(SettingsError, match=words):
        settings_from_args(parse(*argv))


def test_a_bad_job_file_is_refused_naming_the_field(tmp_path: Path) -> None:
    path = job_file(tmp_path, scrapeIntervalSeconds=0)
    with pytest.raises(SettingsError, match=r"spec\.monitoring\.scrapeIntervalSeconds"):
        settings_from_args(parse(f"--job={path}"))
    (tmp_path / "list.yaml").write_text("- 1\n")
    with pytest.raises(SettingsError, match="not a GPUTrainingJob manifest"):
        settings_from_args(parse(f"--job={tmp_path / 'list.yaml'}"))
    with pytest.raises(SettingsError, match=r"missing\.yaml"):
        settings_from_args(parse(f"--job={tmp_path / 'missing.yaml'}"))


def test_the_cli_refuses_before_scraping(capsys: pytest.CaptureFixture[str]) -> None:
    # 127.0.0.1:1 is never dialled: the refusal comes first, with a usage exit code
    rc = cli.main(["diagnose", "127.0.0.1:1", "--threshold=nope=1"])
    assert rc == 64
    assert "gpujob diagnose: --threshold nope: unknown" in capsys.readouterr().err


def test_diagnose_needs_neither_kopf_nor_the_kubernetes_client(tmp_path: Path) -> None:
    """`gpujob diagnose` runs on a trainer's node or a laptop, where only the trainer's
    packages are: importing the operator's kopf handlers there failed before it scraped."""
    blocker = tmp_path / "sitecustomize.py"
    blocker.write_text(
        "import sys\n"
        "class _NoOperatorDeps:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in ('kopf', 'kubernetes'):\n"
        "            raise ImportError(f'{name} is not installed here')\n"
        "sys.meta_path.insert(0, _NoOperatorDeps())\n"
    )
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}:{os.environ.get('PYTHONPATH', '')}"}

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, *args], capture_output=True, text=True, env=env, timeout=60
        )

    assert "is not installed here" in run("-c", "import kopf").stderr  # the blocker works
    out = run(
        *("-m", "gpujob_operator.cli", "diagnose", "127.0.0.1:1"),
        *("--window=1", "--interval=0.5", "--timeout=1"),
    )
    assert "Traceback" not in out.stderr, out.stderr
    assert "WaitingForRanks" in out.stdout, out.stdout
