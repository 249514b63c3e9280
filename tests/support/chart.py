"""Run the locally built helm against the repository's chart (no cluster needed to render)."""

from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import yaml

from gpujob_localcluster import tools

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "gpujob"

NAMESPACED = {"rbac": {"mode": "namespaced", "namespaces": ["team-a", "team-b"]}}
PEERING = {"replicaCount": 2, "peering": {"enabled": True}}
PROMETHEUS_PEER = {
    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
    "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}},
}
"""The Prometheus that scrapes the PodMonitor, let through the jobs' NetworkPolicies."""
PODMONITOR = {
    "metrics": {"podMonitor": {"enabled": True}},
    "jobEndpoints": {"networkPolicy": {"metricsFrom": [PROMETHEUS_PEER]}},
}
MONITORING = {
    "metrics": {"serviceMonitor": {"enabled": True}, "podMonitor": {"enabled": True}},
    "prometheusRule": {"enabled": True},
    "jobEndpoints": PODMONITOR["jobEndpoints"],
}
MODES: dict[str, dict[str, Any]] = {
    "default": {},
    "namespaced": NAMESPACED,
    "peering-cluster": PEERING,
    "peering-namespaced": {**NAMESPACED, **PEERING},
    "monitoring": MONITORING,
    "gang": {
        "gang": {"default": "Native", "native": {"enabled": True}, "kueue": {"enabled": True}}
    },
    "everything": {**NAMESPACED, **PEERING, **MONITORING},
}
"""Values for each mode the chart supports; tests lint and render every one."""


def helm(
    *args: str, kubeconfig: Path | None = None, home: Path | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """Run helm; never raises on a non-zero exit (tests assert on the result).

    ``home`` keeps helm's cache/config/data out of the user's home (installs write there)."""
    cmd = [str(tools.bin_dir() / "helm"), *args]
    if kubeconfig is not None:
        cmd += ["--kubeconfig", str(kubeconfig)]
    env = dict(os.environ)
    if home is not None:
        for var in ("HELM_CACHE_HOME", "HELM_CONFIG_HOME", "HELM_DATA_HOME"):
            env[var] = str(home / var.lower())
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)


def values_file(values: dict[str, Any], folder: Path) -> Path:
    path = folder / "values.yaml"
    path.write_text(yaml.safe_dump(values))
    return path


def template(
    values: dict[str, Any] | None = None,
    *extra: str,
    namespace: str = "gpujob-system",
    release: str = "gj",
) -> subprocess.CompletedProcess[str]:
    """``helm template`` with the given values (written to a file, so types are exact)."""
    with tempfile.TemporaryDirectory() as tmp:
        f = values_file(values or {}, Path(tmp))
        return helm("template", release, str(CHART), "-n", namespace, "-f", str(f), *extra)


def render(values: dict[str, Any] | None = None, *extra: str, **kw: Any) -> list[dict[str, Any]]:
    """The rendered objects; fails the test with helm's message when rendering fails."""
    res = template(values, *extra, **kw)
    assert res.returncode == 0, res.stderr
    return [d for d in yaml.safe_load_all(res.stdout) if d]


def find(objs: list[dict[str, Any]], kind: str, name: str | None = None) -> list[dict[str, Any]]:
    return [
        o for o in objs if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)
    ]
