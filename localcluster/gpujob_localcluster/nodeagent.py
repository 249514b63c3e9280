"""A tiny kubelet stand-in: registers GPU nodes and runs bound pods as local processes.

Why: without a kubelet no pod ever runs, and a mock would not tell us whether the
operator's pods really launch a torchrun gang. The real scheduler binds pods to the
nodes registered here; this agent runs each container's command with the pod's env,
gives every pod its own 127.0.0.0/8 address, and reports status as a kubelet would.

Isolation per pod (when root and ``unshare`` exists): a mount and UTS namespace, so the
pod sees its own hostname and an /etc/hosts that maps its headless-service peers'
DNS names (``<hostname>.<subdomain>[.<ns>.svc.cluster.local]``) to their addresses.
The network namespace is shared with the host: processes that bind 0.0.0.0 on the
same port in two pods collide, so pods should bind their pod IP (the gpujob trainer
does). Images are ignored: commands run with this machine's Python environment.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import itertools
import json
import logging
import os
import queue
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from kubernetes import client, config, watch
from kubernetes.client.rest import ApiException

from gpujob_localcluster import podenv
from gpujob_localcluster.controlplane import pid_alive, proc_state

log = logging.getLogger("gpujob.nodeagent")

HEARTBEAT_SECONDS = 10.0
K8S_VERSION = "v1.37.2"


def now_iso() -> str:
    """An RFC 3339 timestamp in UTC, as the API expects."""
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class NodeShape:
    """The capacity every registered node advertises."""

    gpus: int = 4
    cpu: str = "16"
    memory: str = "64Gi"
    pods: str = "110"


@dataclass
class ContainerRun:
    """One container's process and what became of it."""

    name: str
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None
    exit_code: int | None = None
    reason: str = ""
    message: str = ""
    started_at: str = ""
    finished_at: str = ""


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
    family: set[int] = field(default_factory=set)
    """Every process seen under the pod's containers: killed with the pod, like a cgroup."""

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    def group(self) -> tuple[str, str] | None:
        sub = self.pod.get("spec", {}).get("subdomain")
        return (self.namespace, sub) if sub else None

    def alive(self) -> list[ContainerRun]:
        return [c for c in self.containers if c.proc is not None and c.exit_code is None]


class NodeAgent:
    """Registers nodes, heartbeats them, and runs the pods bound to them."""

    def __init__(
        self,
        api: client.ApiClient,
        node_names: list[str],
        shape: NodeShape,
        state_dir: Path,
        isolate: bool | None = None,
    ) -> None:
        self.core = client.CoreV1Api(api)
        self.coord = client.CoordinationV1Api(api)
        self.nodes = node_names
        self.shape = shape
        self.state_dir = state_dir
        self.pods_dir = state_dir / "pods"
        self.pods_dir.mkdir(parents=True, exist_ok=True)
        self.events: queue.Queue[tuple[str, Any]] = queue.Queue()
        self.runs: dict[str, PodRun] = {}
        self.stopping = threading.Event()
        # A random second octet keeps two clusters on one machine (parallel test runs) apart.
        first = random.randint(1, 200)
        self._ips = (
            f"127.{a}.{b}.{c}"
            for a, b, c in itertools.product(range(first, 255), range(256), range(1, 255))
        )
        become_subreaper()
        self._last_census = 0.0
        can_isolate = os.geteuid() == 0 and shutil.which("unshare") is not None
        self.isolate = can_isolate if isolate is None else isolate and can_isolate
        self.base_env = self._base_env()

    # -- nodes ---------------------------------------------------------------------
    def _base_env(self) -> dict[str, str]:
        """The host environment a pod's process starts from (the image is ignored)."""
        keep = (
            "HOME",
            "LANG",
            "LC_ALL",
            "TMPDIR",
            "VIRTUAL_ENV",
            "PYTHONPATH",
            "OPENBLAS_CORETYPE",
            "OPENBLAS_L2_SIZE",
            "XDG_CACHE_HOME",
        )
        env = {k: os.environ[k] for k in keep if k in os.environ}
        bindir = str(Path(sys.executable).parent)
        env["PATH"] = bindir + os.pathsep + os.environ.get("PATH", "/usr/bin:/bin")
        return env

    def node_body(self, name: str) -> dict[str, Any]:
        capacity = {
            "cpu": self.shape.cpu,
            "memory": self.shape.memory,
            "pods": self.shape.pods,
            "ephemeral-storage": "100Gi",
        }
        if self.shape.gpus:
            capacity["nvidia.com/gpu"] = str(self.shape.gpus)
        return {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": name,
                "labels": {
                    "kubernetes.io/hostname": name,
                    "kubernetes.io/os": "linux",
                    "kubernetes.io/arch": "amd64",
                    "gpujob.dev/local-node": "true",
                    "nvidia.com/gpu.present": "true" if self.shape.gpus else "false",
                },
            },
            "spec": {},
            "status": {"capacity": capacity, "allocatable": capacity},
        }

    def node_status(self, name: str) -> dict[str, Any]:
        body = self.node_body(name)
        ts = now_iso()
        ready = {
            "type": "Ready",
            "status": "True",
            "reason": "KubeletReady",
            "message": "gpujob local node agent is posting ready status",
            "lastHeartbeatTime": ts,
            "lastTransitionTime": ts,
        }
        pressure = [
            {
                "type": t,
                "status": "False",
                "reason": f"KubeletHas{r}",
                "message": "ok",
                "lastHeartbeatTime": ts,
                "lastTransitionTime": ts,
            }
            for t, r in (
                ("MemoryPressure", "SufficientMemory"),
                ("DiskPressure", "NoDiskPressure"),
                ("PIDPressure", "SufficientPID"),
            )
        ]
        return {
            "status": {
                **body["status"],
                "conditions": [ready, *pressure],
                "addresses": [
                    {"type": "InternalIP", "address": "127.0.0.1"},
                    {"type": "Hostname", "address": name},
                ],
                "nodeInfo": {
                    "kubeletVersion": K8S_VERSION,
                    "kubeProxyVersion": K8S_VERSION,
                    "operatingSystem": "linux",
                    "architecture": "amd64",
                    "containerRuntimeVersion": "gpujob-local://1",
                    "osImage": "local processes",
                    "kernelVersion": os.uname().release,
                    "machineID": name,
                    "systemUUID": name,
                    "bootID": name,
                },
                "daemonEndpoints": {"kubeletEndpoint": {"Port": 0}},
            }
        }

    def register_nodes(self) -> None:
        for name in self.nodes:
            try:
                self.core.create_node(cast(Any, self.node_body(name)))
                log.info("registered node %s (gpus=%s)", name, self.shape.gpus)
            except ApiException as e:
                if e.status != 409:
                    raise
            self.core.patch_node_status(name, self.node_status(name))
        self._renew_leases()

    def _renew_leases(self) -> None:
        for name in self.nodes:
            body = {
                "metadata": {"name": name, "namespace": "kube-node-lease"},
                "spec": {
                    "holderIdentity": name,
                    "leaseDurationSeconds": 40,
                    "renewTime": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
                },
            }
            try:
                self.coord.patch_namespaced_lease(name, "kube-node-lease", body)
            except ApiException as e:
                if e.status != 404:
                    raise
                with contextlib.suppress(ApiException):
                    self.coord.create_namespaced_lease("kube-node-lease", cast(Any, body))

    def heartbeat_loop(self) -> None:
        while not self.stopping.wait(HEARTBEAT_SECONDS):
            try:
                for name in self.nodes:
                    self.core.patch_node_status(name, self.node_status(name))
                self._renew_leases()
            except Exception as e:  # keep beating through API hiccups
                log.warning("heartbeat failed: %s", e)

    # -- pods ----------------------------------------------------------------------
    def watch_loop(self) -> None:
        """Feed pod events into the queue, relisting after every broken watch."""
        while not self.stopping.is_set():
            try:
                resp: Any = self.core.list_pod_for_all_namespaces(_preload_content=False)
                listing = json.loads(resp.data)
                seen = set()
                for item in listing["items"]:
                    seen.add(item["metadata"]["uid"])
                    self.events.put(("pod", item))
                self.events.put(("resync", seen))
                w = watch.Watch()
                for ev in w.stream(
                    self.core.list_pod_for_all_namespaces,
                    resource_version=listing["metadata"]["resourceVersion"],
                    timeout_seconds=300,
                    allow_watch_bookmarks=True,
                ):
                    if self.stopping.is_set():
                        w.stop()
                        break
                    kind, obj = ev["type"], ev["raw_object"]
                    if kind == "DELETED":
                        self.events.put(("deleted", obj))
                    elif kind in ("ADDED", "MODIFIED"):
                        self.events.put(("pod", obj))
            except Exception as e:
                if not self.stopping.is_set():
                    log.warning("pod watch broke (%s); relisting", e)
                    self.stopping.wait(1.0)

    def run(self) -> None:
        """The agent's main loop; returns when ``stop()`` is called."""
        threading.Thread(target=self.watch_loop, name="pod-watch", daemon=True).start()
        threading.Thread(target=self.heartbeat_loop, name="heartbeat", daemon=True).start()
        while not self.stopping.is_set():
            try:
                kind, payload = self.events.get(timeout=0.2)
            except queue.Empty:
                kind, payload = "tick", None
            try:
                self._handle(kind, payload)
            except Exception:
                log.exception("handling %s failed", kind)
            self._enforce_grace()
            self._census()
        self.shutdown()

    def _handle(self, kind: str, payload: Any) -> None:
        if kind == "pod":
            self.on_pod(payload)
        elif kind == "deleted":
            run = self.runs.pop(payload["metadata"]["uid"], None)
            if run:
                log.info("pod %s deleted; stopping its processes", run.key)
                self._kill(run, signal.SIGKILL)
                self._refresh_hosts(run.group())
        elif kind == "exit":
            uid, cname, code = payload
            self.on_exit(uid, cname, code)
        elif kind == "resync":
            for uid in [u for u in self.runs if u not in payload]:
                run = self.runs.pop(uid)
                self._kill(run, signal.SIGKILL)

    def on_pod(self, pod: dict[str, Any]) -> None:
        spec, meta, status = pod.get("spec", {}), pod["metadata"], pod.get("status", {})
        if spec.get("nodeName") not in self.nodes:
            return
        uid = meta["uid"]
        run = self.runs.get(uid)
        deleting = bool(meta.get("deletionTimestamp"))
        if run is not None:
            run.pod["metadata"] = meta
            if deleting and run.kill_at is None:
                grace = meta.get(
                    "deletionGracePeriodSeconds", spec.get("terminationGracePeriodSeconds", 30)
                )
                log.info("pod %s is being deleted; SIGTERM, SIGKILL after %ss", run.key, grace)
                run.kill_at = time.monotonic() + float(grace or 0)
                self._kill(run, signal.SIGTERM)
                if not run.alive():
                    self._finalize_delete(run)
            return
        if deleting:
            self._force_delete(meta["namespace"], meta["name"], uid)
            return
        if status.get("phase") in ("Succeeded", "Failed"):
            return
        if status.get("podIP"):
            self._patch_status(
                pod,
                {
                    "phase": "Failed",
                    "reason": "NodeAgentRestarted",
                    "message": "the local node agent restarted and lost this pod's processes",
                },
            )
            return
        self.start_pod(pod)

    def start_pod(self, pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        ip = next(self._ips)
        folder = self.pods_dir / f"{meta['namespace']}_{meta['name']}_{meta['uid'][:8]}"
        folder.mkdir(parents=True, exist_ok=True)
        pod.setdefault("status", {}).update(
            {
                "podIP": ip,
                "podIPs": [{"ip": ip}],
                "hostIP": "127.0.0.1",
                "hostIPs": [{"ip": "127.0.0.1"}],
            }
        )
        run = PodRun(meta["uid"], meta["namespace"], meta["name"], pod, ip, folder)
        self.runs[run.uid] = run
        self._refresh_hosts(run.group(), also=run)
        started = now_iso()
        statuses = []
        for c in pod["spec"].get("containers", []):
            crun = ContainerRun(c["name"], folder / f"{c['name']}.log", started_at=started)
            run.containers.append(crun)
            try:
                self._spawn(run, c, crun)
            except Exception as e:
                crun.exit_code, crun.reason, crun.message = 128, "StartError", str(e)
                crun.finished_at = now_iso()
                log.warning("pod %s container %s could not start: %s", run.key, c["name"], e)
            statuses.append(self._container_status(c, crun))
        (folder / "pod.json").write_text(
            json.dumps(
                {
                    "namespace": run.namespace,
                    "name": run.name,
                    "ip": ip,
                    "logs": {c.name: str(c.log_path) for c in run.containers},
                }
            )
        )
        log.info("pod %s running at %s; logs in %s", run.key, ip, folder)
        conds = [
            {"type": t, "status": "True", "lastTransitionTime": started}
            for t in (
                "PodReadyToStartContainers",
                "Initialized",
                "ContainersReady",
                "Ready",
                "PodScheduled",
            )
        ]
        self._patch_status(
            pod,
            {
                "phase": "Running",
                "podIP": ip,
                "podIPs": [{"ip": ip}],
                "hostIP": "127.0.0.1",
                "hostIPs": [{"ip": "127.0.0.1"}],
                "startTime": started,
                "conditions": conds,
                "containerStatuses": statuses,
            },
        )
        for crun in run.containers:
            if crun.exit_code is not None:
                self.events.put(("exit", (run.uid, crun.name, crun.exit_code)))

    def _spawn(self, run: PodRun, container: dict[str, Any], crun: ContainerRun) -> None:
        env = dict(self.base_env)
        env.update(podenv.container_env(run.pod, container, self._lookup(run.namespace)))
        argv = [
            podenv.expand(a, env)
            for a in (container.get("command") or []) + (container.get("args") or [])
        ]
        if not container.get("command"):
            raise ValueError(
                "the container has no command; the local node agent ignores images and their entrypoints"
            )
        workdir = container.get("workingDir")
        cwd = workdir if workdir and Path(workdir).is_dir() else str(run.folder)
        if self.isolate:
            hosts = run.folder / "hosts"
            script = 'mount --bind "$0" /etc/hosts && hostname "$1" && shift && exec "$@"'
            argv = [
                "unshare",
                "--mount",
                "--uts",
                "--fork",
                "--",
                "/bin/sh",
                "-c",
                script,
                str(hosts),
                podenv.pod_hostname(run.pod),
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
        proc = crun.proc
        threading.Thread(
            target=lambda: self.events.put(("exit", (run.uid, crun.name, proc.wait()))),
            name=f"wait-{run.name}-{crun.name}",
            daemon=True,
        ).start()

    def _lookup(self, namespace: str) -> Any:
        def lookup(kind: str, name: str, key: str) -> str | None:
            try:
                if kind.startswith("configMap"):
                    data = self.core.read_namespaced_config_map(name, namespace).data or {}
                else:
                    import base64

                    raw = self.core.read_namespaced_secret(name, namespace).data or {}
                    data = {k: base64.b64decode(v).decode() for k, v in raw.items()}
            except ApiException:
                return None
            if key == "*":
                return "\n".join(f"{k}={v}" for k, v in data.items())
            return data.get(key)

        return lookup

    def _refresh_hosts(self, group: tuple[str, str] | None, also: PodRun | None = None) -> None:
        """Rewrite the hosts files of every pod in a headless-service group (in place)."""
        members = [r for r in self.runs.values() if group is not None and r.group() == group]
        if also is not None and also not in members:
            members.append(also)
        peers = [(r.pod, r.ip) for r in members]
        for r in members:
            path = r.folder / "hosts"
            text = podenv.hosts_file(r.pod, r.ip, peers)
            # Truncate and write in place: a bind mount follows the inode, not the name.
            with open(path, "a+") as f:
                f.seek(0)
                f.truncate()
                f.write(text)

    def on_exit(self, uid: str, cname: str, code: int) -> None:
        run = self.runs.get(uid)
        if run is None:
            return
        crun = next(c for c in run.containers if c.name == cname)
        if not crun.finished_at:
            crun.exit_code = 128 - code if code < 0 else code
            crun.reason = "Completed" if crun.exit_code == 0 else "Error"
            crun.finished_at = now_iso()
            container = next(c for c in run.pod["spec"]["containers"] if c["name"] == cname)
            if (
                crun.exit_code != 0
                and container.get("terminationMessagePolicy") == "FallbackToLogsOnError"
            ):
                with contextlib.suppress(OSError):
                    crun.message = podenv.termination_tail(
                        crun.log_path.read_text(errors="replace")
                    )
            log.info("pod %s container %s exited with %s", run.key, cname, crun.exit_code)
        if run.alive() or run.finished:
            return
        run.finished = True
        self._kill_family(run)
        failed = any(c.exit_code for c in run.containers)
        statuses = [
            self._container_status(c, crun_)
            for c, crun_ in zip(run.pod["spec"]["containers"], run.containers, strict=False)
        ]
        ts = now_iso()
        conds = [
            {"type": t, "status": "False", "reason": "PodCompleted", "lastTransitionTime": ts}
            for t in ("ContainersReady", "Ready")
        ]
        self._patch_status(
            run.pod,
            {
                "phase": "Failed" if failed else "Succeeded",
                "conditions": conds,
                "containerStatuses": statuses,
            },
        )
        if run.kill_at is not None:
            self._finalize_delete(run)

    def _container_status(self, container: dict[str, Any], crun: ContainerRun) -> dict[str, Any]:
        base = {
            "name": crun.name,
            "image": container.get("image", ""),
            "imageID": "",
            "restartCount": 0,
            "containerID": f"local://{crun.proc.pid if crun.proc else 0}",
        }
        if crun.exit_code is None:
            return {
                **base,
                "ready": True,
                "started": True,
                "state": {"running": {"startedAt": crun.started_at}},
            }
        term = {
            "exitCode": crun.exit_code,
            "reason": crun.reason,
            "startedAt": crun.started_at,
            "finishedAt": crun.finished_at or now_iso(),
        }
        if crun.message:
            term["message"] = crun.message
        return {**base, "ready": False, "started": False, "state": {"terminated": term}}

    def _kill(self, run: PodRun, sig: int) -> None:
        """Signal every process of the pod: its process group and, for SIGKILL, all descendants.

        Descendants matter because torchrun starts each worker in a session of its own: a
        SIGKILL of the container's group alone would leave the workers running.
        """
        for c in run.alive():
            assert c.proc is not None
            family = descendants(c.proc.pid) if sig == signal.SIGKILL else []
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(c.proc.pid, sig)
            for pid in family:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, sig)

    def _census(self) -> None:
        """Once a second: note each pod's processes and reap orphans that died under us."""
        now = time.monotonic()
        if now - self._last_census < 1.0:
            return
        self._last_census = now
        for run in self.runs.values():
            for c in run.alive():
                assert c.proc is not None
                run.family.update(descendants(c.proc.pid))
        ours = {c.proc.pid for r in self.runs.values() for c in r.containers if c.proc is not None}
        for pid in descendants(os.getpid()):
            if pid not in ours and proc_state(pid) == "Z":
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(pid, os.WNOHANG)

    def _kill_family(self, run: PodRun) -> None:
        """SIGKILL what is left of a pod after its containers ended (the cgroup's job)."""
        for pid in run.family:
            if pid_alive(pid):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)

    def _enforce_grace(self) -> None:
        now = time.monotonic()
        for run in list(self.runs.values()):
            if run.kill_at is not None and now >= run.kill_at and run.alive():
                log.info("pod %s grace period over; SIGKILL", run.key)
                self._kill(run, signal.SIGKILL)
                run.kill_at = now + 3600  # once

    def _finalize_delete(self, run: PodRun) -> None:
        self.runs.pop(run.uid, None)
        self._refresh_hosts(run.group())
        self._force_delete(run.namespace, run.name, run.uid)

    def _force_delete(self, namespace: str, name: str, uid: str) -> None:
        body = client.V1DeleteOptions(
            grace_period_seconds=0, preconditions=client.V1Preconditions(uid=uid)
        )
        with contextlib.suppress(ApiException):
            self.core.delete_namespaced_pod(name, namespace, body=body)

    def _patch_status(self, pod: dict[str, Any], status: dict[str, Any]) -> None:
        meta = pod["metadata"]
        try:
            self.core.patch_namespaced_pod_status(
                meta["name"], meta["namespace"], {"status": status}
            )
        except ApiException as e:
            if e.status != 404:
                log.warning(
                    "status update of %s/%s failed: %s", meta["namespace"], meta["name"], e.reason
                )

    def stop(self) -> None:
        self.stopping.set()

    def shutdown(self) -> None:
        """Stop every pod process: SIGTERM, a short grace, then SIGKILL."""
        for run in self.runs.values():
            self._kill(run, signal.SIGTERM)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and any(r.alive() for r in self.runs.values()):
            for run in self.runs.values():
                for c in run.alive():
                    assert c.proc is not None
                    if c.proc.poll() is not None:
                        c.exit_code = c.proc.returncode
            time.sleep(0.05)
        for run in self.runs.values():
            self._kill(run, signal.SIGKILL)
            self._kill_family(run)
        for pid in descendants(os.getpid()):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)


def become_subreaper() -> None:
    """Adopt orphaned pod processes (prctl PR_SET_CHILD_SUBREAPER) so none escape teardown."""
    import ctypes

    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)


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


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--kubeconfig", required=True)
    p.add_argument("--nodes", type=int, default=2)
    p.add_argument("--node-prefix", default="gpu-node")
    p.add_argument("--gpus-per-node", type=int, default=4)
    p.add_argument("--cpu", default="16")
    p.add_argument("--memory", default="64Gi")
    p.add_argument("--state-dir", required=True)
    p.add_argument("--ready-file")
    p.add_argument(
        "--no-isolation", action="store_true", help="run pods without mount/UTS namespaces"
    )
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    api = config.new_client_from_config(config_file=args.kubeconfig)
    names = [f"{args.node_prefix}-{i}" for i in range(args.nodes)]
    agent = NodeAgent(
        api,
        names,
        NodeShape(args.gpus_per_node, args.cpu, args.memory),
        Path(args.state_dir),
        isolate=not args.no_isolation,
    )
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: agent.stop())
    agent.register_nodes()
    log.info("nodes %s ready (pod isolation: %s)", ", ".join(names), agent.isolate)
    if args.ready_file:
        Path(args.ready_file).write_text("ready\n")
    agent.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
