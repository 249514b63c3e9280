"""`make cluster` / `make cluster-down`: the CLI they call starts a usable cluster and stops it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from gpujob_localcluster.controlplane import STATE_FILE
from gpujob_localcluster.tools import bin_dir


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpujob_localcluster.cli", *args],
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_up_prints_a_usable_kubeconfig_and_down_stops_everything(tmp_path: Path) -> None:
    folder = tmp_path / "c"
    try:
        up = cli("up", "--dir", str(folder))
        assert up.returncode == 0, up.stderr
        export = up.stdout.strip().splitlines()[-1]
        assert export == f"export KUBECONFIG={folder / 'admin.kubeconfig'}"
        env = {**os.environ, "KUBECONFIG": export.split("=", 1)[1]}
        nodes = subprocess.run(
            [str(bin_dir() / "kubectl"), "get", "nodes", "-o", "name"],
            capture_output=True, text=True, env=env, timeout=60,
        )  # fmt: skip
        assert nodes.stdout.split() == ["node/gpu-node-0", "node/gpu-node-1"], nodes.stderr
        again = cli("up", "--dir", str(folder))
        assert again.returncode == 0 and "already runs" in again.stderr
    finally:
        down = cli("down", "--dir", str(folder))
    assert down.returncode == 0 and "kube-apiserver" in down.stderr
    assert not (folder / STATE_FILE).exists()
    assert "nothing was running" in cli("down", "--dir", str(folder)).stderr
