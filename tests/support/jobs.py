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


def paced_job(
    name: str,
    steps: int,
    step_seconds: float,
    gpus: int = 4,
    nodes: int = 1,
    labels: dict[str, str] | None = None,
    **spec: Any,
) -> dict[str, Any]:
    """A job whose ranks run ``steps`` steps of ``step_seconds`` (a sleep: the workload)
    through the real tracker and exporter, without torch: its ETA is known and exact.
    Scraped every 2 s; ``spec`` keys merge as in `python_job`."""
    script = f"""
        import time
        from prometheus_client import CollectorRegistry
        from gpujob_trainer import contract
        from gpujob_trainer.env import metrics_addr, metrics_base_port
        from gpujob_trainer.exporter import Exporter, TrainerCollector
        from gpujob_trainer.tracker import Tracker

        tracker = Tracker(total_steps={steps}, hook_optimizers=False)
        registry = CollectorRegistry(auto_describe=False)
        registry.register(TrainerCollector(tracker))
        port = contract.metrics_port(metrics_base_port(), tracker.rank.local_rank)
        Exporter(registry, port, metrics_addr()).start()
        for step in range({steps}):
            time.sleep({step_seconds})
            tracker.end_step()
            tracker.log(samples=8)
        time.sleep(0.5)  # let the last step be scraped
    """
    body = {"training": {"launcher": "none", "totalSteps": steps}}
    merged = {"monitoring": {"scrapeIntervalSeconds": 2}, **body}
    for k, v in spec.items():
        merged[k] = (
            {**merged[k], **v} if isinstance(v, dict) and isinstance(merged.get(k), dict) else v
        )
    return python_job(name, script, nodes, gpus, labels, **merged)


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


def script_job(name: str, script: Path, args: list[str], **spec: Any) -> dict[str, Any]:
    """Two nodes of one rank running the Python script `script` under torchrun, scraped
    every 2 s, no retries, no spec.training.totalSteps (the trainer exports its target);
    `spec` keys are merged as in `python_job`."""
    body: dict[str, Any] = {
        "image": "gpujob-trainer:0.1.0",
        "command": ["python", str(script)],
        "args": list(args),
        "nodes": 2,
        "training": {"procsPerNode": 1},
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


def hollow_job(name: str, pods: int, ranks: int, pad_kb: int = 0, **spec: Any) -> dict[str, Any]:
    """``pods`` x ``ranks`` on hollow nodes (it tolerates their taint and selects them), a
    step a second, ``pad_kb`` KB of env per pod (a wide template); ``spec`` keys merged."""
    from gpujob_localcluster.hollow.kubelet import ENV_STEP_SECONDS, ROLE_LABEL, TOLERATION

    env = [{"name": ENV_STEP_SECONDS, "value": "1"}]
    env += [{"name": f"PAD_{i}", "value": "x" * 4000} for i in range(pad_kb // 4)]
    body: dict[str, Any] = {
        "image": "gpujob-trainer:0.1.0",
        "command": ["python", "-m", "gpujob_trainer.example"],
        "nodes": pods,
        "gpusPerNode": ranks,
        "training": {"totalSteps": 10_000_000},
        "env": env,
        "template": {"tolerations": [TOLERATION], "nodeSelector": {ROLE_LABEL: "true"}},
        "monitoring": {"scrapeIntervalSeconds": 5, "stallTimeoutSeconds": 10},
        "runPolicy": {"backoffLimit": 3},
    }
    return _manifest(name, body, spec, None)
