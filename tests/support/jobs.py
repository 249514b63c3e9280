"""GPUTrainingJob manifests for tests that need real pods but no trainer: each rank runs a
Python snippet itself (launcher none, no torch), so a test controls exactly when it ends."""

from __future__ import annotations

import textwrap
from typing import Any


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
