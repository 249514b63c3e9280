"""The operator as a real process, the way a Deployment runs it, for integration tests."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from gpujob_localcluster.pki import Pki
from gpujob_localcluster.ports import free_port
from tests.support.incluster import rbac_denials
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
    webhook: bool = False
    """Opt-in: serve the admission webhook on 127.0.0.1 (a CA and serving certificate of
    its own) and register it for the watched namespaces (host mode)."""
    webhook_port: int = 0

    @property
    def webhook_name(self) -> str:
        """The ValidatingWebhookConfiguration this operator registers (host mode)."""
        return f"gpujob-test-{'-'.join(self.namespaces) or 'all'}"[:253]

    def webhook_args(self) -> list[str]:
        """The flags that serve and register the webhook, with a serving certificate for
        IP 127.0.0.1 issued by a CA of this operator's own (made once per log folder)."""
        pki = Pki(self.log_path.parent / "webhook-pki")
        served = pki.issue("webhook", "gpujob-webhook", sans=("IP:127.0.0.1",))
        self.webhook_port = free_port()
        return [
            "--webhook-port", str(self.webhook_port),
            "--webhook-cert", str(served.cert),
            "--webhook-key", str(served.key),
            "--webhook-ca", str(pki.ca_cert),
            "--webhook-register", self.webhook_name,
            # Only the API server (its AdmissionConfiguration's client certificate, signed by
            # the cluster's CA) is answered.
            "--webhook-client-ca", str(self.cluster_ca()),
        ]  # fmt: skip

    def cluster_ca(self) -> Path:
        """The cluster's CA file, as the kubeconfig names it (the local cluster's always do)."""
        config = yaml.safe_load(self.kubeconfig.read_text())
        return Path(config["clusters"][0]["cluster"]["certificate-authority"])

    def start(self, timeout: float = 60) -> OperatorProcess:
        self.health_port = free_port()
        self.metrics_port = free_port()
        env = {**os.environ, "KUBECONFIG": str(self.kubeconfig), **self.extra_env}
        if self.webhook:
            env.setdefault("GPUJOB_WEBHOOK_ADDR", "127.0.0.1")
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
        if self.webhook:
            args += self.webhook_args()
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

    def metrics(self) -> str | None:
        """The process's own /metrics text (None while it does not answer)."""
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"operator exited with {self.proc.returncode}: {self.log_tail()}")
        try:
            with urllib.request.urlopen(
                f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=2
            ) as r:
                return str(r.read().decode())
        except OSError:
            return None

    def counter(self, series: str) -> float:
        """The value of one exact series of its /metrics (``name{labels}``); 0 when absent."""
        for line in (self.metrics() or "").splitlines():
            if line.startswith(series + " "):
                return float(line.rsplit(" ", 1)[1])
        return 0.0

    def reconciled(self, namespace: str, name: str) -> bool:
        """This process has reconciled the job: its own /metrics export the job's phase.

        A real "up" signal for one job (liveness only says the process serves HTTP): the
        series appears only after a reconcile pass of that job finished.
        """
        text = self.metrics()
        if text is None:
            return False
        want = (f'namespace="{namespace}"', f'job_name="{name}"')
        return any(
            line.startswith("gpujob_job_phase{") and all(w in line for w in want)
            for line in text.splitlines()
        )

    def wait_exit(self, timeout: float) -> int:
        """Wait for the process to end by itself (an injected fault); its exit code."""
        assert self.proc is not None
        return self.proc.wait(timeout)

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def rbac_denials(self) -> list[str]:
        """Log lines where the API server refused the operator for lack of permission."""
        return rbac_denials(self.log_path.read_text())

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
