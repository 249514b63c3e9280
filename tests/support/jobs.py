"""GPUTrainingJob manifests for tests: `python_job` for real pods but no trainer (each rank
runs a Python snippet itself, launcher none, no torch, so a test controls exactly when it
ends), `example_job` for the example trainer under torchrun."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]


def repo_code_env() -> dict[str, str]:
    """The env entry a pod needs to import code of this checkout that no package installs
    (``tests.*``, ``bench.*``): a pod starts from its spec, never from the test's shell."""
    return {"name": "PYTHONPATH", "value": str(REPO)}


def python_job(
    name: str,
    script: str,
    nodes: int = 2,
    gpus: int = 1,
    labels: dict[str, str] | None = None,
    **spec: Any,
) -> dict[str, Any]:
    """A job whose every rank runs `script` (dedented); `spec` keys are merged into the
    defaults one level deep (e.g. `training={"procsPerNode": 2}` keeps launcher none)."""
    body: dict[str, Any] = {
        "image": "python:3.11-slim",
        "nodes": nodes,
        "gpusPerNode": gpus,
        "command": ["python", "-c", textwrap.dedent(script)],
        "training": {"launcher": "none"},
    }
    return _manifest(name, body, spec, labels)


def example_job(name: str, args: list[str], total_steps: int, **spec: Any) -> dict[str, Any]:
    """Two nodes of one rank running `gpujob_trainer.example` with `args`, scraped every 2 s,
    no retries; `spec` keys are merged as in `python_job`."""
    body: dict[str, Any] = {
        "image": "gpujob-trainer:0.1.0",
        "command": ["python", "-m", "gpujob_trainer.example"],
        "args": list(args),
        "nodes": 2,
        "training": {"procsPerNode": 1, "totalSteps": total_steps},
        "monitoring": {"scrapeIntervalSeconds": 2},
        "runPolicy": {"backoffLimit": 0},
    }
    return _manifest(name, body, spec, None)


def _manifest(
    name: str, body: dict[str, Any], spec: dict[str, Any], labels: dict[str, str] | None
) -> dict[str, Any]:
    """`body` with `spec` merged one level deep, as a GPUTrainingJob."""
    for key, value in spec.items():
        if isinstance(value, dict) and isinstance(body.get(key), dict):
            body[key] = {**body[key], **value}
        else:
            body[key] = value
    metadata: dict[str, Any] = {"name": name}
    if labels:
        metadata["labels"] = labels
    return {
        "apiVersion": "gpujob.dev/v1alpha1",
        "kind": "GPUTrainingJob",
        "metadata": metadata,
        "spec": body,
    }
