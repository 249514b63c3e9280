"""Find (and on a cold cache, build) the control-plane binaries.

The binaries come from Go modules through ``hack/build-tools.sh``; they live in a
cache outside the repo keyed by versions. ``GPUJOB_K8S_BIN_DIR`` points at a ready
folder instead (for example one built by hand elsewhere).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = REPO_ROOT / "hack" / "build-tools.sh"
BINARIES = (
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kubectl",
    "helm",
)


class ToolsUnavailable(RuntimeError):
    """The control plane cannot run because a binary is missing and could not be built."""


def _missing(bin_dir: Path) -> list[str]:
    return [b for b in BINARIES if not os.access(bin_dir / b, os.X_OK)]


def bin_dir(build: bool = True) -> Path:
    """Return the folder holding every binary, building them when the cache is cold."""
    override = os.environ.get("GPUJOB_K8S_BIN_DIR")
    if override:
        path = Path(override)
        missing = _missing(path)
        if missing:
            raise ToolsUnavailable(f"GPUJOB_K8S_BIN_DIR={path} lacks {', '.join(missing)}")
        return path
    if not BUILD_SCRIPT.exists():
        raise ToolsUnavailable(f"{BUILD_SCRIPT} not found; run from a gpujob checkout")
    probe = subprocess.run(
        ["bash", str(BUILD_SCRIPT), "--print-bin-dir"], capture_output=True, text=True, check=True
    )
    path = Path(probe.stdout.strip())
    if (path / ".complete").exists() and not _missing(path):
        return path
    if not build:
        raise ToolsUnavailable(f"control-plane binaries are not built yet in {path}")
    result = subprocess.run(["bash", str(BUILD_SCRIPT)], capture_output=True, text=True)
    if result.returncode != 0:
        tail = "\n".join(result.stderr.splitlines()[-30:])
        raise ToolsUnavailable(
            f"building the control plane from Go modules failed (exit {result.returncode}):\n{tail}"
        )
    path = Path(result.stdout.strip().splitlines()[-1])
    missing = _missing(path)
    if missing:
        raise ToolsUnavailable(f"the build finished but {', '.join(missing)} is missing in {path}")
    return path
