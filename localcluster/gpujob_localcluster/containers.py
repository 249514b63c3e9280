"""The container runtime: each container attempt is a local process group.

A container's command (its image's ENTRYPOINT/CMD, see :mod:`images`) runs with the
host's environment (the image is not pulled), the pod's env and, when the agent is root
and ``unshare`` exists, in a mount and UTS namespace of its own that :mod:`podinit` sets
up (hostname, volumes at their mount paths, the hosts file). Exec probes enter those
namespaces. Stopping a container signals its process group and, for SIGKILL, every
descendant; what is left of an attempt once it ended is killed, as its cgroup would be.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import threading
import urllib.parse
from collections.abc import Collection
from pathlib import Path
from typing import Any, Final

from gpujob_localcluster import dra, images, podenv, probes, volumes
from gpujob_localcluster.podrun import ContainerRun, PodRun
from gpujob_localcluster.processes import descendants, pid_alive, proc_state

PODINIT = Path(__file__).with_name("podinit.py")
IMAGE_PATHS: Final = (Path(sys.prefix), images.REPO_ROOT)
"""What plays every container's image here: the venv and the checkout its editable install
points at. A pod's volume mounted above them must not hide them (see podinit)."""


def api_endpoint(url: str) -> tuple[str, int]:
    """(host, port) of the API server URL the agent talks to (``https://127.0.0.1:6443``)."""
    parsed = urllib.parse.urlsplit(url)
    return parsed.hostname or "127.0.0.1", parsed.port or 443


def base_env(api_host: str, api_port: int) -> dict[str, str]:
    """The host environment a pod's process starts from (the image is ignored).

    Not ``PYTHONPATH``: what a pod imports must not depend on the shell that started the
    cluster. The venv (the image) carries the installed packages; a pod that runs code of
    the checkout that nothing installs says so in its own env, as it would on a real node.
    """
    keep = (
        "HOME",
        "LANG",
        "LC_ALL",
        "TMPDIR",
        "VIRTUAL_ENV",
        "OPENBLAS_CORETYPE",
        "OPENBLAS_L2_SIZE",
        "XDG_CACHE_HOME",
    )
    env = {k: os.environ[k] for k in keep if k in os.environ}
    bindir = str(Path(sys.executable).parent)
    env["PATH"] = bindir + os.pathsep + os.environ.get("PATH", "/usr/bin:/bin")
    # No kube-proxy: the kubernetes Service's variables name the loopback API server.
    env.update(podenv.kubernetes_service_env(api_host, api_port))
    return env


class ContainerRuntime:
    """Starts container attempts and runs exec probes in them."""

    def __init__(
        self,
        base_env: dict[str, str],
        image_table: dict[str, images.ImageConfig],
        events: queue.Queue[tuple[str, Any]],
        isolate: bool | None = None,
    ) -> None:
        self.base_env = base_env
        self.images = image_table
        self.events = events
        """Where each attempt's exit is put: ``("exit", (pod uid, container, attempt, code))``."""
        can_isolate = os.geteuid() == 0 and shutil.which("unshare") is not None
        self.isolate = can_isolate if isolate is None else isolate and can_isolate

    def spawn(
        self, run: PodRun, container: dict[str, Any], crun: ContainerRun, lookup: Any
    ) -> None:
        """Start one attempt of a container; its exit comes back as an ``exit`` event."""
        env = dict(self.base_env)
        env.update(podenv.container_env(run.pod, container, lookup))
        if run.devices.get(crun.name):
            env[dra.ENV] = ",".join(run.devices[crun.name])
        argv = [podenv.expand(a, env) for a in images.container_argv(container, self.images)]
        crun.env = env
        workdir = container.get("workingDir")
        cwd = workdir if workdir and Path(workdir).is_dir() else str(run.folder)
        if self.isolate:
            spec = volumes.init_spec(
                run.mounts.get(crun.name, []),
                run.folder / "hosts",
                podenv.pod_hostname(run.pod),
                IMAGE_PATHS,
            )
            argv = [
                *("unshare", "--mount", "--uts", "--fork", "--"),
                *(sys.executable, "-I", "-S", str(PODINIT), json.dumps(spec)),
                *argv,
            ]
        out = open(crun.log_path, "ab")  # noqa: SIM115 - handed to the child
        try:
            crun.proc = subprocess.Popen(
                argv,
                env=env,
                cwd=cwd,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        finally:
            out.close()
        proc, attempt = crun.proc, crun.attempt
        threading.Thread(
            target=lambda: self.events.put(("exit", (run.uid, crun.name, attempt, proc.wait()))),
            name=f"wait-{run.name}-{crun.name}",
            daemon=True,
        ).start()

    def exec_runner(self, crun: ContainerRun) -> probes.ExecRunner:
        """Runs an exec probe's command with the container's env, in its namespaces."""

        def run_exec(command: Any, timeout: float) -> tuple[int, str]:
            assert crun.proc is not None
            argv = list(command)
            if self.isolate:
                argv = ["nsenter", "-t", str(crun.proc.pid), "-m", "-u", "--", *argv]
            try:
                res = subprocess.run(
                    argv, env=crun.env, capture_output=True, text=True, timeout=timeout
                )
            except subprocess.TimeoutExpired:
                return 1, f"command timed out after {timeout:.0f}s"
            return res.returncode, res.stdout + res.stderr

        return run_exec


def kill_pod(run: PodRun, sig: int) -> None:
    """Signal every process of the pod: its process group and, for SIGKILL, all descendants.

    Descendants matter because torchrun starts each worker in a session of its own: a
    SIGKILL of the container's group alone would leave the workers running.
    """
    for c in run.alive():
        kill_container(c, sig)


def kill_container(crun: ContainerRun, sig: int) -> None:
    """Signal a running container's process group (and, for SIGKILL, all its descendants)."""
    if not crun.running:
        return
    assert crun.proc is not None
    family = descendants(crun.proc.pid) if sig == signal.SIGKILL else []
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(crun.proc.pid, sig)
    for pid in family:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def track(runs: Collection[PodRun]) -> None:
    """Note each container's processes (its family) and reap orphans that died under us."""
    for run in runs:
        for c in run.alive():
            assert c.proc is not None
            c.family.update(descendants(c.proc.pid))
    ours = {c.proc.pid for r in runs for c in r.containers if c.proc is not None}
    for pid in descendants(os.getpid()):
        if pid not in ours and proc_state(pid) == "Z":
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)


def kill_leftovers(crun: ContainerRun) -> None:
    """SIGKILL what is left of a container attempt after it ended (the cgroup's job)."""
    for pid in crun.family:
        if pid_alive(pid):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)


def kill_family(run: PodRun) -> None:
    """SIGKILL what is left of every container of the pod."""
    for c in run.containers:
        kill_leftovers(c)
