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
    ended: bool = False
    """The agent has taken in its last attempt's exit (and decided on a restart)."""
    cleared: bool = False
    """Removed by a restart of every container of its pod (``RestartAllContainers``): it
    starts again in its turn, its restart count and last state kept."""
    kind: str = "regular"
    """``regular``, ``init`` (runs to completion first) or ``sidecar`` (a native sidecar:
    an init container with ``restartPolicy: Always``)."""

    @property
    def running(self) -> bool:
        return self.proc is not None and self.exit_code is None

    @property
    def succeeded(self) -> bool:
        """Its last attempt exited 0 and no restart is pending (a finished init container)."""
        return self.exit_code == 0 and self.restart_at is None

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
    host_ip: str = "127.0.0.1"
    """The node's address (a hostNetwork pod's ``ip`` is this one too)."""
    containers: list[ContainerRun] = field(default_factory=list)
    kill_at: float | None = None
    finished: bool = False
    unsent: dict[str, Any] | None = None
    """A status the API did not take (it was down): resent every second until it is taken,
    as a kubelet's status manager does, so an exit during an API outage is never lost."""
    started_at: str = ""
    tokens: list[ProjectedToken] = field(default_factory=list)
    mounts: dict[str, list[volumes.Mount]] = field(default_factory=dict)
    downward_seen: tuple[dict[str, str], dict[str, str]] | None = None
    """The labels and annotations its downwardAPI files were last written from (see
    :func:`podfiles.refresh_downward`): a pod update that leaves them alone costs nothing."""
    conditions: dict[str, tuple[str, str]] = field(default_factory=dict)
    """Condition type -> (status, lastTransitionTime)."""
    devices: dict[str, list[str]] = field(default_factory=dict)
    """Container name -> the DRA devices allocated to the claims it names (see dra)."""
    initialized: bool = False
    """Every init container is done (sidecars started); the regular containers were started."""
    init_failed: bool = False
    """An init container failed for good: the pod fails, its regular containers never run."""
    winding_down: bool = False
    """The regular containers are done (or init failed): sidecars are stopped, none restarts."""
    sidecar_deadline: float | None = None
    """Monotonic SIGKILL deadline of the sidecars' stop (the pod's grace period)."""
    restarting_all: bool = False
    """A container exited by a ``RestartAllContainers`` rule: every container is being
    killed (condition AllContainersRestarting True) before all start again in place."""
    in_place: bool = False
    """From that exit until the regular containers run again: the pod stays Running."""
    restart_all_at: float | None = None
    """Monotonic time the cleared pod starts again (the trigger's crash-loop back-off)."""
    restart_all_trigger: str = ""
    """The container whose exit restarted them all."""
    restart_all_backoff: BackOff = field(default_factory=BackOff)
    """The crash-loop back-off of the pod's restarts of every container, whichever
    container fires them."""

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

    def of_kind(self, *kinds: str) -> list[ContainerRun]:
        """Its containers of the given kinds, in spec order (init containers first)."""
        return [c for c in self.containers if c.kind in kinds]

    def container(self, name: str) -> ContainerRun | None:
        return next((c for c in self.containers if c.name == name), None)
