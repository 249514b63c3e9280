"""The hollow kubelet: many nodes, pods Running and Ready without a container.

``python -m gpujob_localcluster.hollow.kubelet --nodes 2048 --gpus-per-node 8 ...``

As Kubemark's hollow nodes: the nodes are registered with the real API server, their Leases
renewed (the node lifecycle controller's heartbeat), and the real scheduler binds pods to
them. For each bound pod this process takes an address (``127.<x>.<y>.<z>``), reports the
pod Running and Ready with its containers started, and hands its ranks to an endpoint
process (:mod:`endpoints`) that answers ``/metrics`` and the evidence endpoint where a real
rank would. What the pod's trainer container says in its env decides what the ranks
answer: ``PET_NPROC_PER_NODE`` ranks from ``GPUJOB_METRICS_PORT``, ``PET_NODE_RANK``,
``GPUJOB_TOTAL_STEPS`` (the pod Succeeds once its ranks reach it) and, hollow only,
``GPUJOB_HOLLOW_STEP_SECONDS`` (1 s unless set). A deleted pod is confirmed at once (grace 0).
Faults (a failed, stalled, silent or straggling rank) come from the fault file
(:mod:`faults`), polled twice a second.

The nodes declare the in-place restart feature (``RestartAllContainersOnContainerExits``) and
restart a pod in place as the kubelet does for a trainer whose ``restartPolicyRules`` say
``RestartAllContainers``: its containers' restart count goes up, the last termination is the
exit (1 for a failed rank, 87 when the operator's move of the pod to the next attempt stops
the run), and the ranks answer again only once the operator releases the attempt
(``gpujob.dev/released-attempt``), as the supervisor waits for it.

The state kept per pod is a projection (names, address, ranks, clock), never its body.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import itertools
import logging
import queue
import random
import signal
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubernetes import client, config
from kubernetes.client.rest import ApiException

from gpujob_localcluster import restarts
from gpujob_localcluster.hollow import faults as faultfile
from gpujob_localcluster.hollow.endpoints import Add, EndpointPool, Fault, Remove
from gpujob_localcluster.nodes import DECLARED_FEATURES, Nodes, NodeShape
from gpujob_localcluster.podrun import now_iso
from gpujob_localcluster.podwatch import watch_pods
from gpujob_trainer import contract

log = logging.getLogger("gpujob.hollow")

ROLE_LABEL = "gpujob.dev/hollow-node"
"""The label of hollow nodes (real local nodes carry ``gpujob.dev/local-node``)."""
TAINT = {"key": "gpujob.dev/hollow", "value": "true", "effect": "NoSchedule"}
"""Hollow nodes' taint: only a pod that tolerates it (a hollow job) lands there, so tests and
demos on the same cluster keep their pods on nodes that run them."""
TOLERATION = {"key": TAINT["key"], "operator": "Exists", "effect": TAINT["effect"]}
JOB_LABEL = "gpujob.dev/job-name"
ATTEMPT_LABEL = contract.LABEL_ATTEMPT
ENV_STEP_SECONDS = "GPUJOB_HOLLOW_STEP_SECONDS"
FAULTS_FILE = "faults.json"
LEASE_SECONDS = 10.0


def hollow_addresses(count: int, octet: int) -> list[str]:
    """The nodes' InternalIPs, ``127.254.<octet + i // 254>.<i % 254 + 1>``: apart from local
    nodes (127.255.*) and from the pods' addresses."""
    if count <= 0 or octet + (count - 1) // 254 > 255:
        raise ValueError(f"no room for {count} hollow node addresses from 127.254.{octet}.1")
    return [f"127.254.{octet + i // 254}.{i % 254 + 1}" for i in range(count)]


@dataclass
class HollowPod:
    """What the hollow kubelet keeps of a pod: its projection."""

    uid: str
    namespace: str
    name: str
    node: str
    job: str
    attempt: str
    node_rank: int
    nproc: int
    ip: str
    started: float
    step_seconds: float
    total_steps: int
    port: int = contract.DEFAULT_METRICS_PORT
    containers: tuple[tuple[str, str], ...] = ()
    """(name, image) of each container, for the status of its end."""
    done: bool = False
    fault: tuple[str | None, int | None] = (None, None)
    rules: tuple[dict[str, Any], ...] = ()
    """The trainer container's ``restartPolicyRules`` (in-place restarts)."""
    restarts: int = 0
    """How often its containers restarted in place."""
    last: dict[str, Any] | None = None
    """The last termination (exit code, reason, message, times) of a restart in place."""
    base: int = 0
    """``gpujob.dev/restarts-base``: the restart count the attempt's run begins at."""
    released: str | None = None
    hold: bool = False
    waiting: bool = False
    """Restarted in place (or created held): its ranks wait for the attempt's release."""
    ran: str | None = None
    """The attempt its ranks last ran: a supervisor runs an attempt once, so one that failed
    in place waits for the next attempt's release, not its own again."""

    def restarts_all(self, code: int) -> bool:
        """Whether an exit with ``code`` restarts every container of the pod in place."""
        return restarts.rule_action({"restartPolicyRules": list(self.rules)}, code) == (
            restarts.RESTART_ALL
        )

    def held(self) -> bool:
        """Whether its run must wait for the operator's release of its attempt."""
        return (self.base > 0 or self.hold) and self.released != self.attempt

    def may_resume(self) -> bool:
        """Whether its waiting supervisor starts the run: an attempt it has not run yet is
        released (one whose run failed waits for the operator's move first)."""
        return self.waiting and not self.done and self.released == self.attempt != self.ran

    def restart_in_place(self, code: int, message: str, ts: str) -> dict[str, Any]:
        """Every container exited with ``code`` and started again: counted, the exit kept
        as the last state, the ranks waiting for a release. The status patch that says so."""
        self.restarts += 1
        reason = "Completed" if code == 0 else "Error"
        self.last = {"exitCode": code, "reason": reason, "message": message, "finishedAt": ts}
        self.waiting = True
        self.fault = (None, None)
        return restarted_status(self, ts)


def _env(pod: dict[str, Any]) -> dict[str, str]:
    """The literal env of the pod's trainer container."""
    return {e["name"]: e.get("value", "") for e in _trainer(pod).get("env") or () if "value" in e}


def _int(text: str | None, default: int) -> int:
    try:
        return int(text) if text else default
    except ValueError:
        return default


def _float(text: str | None, default: float) -> float:
    try:
        return float(text) if text else default
    except ValueError:
        return default


def _parse_time(text: str | None) -> float | None:
    if not text:
        return None
    with contextlib.suppress(ValueError):
        return dt.datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.UTC).timestamp()
    return None


def _trainer(pod: dict[str, Any]) -> dict[str, Any]:
    """The trainer container: the one that sets the rank count, else the first."""
    containers = pod.get("spec", {}).get("containers") or [{}]
    for c in containers:
        if any(e.get("name") == "PET_NPROC_PER_NODE" for e in c.get("env") or ()):
            return dict(c)
    return dict(containers[0])


def marks(pod: dict[str, Any]) -> tuple[str, int, str | None, bool]:
    """The operator's marks on a pod: its attempt label, the restart count its run begins
    at, the attempt released, and whether it was created held (pure)."""
    meta = pod["metadata"]
    labels, notes = meta.get("labels") or {}, meta.get("annotations") or {}
    return (
        labels.get(ATTEMPT_LABEL, "0"),
        _int(notes.get(contract.ANNOTATION_RESTARTS_BASE), 0),
        notes.get(contract.ANNOTATION_RELEASED),
        notes.get(contract.ANNOTATION_HOLD) == "true",
    )


def project(pod: dict[str, Any], ip: str) -> HollowPod:
    """The projection of a bound pod, from its body (pure)."""
    meta, spec, status = pod["metadata"], pod.get("spec", {}), pod.get("status") or {}
    env = _env(pod)
    labels = meta.get("labels") or {}
    attempt, base, released, hold = marks(pod)
    trainer = _trainer(pod)
    main: dict[str, Any] = next(
        (s for s in status.get("containerStatuses") or () if s.get("name") == trainer.get("name")),
        {},
    )
    return HollowPod(
        uid=meta["uid"],
        namespace=meta["namespace"],
        name=meta["name"],
        node=spec.get("nodeName", ""),
        job=labels.get(JOB_LABEL, meta["name"]),
        attempt=attempt,
        node_rank=_int(env.get("PET_NODE_RANK") or labels.get("gpujob.dev/node-rank"), 0),
        nproc=max(1, _int(env.get("PET_NPROC_PER_NODE"), 1)),
        ip=ip,
        started=_parse_time(status.get("startTime")) or time.time(),
        step_seconds=max(0.01, _float(env.get(ENV_STEP_SECONDS), 1.0)),
        total_steps=max(1, _int(env.get(contract.ENV_TOTAL_STEPS), 1_000_000)),
        port=_int(env.get(contract.ENV_METRICS_PORT), contract.DEFAULT_METRICS_PORT),
        containers=tuple((c["name"], c.get("image", "")) for c in spec.get("containers") or ()),
        rules=tuple(trainer.get("restartPolicyRules") or ()),
        restarts=_int(str(main.get("restartCount", "")), 0),
        last=(main.get("lastState") or {}).get("terminated"),
        base=base,
        released=released,
        hold=hold,
    )


def running_status(pod: dict[str, Any], ip: str, host_ip: str, started: str) -> dict[str, Any]:
    """The status patch of a pod whose containers all run and are ready (pure)."""
    spec = pod.get("spec", {})
    cond = [
        {"type": t, "status": "True", "lastTransitionTime": started}
        for t in (
            "PodReadyToStartContainers",
            "Initialized",
            "Ready",
            "ContainersReady",
            "PodScheduled",
        )
    ]
    return {
        "status": {
            "phase": "Running",
            "podIP": ip,
            "podIPs": [{"ip": ip}],
            "hostIP": host_ip,
            "hostIPs": [{"ip": host_ip}],
            "startTime": started,
            "conditions": cond,
            "initContainerStatuses": [
                _container(
                    c,
                    {
                        "terminated": {
                            "exitCode": 0,
                            "reason": "Completed",
                            "startedAt": started,
                            "finishedAt": started,
                        }
                    },
                    ready=True,
                )
                for c in spec.get("initContainers") or ()
            ],
            "containerStatuses": [
                _container(c, {"running": {"startedAt": started}}, ready=True)
                for c in spec.get("containers") or ()
            ],
        }
    }


def ended_status(hp: HollowPod, code: int, message: str) -> dict[str, Any]:
    """The status patch of a pod whose containers all exited with ``code`` (pure)."""
    ts = now_iso()
    phase = "Succeeded" if code == 0 else "Failed"
    reason = "Completed" if code == 0 else "Error"
    state = {
        "terminated": {"exitCode": code, "reason": reason, "message": message, "finishedAt": ts}
    }
    return {
        "status": {
            "phase": phase,
            "conditions": [
                {
                    "type": t,
                    "status": "False",
                    "reason": "PodCompleted" if code == 0 else "PodFailed",
                    "lastTransitionTime": ts,
                }
                for t in ("Ready", "ContainersReady")
            ],
            "containerStatuses": [
                _container({"name": n, "image": i}, state, False, hp.restarts)
                for n, i in hp.containers
            ],
        }
    }


def restarted_status(hp: HollowPod, started: str) -> dict[str, Any]:
    """The status patch of a pod whose containers all restarted in place: running again
    (the supervisor, waiting for its release or running), the restart counted, the exit
    that caused it as the last state (pure)."""
    last = {"lastState": {"terminated": hp.last}} if hp.last else {}
    running = {"running": {"startedAt": started}}
    return {
        "status": {
            "phase": "Running",
            "containerStatuses": [
                {**_container({"name": n, "image": i}, running, True, hp.restarts), **last}
                for n, i in hp.containers
            ],
        }
    }


def _container(
    c: dict[str, Any], state: dict[str, Any], ready: bool, restarts: int = 0
) -> dict[str, Any]:
    return {
        "name": c["name"],
        "image": c.get("image", ""),
        "imageID": "",
        "ready": ready,
        "started": "running" in state,
        "restartCount": restarts,
        "state": state,
    }


class HollowKubelet:
    """Registers hollow nodes, renews their Leases and drives the pods bound to them."""

    def __init__(
        self,
        api: client.ApiClient,
        names: list[str],
        shape: NodeShape,
        node_ips: list[str],
        state_dir: Path,
        endpoint_processes: int = 2,
        lease_seconds: float = LEASE_SECONDS,
    ) -> None:
        self.core = client.CoreV1Api(api)
        self.nodes = Nodes(
            api,
            names,
            shape,
            dict(zip(names, node_ips, strict=True)),
            {},
            ROLE_LABEL,
            DECLARED_FEATURES,
            (TAINT,),
        )
        self.node_set = set(names)
        self.state_dir = state_dir
        self.faults_path = state_dir / FAULTS_FILE
        self.lease_seconds = lease_seconds
        self.pool = EndpointPool(endpoint_processes)
        self.writes = ThreadPoolExecutor(8, thread_name_prefix="hollow-write")
        self.renewals = ThreadPoolExecutor(4, thread_name_prefix="hollow-lease")
        """The Leases' own threads: never queued behind a burst of pod deletions."""
        self._renewing: set[str] = set()
        self._renewing_lock = threading.Lock()
        self.lanes = [
            ThreadPoolExecutor(1, thread_name_prefix=f"hollow-status-{i}") for i in range(8)
        ]
        """A pod's status patches, in order (its Running, then its restart, never swapped)."""
        self.events: queue.Queue[tuple[str, Any]] = queue.Queue()
        self.pods: dict[str, HollowPod] = {}
        self.stopping = threading.Event()
        self.faults: list[faultfile.RankFault] = []
        self.bound: dict[str, str] = {}
        self._faults_mtime = 0.0
        first = random.randint(201, 250)
        self._ips = (
            f"127.{a}.{b}.{c}"
            for a, b, c in itertools.product(range(first, 254), range(256), range(1, 255))
        )

    # -- nodes -------------------------------------------------------------------------
    def register(self) -> None:
        list(self.writes.map(self.nodes.register_node, self.nodes.names))
        list(self.writes.map(self.nodes.renew_lease, self.nodes.names))
        log.info("registered %d hollow nodes", len(self.nodes.names))

    def lease_loop(self) -> None:
        """Renew every node's Lease each ``lease_seconds``, spread over the interval."""
        names = self.nodes.names
        while not self.stopping.is_set():
            began = time.monotonic()
            for i, name in enumerate(names):
                if self.stopping.is_set():
                    return
                self._renew(name)
                due = began + self.lease_seconds * (i + 1) / len(names)
                pause = due - time.monotonic()
                if pause > 0:
                    self.stopping.wait(pause)

    def _renew(self, name: str) -> None:
        """Renew a node's Lease unless its last renewal is still waiting for a thread (a
        backlog of stale renewals would only delay the fresh ones)."""
        with self._renewing_lock:
            if name in self._renewing:
                return
            self._renewing.add(name)

        def renew() -> None:
            try:
                self._quiet(self.nodes.renew_lease, name)
            finally:
                with self._renewing_lock:
                    self._renewing.discard(name)

        self.renewals.submit(renew)

    @staticmethod
    def _quiet(fn: Any, *args: Any) -> None:
        try:
            fn(*args)
        except Exception as e:  # an API hiccup: the next round retries
            log.warning("%s%s failed: %s", getattr(fn, "__name__", fn), args[:1], e)

    # -- pods --------------------------------------------------------------------------
    def watch_loop(self) -> None:
        """Feed pod events into the queue, relisting after every broken watch."""
        watch_pods(self.core, self.events, self.stopping, self._ours)

    def _ours(self, pod: dict[str, Any]) -> bool:
        return pod.get("spec", {}).get("nodeName") in self.node_set

    def run(self) -> None:
        threading.Thread(target=self.watch_loop, name="watch", daemon=True).start()
        threading.Thread(target=self.lease_loop, name="leases", daemon=True).start()
        next_tick = 0.0
        while not self.stopping.is_set():
            try:
                kind, payload = self.events.get(timeout=0.5)
            except queue.Empty:
                kind, payload = "", None
            try:
                if kind == "pod":
                    self.on_pod(payload)
                elif kind == "deleted":
                    self.forget(payload["metadata"]["uid"])
                elif kind == "resync":
                    for uid in set(self.pods) - payload:
                        self.forget(uid)
                if time.monotonic() >= next_tick:
                    next_tick = time.monotonic() + 0.5
                    self.tick()
            except Exception:
                log.exception("hollow kubelet: handling %s failed", kind)
        self.pool.stop()
        self.writes.shutdown(wait=False, cancel_futures=True)
        self.renewals.shutdown(wait=False, cancel_futures=True)
        for lane in self.lanes:
            lane.shutdown(wait=False, cancel_futures=True)

    def on_pod(self, pod: dict[str, Any]) -> None:
        meta, status = pod["metadata"], pod.get("status") or {}
        uid = meta["uid"]
        if meta.get("deletionTimestamp"):
            self.forget(uid)
            self.writes.submit(
                self._quiet, self._confirm_delete, meta["namespace"], meta["name"], uid
            )
            return
        known = self.pods.get(uid)
        if known is not None:
            attempt, known.base, known.released, known.hold = marks(pod)
            moved = attempt != known.attempt
            known.attempt = attempt
            if not known.done and known.restarts < known.base:
                # Moved to the next attempt while its run goes on: the supervisor stops the
                # run and exits 87, and the rule restarts the pod in place.
                self.restart(known, contract.RESTART_EXIT_CODE, "restart requested")
            elif known.may_resume():
                self.resume(known)
            if moved:
                self._apply_faults(known, pod)
            return
        if status.get("phase") in ("Succeeded", "Failed"):
            return
        ip = status.get("podIP") or next(self._ips)
        hp = project(pod, ip)
        self.pods[uid] = hp
        # In place, a pod listed again (this kubelet restarted) resumes where it was: its run
        # failed and waits for a move, or was moved and waits for the release.
        failed = bool(hp.rules) and hp.restarts > hp.base
        hp.waiting = bool(hp.rules) and (hp.held() or failed)
        hp.ran = hp.attempt if failed or not hp.held() else None
        if not hp.waiting:
            self.pool.send(uid, self._add(hp))
        if status.get("phase") != "Running" or status.get("podIP") != ip:
            started = dt.datetime.fromtimestamp(hp.started, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            body = running_status(pod, ip, self.nodes.addresses[hp.node], started)
            self._status(hp, body)
        if hp.rules and hp.restarts < hp.base:
            self.restart(hp, contract.RESTART_EXIT_CODE, "restart requested")
        self._apply_faults(hp, pod)

    def _add(self, hp: HollowPod) -> Add:
        return Add(hp.uid, hp.ip, hp.port, hp.nproc, hp.node_rank, hp.started, hp.step_seconds,
                   hp.total_steps, self.nodes.shape.gpus)  # fmt: skip

    def restart(self, hp: HollowPod, code: int, message: str) -> None:
        """Every container of the pod exited and started again in place: its ranks stop
        answering until the attempt is released."""
        body = hp.restart_in_place(code, message, now_iso())
        self.pool.send(hp.uid, Remove(hp.uid))
        self._status(hp, body)
        log.info("pod %s/%s: restarted in place (exit %d, restart %d)", hp.namespace, hp.name,
                 code, hp.restarts)  # fmt: skip

    def resume(self, hp: HollowPod) -> None:
        """The operator released the pod's attempt: its ranks run the new attempt."""
        hp.waiting = False
        hp.ran = hp.attempt
        hp.started = time.time()
        self.pool.send(hp.uid, self._add(hp))
        self._apply_faults(hp, None)

    def forget(self, uid: str) -> None:
        if self.pods.pop(uid, None) is not None:
            self.pool.send(uid, Remove(uid))

    def _status(self, hp: HollowPod, body: dict[str, Any]) -> None:
        """Patch the pod's status in its lane (a pod's patches land in the order made)."""
        lane = self.lanes[hash(hp.uid) % len(self.lanes)]
        lane.submit(self._quiet, self._patch_status, hp, body)

    def _patch_status(self, hp: HollowPod, body: dict[str, Any]) -> None:
        try:
            self.core.patch_namespaced_pod_status(hp.name, hp.namespace, body)
        except ApiException as e:
            if e.status != 404:
                raise

    def _confirm_delete(self, namespace: str, name: str, uid: str) -> None:
        opts = client.V1DeleteOptions(
            grace_period_seconds=0, preconditions=client.V1Preconditions(uid=uid)
        )
        try:
            self.core.delete_namespaced_pod(name, namespace, body=opts)
        except ApiException as e:
            if e.status not in (404, 409):
                raise

    def end(self, hp: HollowPod, code: int, message: str) -> None:
        """Report the pod's containers exited with ``code``; its ranks stop answering."""
        if hp.done:
            return
        hp.done = True
        self.pool.send(hp.uid, Remove(hp.uid))
        self._status(hp, ended_status(hp, code, message))
        log.info("pod %s/%s: %s (exit %d)", hp.namespace, hp.name, message, code)

    # -- faults and completion -----------------------------------------------------------
    def tick(self) -> None:
        self._read_faults()
        now = time.time()
        for hp in list(self.pods.values()):
            if hp.done or hp.waiting:
                continue
            if hp.fault[0] != "stall" and now >= hp.started + hp.total_steps * hp.step_seconds:
                self.end(hp, 0, f"reached step {hp.total_steps}")

    def _read_faults(self) -> None:
        try:
            mtime = self.faults_path.stat().st_mtime
        except FileNotFoundError:
            mtime = 0.0
        if mtime == self._faults_mtime:
            return
        self._faults_mtime = mtime
        try:
            self.faults = faultfile.parse(self.faults_path.read_text()) if mtime else []
        except (OSError, ValueError) as e:
            log.warning("fault file %s unreadable: %s", self.faults_path, e)
            return
        log.info("faults: %s", [f.key for f in self.faults])
        for f in self.faults:
            if f.key not in self.bound and f.attempt is None:
                attempts = [
                    p.attempt
                    for p in self.pods.values()
                    if p.namespace == f.namespace and p.job == f.job and not p.done
                ]
                if attempts:
                    self.bound[f.key] = max(attempts, key=faultfile.attempt_order)
        for hp in list(self.pods.values()):
            self._apply_faults(hp, None)

    def _apply_faults(self, hp: HollowPod, pod: dict[str, Any] | None) -> None:
        if hp.done or hp.waiting:
            return
        for f in self.faults:  # a fault first met with this pod's attempt holds for it
            if (
                f.attempt is None
                and f.key not in self.bound
                and (f.namespace, f.job) == (hp.namespace, hp.job)
            ):
                self.bound[f.key] = hp.attempt
        mode = faultfile.job_mode(self.faults, self.bound, hp.namespace, hp.job, hp.attempt)
        if mode != hp.fault:
            hp.fault = mode
            self.pool.send(hp.uid, Fault(hp.uid, mode[0], mode[1], time.time()))
        failing = faultfile.fails(
            self.faults, self.bound, hp.namespace, hp.job, hp.attempt, hp.node_rank, hp.nproc
        )
        if failing is not None:
            message = f"hollow fault: rank {failing.rank} failed"
            if hp.restarts_all(1):
                self.restart(hp, 1, message)
            else:
                self.end(hp, 1, message)

    def stop(self) -> None:
        self.stopping.set()


def write_faults(state_dir: Path, faults: list[faultfile.RankFault]) -> None:
    """Replace the fault file atomically (the kubelet polls its mtime)."""
    state_dir.mkdir(parents=True, exist_ok=True)
    tmp = state_dir / (FAULTS_FILE + ".tmp")
    tmp.write_text(faultfile.render(faults))
    tmp.replace(state_dir / FAULTS_FILE)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--kubeconfig", required=True)
    p.add_argument("--nodes", type=int, required=True)
    p.add_argument("--node-prefix", default="hollow-node")
    p.add_argument("--gpus-per-node", type=int, default=8)
    p.add_argument("--state-dir", required=True)
    p.add_argument("--ready-file")
    p.add_argument("--endpoint-processes", type=int, default=2)
    p.add_argument("--lease-seconds", type=float, default=LEASE_SECONDS)
    p.add_argument("--node-octet", type=int, default=None, help="first third octet of 127.254.*")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    api = config.new_client_from_config(config_file=args.kubeconfig)
    api.configuration.connection_pool_maxsize = 16
    names = [f"{args.node_prefix}-{i}" for i in range(args.nodes)]
    octet = args.node_octet
    if octet is None:
        octet = random.randint(0, 255 - (args.nodes - 1) // 254)
    kubelet = HollowKubelet(
        api,
        names,
        NodeShape(gpus=args.gpus_per_node, cpu="96", memory="1Ti"),
        hollow_addresses(args.nodes, octet),
        Path(args.state_dir),
        args.endpoint_processes,
        args.lease_seconds,
    )
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: kubelet.stop())
    kubelet.register()
    if args.ready_file:
        Path(args.ready_file).write_text("ready\n")
    kubelet.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
