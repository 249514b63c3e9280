"""Concurrent scraping of the ranks' /metrics (the I/O edge of the monitoring path).

One `Scraper` serves every job of the operator: one pool of kept-alive connections, one
semaphore bounding scrapes in flight across all jobs, a timeout per request and a cap on the
response size, so a thousand jobs with dead or slow endpoints cannot exhaust sockets or
memory. Each endpoint's outcome is a `ScrapeResult`; no endpoint's failure touches another.

The HTTP client is a small HTTP/1.1 one on asyncio protocols rather than a general library:
scraping thousands of endpoints every 15 s is the operator's main CPU cost, and a scrape is
always the same plain GET. It keeps connections alive (as Prometheus does), asks for an
uncompressed body (`Accept-Encoding: identity`; gzip or deflate are still decoded if sent),
reads Content-Length, chunked and until-close bodies, and turns the payload straight into a
window frame (`window.frame_payload`), without per-sample objects.
"""

from __future__ import annotations

import asyncio
import resource
import time
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from types import TracebackType
from typing import Final
from urllib.parse import urlsplit

from gpujob_operator import expfmt
from gpujob_operator.window import NEEDED, Frame, frame, frame_payload
from gpujob_trainer import contract

DEFAULT_CONCURRENCY: Final = 256
DEFAULT_TIMEOUT: Final = 5.0
DEFAULT_MAX_BYTES: Final = 4 * 2**20
ACCEPT: Final = "text/plain;version=0.0.4;q=1,*/*;q=0.1"
USER_AGENT: Final = "gpujob-operator"
IDLE_SECONDS: Final = 60.0
"""Kept-alive connections unused this long are closed (longer than a scrape interval)."""
_MAX_HEAD: Final = 65536


class ErrorKind(StrEnum):
    """Why an endpoint gave no samples."""

    REFUSED = "refused"
    TIMEOUT = "timeout"
    HTTP_STATUS = "http_status"
    PARSE = "parse"
    TOO_LARGE = "too_large"
    MISSING_RANK = "missing_rank"
    CONNECTION = "connection"


@dataclass(frozen=True, slots=True)
class ScrapeTarget:
    """One rank's endpoint and where it runs."""

    url: str
    pod: str
    node: str = ""
    node_rank: int = -1
    local_rank: int = -1
    rank: int | None = None
    """The global rank expected there (None: accept whatever rank answers)."""


@dataclass(slots=True)
class ScrapeResult:
    """The outcome of one scrape: its frame (or samples), or an error kind and message."""

    target: ScrapeTarget
    t: float
    """When the response arrived (or the attempt failed), seconds since the epoch."""
    samples: list[expfmt.Sample] = field(default_factory=list)
    """The parsed samples, only when the scraper was given its own `wanted` set."""
    error: ErrorKind | None = None
    message: str = ""
    seconds: float = 0.0
    """How long the request took (after waiting for a slot)."""
    size: int = 0
    frame: Frame | None = None
    """The payload boiled down to window rows (set on every successful scrape)."""

    @property
    def ok(self) -> bool:
        return self.error is None


class _Failure(Exception):
    def __init__(self, kind: ErrorKind, message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message


class _Response:
    __slots__ = ("body", "encoding", "reason", "status")

    def __init__(self, status: int, reason: str, body: bytes, encoding: bytes) -> None:
        self.status = status
        self.reason = reason
        self.body = body
        self.encoding = encoding


class _Conn(asyncio.Protocol):
    """One HTTP/1.1 connection: one request at a time, kept alive between them."""

    def __init__(self, loop: asyncio.AbstractEventLoop, key: tuple[str, int]) -> None:
        self.loop = loop
        self.key = key
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.waiter: asyncio.Future[_Response] | None = None
        self.buf = bytearray()
        self.max_bytes = 0
        self.head_end = -1
        self.status = 0
        self.reason = ""
        self.length: int | None = None
        self.chunked = False
        self.keep = False
        self.encoding = b""
        self.idle_since = 0.0
        self.uses = 0

    # ---- asyncio.Protocol ------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        if self.waiter is None:  # bytes nobody asked for: the connection is out of step
            self.abort()
            return
        self.buf += data
        try:
            self._progress(eof=False)
        except _Failure as exc:
            self._fail(exc)

    def eof_received(self) -> bool:
        if self.waiter is not None:
            try:
                self._progress(eof=True)
            except _Failure as exc:
                self._fail(exc)
        self.closed = True
        return False  # let the transport close itself

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.waiter is not None:
            self._fail(ConnectionResetError(str(exc) if exc else "connection closed early"))

    # ---- requests -------------------------------------------------------------------------

    def request(self, head: bytes, max_bytes: int) -> asyncio.Future[_Response]:
        assert self.transport is not None
        self.waiter = fut = self.loop.create_future()
        self.buf.clear()
        self.max_bytes = max_bytes
        self.head_end = -1
        self.uses += 1
        self.transport.write(head)
        return fut

    def abort(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.abort()

    def _fail(self, exc: BaseException) -> None:
        waiter, self.waiter = self.waiter, None
        self.abort()
        if waiter is not None and not waiter.done():
            waiter.set_exception(exc)

    def _done(self, body: bytes) -> None:
        waiter, self.waiter = self.waiter, None
        if not self.keep:
            self.abort()
        if waiter is not None and not waiter.done():
            waiter.set_result(_Response(self.status, self.reason, body, self.encoding))

    def _progress(self, *, eof: bool) -> None:
        buf = self.buf
        if self.head_end < 0:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                if len(buf) > _MAX_HEAD or eof:
                    raise _Failure(ErrorKind.CONNECTION, "malformed or incomplete HTTP response")
                return
            self._head(bytes(buf[:end]))
            self.head_end = end + 4
            if self.status != 200:
                self.keep = False
                self._done(b"")
                return
            if self.length is not None and self.length > self.max_bytes:
                raise _Failure(
                    ErrorKind.TOO_LARGE,
                    f"{self.length} bytes exceed the {self.max_bytes}-byte cap",
                )
        start = self.head_end
        if self.length is not None:
            if len(buf) - start >= self.length:
                if len(buf) - start > self.length:
                    self.keep = False  # more than announced: do not trust the connection
                self._done(bytes(buf[start : start + self.length]))
            elif eof:
                raise _Failure(ErrorKind.CONNECTION, "connection closed before the body ended")
            return
        if len(buf) - start > self.max_bytes + (self.max_bytes >> 4) + 4096:
            raise _Failure(ErrorKind.TOO_LARGE, f"body exceeds the {self.max_bytes}-byte cap")
        if self.chunked:
            body = _dechunk(buf, start)
            if body is not None:
                if len(body) > self.max_bytes:
                    raise _Failure(
                        ErrorKind.TOO_LARGE, f"body exceeds the {self.max_bytes}-byte cap"
                    )
                self._done(body)
            elif eof:
                raise _Failure(ErrorKind.CONNECTION, "connection closed before the body ended")
            return
        if eof:  # no length and not chunked: the body runs until the server closes
            if len(buf) - start > self.max_bytes:
                raise _Failure(ErrorKind.TOO_LARGE, f"body exceeds the {self.max_bytes}-byte cap")
            self.keep = False
            self._done(bytes(buf[start:]))

    def _head(self, head: bytes) -> None:
        lines = head.split(b"\r\n")
        parts = lines[0].split(None, 2)
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
            raise _Failure(ErrorKind.CONNECTION, f"not an HTTP response: {lines[0][:80]!r}")
        self.status = int(parts[1])
        self.reason = parts[2].decode("latin-1") if len(parts) > 2 else ""
        keep = parts[0] == b"HTTP/1.1"
        self.length = None
        self.chunked = False
        self.encoding = b""
        for line in lines[1:]:
            name, sep, value = line.partition(b":")
            if not sep:
                raise _Failure(ErrorKind.CONNECTION, f"malformed HTTP header: {line[:80]!r}")
            name = name.strip().lower()
            value = value.strip()
            if name == b"content-length":
                if not value.isdigit():
                    raise _Failure(ErrorKind.CONNECTION, f"bad Content-Length: {value[:40]!r}")
                self.length = int(value)
            elif name == b"transfer-encoding":
                self.chunked = value.lower().endswith(b"chunked")
            elif name == b"connection":
                keep = keep and b"close" not in value.lower()
            elif name == b"content-encoding":
                self.encoding = value.lower()
        if self.chunked:
            self.length = None
        self.keep = keep and (self.length is not None or self.chunked)


def _dechunk(buf: bytearray, pos: int) -> bytes | None:
    """The body of a complete chunked message starting at pos (None: not complete yet)."""
    out = bytearray()
    n = len(buf)
    while True:
        eol = buf.find(b"\r\n", pos)
        if eol < 0:
            return None
        size_text = bytes(buf[pos:eol]).split(b";", 1)[0].strip()
        try:
            size = int(size_text, 16)
        except ValueError:
            raise _Failure(ErrorKind.CONNECTION, f"bad chunk size {size_text[:20]!r}") from None
        pos = eol + 2
        if size == 0:
            # Trailers (if any) end with an empty line.
            end = buf.find(b"\r\n\r\n", eol) if buf[pos : pos + 2] != b"\r\n" else pos
            return bytes(out) if end >= 0 else None
        if pos + size + 2 > n:
            return None
        out += buf[pos : pos + size]
        pos += size + 2


def _decode_body(body: bytes, encoding: bytes, max_bytes: int) -> bytes:
    if not encoding or encoding == b"identity":
        return body
    if encoding not in (b"gzip", b"x-gzip", b"deflate"):
        raise _Failure(ErrorKind.CONNECTION, f"unsupported Content-Encoding {encoding!r}")
    # 47: gzip or zlib header, detected; a raw deflate stream is tried as well.
    for wbits in (47, -15):
        d = zlib.decompressobj(wbits)
        try:
            out = d.decompress(body, max_bytes + 1)
        except zlib.error:
            continue
        if len(out) > max_bytes:
            raise _Failure(ErrorKind.TOO_LARGE, f"body exceeds the {max_bytes}-byte cap")
        return out
    raise _Failure(ErrorKind.CONNECTION, "the compressed body does not decode")


@dataclass(frozen=True, slots=True)
class _Endpoint:
    key: tuple[str, int]
    head: bytes


def _endpoint(url: str) -> _Endpoint:
    parts = urlsplit(url)
    if parts.scheme != "http" or not parts.hostname:
        raise _Failure(ErrorKind.CONNECTION, f"unsupported URL {url!r} (plain http only)")
    try:
        port = parts.port or 80
    except ValueError as exc:
        raise _Failure(ErrorKind.CONNECTION, f"bad URL {url!r}: {exc}") from None
    path = parts.path or "/"
    if parts.query:
        path += "?" + parts.query
    host = parts.netloc.rsplit("@", 1)[-1]
    head = (
        f"GET {path} HTTP/1.1\r\nHost: {host}\r\nUser-Agent: {USER_AGENT}\r\n"
        f"Accept: {ACCEPT}\r\nAccept-Encoding: identity\r\n\r\n"
    ).encode("latin-1")
    return _Endpoint((parts.hostname, port), head)


def _default_idle_limit(concurrency: int) -> int:
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        soft = 65536
    return max(0, min(16384, soft // 2 - concurrency))


class Scraper:
    """Scrapes endpoints through one connection pool, at most `concurrency` at a time."""

    def __init__(
        self,
        *,
        concurrency: int = DEFAULT_CONCURRENCY,
        timeout: float = DEFAULT_TIMEOUT,
        max_bytes: int = DEFAULT_MAX_BYTES,
        wanted: frozenset[str] | None = NEEDED,
        clock: Callable[[], float] = time.time,
        idle_limit: int | None = None,
    ) -> None:
        self.concurrency = concurrency
        self.timeout = timeout
        self.max_bytes = max_bytes
        self.wanted = wanted
        """NEEDED (the default): results carry frames only; any other set: samples too."""
        self.idle_limit = _default_idle_limit(concurrency) if idle_limit is None else idle_limit
        """At most this many idle connections are kept alive (bounded by the fd limit)."""
        self._clock = clock
        self._sem: asyncio.Semaphore | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._idle: dict[tuple[str, int], list[_Conn]] = {}
        self._idle_count = 0
        self._swept = 0.0
        self._endpoints: dict[str, _Endpoint] = {}

    async def __aenter__(self) -> Scraper:
        self._ensure()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    def _ensure(self) -> asyncio.Semaphore:
        # Connections and the semaphore belong to one event loop: a new loop starts afresh.
        loop = asyncio.get_running_loop()
        if self._sem is None or loop is not self._loop:
            self._loop = loop
            self._sem = asyncio.Semaphore(self.concurrency)
            self._idle.clear()
            self._idle_count = 0
        return self._sem

    async def close(self) -> None:
        """Close the kept-alive connections (idempotent)."""
        for conns in self._idle.values():
            for conn in conns:
                conn.abort()
        self._idle.clear()
        self._idle_count = 0

    async def scrape_all(self, targets: Sequence[ScrapeTarget]) -> list[ScrapeResult]:
        """Scrape every target concurrently; results in the targets' order."""
        return list(await asyncio.gather(*(self.scrape(t) for t in targets)))

    async def scrape(self, target: ScrapeTarget) -> ScrapeResult:
        """Scrape one endpoint; never raises (except cancellation)."""
        sem = self._ensure()
        async with sem:
            start = time.monotonic()
            result = await self._fetch(target, start)
            result.seconds = time.monotonic() - start
            return result

    # ---- the connection pool -----------------------------------------------------------------

    def _take(self, key: tuple[str, int]) -> _Conn | None:
        conns = self._idle.get(key)
        while conns:
            conn = conns.pop()
            self._idle_count -= 1
            if not conn.closed:
                return conn
        return None

    def _give(self, conn: _Conn, now: float) -> None:
        if conn.closed or not conn.keep or self.idle_limit <= 0:
            conn.abort()
            return
        if now - self._swept > IDLE_SECONDS / 4:
            self._sweep(now)
        if self._idle_count >= self.idle_limit:
            self._evict()
        conn.idle_since = now
        self._idle.setdefault(conn.key, []).append(conn)
        self._idle_count += 1

    def _sweep(self, now: float) -> None:
        self._swept = now
        for key in list(self._idle):
            kept = []
            for conn in self._idle[key]:
                if conn.closed or now - conn.idle_since > IDLE_SECONDS:
                    conn.abort()
                else:
                    kept.append(conn)
            self._idle_count -= len(self._idle[key]) - len(kept)
            if kept:
                self._idle[key] = kept
            else:
                del self._idle[key]

    def _evict(self) -> None:
        # The pool is full: close the connection idle the longest (the front of some list).
        key = min(self._idle, key=lambda k: self._idle[k][0].idle_since)
        self._idle[key].pop(0).abort()
        self._idle_count -= 1
        if not self._idle[key]:
            del self._idle[key]

    async def _connect(self, key: tuple[str, int], deadline: float) -> _Conn:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout_at(loop.time() + (deadline - time.monotonic())):
                _, conn = await loop.create_connection(lambda: _Conn(loop, key), key[0], key[1])
        except ConnectionRefusedError as exc:
            raise _Failure(ErrorKind.REFUSED, str(exc)) from None
        except TimeoutError:
            raise
        except OSError as exc:
            raise _Failure(ErrorKind.CONNECTION, str(exc)) from None
        return conn

    async def _exchange(self, ep: _Endpoint, deadline: float) -> _Response:
        loop = asyncio.get_running_loop()
        for attempt in (0, 1):
            conn = self._take(ep.key) if attempt == 0 else None
            reused = conn is not None
            if conn is None:
                conn = await self._connect(ep.key, deadline)
            fut = conn.request(ep.head, self.max_bytes)
            timer = loop.call_at(loop.time() + (deadline - time.monotonic()), _expire, conn, fut)
            try:
                resp = await fut
            except TimeoutError:  # an OSError too, but not a connection failure
                conn.abort()
                raise
            except (ConnectionError, OSError) as exc:
                # A kept-alive connection the server closed meanwhile: once more, afresh.
                if reused and not conn.buf:
                    continue
                raise _Failure(ErrorKind.CONNECTION, f"{type(exc).__name__}: {exc}") from None
            except BaseException:
                conn.abort()
                raise
            finally:
                timer.cancel()
            self._give(conn, time.monotonic())
            return resp
        raise AssertionError("unreachable")

    async def _fetch(self, target: ScrapeTarget, start: float) -> ScrapeResult:
        def fail(kind: ErrorKind, message: str, size: int = 0) -> ScrapeResult:
            return ScrapeResult(target, self._clock(), error=kind, message=message, size=size)

        try:
            ep = self._endpoints.get(target.url)
            if ep is None:
                ep = _endpoint(target.url)
                if len(self._endpoints) > 65536:
                    self._endpoints.clear()
                self._endpoints[target.url] = ep
            resp = await self._exchange(ep, start + self.timeout)
            if resp.status != 200:
                return fail(ErrorKind.HTTP_STATUS, f"HTTP {resp.status} {resp.reason}")
            body = _decode_body(resp.body, resp.encoding, self.max_bytes)
        except TimeoutError:
            return fail(ErrorKind.TIMEOUT, f"no complete response within {self.timeout:g}s")
        except _Failure as exc:
            return fail(exc.kind, exc.message)
        t = self._clock()
        samples: list[expfmt.Sample] = []
        try:
            if self.wanted is NEEDED:
                fr = frame_payload(body, t)
            else:
                samples = expfmt.parse(body, self.wanted)
                fr = frame(samples, t)
        except expfmt.ParseError as exc:
            return ScrapeResult(target, t, error=ErrorKind.PARSE, message=str(exc), size=len(body))
        missing = _missing_rank(target, fr)
        if missing:
            return ScrapeResult(
                target, t, error=ErrorKind.MISSING_RANK, message=missing, size=len(body)
            )
        return ScrapeResult(target, t, samples=samples, size=len(body), frame=fr)


def _expire(conn: _Conn, fut: asyncio.Future[_Response]) -> None:
    if not fut.done():
        conn.waiter = None
        conn.abort()
        fut.set_exception(TimeoutError())


def _missing_rank(target: ScrapeTarget, fr: Frame) -> str:
    """Why the payload is not the expected rank's ("" when it is)."""
    steps = fr.steps_local_ranks
    if not steps:
        return f"no {contract.STEPS.name} series: not a gpujob trainer endpoint"
    if target.local_rank >= 0:
        want = str(target.local_rank)
        if want not in steps:
            return (
                f"expected local_rank {want}, the endpoint exports {','.join(sorted(set(steps)))}"
            )
    return ""
