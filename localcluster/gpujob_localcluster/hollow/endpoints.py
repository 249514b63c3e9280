"""A light process that serves many hollow ranks' endpoints.

Each rank listens where a real one would, ``podIP:metricsPort+local_rank``, so the operator
and Prometheus dial the addresses the pods report. One asyncio loop answers thousands of
them: ``/metrics`` is rendered from a recorded payload at the rank's step
(:mod:`payloads`), ``/debug/evidence`` from a recorded stack dump. The hollow kubelet drives
the process with commands on a queue: a pod to serve, a pod gone, a fault on a job's rank.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing as mp
import os
import resource
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from gpujob_localcluster.hollow import payloads
from gpujob_localcluster.hollow.faults import FaultKind

log = logging.getLogger("gpujob.hollow.endpoints")

SILENT_HOLD_SECONDS = 60.0
"""How long a silent rank keeps a connection unanswered before it closes it."""


@dataclass
class PodServe:
    """One hollow pod's ranks, as the kubelet describes them."""

    uid: str
    ip: str
    port: int
    nproc: int
    node_rank: int
    clock: payloads.StepClock
    gpus: int = 8
    fault: FaultKind | None = None
    culprit: int | None = None
    """The job's rank the fault is about (global rank)."""
    servers: list[asyncio.base_events.Server] = field(default_factory=list)
    conns: set[asyncio.BaseTransport] = field(default_factory=set)
    """Its open connections: closed with it, as a process's die with the process (a pod
    restarted in place is served afresh, never by its old run's keep-alive connections)."""


@dataclass(frozen=True)
class Add:
    uid: str
    ip: str
    port: int
    nproc: int
    node_rank: int
    started: float
    step_seconds: float
    total_steps: int
    gpus: int


@dataclass(frozen=True)
class Remove:
    uid: str


@dataclass(frozen=True)
class Fault:
    uid: str
    kind: FaultKind | None
    culprit: int | None
    since: float


Command = Add | Remove | Fault


class Endpoints:
    """The pods this process serves and their listeners (all on one event loop)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.pods: dict[str, PodServe] = {}
        self.templates: dict[tuple[str, int], payloads.Template] = {}
        self.gpu_text: dict[tuple[int, int], str] = {}
        self.answered = 0

    def template(self, scenario: str, rank: int) -> payloads.Template:
        key = (scenario, rank)
        if key not in self.templates:
            self.templates[key] = payloads.Template.recorded(scenario, rank)
        return self.templates[key]

    async def apply(self, cmd: Command) -> None:
        if isinstance(cmd, Add):
            await self.add(cmd)
        elif isinstance(cmd, Remove):
            self.remove(cmd.uid)
        else:
            pod = self.pods.get(cmd.uid)
            if pod is not None:
                pod.fault, pod.culprit = cmd.kind, cmd.culprit
                pod.clock.frozen_at = cmd.since if cmd.kind == "stall" else None

    async def add(self, cmd: Add) -> None:
        if cmd.uid in self.pods:
            return
        clock = payloads.StepClock(cmd.started, cmd.step_seconds, cmd.total_steps)
        pod = PodServe(cmd.uid, cmd.ip, cmd.port, cmd.nproc, cmd.node_rank, clock, cmd.gpus)
        self.pods[cmd.uid] = pod
        for lr in range(cmd.nproc):
            try:
                server = await self.loop.create_server(
                    lambda lr=lr: RankProtocol(self, pod, lr),  # type: ignore[misc]
                    cmd.ip,
                    cmd.port + lr,
                    backlog=64,
                    reuse_address=True,
                )
            except OSError as e:
                log.warning("pod %s: cannot listen on %s:%s: %s", cmd.uid, cmd.ip, cmd.port + lr, e)
                continue
            if self.pods.get(cmd.uid) is not pod:  # removed while binding
                server.close()
                return
            pod.servers.append(server)

    def remove(self, uid: str) -> None:
        pod = self.pods.pop(uid, None)
        if pod is not None:
            for server in pod.servers:
                server.close()
            for conn in list(pod.conns):
                conn.close()

    def answer(self, pod: PodServe, local_rank: int, path: bytes) -> bytes | None:
        """The HTTP response to ``GET path`` on the rank, or None to stay silent."""
        rank = pod.node_rank * pod.nproc + local_rank
        culprit = pod.culprit == rank
        if culprit and pod.fault == "silent":
            return None
        now = time.time()
        if path.startswith(b"/metrics"):
            scenario, which = "healthy", min(local_rank, 1)
            if pod.fault == "straggle":
                scenario, which = "slow_rank", (1 if culprit else 0)
            phase = "forward"
            if pod.fault == "stall":
                phase = "data_wait" if culprit else "comm_wait"
            labels = payloads.RankLabels(rank, local_rank, pod.node_rank)
            body = self.template(scenario, which).render(labels, pod.clock, now, phase)
            if local_rank == 0 and pod.gpus:
                key = (pod.gpus, pod.node_rank)
                if key not in self.gpu_text:
                    self.gpu_text[key] = payloads.gpu_series(pod.gpus, pod.node_rank)
                body += self.gpu_text[key]
            return _response(200, body.encode(), "text/plain; version=0.0.4; charset=utf-8")
        if path.startswith(b"/debug/evidence"):
            kind = "loader" if culprit and pod.fault == "stall" else "collective"
            doc = payloads.evidence(kind, rank, 100_000 + rank, now)
            return _response(200, doc, "application/json")
        return _response(404, b"not found\n", "text/plain")


def _response(code: int, body: bytes, ctype: str) -> bytes:
    reason = "OK" if code == 200 else "Not Found"
    head = (
        f"HTTP/1.1 {code} {reason}\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


class RankProtocol(asyncio.Protocol):
    """HTTP/1.1 keep-alive, GET only: enough for the operator's scraper and Prometheus."""

    MAX_REQUEST = 16 * 1024

    def __init__(self, endpoints: Endpoints, pod: PodServe, local_rank: int) -> None:
        self.endpoints = endpoints
        self.pod = pod
        self.local_rank = local_rank
        self.buf = b""
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.pod.conns.add(transport)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.transport is not None:
            self.pod.conns.discard(self.transport)

    def data_received(self, data: bytes) -> None:
        assert self.transport is not None
        self.buf += data
        if len(self.buf) > self.MAX_REQUEST:
            self.transport.close()
            return
        while b"\r\n\r\n" in self.buf:
            req, self.buf = self.buf.split(b"\r\n\r\n", 1)
            parts = req.split(b" ", 2)
            path = parts[1] if len(parts) > 1 else b"/"
            out = self.endpoints.answer(self.pod, self.local_rank, path)
            if out is None:
                transport = self.transport
                self.endpoints.loop.call_later(SILENT_HOLD_SECONDS, transport.close)
                return
            self.transport.write(out)


def _raise_fd_limit() -> None:
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def _finish(done: asyncio.Future[None]) -> None:
    if not done.done():
        done.set_result(None)


def serve(commands: mp.Queue[Command | None], name: str) -> None:
    """The process's body: apply commands until a None arrives."""
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s {name} %(levelname)s %(message)s")
    _raise_fd_limit()
    loop = asyncio.new_event_loop()
    endpoints = Endpoints(loop)
    done = loop.create_future()

    def feed() -> None:
        while True:
            cmd = commands.get()
            if cmd is None:
                loop.call_soon_threadsafe(_finish, done)
                return
            asyncio.run_coroutine_threadsafe(endpoints.apply(cmd), loop)

    threading.Thread(target=feed, name="commands", daemon=True).start()
    log.info("serving hollow ranks (pid %d)", os.getpid())
    loop.run_until_complete(done)


class EndpointPool:
    """``count`` endpoint processes; a pod's ranks all live in one, chosen by its uid."""

    def __init__(self, count: int) -> None:
        ctx = mp.get_context("spawn")
        self.queues: list[Any] = [ctx.Queue() for _ in range(count)]
        self.procs = [
            ctx.Process(
                target=serve, args=(q, f"endpoints-{i}"), daemon=True, name=f"endpoints-{i}"
            )
            for i, q in enumerate(self.queues)
        ]
        for p in self.procs:
            p.start()

    def send(self, uid: str, cmd: Command) -> None:
        self.queues[_slot(uid, len(self.queues))].put(cmd)

    def alive(self) -> bool:
        return all(p.is_alive() for p in self.procs)

    def stop(self) -> None:
        for q in self.queues:
            q.put(None)
        for p in self.procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()


def _slot(uid: str, count: int) -> int:
    return sum(uid.encode()) % count
