"""The local cluster's child processes: are they alive, what did they start, stop them, wait.

Both the control plane (etcd, kube-apiserver, ...) and the node agent (every container of
every pod) run as local process groups. What they share lives here: reading a pid's state
from /proc, finding every descendant (torchrun starts its workers in sessions of their
own, so a process group alone does not hold them), adopting orphans so none escape
teardown, SIGTERM-then-SIGKILL of a group, and waiting, with a deadline, for a started
process to serve (:class:`ClusterError` says why it did not). A :class:`Component` is one
started binary with what it takes to start it again.
"""

from __future__ import annotations

import contextlib
import os
import signal
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path


class ClusterError(RuntimeError):
    """The local control plane could not start or is in a state we refuse to touch."""


def proc_state(pid: int) -> str | None:
    """The state letter of ``pid`` from /proc (``Z`` for a zombie), or None when it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def pid_alive(pid: int) -> bool:
    """Whether a process with ``pid`` exists (and is not a zombie we could reap)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return proc_state(pid) != "Z"


def descendants(pid: int) -> list[int]:
    """Every descendant of ``pid`` (through /proc/<pid>/task/*/children), deepest last."""
    out: list[int] = []
    queue_ = [pid]
    while queue_:
        current = queue_.pop()
        try:
            tasks = list(Path(f"/proc/{current}/task").iterdir())
        except OSError:
            continue
        for task in tasks:
            try:
                kids = [int(k) for k in (task / "children").read_text().split()]
            except OSError:
                continue
            out.extend(kids)
            queue_.extend(kids)
    return out


def become_subreaper() -> None:
    """Adopt orphaned pod processes (prctl PR_SET_CHILD_SUBREAPER) so none escape teardown."""
    import ctypes

    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)


def terminate_group(pid: int, grace: float) -> None:
    """SIGTERM a process group, then SIGKILL it once ``grace`` seconds have passed."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and pid_alive(pid):
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def wait_for(
    check: Callable[[], bool],
    timeout: float,
    what: str,
    alive: Callable[[], str | None] | None = None,
) -> None:
    """Poll ``check`` until it is true; fail after ``timeout`` or when ``alive`` reports death."""
    deadline = time.monotonic() + timeout
    delay = 0.05
    while True:
        if alive is not None:
            problem = alive()
            if problem:
                raise ClusterError(f"while waiting for {what}: {problem}")
        with contextlib.suppress(Exception):
            if check():
                return
        if time.monotonic() > deadline:
            raise ClusterError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(delay)
        delay = min(delay * 1.5, 0.5)


def http_ok(url: str, ctx: ssl.SSLContext | None = None) -> bool:
    """Whether ``url`` answers 200 (a health endpoint, for :func:`wait_for`)."""
    try:
        with urllib.request.urlopen(url, context=ctx, timeout=2) as resp:
            return int(resp.status) == 200
    except (urllib.error.URLError, OSError):
        return False


def log_tail(path: Path, lines: int = 25) -> str:
    """The last ``lines`` lines of a log file, for error messages."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


@dataclass
class Component:
    """One running binary of the control plane."""

    name: str
    proc: subprocess.Popen[bytes]
    log_path: Path
    args: list[str] = field(default_factory=list)
    """The command line, kept so that a restart brings back the same ports, certs and data."""
    ready: Callable[[], bool] | None = None
    """Whether the component serves (its health endpoint answers), for restarts."""
    env: dict[str, str] | None = None
    """Extra environment it was started with, kept for restarts too."""

    def problem(self) -> str | None:
        """A message if the process has exited, else None."""
        code = self.proc.poll()
        if code is None:
            return None
        return f"{self.name} exited with code {code}; last lines of {self.log_path}:\n{log_tail(self.log_path)}"
