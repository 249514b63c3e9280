"""The operator as a real process, the way a Deployment runs it, for integration tests."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from gpujob_localcluster.controlplane import free_port
from tests.support.waiting import wait_until


@dataclass
class OperatorProcess:
    """``python -m gpujob_operator operator`` watching some namespaces with some kubeconfig."""

    kubeconfig: Path
    namespaces: list[str]
    log_path: Path
    extra_env: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen[bytes] | None = None
    health_port: int = 0
    metrics_port: int = 0

    def start(self, timeout: float = 60) -> OperatorProcess:
        self.health_port = free_port()
        self.metrics_port = free_port()
        env = {**os.environ, "KUBECONFIG": str(self.kubeconfig), **self.extra_env}
        args = [
            sys.executable,
            "-m",
            "gpujob_operator",
            "operator",
            "--liveness",
            f"http://127.0.0.1:{self.health_port}/healthz",
            "--metrics-port",
            str(self.metrics_port),
        ]
        for ns in self.namespaces:
            args += ["--namespace", ns]
        out = open(self.log_path, "ab")  # noqa: SIM115 - handed to the child
        self.proc = subprocess.Popen(
            args, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
        out.close()
        wait_until(self.healthy, timeout, f"operator liveness (log: {self.log_path})")
        return self

    def healthy(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"operator exited with {self.proc.returncode}: {self.log_tail()}")
        try:
            with urllib.request.urlopen(
                f"http://127.0.0.1:{self.health_port}/healthz", timeout=2
            ) as r:
                return int(r.status) == 200
        except OSError:
            return False

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def rbac_denials(self) -> list[str]:
        """Log lines where the API server refused the operator for lack of permission.

        A 403 shows as "Forbidden" in the client's and kopf's errors (a bare "403" also matches
        audit IDs, ports and tokens). Namespaces of earlier tests that are still terminating
        refuse new content with a Forbidden too, and kopf's namespace scan may be refused in
        namespaced mode: neither is a missing permission of the operator's own work.
        """
        log = self.log_path.read_text().replace("Not enough permissions to list namespaces", "")
        return [
            line
            for line in log.splitlines()
            if "Forbidden" in line
            and "being terminated" not in line
            and "NamespaceTerminating" not in line
        ]

    def kill(self) -> None:
        """SIGKILL, as a node failure or OOM would: no graceful shutdown."""
        assert self.proc is not None
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(5)
