"""Run the example trainer under a real torchrun and read its ranks' /metrics over HTTP.

Synchronisation is by condition with a deadline (scrape until a value appears), never by
sleeping for a guessed time. Everything binds and dials 127.0.0.1 only.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from prometheus_client.parser import text_string_to_metric_families

from gpujob_localcluster.ports import free_port
from gpujob_localcluster.processes import become_subreaper, descendants
from gpujob_trainer import contract

RUN_MARKER_ENV = "GPUJOB_TEST_RUN"
become_subreaper()  # orphaned torchrun workers come back to this process, so kill() finds them

T = TypeVar("T")
LOOPBACK = "127.0.0.1"


def wait_for(what: str, probe: Callable[[], T | None], timeout: float, interval: float = 0.1) -> T:
    """Poll `probe` until it returns a value (not None) or the deadline passes."""
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        try:
            value = probe()
        except Exception as exc:  # endpoint not up yet, and the like
            last_error = exc
            value = None
        if value is not None:
            return value
        time.sleep(interval)  # poll interval, not synchronisation
    raise TimeoutError(f"timed out after {timeout}s waiting for {what}; last error: {last_error}")


@dataclass
class Scrape:
    """One parsed /metrics response: samples by (name, labels)."""

    text: str
    samples: dict[tuple[str, frozenset[tuple[str, str]]], float] = field(default_factory=dict)
    types: dict[str, str] = field(default_factory=dict)

    @classmethod
    def parse(cls, text: str) -> Scrape:
        out = cls(text)
        for fam in text_string_to_metric_families(text):
            out.types[fam.name] = fam.type
            for s in fam.samples:
                out.samples[(s.name, frozenset(s.labels.items()))] = s.value
        return out

    def get(self, name: str, **labels: str) -> float | None:
        """The one sample of `name` whose labels include `labels` (None if absent)."""
        want = set(labels.items())
        found = [v for (n, ls), v in self.samples.items() if n == name and want <= ls]
        if len(found) > 1:
            raise AssertionError(f"{name}{labels} matches {len(found)} samples")
        return found[0] if found else None

    def value(self, name: str, **labels: str) -> float:
        got = self.get(name, **labels)
        if got is None:
            raise AssertionError(f"no sample {name}{labels}")
        return got

    def phases(self) -> dict[str, float]:
        return {p: self.value(contract.PHASE_SECONDS.name, phase=p) for p in contract.PHASES}

    def names(self) -> set[str]:
        return {name for name, _ in self.samples}


def scrape(port: int, timeout: float = 5.0) -> Scrape:
    url = f"http://{LOOPBACK}:{port}{contract.METRICS_PATH}"
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return Scrape.parse(response.read().decode())


@dataclass
class TrainerRun:
    """A torchrun of `gpujob_trainer.example` with `nproc` local ranks."""

    proc: subprocess.Popen[bytes]
    base_port: int
    nproc: int
    log_path: Path
    seen_workers: set[int] = field(default_factory=set)
    """Worker PIDs seen so far: torchrun starts each in its own session, so killing
    torchrun's process group alone would leave them running."""
    marker: str = ""
    """A value of RUN_MARKER_ENV in every process of this run, found again after reparenting."""
    worker_tag: bytes = b"gpujob_trainer.example"
    """What a worker's command line holds (the module or script torchrun runs)."""

    def ports(self) -> list[int]:
        return [contract.metrics_port(self.base_port, r) for r in range(self.nproc)]

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_steps(self, steps: int, timeout: float) -> list[Scrape]:
        """Scrape every rank until each reports `steps` steps; returns the final scrapes."""

        def probe() -> list[Scrape] | None:
            if self.proc.poll() is not None:
                raise AssertionError(f"torchrun exited {self.proc.returncode}:\n{self.log()}")
            got = [scrape(p) for p in self.ports()]
            self.workers()  # remember them while torchrun can still name them
            done = all(s.get(contract.STEPS.name) == steps for s in got)
            return got if done else None

        try:
            return wait_for(f"{steps} steps on every rank", probe, timeout)
        except TimeoutError as exc:
            raise AssertionError(f"{exc}\n--- trainer log ---\n{self.log()}") from exc

    def workers(self) -> list[int]:
        """PIDs of torchrun's worker processes (its children running the example)."""
        pids: list[int] = []
        try:
            tasks = list(Path(f"/proc/{self.proc.pid}/task").iterdir())
        except OSError:  # torchrun is gone
            return pids
        for task in tasks:
            try:
                children = (task / "children").read_text().split()
            except OSError:
                continue
            for pid in map(int, children):
                try:
                    cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
                except OSError:
                    continue
                if self.worker_tag in cmdline:
                    pids.append(pid)
        self.seen_workers.update(pids)
        return pids

    def end_linger(self, timeout: float = 60.0) -> int:
        """SIGTERM the lingering workers (they then exit 0) and return torchrun's exit code."""
        for pid in self.workers():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        return self.proc.wait(timeout=timeout)

    def kill(self) -> None:
        """Tear the whole run down: the workers' sessions, then torchrun's (ours only)."""
        if self.proc.poll() is None:
            self.workers()
        for pid in sorted(self.seen_workers):
            try:  # still our worker (not a reused PID)?
                if self.worker_tag not in Path(f"/proc/{pid}/cmdline").read_bytes():
                    continue
            except OSError:
                continue
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)  # a worker leads its own session and group
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)
        # Workers torchrun left behind were reparented to us (a subreaper): find them by marker.
        for pid in descendants(os.getpid()):
            with contextlib.suppress(OSError):
                if (
                    f"{RUN_MARKER_ENV}={self.marker}".encode()
                    in Path(f"/proc/{pid}/environ").read_bytes()
                ):
                    os.kill(pid, signal.SIGKILL)


@contextlib.contextmanager
def torchrun_example(
    args: Sequence[str], tmp_path: Path, nproc: int = 2, env: dict[str, str] | None = None
) -> Iterator[TrainerRun]:
    """Start the example under torchrun (CPU, gloo) with lingering exporters; kill on exit."""
    command = ["-m", "gpujob_trainer.example", "--device=cpu", "--linger=300", "--log-every=0"]
    with torchrun([*command, *args], tmp_path, nproc, env) as run:
        yield run


@contextlib.contextmanager
def torchrun(
    command: Sequence[str],
    tmp_path: Path,
    nproc: int = 2,
    env: dict[str, str] | None = None,
    worker_tag: bytes = b"gpujob_trainer.example",
) -> Iterator[TrainerRun]:
    """Start `command` (a script or `-m module`, then its arguments) under torchrun with
    `nproc` CPU ranks, exporters on loopback ports; kill whatever is left on exit."""
    base = free_port(nproc)
    log_path = tmp_path / f"torchrun-{base}.log"
    inherited = {k: v for k, v in os.environ.items() if k not in contract.ENV_TRAINER}
    marker = uuid.uuid4().hex
    run_env = {
        **inherited,
        RUN_MARKER_ENV: marker,
        contract.ENV_METRICS_ADDR: LOOPBACK,
        contract.ENV_METRICS_PORT: str(base),
        "OMP_NUM_THREADS": "1",
        "PYTHONUNBUFFERED": "1",
        "PYTHONWARNINGS": "ignore",
        **(env or {}),
    }
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={nproc}",
        *command,
    ]
    with open(log_path, "wb") as log_file:
        proc = subprocess.Popen(
            cmd, stdout=log_file, stderr=subprocess.STDOUT, env=run_env, start_new_session=True
        )
    run = TrainerRun(proc, base, nproc, log_path, marker=marker, worker_tag=worker_tag)
    try:
        yield run
    finally:
        run.kill()


def per_step(s: Scrape) -> dict[str, float]:
    """Phase seconds per step, plus compute and step time per step."""
    steps = s.value(contract.STEPS.name)
    out = {p: v / steps for p, v in s.phases().items()}
    out["compute"] = s.value(contract.COMPUTE_SECONDS.name) / steps
    out["step"] = s.value(contract.STEP_DURATION.name + "_sum") / steps
    return out


def shares(s: Scrape) -> dict[str, float]:
    """Each phase's share of the step time (0-1)."""
    phases = s.phases()
    total = sum(phases.values())
    return {p: v / total for p, v in phases.items()}
