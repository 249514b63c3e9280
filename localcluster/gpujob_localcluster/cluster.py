"""A whole local cluster: the control plane plus the node agent, as one object.

Tests use it as a session fixture; ``make cluster`` runs it under a supervisor process
in the background. ``LocalCluster.start`` is the only place that wires the two.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from gpujob_localcluster.controlplane import ControlPlane, wait_for

log = logging.getLogger("gpujob.localcluster")

DEFAULT_FOLDER = Path(os.environ.get("GPUJOB_CLUSTER_DIR", "/tmp/gpujob-cluster"))


@dataclass
class NodeConfig:
    """How many GPU nodes the agent registers and what each offers."""

    count: int = 2
    gpus: int = 4
    cpu: str = "16"
    memory: str = "64Gi"
    prefix: str = "gpu-node"

    @property
    def names(self) -> list[str]:
        return [f"{self.prefix}-{i}" for i in range(self.count)]


@dataclass
class LocalCluster:
    """Control plane + node agent rooted at ``folder``."""

    folder: Path = DEFAULT_FOLDER
    nodes: NodeConfig = field(default_factory=NodeConfig)
    cp: ControlPlane | None = None
    agent: subprocess.Popen[bytes] | None = None

    @property
    def kubeconfig(self) -> Path:
        return self.folder / "admin.kubeconfig"

    @property
    def pods_dir(self) -> Path:
        """Where the agent keeps each pod's folder: container logs, hosts file, pod.json."""
        return self.folder / "agent" / "pods"

    def start(self, timeout: float = 180) -> LocalCluster:
        self.cp = ControlPlane(self.folder).start(timeout)
        try:
            self._start_agent(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def _start_agent(self, timeout: float) -> None:
        assert self.cp is not None
        ready = self.folder / "agent" / "ready"
        ready.parent.mkdir(parents=True, exist_ok=True)
        log_path = self.cp.log_dir / "node-agent.log"
        out = open(log_path, "ab")  # noqa: SIM115 - owned by the child
        self.agent = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "gpujob_localcluster.nodeagent",
                "--kubeconfig",
                str(self.kubeconfig),
                "--nodes",
                str(self.nodes.count),
                "--node-prefix",
                self.nodes.prefix,
                "--gpus-per-node",
                str(self.nodes.gpus),
                "--cpu",
                self.nodes.cpu,
                "--memory",
                self.nodes.memory,
                "--state-dir",
                str(ready.parent),
                "--ready-file",
                str(ready),
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        out.close()
        self.cp.register_pid("node-agent", self.agent.pid)
        agent = self.agent

        def problem() -> str | None:
            code = agent.poll()
            return None if code is None else f"node agent exited with {code}; see {log_path}"

        wait_for(ready.exists, timeout, "the node agent to register its nodes", problem)
        # The node lifecycle controller must see the nodes Ready before the scheduler uses them.
        names = ",".join(self.nodes.names)
        wait_for(
            lambda: self._nodes_ready(), timeout, f"nodes {names} Ready and schedulable", problem
        )

    def _nodes_ready(self) -> bool:
        assert self.cp is not None
        res = self.cp.kubectl(
            "get",
            "nodes",
            "-l",
            "gpujob.dev/local-node=true",
            "-o",
            "jsonpath={range .items[*]}{.metadata.name} {.spec.taints}{'\\n'}{end}",
        )
        lines = [ln for ln in res.stdout.splitlines() if ln.strip()]
        return len(lines) == self.nodes.count and all("not-ready" not in ln for ln in lines)

    def kubectl(self, *args: str, **kw: object) -> subprocess.CompletedProcess[str]:
        assert self.cp is not None
        return self.cp.kubectl(*args, **kw)  # type: ignore[arg-type]

    def stop(self) -> None:
        if self.cp is not None:
            self.cp.stop()
