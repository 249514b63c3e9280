"""A whole local cluster: the control plane plus the node agent, as one object.

Tests use it as a session fixture; ``make cluster`` runs it under a supervisor process
in the background. ``LocalCluster.start`` is the only place that wires the two.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import signal
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from gpujob_localcluster.controlplane import ControlPlane
from gpujob_localcluster.hollow.faults import RankFault
from gpujob_localcluster.hollow.kubelet import write_faults
from gpujob_localcluster.nodes import node_addresses
from gpujob_localcluster.processes import descendants, pid_alive, wait_for

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


HOLLOW_CLIENT_QPS = 200
"""The controller-manager's and scheduler's API rate with hollow nodes (thousands of nodes
and pods: the defaults, 20 and 50 a second, are the bottleneck there)."""


HOLLOW_NODE_GRACE_SECONDS = 180.0
"""The least node grace of a cluster with hollow nodes (`HollowConfig.node_grace_seconds`)."""


@dataclass
class HollowConfig:
    """Hollow nodes beside the real ones (:mod:`gpujob_localcluster.hollow`): registered and
    scheduled to like any node, their pods reported Running without a container."""

    count: int = 0
    gpus: int = 8
    prefix: str = "hollow-node"
    endpoint_processes: int = 2
    lease_seconds: float = 10.0

    @property
    def node_grace_seconds(self) -> float:
        """The controller-manager's node grace with hollow nodes: several lease intervals.

        The hollow kubelet renews every node's Lease from one process on a machine the whole
        control plane shares; in a burst (hundreds of 400 KB pods created) the renewals and
        the controller-manager's lease informer fall tens of seconds behind. At the default
        grace (under a minute) the node lifecycle controller then marks live hollow nodes Unknown and,
        five minutes later, evicts their pods one node every 10 s: a bench artefact, not
        what the operator does.
        """
        return max(HOLLOW_NODE_GRACE_SECONDS, 4 * self.lease_seconds)

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
    gang_scheduling: bool = False
    """Native gang scheduling (Workload/PodGroup API, GangScheduling plugin); see ControlPlane."""
    kueue: bool = False
    """Run Kueue's manager too (built from its Go module; see kueue.py)."""
    hollow: HollowConfig = field(default_factory=HollowConfig)
    hollow_proc: subprocess.Popen[bytes] | None = None
    node_ips: list[str] = field(default_factory=list)
    """Each node's loopback address, chosen on the agent's first start and kept across its
    restarts (a restarted kubelet keeps its node's address)."""

    @property
    def kubeconfig(self) -> Path:
        return self.folder / "admin.kubeconfig"

    @property
    def pods_dir(self) -> Path:
        """Where the agent keeps each pod's folder: container logs, hosts file, pod.json."""
        return self.folder / "agent" / "pods"

    def start(self, timeout: float = 180) -> LocalCluster:
        self.cp = ControlPlane(
            self.folder,
            gang_scheduling=self.gang_scheduling,
            client_qps=HOLLOW_CLIENT_QPS if self.hollow.count else 0,
            node_grace_seconds=self.hollow.node_grace_seconds if self.hollow.count else 0,
        ).start(timeout)
        try:
            if self.kueue:
                from gpujob_localcluster.kueue import Kueue

                Kueue(self.cp).start(timeout)
            self._start_agent(timeout)
            if self.hollow.count:
                self._start_hollow(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def kill_agent(self) -> list[int]:
        """SIGKILL the node agent and every pod process it runs, as a node crash would.

        The agent starts each pod in a session of its own, so its process group alone would
        leave the pods running; the whole family is found first and killed after the agent.
        Returns the pod processes that were killed.
        """
        assert self.agent is not None
        family = descendants(self.agent.pid)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.agent.pid, signal.SIGKILL)
        for pid in family:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        self.agent.wait(timeout=10)
        # The orphans are reparented to init (or our subreaper); wait until they are gone.
        wait_for(lambda: not [p for p in family if pid_alive(p)], 30, "the pod processes to die")
        return family

    def start_agent(self, timeout: float = 180) -> None:
        """Start the node agent again (after :meth:`kill_agent`); it re-registers its nodes."""
        if self.agent is not None and self.agent.poll() is None:
            raise RuntimeError(f"the node agent still runs (pid {self.agent.pid})")
        self._start_agent(timeout)

    def _start_agent(self, timeout: float) -> None:
        assert self.cp is not None
        ready = self.folder / "agent" / "ready"
        ready.parent.mkdir(parents=True, exist_ok=True)
        ready.unlink(missing_ok=True)
        if not self.node_ips:
            self.node_ips = node_addresses(self.nodes.count, random.randint(0, 254))
        # The kubelet API's serving certificate, checked by the API server against the local CA
        # at each node's InternalIP.
        serving = self.cp.pki.issue(
            "kubelet",
            "gpujob-node-agent",
            sans=(
                "IP:127.0.0.1",
                "DNS:localhost",
                *(f"IP:{ip}" for ip in self.node_ips),
                *(f"DNS:{n}" for n in self.nodes.names),
            ),
        )
        self.agent, problem = self._spawn(
            "node-agent",
            [
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
                "--kubelet-cert",
                str(serving.cert),
                "--kubelet-key",
                str(serving.key),
                "--client-ca",
                str(self.cp.pki.ca_cert),
                *(arg for ip in self.node_ips for arg in ("--node-ip", ip)),
            ],
        )
        wait_for(ready.exists, timeout, "the node agent to register its nodes", problem)
        # The node lifecycle controller must see the nodes Ready before the scheduler uses them.
        names = ",".join(self.nodes.names)
        wait_for(
            lambda: self._ready("gpujob.dev/local-node=true", self.nodes.count),
            timeout,
            f"nodes {names} Ready and schedulable",
            problem,
        )

    @property
    def hollow_dir(self) -> Path:
        """The hollow kubelet's folder: its ready file and the fault file it polls."""
        return self.folder / "hollow"

    def hollow_faults(self, faults: list[RankFault]) -> None:
        """Give hollow jobs' ranks these faults (replacing the previous ones)."""
        write_faults(self.hollow_dir, faults)

    def _start_hollow(self, timeout: float) -> None:
        assert self.cp is not None
        ready = self.hollow_dir / "ready"
        ready.parent.mkdir(parents=True, exist_ok=True)
        ready.unlink(missing_ok=True)
        h = self.hollow
        self.hollow_proc, problem = self._spawn(
            "hollow-kubelet",
            [
                "gpujob_localcluster.hollow.kubelet",
                "--kubeconfig",
                str(self.kubeconfig),
                "--nodes",
                str(h.count),
                "--node-prefix",
                h.prefix,
                "--gpus-per-node",
                str(h.gpus),
                "--state-dir",
                str(self.hollow_dir),
                "--ready-file",
                str(ready),
                "--endpoint-processes",
                str(h.endpoint_processes),
                "--lease-seconds",
                str(h.lease_seconds),
            ],
        )
        wait_for(ready.exists, timeout, "the hollow kubelet to register its nodes", problem)
        wait_for(
            lambda: self._ready("gpujob.dev/hollow-node=true", h.count),
            timeout,
            f"{h.count} hollow nodes Ready and schedulable",
            problem,
        )

    def _spawn(
        self, name: str, module_args: list[str]
    ) -> tuple[subprocess.Popen[bytes], Callable[[], str | None]]:
        """Start ``python -m <module_args>`` in a session of its own, logging to the cluster's
        logs/<name>.log and recorded for teardown; with what to say should it die."""
        assert self.cp is not None
        log_path = self.cp.log_dir / f"{name}.log"
        with open(log_path, "ab") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", *module_args],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        self.cp.register_pid(name, proc.pid)

        def problem() -> str | None:
            code = proc.poll()
            return None if code is None else f"{name} exited with {code}; see {log_path}"

        return proc, problem

    def _ready(self, selector: str, count: int) -> bool:
        """Exactly ``count`` nodes carry ``selector`` and none is tainted not-ready."""
        assert self.cp is not None
        res = self.cp.kubectl(
            "get",
            "nodes",
            "-l",
            selector,
            "-o",
            "jsonpath={range .items[*]}{.metadata.name} {.spec.taints}{'\\n'}{end}",
        )
        lines = [ln for ln in res.stdout.splitlines() if ln.strip()]
        return len(lines) == count and all("not-ready" not in ln for ln in lines)

    def kubectl(self, *args: str, **kw: object) -> subprocess.CompletedProcess[str]:
        assert self.cp is not None
        return self.cp.kubectl(*args, **kw)  # type: ignore[arg-type]

    def stop(self) -> None:
        if self.cp is not None:
            self.cp.stop()
