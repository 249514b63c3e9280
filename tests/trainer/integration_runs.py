"""Run a framework training script (`hf_train.py`, `lightning_train.py`) under a real torchrun
with 2 CPU ranks and read what each rank reported (`integration_report.py`)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from contextlib import redirect_stdout
from dataclasses import dataclass
from io import StringIO
from pathlib import Path
from typing import Any

from trainer_harness import Scrape, TrainerRun, torchrun, wait_for

from gpujob_operator import cli
from gpujob_trainer import contract

HERE = Path(__file__).parent
TIMEOUT = 300.0  # torchrun, torch and the framework imported twice on a loaded 2-core machine


@dataclass
class RankReport:
    """One rank's /metrics at the end of training and the framework's own numbers."""

    scrape: Scrape
    facts: dict[str, Any]

    def value(self, name: str, **labels: str) -> float:
        return self.scrape.value(name, **labels)

    @property
    def exported_global_step(self) -> float:
        return self.value(contract.START_STEP.name) + self.value(contract.STEPS.name)


def reports(out: Path, nproc: int = 2) -> list[RankReport] | None:
    """Every rank's report, once all are written (None before)."""
    paths = [out / f"rank{r}.json" for r in range(nproc)]
    if not all(p.exists() for p in paths):
        return None
    found = []
    for path in paths:
        data = json.loads(path.read_text())
        found.append(RankReport(Scrape.parse(data.pop("metrics")), data))
    return found


def wait_reports(run: TrainerRun, out: Path) -> list[RankReport]:
    def probe() -> list[RankReport] | None:
        if run.proc.poll() not in (None, 0):
            raise AssertionError(f"torchrun exited {run.proc.returncode}:\n{run.log()}")
        return reports(out)

    try:
        return wait_for("every rank's report", probe, TIMEOUT, 0.2)
    except TimeoutError as exc:
        raise AssertionError(f"{exc}\n--- log ---\n{run.log()}") from exc


def train(
    script: str,
    args: Sequence[str],
    out: Path,
    *,
    diagnose: bool = False,
    env: dict[str, str] | None = None,
) -> tuple[list[RankReport], dict[str, Any] | None]:
    """Run `script` to its end; with `diagnose`, the ranks wait after training while
    `gpujob diagnose --json` reads rank 0's live endpoint (its report is returned)."""
    out.mkdir(parents=True, exist_ok=True)
    command = [str(HERE / script), f"--out={out}", *args, *(["--hold"] if diagnose else [])]
    diagnosis = None
    with torchrun(command, out, env=env, worker_tag=script.encode()) as run:
        found = wait_reports(run, out)
        if diagnose:
            url = f"127.0.0.1:{found[0].facts['port']}"
            text = StringIO()
            with redirect_stdout(text):
                rc = cli.main(["diagnose", url, "--window=2", "--interval=1", "--json"])
            assert rc == 0, text.getvalue()
            diagnosis = json.loads(text.getvalue())
            (out / "release").touch()
        assert run.proc.wait(timeout=TIMEOUT) == 0, run.log()
    return found, diagnosis
