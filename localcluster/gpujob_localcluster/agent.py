"""The node agent's loop: pod events in; pods started, probed, restarted and stopped.

After every change to a pod, :meth:`NodeAgent._advance` moves it on: the next init
container (:mod:`initorder`), the regular containers once initialized, the sidecars' stop
once the regular containers are done, and the pod's end once nothing runs.

:class:`NodeAgent` is what the ``nodeagent`` command runs. One thread watches the pods
(relisting after every broken watch), one heartbeats the nodes (:mod:`nodes`), one waits
on each container attempt and one runs each probe; they all put events on one queue, and
only the main loop acts on them, so the pods' records (:mod:`podrun`) change in one
thread. It composes the pieces that do the work: the pod's files (:mod:`podfiles`), the
container runtime (:mod:`containers`), status and Events (:mod:`podstatus`), and the
kubelet API for ``kubectl logs`` (:mod:`kubeletapi`).
"""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import json
import logging
import os
import queue
import random
import signal
import tempfile
import threading
import time
from pathlib import Path
from typing import IO, Any

from kubernetes import client
from kubernetes.client.rest import ApiException

from gpujob_localcluster import (
    containers,
    dra,
    images,
    initorder,
    podenv,
    podfiles,
    podstatus,
    probes,
    volumes,
)
from gpujob_localcluster.kubeletapi import BadRequest, KubeletServer, LogRequest, LogSource
from gpujob_localcluster.nodes import Nodes, NodeShape, node_addresses
from gpujob_localcluster.podrun import ContainerRun, PodRun, now_iso
from gpujob_localcluster.podstatus import PodReporter
from gpujob_localcluster.podwatch import watch_pods
from gpujob_localcluster.processes import become_subreaper, descendants
from gpujob_localcluster.restarts import (
    RESTART_ALL,
    backoff_message,
    container_restart,
    rule_action,
)

log = logging.getLogger("gpujob.nodeagent")

MOUNT_RETRY_SECONDS = 2.0


POD_NETWORKS = Path(tempfile.gettempdir()) / "gpujob-pod-networks"
"""Lock files, one per second octet of 127/8 an agent hands its pods' addresses from."""


def claim_pod_network() -> tuple[int, IO[bytes]]:
    """A second octet (1-200) no other live agent on this machine holds, and the open lock
    file that holds it: the lock goes with the process, however it ends. Tried in a random
    order, so that few tries are needed with many clusters up."""
    POD_NETWORKS.mkdir(parents=True, exist_ok=True)
    for first in random.sample(range(1, 201), 200):
        f = open(POD_NETWORKS / f"{first}.lock", "ab")  # noqa: SIM115 - kept open: the claim
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.close()
            continue
        return first, f
    raise RuntimeError(f"every pod network 127.1-200.x.x is held by another agent ({POD_NETWORKS})")


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
        node_ips: list[str] | None = None,
    ) -> None:
        self.core = client.CoreV1Api(api)
        self.resource = client.ResourceV1Api(api)
        self.state_dir = state_dir
        self.pods_dir = state_dir / "pods"
        self.pods_dir.mkdir(parents=True, exist_ok=True)
        self.events: queue.Queue[tuple[str, Any]] = queue.Queue()
        self.runs: dict[str, PodRun] = {}
        self.waiting_mounts: dict[str, tuple[dict[str, Any], float]] = {}
        """Pods whose volumes could not be filled yet: uid -> (pod, retry at)."""
        self.stopping = threading.Event()
        # A second octet of its own keeps two clusters on one machine apart (their pods would
        # otherwise bind the same address and metrics port).
        first, self._pod_network = claim_pod_network()
        self._ips = (
            f"127.{a}.{b}.{c}"
            for a, b, c in itertools.product(range(first, 255), range(256), range(1, 255))
        )
        become_subreaper()
        self._last_census = 0.0
        api_host, api_port = containers.api_endpoint(api.configuration.host)
        self.runtime = containers.ContainerRuntime(
            containers.base_env(api_host, api_port),
            images.load_table() if image_table is None else image_table,
            self.events,
            isolate,
        )
        self.reporter = PodReporter(self.core)
        if node_ips is None:
            node_ips = node_addresses(len(node_names), random.randint(0, 254))
        if len(node_ips) != len(node_names):
            raise ValueError(f"{len(node_ips)} node addresses for {len(node_names)} nodes")
        addresses = dict(zip(node_names, node_ips, strict=True))
        # One kubelet API per node, on the node's address: the API server dials InternalIP.
        self.kubelets: dict[str, KubeletServer] = {}
        if kubelet_tls is not None:
            cert, key, ca = kubelet_tls
            for name, ip in addresses.items():
                self.kubelets[name] = KubeletServer(self.resolve_log, cert, key, ca, ip).start()
        ports = {name: server.port for name, server in self.kubelets.items()}
        self.nodes = Nodes(api, node_names, shape, addresses, ports)

    # -- pods ----------------------------------------------------------------------
    def watch_loop(self) -> None:
        """Feed pod events into the queue, relisting after every broken watch."""
        watch_pods(self.core, self.events, self.stopping)

    def run(self) -> None:
        """The agent's main loop; returns when ``stop()`` is called."""
        threading.Thread(target=self.watch_loop, name="pod-watch", daemon=True).start()
        threading.Thread(
            target=self.nodes.heartbeat_loop, args=(self.stopping,), name="heartbeat", daemon=True
        ).start()
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
                podfiles.refresh_tokens(self.core, self.runs.values())
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
                containers.kill_pod(run, signal.SIGKILL)
                containers.kill_family(run)
                podfiles.refresh_hosts(self.runs.values(), run.group())
        elif kind == "exit":
            uid, cname, attempt, code = payload
            self.on_exit(uid, cname, attempt, code)
        elif kind == "probe":
            self.on_probe(*payload)
        elif kind == "resync":
            for uid in [u for u in self.runs if u not in payload]:
                run = self.runs.pop(uid)
                containers.kill_pod(run, signal.SIGKILL)
                containers.kill_family(run)
            for uid in [u for u in self.waiting_mounts if u not in payload]:
                self.waiting_mounts.pop(uid)

    def on_pod(self, pod: dict[str, Any]) -> None:
        spec, meta, status = pod.get("spec", {}), pod["metadata"], pod.get("status", {})
        if spec.get("nodeName") not in self.nodes.names:
            return
        uid = meta["uid"]
        run = self.runs.get(uid)
        deleting = bool(meta.get("deletionTimestamp"))
        if run is not None:
            run.pod["metadata"] = meta
            if not deleting and not run.finished:
                podfiles.refresh_downward(run)  # free unless labels/annotations changed
            if deleting and run.kill_at is None:
                grace = meta.get(
                    "deletionGracePeriodSeconds", spec.get("terminationGracePeriodSeconds", 30)
                )
                log.info("pod %s is being deleted; SIGTERM, SIGKILL after %ss", run.key, grace)
                run.kill_at = time.monotonic() + float(grace or 0)
                for c in run.containers:
                    c.restart_at = None
                containers.kill_pod(run, signal.SIGTERM)
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
            self.reporter.patch_status(
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
            run.devices = self._prepare_claims(pod)
            podfiles.prepare_volumes(self.core, self.reporter, run)
        except (dra.ClaimNotReady, volumes.VolumeNotReady, ApiException, OSError, ValueError) as e:
            # The kubelet keeps the pod in ContainerCreating and says why in Events.
            first = meta["uid"] not in self.waiting_mounts
            self.waiting_mounts[meta["uid"]] = (pod, time.monotonic() + MOUNT_RETRY_SECONDS)
            if first:
                reason = getattr(e, "reason", None) or str(e)
                log.info("pod %s waits for its volumes or claims: %s", run.key, reason)
                if isinstance(e, dra.ClaimNotReady):
                    self.reporter.event(run, "Warning", "FailedPrepareDynamicResources", reason)
                else:
                    self.reporter.event(
                        run, "Warning", "FailedMount", f"MountVolume.SetUp failed: {reason}"
                    )
            return
        self.waiting_mounts.pop(meta["uid"], None)
        run.host_ip = self.nodes.addresses[pod["spec"]["nodeName"]]
        # A hostNetwork pod has its node's address, shared with the node's other such pods.
        ip = run.host_ip if pod["spec"].get("hostNetwork") else next(self._ips)
        run.ip = ip
        pod.setdefault("status", {}).update(
            {
                "podIP": ip,
                "podIPs": [{"ip": ip}],
                "hostIP": run.host_ip,
                "hostIPs": [{"ip": run.host_ip}],
            }
        )
        self.runs[run.uid] = run
        podfiles.refresh_hosts(self.runs.values(), run.group(), also=run)
        run.started_at = now_iso()
        for c in pod["spec"].get("initContainers") or []:
            kind = "sidecar" if c.get("restartPolicy") == "Always" else "init"
            run.containers.append(
                ContainerRun(c["name"], c, folder / f"{c['name']}.log", kind=kind)
            )
        for c in pod["spec"].get("containers", []):
            run.containers.append(ContainerRun(c["name"], c, folder / f"{c['name']}.log"))
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
        self._advance(run)

    def _prepare_claims(self, pod: dict[str, Any]) -> dict[str, list[str]]:
        """The DRA devices of each container (what NodePrepareResources would hand over)."""
        if not pod.get("spec", {}).get("resourceClaims"):
            return {}
        names = dra.claim_names(pod)
        claims: dict[str, dict[str, Any]] = {}
        for pod_name, claim_name in names.items():
            try:
                resp: Any = self.resource.read_namespaced_resource_claim(
                    claim_name, pod["metadata"]["namespace"], _preload_content=False
                )
            except ApiException as e:
                if e.status == 404:
                    raise dra.ClaimNotReady(f"ResourceClaim {claim_name} not found") from e
                raise
            claims[pod_name] = json.loads(resp.data)
        return dra.container_devices(pod, claims)

    def _retry_mounts(self) -> None:
        now = time.monotonic()
        for uid, (pod, at) in list(self.waiting_mounts.items()):
            if now >= at and uid not in self.runs:
                self.start_pod(pod)

    def _start_container(self, run: PodRun, crun: ContainerRun) -> None:
        """Start one attempt of a container (the first, or a restart) and its probes."""
        if crun.running:
            log.warning("pod %s container %s is running; not started twice", run.key, crun.name)
            return
        crun.attempt += 1
        crun.proc, crun.cleared = None, False
        crun.exit_code, crun.reason, crun.message, crun.finished_at = None, "", "", ""
        crun.waiting, crun.restart_at, crun.kill_at = None, None, None
        crun.family, crun.ended = set(), False
        crun.started_at = now_iso()
        crun.probe_states = {p.kind: probes.ProbeState(p) for p in probes.probes_of(crun.spec)}
        try:
            self.runtime.spawn(run, crun.spec, crun, podfiles.env_lookup(self.core, run.namespace))
        except Exception as e:
            crun.exit_code, crun.reason, crun.message = 128, "StartError", str(e)
            crun.finished_at = now_iso()
            log.warning("pod %s container %s could not start: %s", run.key, crun.name, e)
            self.reporter.event(run, "Warning", "Failed", f"Error: {e}", crun.name)
            self.events.put(("exit", (run.uid, crun.name, crun.attempt, 128)))
            return
        for probe in crun.probe_states.values():
            threading.Thread(
                target=self._probe_loop,
                args=(run, crun, crun.attempt, probe.probe),
                name=f"probe-{run.name}-{crun.name}-{probe.probe.kind}",
                daemon=True,
            ).start()

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
                ok, message = probes.check(probe, run.ip, crun.spec, self.runtime.exec_runner(crun))
                self.events.put(("probe", (run.uid, crun.name, attempt, probe.kind, ok, message)))
            if self.stopping.wait(probe.period):
                return

    def on_probe(self, uid: str, cname: str, attempt: int, kind: str, ok: bool, msg: str) -> None:
        run = self.runs.get(uid)
        if run is None or run.deleting:
            return
        crun = run.container(cname)
        if crun is None:
            return
        state = crun.probe_states.get(kind)
        if crun.attempt != attempt or not crun.running or state is None:
            return
        if not ok:
            self.reporter.event(
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
            self.reporter.event(
                run,
                "Normal",
                "Killing",
                f"Container {cname} failed {kind} probe, will be restarted",
                cname,
            )
            crun.kill_at = time.monotonic() + grace
            containers.kill_container(crun, signal.SIGTERM)
        # A sidecar whose startupProbe passed lets the next init container start.
        self._advance(run)

    # -- exits and restarts ----------------------------------------------------------
    def on_exit(self, uid: str, cname: str, attempt: int, code: int) -> None:
        run = self.runs.get(uid)
        if run is None:
            return
        crun = run.container(cname)
        if crun is None or crun.attempt != attempt or crun.cleared:
            return  # an attempt a restart of every container already took in
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
        containers.kill_leftovers(crun)
        if run.finished:
            return
        crun.ended = True
        if run.restarting_all:
            if not run.alive():
                self._clear_all(run)
            return
        # A stop the pod made itself (its sidecars wound down, a failed init ends it) is no
        # exit for the rules: the kubelet evaluates none on a pod it is terminating.
        if (
            not run.deleting
            and not self.stopping.is_set()
            and not run.winding_down
            and rule_action(crun.spec, crun.exit_code or 0) == RESTART_ALL
        ):
            self._restart_all(run, crun)
            return
        if not run.deleting and not self.stopping.is_set() and self._wants_restart(run, crun):
            wait = crun.backoff.wait_after(time.monotonic())
            crun.restart_at = time.monotonic() + wait
            if wait > 0:
                message = backoff_message(wait, cname, run.name, run.namespace, run.uid)
                crun.waiting = ("CrashLoopBackOff", message)
                self.reporter.event(
                    run, "Warning", "BackOff", "Back-off restarting failed container", cname
                )
                self.reporter.publish(run)
            return
        self._advance(run)

    @staticmethod
    def _wants_restart(run: PodRun, crun: ContainerRun) -> bool:
        """Whether an attempt that just ended is started again, as the kubelet decides.

        A plain init container is retried only when it failed and the pod may restart; a
        sidecar always, until the pod winds down; a regular container by the pod's policy.
        """
        code = crun.exit_code or 0
        if crun.kind == "init":
            return code != 0 and run.policy != "Never"
        if crun.kind == "sidecar":
            return not run.winding_down
        return container_restart(crun.spec, run.policy, code)

    def _restart_all(self, run: PodRun, trigger: ContainerRun) -> None:
        """``RestartAllContainers``: kill every container of the pod at once (no grace
        period, no preStop hook, as the kubelet does), then start them all again in place:
        the same pod, UID, address, volumes and devices."""
        log.info("pod %s: container %s exited %s: restarting every container in place",
                 run.key, trigger.name, trigger.exit_code)  # fmt: skip
        run.restarting_all = True
        # The kubelet keeps Initialized True (and the pod Running) only if it was already.
        run.in_place = run.initialized or run.in_place
        run.restart_all_trigger = trigger.name
        run.winding_down, run.sidecar_deadline = False, None
        for c in run.containers:
            c.restart_at, c.waiting, c.kill_at = None, None, None
        alive = run.alive()
        for c in alive:
            containers.kill_container(c, signal.SIGKILL)
        self.reporter.event(
            run,
            "Normal",
            "Killing",
            f"Container {trigger.name} exited with {trigger.exit_code}: restarting all "
            "containers in place (restartPolicyRules RestartAllContainers)",
            trigger.name,
        )
        self.reporter.publish(run)
        if not alive:
            self._clear_all(run)

    def _clear_all(self, run: PodRun) -> None:
        """Every container is gone: keep each one's exit as its last state, count a restart
        for each that ran, and start the pod over from its first init container (after the
        trigger's crash-loop back-off)."""
        now = time.monotonic()
        for c in run.containers:
            if c.attempt > 0 and not c.cleared:
                c.last_state = {"terminated": podstatus.terminated(c)}
                c.restart_count += 1
                with contextlib.suppress(OSError):
                    os.replace(c.log_path, c.previous_log)
            c.cleared, c.proc, c.ended = True, None, False
            c.exit_code, c.reason, c.message, c.finished_at = None, "", "", ""
            c.started_at, c.probe_states = "", {}
        run.initialized = run.init_failed = run.winding_down = False
        run.restarting_all = False
        # One back-off for the pod's restarts, whichever container fired them.
        wait = run.restart_all_backoff.wait_after(now)
        run.restart_all_backoff.restarted(now + wait)
        if wait > 0 and not run.deleting and not self.stopping.is_set():
            run.restart_all_at = now + wait
            trigger = run.container(run.restart_all_trigger)
            if trigger is not None:
                message = backoff_message(wait, trigger.name, run.name, run.namespace, run.uid)
                trigger.waiting = ("CrashLoopBackOff", message)
            self.reporter.publish(run)
            return
        self._advance(run)

    def _advance(self, run: PodRun) -> None:
        """Move the pod on after a change: the next init container, the regular containers
        once initialized, the sidecars' stop once the regular containers are done, and the
        pod's end once nothing runs any more. Publishes the pod's status."""
        if run.finished:
            return
        if (run.restarting_all or run.restart_all_at is not None) and not run.deleting:
            self.reporter.publish(run)  # nothing starts until every container is gone
            return
        if not run.deleting and not self.stopping.is_set() and not run.winding_down:
            step = initorder.next_step(podstatus.init_fates(run))
            while step.start is not None:
                crun = run.container(step.start)
                assert crun is not None
                self._start_container(run, crun)
                step = initorder.next_step(podstatus.init_fates(run))
            if step.failed:
                log.info("pod %s: an init container failed; the pod fails", run.key)
                run.init_failed = run.winding_down = True
                run.in_place = False
            elif step.done and not run.initialized:
                run.initialized = True
                for crun in run.of_kind("regular"):
                    self._start_container(run, crun)
                run.in_place = False
        regulars = run.of_kind("regular")
        # Done: every regular container's exit taken in, and none of them to be restarted.
        if run.initialized and all(c.ended and c.restart_at is None for c in regulars):
            run.winding_down = True
        if run.winding_down:
            self._stop_sidecars(run)
        if run.alive() or any(c.restart_at is not None for c in run.containers):
            self.reporter.publish(run)
            return
        run.finished = True
        containers.kill_family(run)
        self.reporter.publish(run)
        if run.deleting:
            self._finalize_delete(run)

    def _stop_sidecars(self, run: PodRun) -> None:
        """SIGTERM the sidecars one at a time, last first (the next once the one before has
        exited), within the pod's grace period; pending restarts are dropped."""
        for c in run.of_kind("sidecar"):
            c.restart_at, c.waiting = None, None
        running = [c for c in run.of_kind("sidecar") if c.running]
        if not running:
            return
        if run.sidecar_deadline is None:
            grace = float(run.pod["spec"].get("terminationGracePeriodSeconds", 30))
            run.sidecar_deadline = time.monotonic() + grace
        last = running[-1]
        if last.kill_at is None:
            log.info("pod %s: stopping sidecar %s", run.key, last.name)
            last.kill_at = run.sidecar_deadline
            containers.kill_container(last, signal.SIGTERM)

    def _restart_due(self) -> None:
        now = time.monotonic()
        for run in list(self.runs.values()):
            if run.restart_all_at is not None and now >= run.restart_all_at:
                run.restart_all_at = None
                if not run.deleting:
                    self._advance(run)
            for crun in run.containers:
                if crun.restart_at is None or now < crun.restart_at or run.deleting:
                    continue
                crun.last_state = {"terminated": podstatus.terminated(crun)}
                crun.restart_count += 1
                crun.backoff.restarted(now)
                with contextlib.suppress(OSError):
                    os.replace(crun.log_path, crun.previous_log)
                log.info("pod %s container %s: restart %d", run.key, crun.name, crun.restart_count)
                self._start_container(run, crun)
                self._advance(run)

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
        if crun.cleared and crun.previous_log.exists():
            # Restarting in place, not started again yet: its last attempt is what it has.
            return LogSource(crun.previous_log, lambda: False)
        attempt = crun.attempt
        return LogSource(crun.log_path, lambda: crun.attempt == attempt and crun.running)

    # -- stopping ----------------------------------------------------------------------
    def _census(self) -> None:
        """Once a second: note each container's processes and reap orphans that died under us."""
        now = time.monotonic()
        if now - self._last_census < 1.0:
            return
        self._last_census = now
        for run in list(self.runs.values()):
            if run.unsent is not None:
                self.reporter.patch_status(run.pod, run.unsent, run)
        containers.track(self.runs.values())

    def _enforce_grace(self) -> None:
        now = time.monotonic()
        for run in list(self.runs.values()):
            if run.kill_at is not None and now >= run.kill_at and run.alive():
                log.info("pod %s grace period over; SIGKILL", run.key)
                containers.kill_pod(run, signal.SIGKILL)
                run.kill_at = now + 3600  # once
            for c in run.containers:
                if c.kill_at is not None and now >= c.kill_at and c.running:
                    log.info("pod %s container %s grace period over; SIGKILL", run.key, c.name)
                    containers.kill_container(c, signal.SIGKILL)
                    c.kill_at = None

    def _finalize_delete(self, run: PodRun) -> None:
        self.runs.pop(run.uid, None)
        podfiles.refresh_hosts(self.runs.values(), run.group())
        self._force_delete(run.namespace, run.name, run.uid)

    def _force_delete(self, namespace: str, name: str, uid: str) -> None:
        body = client.V1DeleteOptions(
            grace_period_seconds=0, preconditions=client.V1Preconditions(uid=uid)
        )
        with contextlib.suppress(ApiException):
            self.core.delete_namespaced_pod(name, namespace, body=body)

    def stop(self) -> None:
        self.stopping.set()

    def shutdown(self) -> None:
        """Stop every pod process: SIGTERM, a short grace, then SIGKILL."""
        for server in self.kubelets.values():
            server.stop()
        for run in self.runs.values():
            containers.kill_pod(run, signal.SIGTERM)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and any(r.alive() for r in self.runs.values()):
            for run in self.runs.values():
                for c in run.alive():
                    assert c.proc is not None
                    if c.proc.poll() is not None:
                        c.exit_code = c.proc.returncode
            time.sleep(0.05)
        for run in self.runs.values():
            containers.kill_pod(run, signal.SIGKILL)
            containers.kill_family(run)
        for pid in descendants(os.getpid()):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
