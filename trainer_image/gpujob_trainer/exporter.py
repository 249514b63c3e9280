"""A rank's Prometheus endpoint: collectors over the tracker (and NVML, CUDA allocator).

The collectors read plain counters at scrape time and render them with the names of
`contract.py`. They emit no `_created` series (prometheus_client adds those only for its own
metric objects, which are not used here), and they live in a private CollectorRegistry so a
user's own metrics and ours never collide.

The exporter reads a tracker through `Source` (its rank, its CUDA device and `snapshot()`), so it
imports no tracker: the tracker imports it, when it starts one.
"""

from __future__ import annotations

import hmac
import json
import logging
import socket
import threading
from collections.abc import Iterator, Mapping
from typing import Any, Final, Protocol
from urllib.parse import parse_qs
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from gpujob_trainer import contract, evidence, profiling
from gpujob_trainer.cuda_memory import CudaMemoryCollector
from gpujob_trainer.env import RankInfo, endpoint_token, metrics_addr, metrics_base_port
from gpujob_trainer.families import family, rank_values
from gpujob_trainer.nvml import NvmlCollector
from gpujob_trainer.snapshot import Snapshot

log = logging.getLogger("gpujob_trainer")


class Source(Protocol):
    """What the exporter reads from a rank's tracker (`tracker.Tracker` is one)."""

    rank: RankInfo
    cuda_device: int | None
    """Index of the model's CUDA device, once known."""

    def snapshot(self) -> Snapshot: ...


def render_snapshot(snap: Snapshot) -> list[Metric]:
    """The trainer series of one snapshot (pure: used by the collector and by tests)."""
    rank = rank_values(snap.rank)
    out: list[Metric] = []

    def single(spec: contract.MetricSpec, value: float | None) -> None:
        if value is None:
            return
        fam = family(spec)
        fam.add_metric(rank, float(value))  # type: ignore[attr-defined]
        out.append(fam)

    single(contract.STEPS, snap.steps)
    single(contract.START_STEP, snap.start_step)
    single(contract.TARGET_STEPS, snap.target_steps)
    single(contract.SAMPLES, snap.samples)
    single(contract.TOKENS, snap.tokens)
    single(contract.EPOCH, snap.epoch)
    single(contract.LOSS, snap.loss)  # NaN and Inf are valid samples and worth seeing

    hist = family(contract.STEP_DURATION)
    bounds = [repr(float(b)) for b in contract.STEP_DURATION_BUCKETS] + ["+Inf"]
    hist.add_metric(  # type: ignore[attr-defined]
        rank, list(zip(bounds, snap.step_buckets, strict=True)), snap.step_sum
    )
    out.append(hist)

    phases = family(contract.PHASE_SECONDS)
    for name in contract.PHASES:
        phases.add_metric([*rank, name], snap.phase_seconds[name])  # type: ignore[attr-defined]
    out.append(phases)
    single(contract.COMPUTE_SECONDS, snap.compute_seconds)
    single(contract.LAST_STEP_TIMESTAMP, snap.last_step_timestamp)
    single(contract.HEARTBEAT_TIMESTAMP, snap.heartbeat_timestamp)
    single(contract.CLOCK_TIMESTAMP, snap.clock_timestamp)
    current = family(contract.CURRENT_PHASE)
    for name in contract.PHASES:
        current.add_metric(  # type: ignore[attr-defined]
            [*rank, name], 1.0 if name == snap.current_phase else 0.0
        )
    out.append(current)
    single(contract.MODEL_FLOPS, snap.model_flops)
    if snap.peak is not None:
        peak = family(contract.PEAK_FLOPS)
        p = snap.peak
        peak.add_metric([*rank, p.device, p.dtype, p.reason], p.flops or 0.0)  # type: ignore[attr-defined]
        out.append(peak)
    if snap.devices:
        devices = family(contract.RANK_DEVICE)
        for i, uuid in enumerate(snap.devices):
            devices.add_metric([*rank, uuid], float(i))  # type: ignore[attr-defined]
        out.append(devices)
    return out


def render_profile(rank: RankInfo, parts: Mapping[str, float] | None) -> list[Metric]:
    """The latest finished profile's parts per step (nothing until a capture finished)."""
    if not parts:
        return []
    fam = family(contract.PROFILE_STEP_SECONDS)
    values = rank_values(rank)
    for part in contract.PROFILE_PARTS:
        fam.add_metric([*values, part], float(parts.get(part, 0.0)))  # type: ignore[attr-defined]
    return [fam]


class TrainerCollector(Collector):
    """Renders a tracker's counters at scrape time."""

    def __init__(self, tracker: Source) -> None:
        self._tracker = tracker

    def collect(self) -> Iterator[Metric]:
        yield from render_snapshot(self._tracker.snapshot())
        profiler = getattr(self._tracker, "profiler", None)
        if profiler is not None:  # one attribute read: the parts are kept ready
            yield from render_profile(self._tracker.rank, profiler.latest_parts)


class _Quiet(WSGIRequestHandler):
    """No access log on the trainer's stderr (a scrape every few seconds)."""

    def log_message(self, format: str, *args: Any) -> None:
        pass


UNAUTHORIZED: Final = b"this path needs the job's endpoint token\n"
"""The whole answer to a request without the token: fixed, so a refusal costs nothing."""


def _authorized(environ: dict[str, Any], expected: bytes) -> bool:
    """Whether the request carries ``Authorization: Bearer <token>`` (constant-time compare)."""
    got = str(environ.get("HTTP_AUTHORIZATION", "")).encode("latin-1", "replace")
    return hmac.compare_digest(got, expected)


MAX_PROFILE_ANSWER: Final = 64 * 1024
"""The most a `contract.PROFILE_PATH` answer holds (the summary itself is 16 KiB at most)."""


def _json(start_response: Any, status: str, doc: dict[str, Any]) -> list[bytes]:
    body = json.dumps(doc, separators=(",", ":")).encode()
    if len(body) > MAX_PROFILE_ANSWER:  # cannot happen with the bounds above; never send it
        status = "500 Internal Server Error"
        body = json.dumps({"error": f"the answer exceeds {MAX_PROFILE_ANSWER} bytes"}).encode()
    start_response(
        status, [("Content-Type", "application/json"), ("Content-Length", str(len(body)))]
    )
    return [body]


def profile_answer(
    profiler: profiling.Profiler | None, rank: int | None, debug: bool, query: str
) -> tuple[str, dict[str, Any]]:
    """The HTTP status and JSON document of a `contract.PROFILE_PATH` request."""
    if not debug:
        why = f"evidence is off ({contract.ENV_EVIDENCE}=0)"
        return "404 Not Found", {"version": 1, "rank": rank, "state": "unavailable", "error": why}
    try:
        asked = profiling.parse_request(parse_qs(query, keep_blank_values=True, max_num_fields=16))
    except (profiling.RequestError, ValueError) as exc:
        return "400 Bad Request", {"error": str(exc)[: profiling.MAX_ERROR]}
    if profiler is None:
        why = "this endpoint serves no tracker"
        return "200 OK", {"version": 1, "rank": rank, "state": "unavailable", "error": why}
    doc = profiler.state() if asked is None else profiler.request(*asked)
    return "200 OK", doc


def _app(
    registry: CollectorRegistry,
    rank: int | None,
    debug: bool,
    token: str | None = None,
    profiler: profiling.Profiler | None = None,
) -> Any:
    """/metrics from the registry, and (unless turned off) the hang evidence.

    With a token, ``/debug/*`` is checked first of all: the stacks and the Flight Recorder
    are the job's secrets, and a caller without the token must not make the rank do the work
    of collecting them. ``/metrics`` stays open, since the PodMonitor's Prometheus cannot know
    a per-job token; the NetworkPolicy is what closes it.
    """
    metrics = make_wsgi_app(registry)
    expected = f"Bearer {token}".encode() if token else None

    def app(environ: dict[str, Any], start_response: Any) -> Any:
        path = environ.get("PATH_INFO") or ""
        if (
            expected is not None
            and path.startswith(contract.DEBUG_PREFIX)
            and not _authorized(environ, expected)
        ):
            start_response(
                "401 Unauthorized",
                [
                    ("Content-Type", "text/plain"),
                    ("Content-Length", str(len(UNAUTHORIZED))),
                    ("WWW-Authenticate", "Bearer"),
                ],
            )
            return [UNAUTHORIZED]
        if path == contract.PROFILE_PATH:
            status, doc = profile_answer(
                profiler, rank, debug, str(environ.get("QUERY_STRING") or "")
            )
            return _json(start_response, status, doc)
        if path == contract.EVIDENCE_PATH:
            status = "200 OK" if debug else "404 Not Found"
            body = evidence.render(rank) if debug else b"evidence is off (GPUJOB_EVIDENCE=0)\n"
            kind = "application/json" if debug else "text/plain"
            start_response(status, [("Content-Type", kind), ("Content-Length", str(len(body)))])
            return [body]
        return metrics(environ, start_response)

    return app


def _serve(addr: str, port: int, app: Any) -> tuple[Any, threading.Thread]:
    class Server(ThreadingWSGIServer):
        address_family = socket.AF_INET6 if ":" in addr else socket.AF_INET

    server = make_server(addr, port, app, Server, handler_class=_Quiet)
    thread = threading.Thread(target=server.serve_forever, name="gpujob-exporter", daemon=True)
    thread.start()
    return server, thread


class Exporter:
    """The HTTP endpoint of one rank: a private registry served on one port."""

    def __init__(
        self,
        registry: CollectorRegistry,
        port: int,
        addr: str = "0.0.0.0",
        rank: int | None = None,
        debug: bool | None = None,
        token: str | None = None,
        profiler: profiling.Profiler | None = None,
    ) -> None:
        self.registry = registry
        self.profiler = profiler
        """Whose captures :data:`contract.PROFILE_PATH` asks for (None: none offered)."""
        self.rank = rank
        self.debug = evidence.enabled() if debug is None else debug
        """Whether :data:`contract.EVIDENCE_PATH` is served (``GPUJOB_EVIDENCE``)."""
        self.token = token
        """What ``/debug/*`` requires as a bearer token (``GPUJOB_ENDPOINT_TOKEN``; None: open)."""
        self.addr = addr
        self.port = port
        self._server: Any = None
        self._thread: threading.Thread | None = None
        self._stop_requested = threading.Event()

    @classmethod
    def for_tracker(
        cls,
        tracker: Source,
        *,
        port: int | None = None,
        addr: str | None = None,
        gpu: bool | None = None,
    ) -> Exporter:
        """Registry with the trainer collector, the CUDA allocator collector and (on local
        rank 0 unless told otherwise) the NVML collector for all GPUs of the node."""
        rank = tracker.rank
        registry = CollectorRegistry(auto_describe=False)
        registry.register(TrainerCollector(tracker))
        registry.register(CudaMemoryCollector(rank, device_fn=lambda: tracker.cuda_device))
        if gpu if gpu is not None else rank.local_rank == 0:
            registry.register(NvmlCollector(node_rank=rank.node_rank))
        if port is None:
            port = contract.metrics_port(metrics_base_port(), rank.local_rank)
        return cls(
            registry,
            port,
            addr if addr is not None else metrics_addr(),
            rank=rank.rank,
            token=endpoint_token(),
            profiler=getattr(tracker, "profiler", None),
        )

    def start(self) -> int:
        """Start serving in a daemon thread; returns the bound port (useful with port 0)."""
        if self._server is None:
            app = _app(self.registry, self.rank, self.debug, self.token, self.profiler)
            self._server, self._thread = _serve(self.addr, self.port, app)
            self.port = int(self._server.server_port)
            log.info(
                "gpujob metrics on http://%s:%d%s", self.addr, self.port, contract.METRICS_PATH
            )
        return self.port

    def request_stop(self) -> None:
        """Ask a lingering `wait_stopped` to return early (safe from a signal handler)."""
        self._stop_requested.set()

    def wait_stopped(self, timeout: float) -> bool:
        """Keep serving until `request_stop()` or `timeout` seconds; True if asked to stop."""
        return self._stop_requested.wait(timeout)

    def stop(self) -> None:
        """Stop serving and close the socket."""
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
