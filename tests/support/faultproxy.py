"""A fault-injecting HTTP proxy on loopback between a client and the real API server.

The client (the operator) talks plain HTTP to the proxy with a kubeconfig that has no
credentials; the proxy forwards every request over TLS with the admin's client certificate
and streams the answer back (watches included). Requests that match a :class:`Fault` get
the fault's status and a metav1.Status body instead, and the time of every matching request
is recorded, so a test reads the client's retry delays from real timestamps.
"""

from __future__ import annotations

import asyncio
import json
import re
import ssl
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import yaml
from aiohttp import web

_HOP: frozenset[str] = frozenset(
    {
        "host",
        "authorization",
        "connection",
        "keep-alive",
        "transfer-encoding",
        "content-length",
        "te",
        "trailer",
        "upgrade",
        "proxy-authorization",
    }
)

STATUS_REASONS: dict[int, str] = {
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
    502: "InternalError",
    504: "Timeout",
}


RESET = -1
"""A code that answers nothing: the connection is cut (a failover's reset, not a refusal)."""


@dataclass
class Fault:
    """Answer the first ``len(codes)`` requests that match with these status codes
    (:data:`RESET`: cut the connection instead of answering)."""

    method: str
    path: re.Pattern[str]
    codes: list[int]
    seen: list[tuple[float, int]] = field(default_factory=list)
    """(unix time, status answered) of every matching request, faulted or passed on."""

    forever: bool = False
    """Keep answering the last code once ``codes`` are used up (a server that stays down)."""

    before: Callable[[], None] | None = None
    """Run in the proxy's loop when a matching request arrives, before it is answered or
    passed on: a test's fault that must start exactly then (a watch going dark)."""

    def next_code(self) -> int:
        """The status to answer the next matching request with; 0 passes it on."""
        used = sum(1 for _, code in self.seen if code)
        if used < len(self.codes):
            return self.codes[used]
        return self.codes[-1] if self.forever and self.codes else 0

    def matches(self, method: str, path: str) -> bool:
        return method == self.method and bool(self.path.fullmatch(path))


@dataclass
class FaultProxy:
    """Serve on 127.0.0.1 in a thread of its own; :meth:`kubeconfig` points a client at it."""

    upstream_kubeconfig: Path
    faults: list[Fault] = field(default_factory=list)
    port: int = 0
    _loop: asyncio.AbstractEventLoop | None = None
    _thread: threading.Thread | None = None
    _runner: web.AppRunner | None = None
    _streams: dict[int, tuple[str, asyncio.BaseTransport]] = field(default_factory=dict)
    """The responses being streamed now (watches), by request id: path and transport."""

    def start(self) -> FaultProxy:
        cfg = yaml.safe_load(self.upstream_kubeconfig.read_text())
        cluster, user = cfg["clusters"][0]["cluster"], cfg["users"][0]["user"]
        self._upstream = cluster["server"].rstrip("/")
        ctx = ssl.create_default_context(cafile=cluster["certificate-authority"])
        ctx.load_cert_chain(user["client-certificate"], user["client-key"])
        self._ssl = ctx
        ready = threading.Event()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._serve, args=(ready,), daemon=True)
        self._thread.start()
        if not ready.wait(30):
            raise RuntimeError("fault proxy did not start")
        return self

    def _serve(self, ready: threading.Event) -> None:
        assert self._loop is not None
        asyncio.set_event_loop(self._loop)

        async def setup() -> None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0),  # watches hold connections open
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=10),
                auto_decompress=False,
            )
            app = web.Application(client_max_size=64 * 1024 * 1024)
            app.router.add_route("*", "/{tail:.*}", self._handle)
            self._runner = web.AppRunner(app, shutdown_timeout=2.0)
            await self._runner.setup()
            site = web.TCPSite(self._runner, "127.0.0.1", 0)
            await site.start()
            sockets = getattr(site._server, "sockets", None)
            assert sockets
            self.port = int(sockets[0].getsockname()[1])

        self._loop.run_until_complete(setup())
        ready.set()
        self._loop.run_forever()

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        for fault in self.faults:
            if fault.matches(request.method, request.path):
                if fault.before is not None:
                    fault.before()
                code = fault.next_code()
                fault.seen.append((time.time(), code))
                if code == RESET:
                    if request.transport is not None:
                        request.transport.abort()
                    raise ConnectionResetError("cut by the test's fault proxy")
                if code:
                    return self._status(code)
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP}
        body = await request.read()
        resp: web.StreamResponse | None = None
        try:
            async with self._session.request(
                request.method,
                self._upstream + request.path_qs,
                headers=headers,
                data=body or None,
                ssl=self._ssl,
                # Forward the client's Content-Type as is, or none (the API server then reads
                # JSON); never aiohttp's application/octet-stream for a bytes body.
                skip_auto_headers=("Content-Type",),
            ) as up:
                resp = web.StreamResponse(
                    status=up.status,
                    headers={k: v for k, v in up.headers.items() if k.lower() not in _HOP},
                )
                await resp.prepare(request)
                if request.transport is not None:
                    self._streams[id(request)] = (request.path, request.transport)
                try:
                    async for chunk in up.content.iter_any():
                        await resp.write(chunk)
                finally:
                    self._streams.pop(id(request), None)
        except (ConnectionResetError, aiohttp.ClientError, RuntimeError):
            # Either side went away (the client stopped, or stop() closed upstream), or the
            # API server could not be reached: a gateway error if nothing was sent yet.
            if resp is None:
                return self._status(502)
        return resp

    @staticmethod
    def _status(code: int) -> web.Response:
        reason = STATUS_REASONS.get(code, "InternalError")
        body = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": f"injected by the test's fault proxy: {reason}",
            "reason": reason,
            "code": code,
        }
        return web.Response(status=code, text=json.dumps(body), content_type="application/json")

    def cut_now(self, path: re.Pattern[str]) -> int:
        """Cut every response being streamed now (a watch) whose path matches: the client
        sees its connection reset, as in a failover. Call it in the proxy's loop (a
        :attr:`Fault.before`); returns how many were cut."""
        hit = [tr for p, tr in list(self._streams.values()) if path.fullmatch(p)]
        for tr in hit:
            tr.abort()  # type: ignore[attr-defined]
        return len(hit)

    def kubeconfig(self, path: Path) -> Path:
        """A kubeconfig that sends a client through the proxy (no credentials of its own)."""
        cfg = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "proxy", "cluster": {"server": f"http://127.0.0.1:{self.port}"}}],
            "users": [{"name": "proxy", "user": {"token": "unused-the-proxy-authenticates"}}],
            "contexts": [{"name": "proxy", "context": {"cluster": "proxy", "user": "proxy"}}],
            "current-context": "proxy",
        }
        path.write_text(yaml.safe_dump(cfg))
        return path

    def stop(self) -> None:
        loop = self._loop
        if loop is None:
            return

        async def shutdown() -> None:
            await self._session.close()  # ends the streams of open watches first
            if self._runner is not None:
                await self._runner.cleanup()

        asyncio.run_coroutine_threadsafe(shutdown(), loop).result(15)
        loop.call_soon_threadsafe(loop.stop)
        if self._thread is not None:
            self._thread.join(15)
        self._loop = None


def pod_creates(namespace: str, codes: list[int]) -> Fault:
    """Fault pod creation (dry runs included) in ``namespace``."""
    return Fault("POST", re.compile(rf"/api/v1/namespaces/{re.escape(namespace)}/pods"), codes)
