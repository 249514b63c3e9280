"""The kubelet's container-logs endpoint, so that ``kubectl logs`` works on the local cluster.

``kubectl logs`` asks the API server, which proxies to the node's kubelet at
``https://<node InternalIP>:<daemonEndpoints.kubeletEndpoint.Port>/containerLogs/<ns>/<pod>/<container>``
with its ``--kubelet-client-certificate``, and checks the kubelet's serving certificate
against ``--kubelet-certificate-authority``. This server speaks that one path over TLS with
a certificate the local CA signs, and accepts only clients whose certificate that CA signed
(the API server's). Supported query parameters: ``follow``, ``previous``, ``tailLines``,
``limitBytes``; ``timestamps`` and ``sinceSeconds``/``sinceTime`` are ignored, since the
agent's log files carry no per-line times.
"""

from __future__ import annotations

import logging
import ssl
import threading
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

log = logging.getLogger("gpujob.nodeagent.kubeletapi")

FOLLOW_POLL_SECONDS = 0.2


@dataclass(frozen=True)
class LogRequest:
    """One ``/containerLogs`` request, parsed."""

    namespace: str
    pod: str
    container: str
    follow: bool = False
    previous: bool = False
    tail_lines: int | None = None
    limit_bytes: int | None = None


class BadRequest(ValueError):
    """A request the endpoint refuses (HTTP 400 or 404, with the message)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def _flag(values: dict[str, list[str]], name: str) -> bool:
    return values.get(name, ["false"])[-1].lower() in ("true", "1")


def _positive(values: dict[str, list[str]], name: str) -> int | None:
    if name not in values:
        return None
    try:
        n = int(values[name][-1])
    except ValueError:
        raise BadRequest(400, f"{name} must be an integer") from None
    if n < 0:
        raise BadRequest(400, f"{name} must be >= 0")
    return n


def parse_request(target: str) -> LogRequest:
    """``/containerLogs/<ns>/<pod>/<container>?query`` -> :class:`LogRequest`."""
    url = urllib.parse.urlsplit(target)
    parts = [urllib.parse.unquote(p) for p in url.path.split("/") if p]
    if len(parts) != 4 or parts[0] != "containerLogs":
        raise BadRequest(404, f"no such path {url.path!r}")
    q = urllib.parse.parse_qs(url.query)
    return LogRequest(
        namespace=parts[1],
        pod=parts[2],
        container=parts[3],
        follow=_flag(q, "follow"),
        previous=_flag(q, "previous"),
        tail_lines=_positive(q, "tailLines"),
        limit_bytes=_positive(q, "limitBytes"),
    )


def tail(data: bytes, lines: int | None) -> bytes:
    """The last ``lines`` lines of ``data`` (a final line without newline counts)."""
    if lines is None:
        return data
    if lines == 0:
        return b""
    chunks = data.splitlines(keepends=True)
    return b"".join(chunks[-lines:])


@dataclass(frozen=True)
class LogSource:
    """Where a container's log is, and whether it may still grow (for ``follow``)."""

    path: Path
    growing: Callable[[], bool]


Resolver = Callable[[LogRequest], LogSource]
"""Finds the log of a request, or raises :class:`BadRequest` (404: no such pod/container)."""


class KubeletServer:
    """An HTTPS server on loopback with the ``/containerLogs`` endpoint."""

    def __init__(
        self, resolve: Resolver, cert: Path, key: Path, client_ca: Path, host: str = "127.0.0.1"
    ) -> None:
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(client_ca))
        ctx.load_cert_chain(str(cert), str(key))
        ctx.verify_mode = ssl.CERT_REQUIRED
        self.resolve = resolve
        self.stopping = threading.Event()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, fmt: str, *args: object) -> None:
                log.debug("kubelet api: " + fmt, *args)

            def do_GET(self) -> None:
                server.handle(self)

        self.httpd = ThreadingHTTPServer((host, 0), Handler)
        self.httpd.daemon_threads = True
        self.httpd.socket = ctx.wrap_socket(self.httpd.socket, server_side=True)
        self.host = host
        self.port = int(self.httpd.server_address[1])

    def start(self) -> KubeletServer:
        threading.Thread(target=self.httpd.serve_forever, name="kubelet-api", daemon=True).start()
        return self

    def stop(self) -> None:
        self.stopping.set()
        self.httpd.shutdown()
        self.httpd.server_close()

    def handle(self, h: BaseHTTPRequestHandler) -> None:
        if h.path.split("?", 1)[0] == "/healthz":
            self._reply(h, 200, b"ok")
            return
        try:
            req = parse_request(h.path)
            source = self.resolve(req)
            raw = source.path.read_bytes() if source.path.exists() else b""
        except BadRequest as e:
            self._reply(h, e.status, str(e).encode())
            return
        data = tail(raw, req.tail_lines)
        if req.limit_bytes is not None:
            data = data[: req.limit_bytes]
        if not req.follow:
            self._reply(h, 200, data)
            return
        self._stream(h, req, source, data, len(raw))

    def _reply(self, h: BaseHTTPRequestHandler, status: int, body: bytes) -> None:
        h.send_response(status)
        h.send_header("Content-Type", "text/plain")
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        h.wfile.write(body)

    def _stream(
        self,
        h: BaseHTTPRequestHandler,
        req: LogRequest,
        source: LogSource,
        first: bytes,
        offset: int,
    ) -> None:
        """Chunked: what is there, then what the container appends until it stops."""
        h.send_response(200)
        h.send_header("Content-Type", "text/plain")
        h.send_header("Transfer-Encoding", "chunked")
        h.end_headers()
        budget = req.limit_bytes

        def send(chunk: bytes) -> bool:
            nonlocal budget
            if budget is not None:
                chunk = chunk[:budget]
                budget -= len(chunk)
            if chunk:
                h.wfile.write(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
                h.wfile.flush()
            return budget is None or budget > 0

        try:
            more = send(first)
            while more and not self.stopping.is_set():
                growing = source.growing()
                size = source.path.stat().st_size if source.path.exists() else 0
                if size > offset:
                    with source.path.open("rb") as f:
                        f.seek(offset)
                        chunk = f.read(size - offset)
                    offset += len(chunk)
                    more = send(chunk)
                elif not growing:
                    break
                else:
                    time.sleep(FOLLOW_POLL_SECONDS)
            h.wfile.write(b"0\r\n\r\n")
            h.wfile.flush()
        except (BrokenPipeError, ConnectionResetError, ssl.SSLError):
            pass  # the client went away (kubectl logs -f interrupted)
