"""What the node agent knows about each pod it runs, and about each of its containers.

Plain records: the agent's loop, the container runtime, the status reporter and the pod's
files all read and update the same :class:`PodRun` and :class:`ContainerRun`, so they
live apart from each of those. Timestamps are kept as the API wants them (:func:`now_iso`).
"""

from __future__ import annotations

import datetime as dt
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpujob_localcluster import probes, volumes
from gpujob_localcluster.restarts import BackOff


def now_iso() -> str:
    """An RFC 3339 timestamp in UTC, as the API expects."""
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class ContainerRun:
    """One container of a pod: its current attempt, its restarts and its probes."""

    name: str
    spec: dict[str, Any]
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None
    exit_code: int | None = None
    reason: str = ""
    message: str = ""
    started_at: str = ""
    finished_at: str = ""
    attempt: int = 0
    restart_count: int = 0
    last_state: dict[str, Any] = field(default_factory=dict)
    restart_at: float | None = None
    """Monotonic time of a pending restart (None: none pending)."""
    waiting: tuple[str, str] | None = None
    backoff: BackOff = field(default_factory=BackOff)
    probe_states: dict[str, probes.ProbeState] = field(default_factory=dict)
    kill_at: float | None = None
    """SIGKILL deadline of a stop the agent started (a failed liveness probe)."""
    env: dict[str, str] = field(default_factory=dict)
    family: set[int] = field(default_factory=set)
    """Every process seen under this container: killed when it ends, like a cgroup."""

    @property
    def running(self) -> bool:
        return self.proc is not None and self.exit_code is None

    @property
    def previous_log(self) -> Path:
        return self.log_path.with_name(f"{self.name}.previous.log")

    def passing(self, kind: str) -> bool:
        """Whether the probe of ``kind`` passes (True when the container has none)."""
        state = self.probe_states.get(kind)
        return state is None or state.passing

    @property
    def started(self) -> bool:
        return self.running and self.passing("startup")

    @property
    def ready(self) -> bool:
        return self.started and self.passing("readiness")


@dataclass
class ProjectedToken:
    """A token file of a projected volume, and when it was last written."""

    path: Path
    source: volumes.TokenSource
    issued_at: float


@dataclass
class PodRun:
    """A pod this agent has taken on."""

    uid: str
    namespace: str
    name: str
    pod: dict[str, Any]
    ip: str
    folder: Path
    containers: list[ContainerRun] = field(default_factory=list)
    kill_at: float | None = None
    finished: bool = False
    unsent: dict[str, Any] | None = None
    """A status the API did not take (it was down): resent every second until it is taken,
    as a kubelet's status manager does, so an exit during an API outage is never lost."""
    started_at: str = ""
    tokens: list[ProjectedToken] = field(default_factory=list)
    mounts: dict[str, list[volumes.Mount]] = field(default_factory=dict)
    conditions: dict[str, tuple[str, str]] = field(default_factory=dict)
    """Condition type -> (status, lastTransitionTime)."""

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def policy(self) -> str:
        return str(self.pod.get("spec", {}).get("restartPolicy") or "Always")

    @property
    def deleting(self) -> bool:
        return self.kill_at is not None

    def group(self) -> tuple[str, str] | None:
        sub = self.pod.get("spec", {}).get("subdomain")
        return (self.namespace, sub) if sub else None

    def alive(self) -> list[ContainerRun]:
        return [c for c in self.containers if c.running]
