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


def kubectl(
    env: dict[str, str], *args: str, check: bool = False
) -> subprocess.CompletedProcess[str]:
    res = subprocess.run(
        [str(bin_dir() / "kubectl"), *args], capture_output=True, text=True, env=env, timeout=60
    )
    assert res.returncode == 0 or not check, res.stderr
    return res


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


def test_a_second_start_in_the_same_folder_serves_pod_logs(tmp_path: Path) -> None:
    """Each start picks new node addresses; the kubelet's serving certificate must name them,
    or ``kubectl logs`` fails "x509: certificate is valid for ..., not 127.255.x.y"."""
    folder = tmp_path / "c"
    try:
        for start in (1, 2):
            up = cli("up", "--dir", str(folder), "--nodes", "1")
            assert up.returncode == 0, up.stderr
            env = {**os.environ, "KUBECONFIG": str(folder / "admin.kubeconfig")}
            pod = f"hello-{start}"
            kubectl(env, "run", pod, "--image=busybox", "--restart=Never", "--command", "--",
                    "sh", "-c", f"echo start {start}", check=True)  # fmt: skip
            kubectl(env, "wait", "--for=jsonpath={.status.phase}=Succeeded", f"pod/{pod}",
                    "--timeout=60s", check=True)  # fmt: skip
            logs = kubectl(env, "logs", pod)
            assert logs.returncode == 0 and logs.stdout.strip() == f"start {start}", logs.stderr
            if start == 1:
                assert cli("down", "--dir", str(folder)).returncode == 0
    finally:
        cli("down", "--dir", str(folder))
