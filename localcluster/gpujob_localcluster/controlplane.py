"""Start and stop a real Kubernetes control plane on loopback.

etcd, kube-apiserver (RBAC on, service-account signing keys so ``kubectl create
token`` works), kube-controller-manager and kube-scheduler run as child processes,
each in its own process group with its log in ``<folder>/logs``. Readiness is waited
for with deadlines; a component that exits early fails start-up with its log tail.
The folder's state file records every pid, so a second start refuses a live cluster and
``stop_folder`` can stop one started elsewhere. Process helpers: :mod:`processes`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import ssl
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from gpujob_localcluster.pki import API_SERVER_SANS, Identity, Pki, kubeconfig
from gpujob_localcluster.ports import free_port
from gpujob_localcluster.processes import (
    ClusterError,
    Component,
    http_ok,
    pid_alive,
    terminate_group,
    wait_for,
)
from gpujob_localcluster.tools import bin_dir

log = logging.getLogger("gpujob.localcluster")

SA_ISSUER = "https://kubernetes.default.svc.cluster.local"
WEBHOOK_CLIENT_CN = "kube-apiserver-webhook-client"
"""The subject of the client certificate the API server presents to admission webhooks
(signed by the cluster's CA, ``pki/ca.crt``): a webhook that requires it answers only the
API server."""
STATE_FILE = "state.json"
# What a previous run leaves behind; certificates are kept (a fresh CA is not needed).
STALE_PARTS = ("etcd", "agent", "apiserver-certs", "logs")


GANG_FEATURE_GATES = "GenericWorkload=true"
"""Kubernetes v1.37: the Workload/PodGroup API and kube-scheduler's GangScheduling plugin."""
GANG_RUNTIME_CONFIG = "scheduling.k8s.io/v1alpha3=true,scheduling.k8s.io/v1beta1=true"
"""Both versions of the Workload API (kube-scheduler watches PodGroups through v1beta1)."""


@dataclass
class ControlPlane:
    """A local control plane rooted at ``folder``.

    ``start()`` refuses a folder whose previous cluster still runs, wipes a stale one
    (saying so), and leaves ``admin.kubeconfig`` ready when it returns.
    """

    folder: Path
    components: list[Component] = field(default_factory=list)
    server: str = ""
    bins: Path | None = None
    gang_scheduling: bool = False
    """Enable native gang scheduling: GenericWorkload in every component, the
    scheduling.k8s.io Workload/PodGroup API, and so kube-scheduler's GangScheduling plugin
    (it is in the default profile whenever the gate is on)."""
    client_qps: int = 0
    """The controller-manager's and scheduler's API client rate (0: their defaults, 20 and
    50 per second). A cluster of thousands of (hollow) nodes needs more: at 20 the node
    lifecycle controller lifts new nodes' not-ready taints at about 5 a second."""
    node_grace_seconds: float = 0
    """The node lifecycle controller's grace before a node whose Lease is not renewed turns
    Unknown, tainted and (5 minutes later) evicted (0: its default, under a minute)."""

    def gates(self) -> list[str]:
        """Feature-gate flags every component gets."""
        return ["--feature-gates", GANG_FEATURE_GATES] if self.gang_scheduling else []

    def qps(self) -> list[str]:
        """API client rate flags of the controller-manager and the scheduler."""
        if not self.client_qps:
            return []
        return [
            "--kube-api-qps",
            str(self.client_qps),
            "--kube-api-burst",
            str(2 * self.client_qps),
        ]

    def node_grace(self) -> list[str]:
        """The controller-manager's node grace flag, when set."""
        if not self.node_grace_seconds:
            return []
        return ["--node-monitor-grace-period", f"{self.node_grace_seconds:g}s"]

    @property
    def admin_kubeconfig(self) -> Path:
        return self.folder / "admin.kubeconfig"

    @property
    def log_dir(self) -> Path:
        return self.folder / "logs"

    @property
    def pki(self) -> Pki:
        return Pki(self.folder / "pki")

    def bin(self, name: str) -> str:
        assert self.bins is not None
        return str(self.bins / name)

    # -- lifecycle -----------------------------------------------------------------
    @classmethod
    def attach(cls, folder: Path) -> ControlPlane:
        """A handle on a control plane that already runs in ``folder`` (started elsewhere)."""
        cp = cls(folder)
        state = folder / STATE_FILE
        if state.exists():
            cp.server = str(json.loads(state.read_text()).get("server", ""))
        cp.bins = bin_dir()
        return cp

    def _check_stale(self) -> None:
        state = self.folder / STATE_FILE
        if state.exists():
            pids = json.loads(state.read_text()).get("pids", {})
            alive = {n: p for n, p in pids.items() if pid_alive(int(p))}
            if alive:
                listing = ", ".join(f"{n} (pid {p})" for n, p in alive.items())
                raise ClusterError(
                    f"a local cluster already runs in {self.folder}: {listing}. "
                    f"Stop it first (make cluster-down) or use another folder."
                )
            state.unlink()
        stale = [self.folder / n for n in STALE_PARTS if (self.folder / n).exists()]
        if stale:
            log.warning(
                "removing stale cluster data in %s from a run that is no longer alive", self.folder
            )
            for path in stale:
                shutil.rmtree(path) if path.is_dir() else path.unlink()

    def _spawn(
        self,
        name: str,
        args: list[str],
        ready: Callable[[], bool] | None = None,
        env: dict[str, str] | None = None,
    ) -> Component:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log_path = self.log_dir / f"{name}.log"
        out = open(log_path, "ab")  # noqa: SIM115 - owned by the child for its lifetime
        proc = subprocess.Popen(
            args,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env={**os.environ, **env} if env else None,
        )
        out.close()
        comp = Component(name, proc, log_path, list(args), ready, env)
        old = [i for i, c in enumerate(self.components) if c.name == name]
        if old:
            self.components[old[0]] = comp
        else:
            self.components.append(comp)
        self._write_state()
        return comp

    # -- faults (the chaos tests restart components the way a node reboot would) ----------
    def component(self, name: str) -> Component:
        """The running component called ``name`` (etcd, kube-apiserver, ...)."""
        for comp in self.components:
            if comp.name == name:
                return comp
        raise ClusterError(f"no component {name!r} in this control plane")

    def stop_component(self, name: str, sig: int = signal.SIGKILL) -> None:
        """Stop one component abruptly (SIGKILL: a crash) or gracefully (SIGTERM)."""
        comp = self.component(name)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(comp.proc.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            comp.proc.wait(timeout=30)
        if comp.proc.poll() is None:
            terminate_group(comp.proc.pid, 0)
            comp.proc.wait(timeout=10)

    def start_component(self, name: str, timeout: float = 120.0) -> Component:
        """Start a stopped component again with the same command line; wait until it serves."""
        old = self.component(name)
        if old.proc.poll() is None:
            raise ClusterError(f"{name} still runs (pid {old.proc.pid}); stop it first")
        comp = self._spawn(name, old.args, old.ready, old.env)
        if comp.ready is not None:
            wait_for(comp.ready, timeout, f"{name} to serve again", comp.problem)
        return comp

    def restart_component(
        self, name: str, sig: int = signal.SIGKILL, timeout: float = 120.0
    ) -> Component:
        """Stop and start one component; ports, certificates and data are kept."""
        self.stop_component(name, sig)
        return self.start_component(name, timeout)

    def _write_state(self, extra: dict | None = None) -> None:
        state_path = self.folder / STATE_FILE
        state = json.loads(state_path.read_text()) if state_path.exists() else {}
        state.setdefault("pids", {})
        for c in self.components:
            state["pids"][c.name] = c.proc.pid
        state["server"] = self.server
        state["kubeconfig"] = str(self.admin_kubeconfig)
        if extra:
            state.update(extra)
        state_path.write_text(json.dumps(state, indent=2))

    def register_pid(self, name: str, pid: int) -> None:
        """Record an extra process (the node agent) so stale checks and teardown see it."""
        self._write_state({"pids": {**self._pids(), name: pid}})

    def _pids(self) -> dict[str, int]:
        state_path = self.folder / STATE_FILE
        if not state_path.exists():
            return {}
        return dict(json.loads(state_path.read_text()).get("pids", {}))

    def start(self, timeout: float = 180.0) -> ControlPlane:
        """Start every component and wait until the API server serves and RBAC is ready."""
        self._check_stale()
        self.folder.mkdir(parents=True, exist_ok=True)
        self.bins = bin_dir()
        started = time.monotonic()
        try:
            self._start(timeout)
        except BaseException:
            self.stop()
            raise
        log.info("control plane ready in %.1fs at %s", time.monotonic() - started, self.server)
        return self

    def _webhook_client_config(self, pki: Pki) -> Path:
        """An AdmissionConfiguration giving the API server a client certificate (signed by
        the cluster's CA, CN ``kube-apiserver-webhook-client``) for every webhook it calls."""
        client = pki.issue("apiserver-webhook-client", WEBHOOK_CLIENT_CN)
        kubeconfig = self.folder / "webhook-client.kubeconfig"
        kubeconfig.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "users": [
                        {
                            "name": "*",
                            "user": {
                                "client-certificate": str(client.cert),
                                "client-key": str(client.key),
                            },
                        }
                    ],
                }
            )
        )
        plugin_config = {
            "apiVersion": "apiserver.config.k8s.io/v1",
            "kind": "WebhookAdmissionConfiguration",
            "kubeConfigFile": str(kubeconfig),
        }
        config = self.folder / "admission-config.yaml"
        config.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "apiserver.config.k8s.io/v1",
                    "kind": "AdmissionConfiguration",
                    "plugins": [
                        {"name": name, "configuration": plugin_config}
                        for name in ("ValidatingAdmissionWebhook", "MutatingAdmissionWebhook")
                    ],
                }
            )
        )
        return config

    def _start(self, timeout: float) -> None:
        pki = self.pki
        server_id = pki.issue("apiserver", "kube-apiserver", sans=API_SERVER_SANS)
        admin = pki.issue("admin", "gpujob-admin", orgs=("system:masters",))
        cm = pki.issue("controller-manager", "system:kube-controller-manager")
        sched = pki.issue("scheduler", "system:kube-scheduler")
        # The API server's identity towards kubelets (kubectl logs is proxied with it).
        kubelet_client = pki.issue(
            "apiserver-kubelet-client", "kube-apiserver-kubelet-client", orgs=("system:masters",)
        )
        sa_key, sa_pub = pki.service_account_keys()
        admission_config = self._webhook_client_config(pki)

        etcd_port, peer_port, api_port = free_port(), free_port(), free_port()
        cm_port, sched_port = free_port(), free_port()
        self.server = f"https://127.0.0.1:{api_port}"
        self._write_kubeconfig(self.admin_kubeconfig, "admin", admin)
        cm_kc = self._write_kubeconfig(self.folder / "controller-manager.kubeconfig", "cm", cm)
        sched_kc = self._write_kubeconfig(self.folder / "scheduler.kubeconfig", "scheduler", sched)

        etcd_url = f"http://127.0.0.1:{etcd_port}"
        etcd = self._spawn(
            "etcd",
            [
                self.bin("etcd"),
                "--name",
                "local",
                "--data-dir",
                str(self.folder / "etcd"),
                "--listen-client-urls",
                etcd_url,
                "--advertise-client-urls",
                etcd_url,
                "--listen-peer-urls",
                f"http://127.0.0.1:{peer_port}",
                "--initial-advertise-peer-urls",
                f"http://127.0.0.1:{peer_port}",
                "--initial-cluster",
                f"local=http://127.0.0.1:{peer_port}",
                "--unsafe-no-fsync",
                # A wide job of 400 KB pods writes about 1.4 GB of history per create and
                # restart (each pod created, bound, reported, deleted): a 2 GiB store filled
                # up between the API server's compactions and refused every write.
                "--quota-backend-bytes",
                str(8 * 1024**3),
                "--log-level",
                "warn",
            ],
            ready=lambda: http_ok(f"{etcd_url}/health"),
        )
        wait_for(lambda: http_ok(f"{etcd_url}/health"), 30, "etcd /health", etcd.problem)

        ctx = self.ssl_context(admin)
        api = self._spawn(
            "kube-apiserver",
            [
                self.bin("kube-apiserver"),
                "--etcd-servers",
                etcd_url,
                # History compacted every 2 minutes (default 5): freed pages are reused
                # sooner under the churn of wide pods, and a paged list's continue token
                # still lives 2-4 minutes.
                "--etcd-compaction-interval",
                "2m",
                "--bind-address",
                "127.0.0.1",
                "--advertise-address",
                "127.0.0.1",
                "--secure-port",
                str(api_port),
                "--cert-dir",
                str(self.folder / "apiserver-certs"),
                "--tls-cert-file",
                str(server_id.cert),
                "--tls-private-key-file",
                str(server_id.key),
                "--client-ca-file",
                str(pki.ca_cert),
                "--authorization-mode",
                "RBAC",
                # The API server presents a client certificate to admission webhooks, as a
                # cluster that authenticates itself to them does (the webhook refuses others).
                "--admission-control-config-file",
                str(admission_config),
                "--service-account-issuer",
                SA_ISSUER,
                "--api-audiences",
                SA_ISSUER,
                "--service-account-key-file",
                str(sa_pub),
                "--service-account-signing-key-file",
                str(sa_key),
                "--service-cluster-ip-range",
                "10.96.0.0/16",
                "--allow-privileged=true",
                "--endpoint-reconciler-type",
                "none",
                "--profiling=false",
                "--enable-priority-and-fairness=false",
                *self.gates(),
                *(["--runtime-config", GANG_RUNTIME_CONFIG] if self.gang_scheduling else []),
                "--kubelet-client-certificate",
                str(kubelet_client.cert),
                "--kubelet-client-key",
                str(kubelet_client.key),
                "--kubelet-certificate-authority",
                str(pki.ca_cert),
                # Nodes advertise their loopback address as InternalIP; their Hostname does not resolve.
                "--kubelet-preferred-address-types",
                "InternalIP",
                "--v",
                "1",
            ],
            ready=lambda: http_ok(f"{self.server}/readyz", ctx),
        )
        wait_for(
            lambda: http_ok(f"{self.server}/readyz", ctx),
            timeout,
            "kube-apiserver /readyz",
            api.problem,
        )

        # Endpoint controllers are off: they refuse the agent's loopback pod IPs and only add noise.
        cm_proc = self._spawn(
            "kube-controller-manager",
            [
                self.bin("kube-controller-manager"),
                "--kubeconfig",
                str(cm_kc),
                "--authentication-kubeconfig",
                str(cm_kc),
                "--authorization-kubeconfig",
                str(cm_kc),
                "--bind-address",
                "127.0.0.1",
                "--secure-port",
                str(cm_port),
                "--service-account-private-key-file",
                str(sa_key),
                "--root-ca-file",
                str(pki.ca_cert),
                "--use-service-account-credentials=true",
                "--leader-elect=false",
                "--controllers",
                "*,-endpoint,-endpointslice,-endpointslicemirroring",
                "--concurrent-gc-syncs",
                "5",
                *self.qps(),
                *self.node_grace(),
                *self.gates(),
                "--v",
                "1",
            ],
        )
        sched_proc = self._spawn(
            "kube-scheduler",
            [
                self.bin("kube-scheduler"),
                "--kubeconfig",
                str(sched_kc),
                "--authentication-kubeconfig",
                str(sched_kc),
                "--authorization-kubeconfig",
                str(sched_kc),
                "--bind-address",
                "127.0.0.1",
                "--secure-port",
                str(sched_port),
                "--leader-elect=false",
                *self.qps(),
                *self.gates(),
                "--v",
                "1",
            ],
        )
        insecure = ssl.create_default_context()
        insecure.check_hostname = False
        insecure.verify_mode = ssl.CERT_NONE
        wait_for(
            lambda: http_ok(f"https://127.0.0.1:{cm_port}/healthz", insecure),
            timeout,
            "kube-controller-manager /healthz",
            cm_proc.problem,
        )
        wait_for(
            lambda: http_ok(f"https://127.0.0.1:{sched_port}/healthz", insecure),
            timeout,
            "kube-scheduler /healthz",
            sched_proc.problem,
        )
        # The default namespace's ServiceAccount marks the controllers as working.
        wait_for(
            lambda: (
                self.kubectl("get", "serviceaccount", "default", "-n", "default").returncode == 0
            ),
            timeout,
            "the default ServiceAccount",
            cm_proc.problem,
        )

    def ssl_context(self, ident: Identity | None = None) -> ssl.SSLContext:
        """A TLS context that trusts the local CA and presents the admin certificate."""
        ident = ident or Identity(self.pki.folder / "admin.crt", self.pki.folder / "admin.key")
        ctx = ssl.create_default_context(cafile=str(self.pki.ca_cert))
        ctx.load_cert_chain(str(ident.cert), str(ident.key))
        return ctx

    def _write_kubeconfig(self, path: Path, user: str, ident: Identity) -> Path:
        cfg = kubeconfig(self.server, self.pki.ca_cert, user, ident.cert, ident.key)
        path.write_text(yaml.safe_dump(cfg))
        return path

    def problems(self) -> list[str]:
        """Messages for every component that has died."""
        return [p for c in self.components if (p := c.problem())]

    def kubectl(
        self,
        *args: str,
        input: str | None = None,
        kubeconfig_path: Path | None = None,
        timeout: float = 60,
    ) -> subprocess.CompletedProcess[str]:
        """Run the built kubectl against this cluster; never raises on a non-zero exit."""
        assert self.bins is not None
        cfg = kubeconfig_path or self.admin_kubeconfig
        return subprocess.run(
            [self.bin("kubectl"), "--kubeconfig", str(cfg), *args],
            capture_output=True,
            text=True,
            input=input,
            timeout=timeout,
        )

    def token_kubeconfig(
        self, namespace: str, service_account: str, path: Path, duration: str = "24h"
    ) -> Path:
        """A kubeconfig that authenticates as a ServiceAccount through a bound token."""
        res = self.kubectl(
            "create", "token", service_account, "-n", namespace, "--duration", duration
        )
        if res.returncode != 0:
            raise ClusterError(
                f"kubectl create token {namespace}/{service_account}: {res.stderr.strip()}"
            )
        cfg = kubeconfig(
            self.server,
            self.pki.ca_cert,
            f"{namespace}-{service_account}",
            token=res.stdout.strip(),
        )
        path.write_text(yaml.safe_dump(cfg))
        return path

    def stop(self, grace: float = 10.0) -> None:
        """Stop every component (and recorded extra processes), newest first, by process group."""
        pids = self._pids()
        own = {c.proc.pid for c in self.components}
        extra = [int(p) for n, p in pids.items() if int(p) not in own]
        for pid in extra:
            terminate_group(pid, grace)
        for comp in reversed(self.components):
            terminate_group(comp.proc.pid, grace)
            with contextlib.suppress(Exception):
                comp.proc.wait(timeout=1)
        self.components.clear()
        state = self.folder / STATE_FILE
        if state.exists():
            state.unlink()


def stop_folder(folder: Path, grace: float = 10.0) -> list[str]:
    """Stop whatever a state file in ``folder`` records; returns the names stopped."""
    state = folder / STATE_FILE
    if not state.exists():
        return []
    pids = json.loads(state.read_text()).get("pids", {})
    order = [
        "supervisor",
        "node-agent",
        "kube-scheduler",
        "kube-controller-manager",
        "kube-apiserver",
        "etcd",
    ]
    names = sorted(pids, key=lambda n: order.index(n) if n in order else -1)
    stopped = []
    for name in names:
        pid = int(pids[name])
        if pid_alive(pid):
            terminate_group(pid, grace)
            stopped.append(name)
    state.unlink()
    return stopped
