"""A small kubelet stand-in: registers GPU nodes and runs bound pods as local processes.

Why: without a kubelet no pod ever runs, and a mock would not tell us whether the
operator's pods really launch a torchrun gang, or whether the chart's Deployment really
runs the operator. The real scheduler binds pods to the nodes registered here; this
agent runs each container's command with the pod's env, gives every pod its own
127.0.0.0/8 address, and reports status as a kubelet would.

What it does like a kubelet: env (downward API, ConfigMap/Secret refs, the
``KUBERNETES_SERVICE_*`` variables pointing at the loopback API server); volumes
(emptyDir, hostPath, configMap, secret, downwardAPI, projected, including the
``kube-api-access-*`` service-account token from the TokenRequest API, refreshed at 80%
of its lifetime); startup/liveness/readiness probes (httpGet, tcpSocket, exec) with the
Ready condition; ``restartPolicy`` Always/OnFailure with crash-loop back-off; the
``/containerLogs`` endpoint (``kubectl logs``, ``-f``, ``--previous``) on loopback TLS.

Isolation per pod (when root and ``unshare`` exists): a mount and UTS namespace, so the
pod sees its own hostname, its volumes at their mount paths, and an /etc/hosts that maps
its headless-service peers' DNS names (``<hostname>.<subdomain>[.<ns>.svc.cluster.local]``)
to their addresses. The network namespace is shared with the host: processes that bind
0.0.0.0 on the same port in two pods collide, so pods bind their pod IP (the gpujob
trainer and the chart's operator do). Images are not pulled: see :mod:`images`.
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
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, cast

from kubernetes import client, config, watch
from kubernetes.client.rest import ApiException

from gpujob_localcluster import images, podenv, probes, tokens, volumes
from gpujob_localcluster.controlplane import pid_alive, proc_state
from gpujob_localcluster.kubeletapi import BadRequest, KubeletServer, LogRequest, LogSource
from gpujob_localcluster.restarts import (
    BackOff,
    ContainerFate,
    backoff_message,
    pod_phase,
    should_restart,
)

log = logging.getLogger("gpujob.nodeagent")

HEARTBEAT_SECONDS = 10.0
K8S_VERSION = "v1.37.2"
MOUNT_RETRY_SECONDS = 2.0
PODINIT = Path(__file__).with_name("podinit.py")
IMAGE_PATHS: Final = (Path(sys.prefix), images.REPO_ROOT)
"""What plays every container's image here: the venv and the checkout its editable install
points at. A pod's volume mounted above them must not hide them (see podinit)."""
POD_CONDITIONS = ("PodReadyToStartContainers", "Initialized", "ContainersReady", "Ready")


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

    def family(self) -> set[int]:
        return set().union(*(c.family for c in self.containers)) if self.containers else set()


class NodeAgent:
    """Registers nodes, heartbeats them, and runs the pods bound to them."""

    def __init__(
        self,
        api: client.ApiClient,
        node_names: list[str],
        shape: NodeShape,
        state_dir: Path,
        isolate: bool | None = None,
        kubelet_tls: tuple[Path, Path, Path] | None = None,
        image_table: dict[str, images.ImageConfig] | None = None,
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
        self.waiting_mounts: dict[str, tuple[dict[str, Any], float]] = {}
        """Pods whose volumes could not be filled yet: uid -> (pod, retry at)."""
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
        self.api_host, self.api_port = api_endpoint(api.configuration.host)
        self.base_env = self._base_env()
        self.images = images.load_table() if image_table is None else image_table
        self._recorded: dict[tuple[str, ...], tuple[str, int]] = {}
        """Events already posted: (pod uid, container, type, reason, message) -> (name, count)."""
        self.kubelet: KubeletServer | None = None
        if kubelet_tls is not None:
            cert, key, ca = kubelet_tls
            self.kubelet = KubeletServer(self.resolve_log, cert, key, ca).start()

    @property
    def kubelet_port(self) -> int:
        return self.kubelet.port if self.kubelet is not None else 0

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
        # No kube-proxy: the kubernetes Service's variables name the loopback API server.
        env.update(podenv.kubernetes_service_env(self.api_host, self.api_port))
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
                "daemonEndpoints": {"kubeletEndpoint": {"Port": self.kubelet_port}},
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
                self._enforce_grace()
                self._restart_due()
                self._retry_mounts()
                self._refresh_tokens()
                self._census()
            except Exception:
                log.exception("handling %s failed", kind)
        self.shutdown()

    def _handle(self, kind: str, payload: Any) -> None:
        if kind == "pod":
            self.on_pod(payload)
        elif kind == "deleted":
            uid = payload["metadata"]["uid"]
            self.waiting_mounts.pop(uid, None)
            run = self.runs.pop(uid, None)
            if run:
                log.info("pod %s deleted; stopping its processes", run.key)
                self._kill(run, signal.SIGKILL)
                self._kill_family(run)
                self._refresh_hosts(run.group())
        elif kind == "exit":
            uid, cname, attempt, code = payload
            self.on_exit(uid, cname, attempt, code)
        elif kind == "probe":
            self.on_probe(*payload)
        elif kind == "resync":
            for uid in [u for u in self.runs if u not in payload]:
                run = self.runs.pop(uid)
                self._kill(run, signal.SIGKILL)
                self._kill_family(run)
            for uid in [u for u in self.waiting_mounts if u not in payload]:
                self.waiting_mounts.pop(uid)

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
                for c in run.containers:
                    c.restart_at = None
                self._kill(run, signal.SIGTERM)
                if not run.alive():
                    self._finalize_delete(run)
            return
        if deleting:
            self.waiting_mounts.pop(uid, None)
            self._force_delete(meta["namespace"], meta["name"], uid)
            return
        if uid in self.waiting_mounts:
            self.waiting_mounts[uid] = (pod, self.waiting_mounts[uid][1])
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

    # -- starting pods and containers ----------------------------------------------
    def start_pod(self, pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        folder = self.pods_dir / f"{meta['namespace']}_{meta['name']}_{meta['uid'][:8]}"
        folder.mkdir(parents=True, exist_ok=True)
        run = PodRun(meta["uid"], meta["namespace"], meta["name"], pod, "", folder)
        try:
            self._prepare_volumes(run)
        except (volumes.VolumeNotReady, ApiException, OSError, ValueError) as e:
            # The kubelet keeps the pod in ContainerCreating and says why in FailedMount Events.
            first = meta["uid"] not in self.waiting_mounts
            self.waiting_mounts[meta["uid"]] = (pod, time.monotonic() + MOUNT_RETRY_SECONDS)
            if first:
                reason = getattr(e, "reason", None) or str(e)
                log.info("pod %s waits for its volumes: %s", run.key, reason)
                self._event(run, "Warning", "FailedMount", f"MountVolume.SetUp failed: {reason}")
            return
        self.waiting_mounts.pop(meta["uid"], None)
        ip = next(self._ips)
        run.ip = ip
        pod.setdefault("status", {}).update(
            {
                "podIP": ip,
                "podIPs": [{"ip": ip}],
                "hostIP": "127.0.0.1",
                "hostIPs": [{"ip": "127.0.0.1"}],
            }
        )
        self.runs[run.uid] = run
        self._refresh_hosts(run.group(), also=run)
        run.started_at = now_iso()
        for c in pod["spec"].get("containers", []):
            crun = ContainerRun(c["name"], c, folder / f"{c['name']}.log")
            run.containers.append(crun)
            self._start_container(run, crun)
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
        self._publish(run)

    def _retry_mounts(self) -> None:
        now = time.monotonic()
        for uid, (pod, at) in list(self.waiting_mounts.items()):
            if now >= at and uid not in self.runs:
                self.start_pod(pod)

    def _prepare_volumes(self, run: PodRun) -> None:
        """Fill every volume's folder (tokens included) and plan each container's mounts."""
        spec = run.pod.get("spec", {})
        folders: dict[str, Path | None] = {}
        lookup = self._volume_lookup(run.namespace)
        for vol in spec.get("volumes") or []:
            kind = volumes.kind_of(vol)
            folder = run.folder / "volumes" / vol["name"]
            if kind == "emptyDir":
                folder.mkdir(parents=True, exist_ok=True)
            elif kind == "hostPath":
                folder = Path(vol["hostPath"]["path"])
                if vol["hostPath"].get("type") == "DirectoryOrCreate":
                    folder.mkdir(parents=True, exist_ok=True)
            elif kind in volumes.FILE_KINDS:
                files, sources = volumes.volume_contents(vol, run.pod, lookup)
                folder.mkdir(parents=True, exist_ok=True)
                for rel, text in files.items():
                    write_atomic(folder / rel, text)
                for source in sources:
                    tok = ProjectedToken(folder / source.path, source, 0.0)
                    self._write_token(run, tok)
                    run.tokens.append(tok)
            else:
                folders[vol["name"]] = None
                self._event(
                    run,
                    "Warning",
                    "VolumeNotMounted",
                    f"volume {vol['name']!r} ({kind or 'no source'}) is not supported by the "
                    f"local node agent; containers see no mount at its mount paths",
                )
                continue
            folders[vol["name"]] = folder
        for c in spec.get("containers", []):
            run.mounts[c["name"]] = volumes.container_mounts(c, folders)

    def _write_token(self, run: PodRun, tok: ProjectedToken) -> None:
        spec = run.pod.get("spec", {})
        sa = spec.get("serviceAccountName") or "default"
        body = tokens.token_request(tok.source, run.name, run.uid)
        write_atomic(tok.path, tokens.request_token(self.core, run.namespace, sa, body))
        tok.issued_at = time.monotonic()

    def _refresh_tokens(self) -> None:
        now = time.monotonic()
        for run in list(self.runs.values()):
            if run.finished or run.deleting:
                continue
            for tok in run.tokens:
                if tokens.refresh_due(tok.issued_at, tok.source.expiration_seconds, now):
                    try:
                        self._write_token(run, tok)
                        log.info("pod %s: refreshed the token in %s", run.key, tok.path)
                    except ApiException as e:
                        # Keep the old token (still valid for the remaining 20%); retry shortly.
                        tok.issued_at += 10.0
                        log.warning("pod %s: token refresh failed: %s", run.key, e.reason)

    def _volume_lookup(self, namespace: str) -> volumes.Lookup:
        def lookup(kind: str, name: str) -> dict[str, str] | None:
            try:
                if kind == "configMap":
                    return dict(self.core.read_namespaced_config_map(name, namespace).data or {})
                secret = self.core.read_namespaced_secret(name, namespace)
                return volumes.secret_lookup_data(cast(Any, secret.data))
            except ApiException as e:
                if e.status == 404:
                    return None
                raise

        return lookup

    def _start_container(self, run: PodRun, crun: ContainerRun) -> None:
        """Start one attempt of a container (the first, or a restart) and its probes."""
        crun.attempt += 1
        crun.proc = None
        crun.exit_code, crun.reason, crun.message, crun.finished_at = None, "", "", ""
        crun.waiting, crun.restart_at, crun.kill_at = None, None, None
        crun.family = set()
        crun.started_at = now_iso()
        crun.probe_states = {p.kind: probes.ProbeState(p) for p in probes.probes_of(crun.spec)}
        try:
            self._spawn(run, crun.spec, crun)
        except Exception as e:
            crun.exit_code, crun.reason, crun.message = 128, "StartError", str(e)
            crun.finished_at = now_iso()
            log.warning("pod %s container %s could not start: %s", run.key, crun.name, e)
            self._event(run, "Warning", "Failed", f"Error: {e}", crun.name)
            self.events.put(("exit", (run.uid, crun.name, crun.attempt, 128)))
            return
        for probe in crun.probe_states.values():
            threading.Thread(
                target=self._probe_loop,
                args=(run, crun, crun.attempt, probe.probe),
                name=f"probe-{run.name}-{crun.name}-{probe.probe.kind}",
                daemon=True,
            ).start()

    def _spawn(self, run: PodRun, container: dict[str, Any], crun: ContainerRun) -> None:
        env = dict(self.base_env)
        env.update(podenv.container_env(run.pod, container, self._lookup(run.namespace)))
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

    def _lookup(self, namespace: str) -> Any:
        def lookup(kind: str, name: str, key: str) -> str | None:
            data = self._volume_lookup(namespace)(
                "configMap" if kind.startswith("configMap") else "secret", name
            )
            if data is None:
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

    # -- probes ----------------------------------------------------------------------
    def _probe_loop(
        self, run: PodRun, crun: ContainerRun, attempt: int, probe: probes.Probe
    ) -> None:
        """Run one probe of one container attempt every period, as the kubelet's prober does."""
        if self.stopping.wait(probe.initial_delay):
            return
        while crun.attempt == attempt and crun.running and run.uid in self.runs:
            gated = probe.kind != "startup" and not crun.passing("startup")
            done = probe.kind == "startup" and crun.passing("startup")
            if done:
                return
            if not gated and not run.deleting:
                ok, message = probes.check(probe, run.ip, crun.spec, self._exec_runner(crun))
                self.events.put(("probe", (run.uid, crun.name, attempt, probe.kind, ok, message)))
            if self.stopping.wait(probe.period):
                return

    def _exec_runner(self, crun: ContainerRun) -> probes.ExecRunner:
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

    def on_probe(self, uid: str, cname: str, attempt: int, kind: str, ok: bool, msg: str) -> None:
        run = self.runs.get(uid)
        if run is None or run.deleting:
            return
        crun = next(c for c in run.containers if c.name == cname)
        state = crun.probe_states.get(kind)
        if crun.attempt != attempt or not crun.running or state is None:
            return
        if not ok:
            self._event(
                run, "Warning", "Unhealthy", f"{kind.capitalize()} probe failed: {msg}", cname
            )
        change = state.record(ok, msg)
        if change is None:
            return
        log.info("pod %s container %s: %s probe %s", run.key, cname, kind, change)
        if change == "failed" and kind in ("liveness", "startup"):
            grace = state.probe.termination_grace
            if grace is None:
                grace = float(run.pod["spec"].get("terminationGracePeriodSeconds", 30))
            self._event(
                run,
                "Normal",
                "Killing",
                f"Container {cname} failed {kind} probe, will be restarted",
                cname,
            )
            crun.kill_at = time.monotonic() + grace
            self._kill_container(crun, signal.SIGTERM)
        self._publish(run)

    # -- exits and restarts ----------------------------------------------------------
    def on_exit(self, uid: str, cname: str, attempt: int, code: int) -> None:
        run = self.runs.get(uid)
        if run is None:
            return
        crun = next(c for c in run.containers if c.name == cname)
        if crun.attempt != attempt:
            return
        if not crun.finished_at:
            crun.exit_code = 128 - code if code < 0 else code
            if not crun.reason:
                crun.reason = "Completed" if crun.exit_code == 0 else "Error"
            crun.finished_at = now_iso()
            if (
                crun.exit_code != 0
                and crun.spec.get("terminationMessagePolicy") == "FallbackToLogsOnError"
            ):
                with contextlib.suppress(OSError):
                    crun.message = podenv.termination_tail(
                        crun.log_path.read_text(errors="replace")
                    )
            log.info("pod %s container %s exited with %s", run.key, cname, crun.exit_code)
        crun.kill_at = None
        self._kill_leftovers(crun)
        if run.finished:
            return
        restart = should_restart(run.policy, crun.exit_code or 0)
        if restart and not run.deleting and not self.stopping.is_set():
            wait = crun.backoff.wait_after(time.monotonic())
            crun.restart_at = time.monotonic() + wait
            if wait > 0:
                message = backoff_message(wait, cname, run.name, run.namespace, run.uid)
                crun.waiting = ("CrashLoopBackOff", message)
                self._event(
                    run, "Warning", "BackOff", "Back-off restarting failed container", cname
                )
                self._publish(run)
            return
        if run.alive() or any(c.restart_at is not None for c in run.containers):
            self._publish(run)
            return
        run.finished = True
        self._kill_family(run)
        self._publish(run)
        if run.deleting:
            self._finalize_delete(run)

    def _restart_due(self) -> None:
        now = time.monotonic()
        for run in list(self.runs.values()):
            for crun in run.containers:
                if crun.restart_at is None or now < crun.restart_at or run.deleting:
                    continue
                crun.last_state = {"terminated": self._terminated(crun)}
                crun.restart_count += 1
                crun.backoff.restarted(now)
                with contextlib.suppress(OSError):
                    os.replace(crun.log_path, crun.previous_log)
                log.info("pod %s container %s: restart %d", run.key, crun.name, crun.restart_count)
                self._start_container(run, crun)
                self._publish(run)

    # -- status ----------------------------------------------------------------------
    def _publish(self, run: PodRun) -> None:
        """Patch the pod's status from what the agent knows: phase, conditions, containers."""
        fates = [
            ContainerFate(c.running, c.exit_code, c.restart_at is not None) for c in run.containers
        ]
        phase = pod_phase(fates)
        ready = phase == "Running" and all(c.ready for c in run.containers)
        ts = now_iso()
        wanted = {
            "PodReadyToStartContainers": "True",
            "Initialized": "True",
            "ContainersReady": "True" if ready else "False",
            "Ready": "True" if ready else "False",
        }
        conds = [{"type": "PodScheduled", "status": "True"}]
        for ctype in POD_CONDITIONS:
            status = wanted[ctype]
            old = run.conditions.get(ctype)
            if old is None or old[0] != status:
                run.conditions[ctype] = (status, ts)
            cond: dict[str, Any] = {
                "type": ctype,
                "status": status,
                "lastTransitionTime": run.conditions[ctype][1],
            }
            if status == "False" and ctype in ("ContainersReady", "Ready"):
                if phase in ("Succeeded", "Failed"):
                    cond["reason"] = "PodCompleted"
                else:
                    cond["reason"] = "ContainersNotReady"
                    unready = [c.name for c in run.containers if not c.ready]
                    cond["message"] = f"containers with unready status: [{' '.join(unready)}]"
            conds.append(cond)
        self._patch_status(
            run.pod,
            {
                "phase": phase,
                "podIP": run.ip,
                "podIPs": [{"ip": run.ip}],
                "hostIP": "127.0.0.1",
                "hostIPs": [{"ip": "127.0.0.1"}],
                "startTime": run.started_at,
                "conditions": conds,
                "containerStatuses": [self._container_status(c) for c in run.containers],
            },
            run,
        )

    def _terminated(self, crun: ContainerRun) -> dict[str, Any]:
        term: dict[str, Any] = {
            "exitCode": crun.exit_code,
            "reason": crun.reason,
            "startedAt": crun.started_at,
            "finishedAt": crun.finished_at or now_iso(),
            "containerID": f"local://{crun.proc.pid if crun.proc else 0}",
        }
        if crun.message:
            term["message"] = crun.message
        return term

    def _container_status(self, crun: ContainerRun) -> dict[str, Any]:
        base: dict[str, Any] = {
            "name": crun.name,
            "image": crun.spec.get("image", ""),
            "imageID": "",
            "restartCount": crun.restart_count,
            "containerID": f"local://{crun.proc.pid if crun.proc else 0}",
            "lastState": crun.last_state,
            "ready": crun.ready,
            "started": crun.started,
        }
        if crun.running:
            return {**base, "state": {"running": {"startedAt": crun.started_at}}}
        if crun.waiting is not None and crun.restart_at is not None:
            reason, message = crun.waiting
            # While it waits, the last attempt is the container's last state.
            last = {"terminated": self._terminated(crun)}
            return {
                **base,
                "lastState": last,
                "state": {"waiting": {"reason": reason, "message": message}},
            }
        return {**base, "state": {"terminated": self._terminated(crun)}}

    # -- logs (the kubelet API) ------------------------------------------------------
    def resolve_log(self, req: LogRequest) -> LogSource:
        """Where ``kubectl logs`` of a container reads (called from the kubelet API's threads)."""
        run = next(
            (
                r
                for r in list(self.runs.values())
                if (r.namespace, r.name) == (req.namespace, req.pod)
            ),
            None,
        )
        if run is None:
            raise BadRequest(
                404, f'pod "{req.pod}" in namespace "{req.namespace}" is not on this node'
            )
        crun = next((c for c in run.containers if c.name == req.container), None)
        if crun is None:
            raise BadRequest(404, f'container "{req.container}" in pod "{req.pod}" not found')
        if req.previous:
            if crun.restart_count == 0 or not crun.previous_log.exists():
                raise BadRequest(
                    400,
                    f'previous terminated container "{req.container}" in pod "{req.pod}" not found',
                )
            return LogSource(crun.previous_log, lambda: False)
        attempt = crun.attempt
        return LogSource(crun.log_path, lambda: crun.attempt == attempt and crun.running)

    # -- stopping ----------------------------------------------------------------------
    def _kill(self, run: PodRun, sig: int) -> None:
        """Signal every process of the pod: its process group and, for SIGKILL, all descendants.

        Descendants matter because torchrun starts each worker in a session of its own: a
        SIGKILL of the container's group alone would leave the workers running.
        """
        for c in run.alive():
            self._kill_container(c, sig)

    def _kill_container(self, crun: ContainerRun, sig: int) -> None:
        if not crun.running:
            return
        assert crun.proc is not None
        family = descendants(crun.proc.pid) if sig == signal.SIGKILL else []
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(crun.proc.pid, sig)
        for pid in family:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)

    def _census(self) -> None:
        """Once a second: note each container's processes and reap orphans that died under us."""
        now = time.monotonic()
        if now - self._last_census < 1.0:
            return
        self._last_census = now
        for run in list(self.runs.values()):
            if run.unsent is not None:
                self._patch_status(run.pod, run.unsent, run)
        for run in self.runs.values():
            for c in run.alive():
                assert c.proc is not None
                c.family.update(descendants(c.proc.pid))
        ours = {c.proc.pid for r in self.runs.values() for c in r.containers if c.proc is not None}
        for pid in descendants(os.getpid()):
            if pid not in ours and proc_state(pid) == "Z":
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(pid, os.WNOHANG)

    def _kill_leftovers(self, crun: ContainerRun) -> None:
        """SIGKILL what is left of a container attempt after it ended (the cgroup's job)."""
        for pid in crun.family:
            if pid_alive(pid):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)

    def _kill_family(self, run: PodRun) -> None:
        for c in run.containers:
            self._kill_leftovers(c)

    def _enforce_grace(self) -> None:
        now = time.monotonic()
        for run in list(self.runs.values()):
            if run.kill_at is not None and now >= run.kill_at and run.alive():
                log.info("pod %s grace period over; SIGKILL", run.key)
                self._kill(run, signal.SIGKILL)
                run.kill_at = now + 3600  # once
            for c in run.containers:
                if c.kill_at is not None and now >= c.kill_at and c.running:
                    log.info("pod %s container %s grace period over; SIGKILL", run.key, c.name)
                    self._kill_container(c, signal.SIGKILL)
                    c.kill_at = None

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

    def _patch_status(
        self, pod: dict[str, Any], status: dict[str, Any], run: PodRun | None = None
    ) -> None:
        """Send a pod's status; with ``run``, one the API refuses is kept and resent later."""
        meta = pod["metadata"]
        try:
            self.core.patch_namespaced_pod_status(
                meta["name"], meta["namespace"], {"status": status}
            )
        except ApiException as e:
            log.warning(
                "status update of %s/%s failed: %s", meta["namespace"], meta["name"], e.reason
            )
            if e.status is None or not (e.status >= 500 or e.status == 429):
                status = {}  # gone (404) or refused for good: resending cannot help
        except Exception as e:  # the API server is down: keep the status for a later resend
            log.warning(
                "status update of %s/%s failed (%s); resending",
                meta["namespace"],
                meta["name"],
                type(e).__name__,
            )
        else:
            status = {}
        if run is not None:
            # A later status supersedes an unsent one only where it says something.
            run.unsent = {**(run.unsent or {}), **status} if status else None

    def _event(
        self, run: PodRun, type_: str, reason: str, message: str, container: str | None = None
    ) -> None:
        """Record an Event on the pod, as the kubelet does: a repeat of the same event bumps
        its count instead of adding another (failures are only logged)."""
        ts = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        message = message[:1024]
        key = (run.uid, container or "", type_, reason, message)
        seen = self._recorded.get(key)
        try:
            if seen is not None:
                name, count = seen
                self.core.patch_namespaced_event(
                    name, run.namespace, {"count": count + 1, "lastTimestamp": ts}
                )
                self._recorded[key] = (name, count + 1)
                return
            involved: dict[str, Any] = {
                "apiVersion": "v1",
                "kind": "Pod",
                "namespace": run.namespace,
                "name": run.name,
                "uid": run.uid,
            }
            if container:
                involved["fieldPath"] = f"spec.containers{{{container}}}"
            body = {
                "metadata": {"generateName": f"{run.name}.", "namespace": run.namespace},
                "involvedObject": involved,
                "reason": reason,
                "message": message,
                "type": type_,
                "source": {"component": "kubelet", "host": run.pod["spec"].get("nodeName", "")},
                "firstTimestamp": ts,
                "lastTimestamp": ts,
                "count": 1,
            }
            created: Any = self.core.create_namespaced_event(run.namespace, cast(Any, body))
            if len(self._recorded) > 4096:
                self._recorded.clear()
            self._recorded[key] = (created.metadata.name, 1)
        except ApiException as e:
            self._recorded.pop(key, None)
            log.debug("event %s on %s not recorded: %s", reason, run.key, e.reason)

    def stop(self) -> None:
        self.stopping.set()

    def shutdown(self) -> None:
        """Stop every pod process: SIGTERM, a short grace, then SIGKILL."""
        if self.kubelet is not None:
            self.kubelet.stop()
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


def api_endpoint(url: str) -> tuple[str, int]:
    """(host, port) of the API server URL the agent talks to (``https://127.0.0.1:6443``)."""
    parsed = urllib.parse.urlsplit(url)
    return parsed.hostname or "127.0.0.1", parsed.port or 443


def write_atomic(path: Path, text: str) -> None:
    """Replace a file in one step (a reader sees the old or the new content, never half)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


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
    p.add_argument("--kubelet-cert", help="serving certificate of the kubelet API (kubectl logs)")
    p.add_argument("--kubelet-key", help="its key")
    p.add_argument("--client-ca", help="CA whose client certificates may call the kubelet API")
    p.add_argument(
        "--image",
        action="append",
        default=[],
        metavar="REPOSITORY=DOCKERFILE",
        help="map an image to the Dockerfile whose ENTRYPOINT/CMD it runs (repeatable)",
    )
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    api = config.new_client_from_config(config_file=args.kubeconfig)
    names = [f"{args.node_prefix}-{i}" for i in range(args.nodes)]
    tls = None
    if args.kubelet_cert and args.kubelet_key and args.client_ca:
        tls = (Path(args.kubelet_cert), Path(args.kubelet_key), Path(args.client_ca))
    extra = dict(item.split("=", 1) for item in args.image)
    agent = NodeAgent(
        api,
        names,
        NodeShape(args.gpus_per_node, args.cpu, args.memory),
        Path(args.state_dir),
        isolate=not args.no_isolation,
        kubelet_tls=tls,
        image_table=images.load_table(extra),
    )
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: agent.stop())
    agent.register_nodes()
    log.info(
        "nodes %s ready (pod isolation: %s, kubelet API port: %s)",
        ", ".join(names),
        agent.isolate,
        agent.kubelet_port or "off",
    )
    if args.ready_file:
        Path(args.ready_file).write_text("ready\n")
    agent.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
