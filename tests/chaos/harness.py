"""What the chaos tier watches while it breaks things: the operator's RSS, CPU and health,
and every pod the operator ever creates; both report into the ledger (:mod:`tests.chaos.ledger`).

Each piece runs beside the test as a thread and only reads (the API, /proc, /healthz), so it
sees the faults the way a user would.
"""

from __future__ import annotations

import json
import os
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes import client, config, watch

from tests.chaos.ledger import Ledger
from tests.support.jobs import python_job
from tests.support.operator import OperatorProcess

LABEL_JOB = "gpujob.dev/job-name"
LABEL_ATTEMPT = "gpujob.dev/attempt"
LABEL_RANK = "gpujob.dev/node-rank"
WATCH_SECONDS = 3
"""How long one watch request of the pod recorder lasts: its ``stop`` waits at most this."""


# ---- the operator under test ---------------------------------------------------------------


def rss_bytes(pid: int) -> int | None:
    """Resident set size of ``pid`` from /proc (None once it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def cpu_seconds(pid: int) -> float:
    """User + system CPU time ``pid`` has used, from /proc (0 once it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Sampler(threading.Thread):
    """Calls ``probe`` every ``interval`` seconds until stopped (RSS, /healthz latency)."""

    def __init__(self, probe: Callable[[], None], interval: float) -> None:
        super().__init__(daemon=True)
        self.probe, self.interval = probe, interval
        self.stopping = threading.Event()

    def run(self) -> None:
        while not self.stopping.is_set():
            self.probe()
            self.stopping.wait(self.interval)

    def stop(self) -> None:
        self.stopping.set()
        self.join(10)


@dataclass
class ChaosOperator:
    """An operator process whose RSS and /healthz latency are watched from its start."""

    ledger: Ledger
    kubeconfig: Path
    namespaces: list[str]
    log_dir: Path
    extra_env: dict[str, str] = field(default_factory=dict)
    proc: OperatorProcess | None = None
    peak_rss: int = 0
    rss_after_start: int = 0
    health_worst: float = 0.0
    health_busy_worst: float = 0.0
    health_failures: list[str] = field(default_factory=list)
    cpu_by_pid: dict[int, float] = field(default_factory=dict)
    """The last CPU seconds seen of each operator process this test started."""
    _samplers: list[Sampler] = field(default_factory=list)
    _n: int = 0

    def start(self, **env: str) -> ChaosOperator:
        """A fresh operator process (the previous one must be gone); ``env`` adds variables."""
        self._n += 1
        log = self.log_dir / f"operator-{self._n}.log"
        op = OperatorProcess(self.kubeconfig, self.namespaces, log, {**self.extra_env, **env})
        self.proc = op.start()
        self.ledger.operator_restarts += self._n > 1
        assert op.proc is not None
        pid = op.proc.pid
        self.rss_after_start = rss_bytes(pid) or 0

        def sample_rss() -> None:
            if cpu := cpu_seconds(pid):
                self.cpu_by_pid[pid] = cpu
            rss = rss_bytes(pid)
            if rss:
                self.peak_rss = max(self.peak_rss, rss)

        def probe_health() -> None:
            if op.proc is None or op.proc.poll() is not None:
                return
            started, cpu0 = time.monotonic(), cpu_seconds(pid)
            try:
                with urllib.request.urlopen(
                    f"http://127.0.0.1:{op.health_port}/healthz", timeout=30
                ) as r:
                    ok = int(r.status) == 200
            except OSError as e:
                ok = False
                if op.proc.poll() is None:
                    self.health_failures.append(f"{type(e).__name__}: {e}")
            took = time.monotonic() - started
            self.health_worst = max(self.health_worst, took)
            # CPU the operator burnt while the probe waited: its own work blocking the loop,
            # as opposed to a busy machine not giving it a core.
            self.health_busy_worst = max(self.health_busy_worst, cpu_seconds(pid) - cpu0)
            if not ok and not self.health_failures:
                self.health_failures.append(f"/healthz answered not-OK after {took:.1f}s")

        self._samplers = [Sampler(sample_rss, 0.1), Sampler(probe_health, 0.25)]
        for s in self._samplers:
            s.start()
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None and self.proc.proc is not None
        return self.proc.proc.pid

    def alive(self) -> bool:
        return (
            self.proc is not None and self.proc.proc is not None and self.proc.proc.poll() is None
        )

    def _stop_samplers(self) -> None:
        for s in self._samplers:
            s.stop()
        self._samplers = []

    def kill(self) -> None:
        """SIGKILL the operator, as an OOM kill or a node loss would."""
        assert self.proc is not None
        self._stop_samplers()
        self.proc.kill()
        self.ledger.operator_kills += 1

    def wait_exit(self, timeout: float) -> int:
        """Wait for the operator to exit by itself (a fault point); returns its exit status."""
        assert self.proc is not None and self.proc.proc is not None
        try:
            code = self.proc.proc.wait(timeout)
        finally:
            self._stop_samplers()
        return code

    def stop(self) -> None:
        if self.alive() and (cpu := cpu_seconds(self.pid)):
            self.cpu_by_pid[self.pid] = cpu
        self._stop_samplers()
        if self.proc is None or self.proc.proc is None:
            return
        self.ledger.operator_used(
            sum(self.cpu_by_pid.values()), len(self.cpu_by_pid), self.peak_rss
        )
        code = self.proc.proc.poll()
        if code is not None and code not in (0, -9, 137):
            self.ledger.operator_crashes.append(
                f"{self.ledger.current_test}: exited with {code}: {self.proc.log_tail(5)}"
            )
        self.proc.stop()

    def log_text(self) -> str:
        return "\n".join(
            p.read_text(errors="replace") for p in sorted(self.log_dir.glob("operator-*.log"))
        )

    def tracebacks(self) -> list[str]:
        """Lines of the operator's logs that start a traceback (a bug, by the house rules)."""
        lines = self.log_text().splitlines()
        return [
            "\n".join(lines[max(i - 1, 0) : i + 12])
            for i, line in enumerate(lines)
            if line.startswith("Traceback")
        ]


# ---- every pod, as the API saw it ------------------------------------------------------------


@dataclass(frozen=True)
class SeenPod:
    uid: str
    job: str
    name: str
    attempt: int
    rank: int


class PodRecorder(threading.Thread):
    """Watches the namespace's job pods and keeps every pod ever created.

    It also checks the gang invariant while it watches: a pod of one attempt is never
    created while a pod of another attempt of the same job still exists (pod names are
    fixed, so two pods of one rank cannot coexist; what can go wrong is a gang of mixed
    attempts, or pods created twice). A broken watch (an API server restart) relists.
    """

    def __init__(self, kubeconfig: Path, namespace: str) -> None:
        super().__init__(daemon=True)
        self.api = client.CoreV1Api(config.new_client_from_config(config_file=str(kubeconfig)))
        self.namespace = namespace
        self.seen: dict[str, SeenPod] = {}
        self.live: dict[str, SeenPod] = {}
        self.violations: list[str] = []
        self.relists = 0
        self.stopping = threading.Event()
        self.lock = threading.Lock()

    @staticmethod
    def _pod(obj: dict[str, Any]) -> SeenPod:
        meta = obj["metadata"]
        labels = meta.get("labels") or {}
        return SeenPod(
            meta["uid"],
            labels.get(LABEL_JOB, ""),
            meta["name"],
            int(labels.get(LABEL_ATTEMPT, "0")),
            int(labels.get(LABEL_RANK, "-1")),
        )

    def _added(self, pod: SeenPod) -> None:
        if pod.uid in self.live:
            return
        others = [p for p in self.live.values() if p.job == pod.job and p.attempt != pod.attempt]
        if others:
            self.violations.append(
                f"{pod.name} (attempt {pod.attempt}) created while "
                + ", ".join(f"{p.name} (attempt {p.attempt})" for p in others)
                + " still existed"
            )
        self.live[pod.uid] = pod
        self.seen.setdefault(pod.uid, pod)

    def run(self) -> None:
        rv = ""
        while not self.stopping.is_set():
            try:
                if not rv:
                    rv = self._relist()
                rv = self._watch(rv)
            except Exception:  # a broken watch is the fault under test: relist
                rv = ""
                self.stopping.wait(0.5)

    def _relist(self) -> str:
        """Replace the live set with a fresh listing; returns its resourceVersion."""
        resp: Any = self.api.list_namespaced_pod(
            self.namespace, label_selector=LABEL_JOB, _preload_content=False
        )
        listing = json.loads(resp.data)
        with self.lock:
            self.relists += 1
            self.live = {}
            for item in listing["items"]:
                self._added(self._pod(item))
        return str(listing["metadata"]["resourceVersion"])

    def _watch(self, rv: str) -> str:
        """Follow events from ``rv`` for a few seconds (so ``stop`` is prompt); returns where
        to go on from, or "" when the API server says the version is gone (410: relist)."""
        w = watch.Watch()
        for ev in w.stream(
            self.api.list_namespaced_pod,
            self.namespace,
            label_selector=LABEL_JOB,
            resource_version=rv,
            timeout_seconds=WATCH_SECONDS,
        ):
            obj = ev["raw_object"]
            if obj.get("kind") == "Status":
                return ""
            rv = obj["metadata"].get("resourceVersion") or rv
            pod = self._pod(obj)
            with self.lock:
                if ev["type"] == "DELETED":
                    self.live.pop(pod.uid, None)
                else:
                    self._added(pod)
            if self.stopping.is_set():
                w.stop()
        return rv

    def stop(self) -> None:
        self.stopping.set()
        self.join(WATCH_SECONDS + 30)

    def created(self, job: str) -> list[SeenPod]:
        with self.lock:
            return [p for p in self.seen.values() if p.job == job]


# ---- jobs ---------------------------------------------------------------------------------


def shell_job(
    name: str, script: str, nodes: int = 2, monitoring: bool = False, **spec: Any
) -> dict[str, Any]:
    """A job whose every rank runs a Python snippet itself (no torchrun, no trainer)."""
    return python_job(name, script, nodes, gpus=0, monitoring={"enabled": monitoring}, **spec)


def gated_script(release: Path, fail: Path | None = None, marker: Path | None = None) -> str:
    """Ranks wait for ``release`` and exit 0; rank 1 exits 3 once when ``fail`` appears."""
    fail_check = ""
    if fail is not None and marker is not None:
        fail_check = f"""
            if rank == "1" and pathlib.Path({str(fail)!r}).exists() and not m.exists():
                m.write_text("x"); print("rank 1 fails once", flush=True); sys.exit(3)"""
    return f"""
        import os, pathlib, sys, time
        rank = os.environ["RANK"]
        m = pathlib.Path({str(marker)!r})
        while True:{fail_check}
            if pathlib.Path({str(release)!r}).exists():
                sys.exit(0)
            time.sleep(0.1)
    """
