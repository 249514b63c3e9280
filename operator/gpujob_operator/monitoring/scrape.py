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
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from enum import StrEnum
from types import TracebackType
from typing import Final
from urllib.parse import urlsplit

from gpujob_operator.monitoring import expfmt, guard
from gpujob_operator.monitoring.expfmt import common_prefix
from gpujob_operator.monitoring.window import NEEDED, Frame, frame, frame_payload
from gpujob_trainer import contract

DEFAULT_CONCURRENCY: Final = 256
DEFAULT_TIMEOUT: Final = 5.0
DEFAULT_MAX_BYTES: Final = 4 * 2**20
DEFAULT_MAX_LINES: Final = 100_000
"""Lines per payload (a rank's is ~100-300, a node's local rank 0 with 16 GPUs ~600)."""
DEFAULT_MAX_SAMPLES: Final = 10_000
"""Lines of the metrics contract per payload."""
INLINE_PARSE_BYTES: Final = 256 * 1024
"""Larger payloads are parsed off the event loop."""
ACCEPT: Final = "text/plain;version=0.0.4;q=1,*/*;q=0.1"
USER_AGENT: Final = "gpujob-operator"
IDLE_SECONDS: Final = 60.0
"""Kept-alive connections unused this long are closed (longer than a scrape interval)."""
_MAX_HEAD: Final = 65536
_MAX_CHUNK_LINE: Final = 4096
# States of the chunked-body decoder.
_SIZE, _DATA, _DATA_END, _TRAILER = 0, 1, 2, 3


class ErrorKind(StrEnum):
    """Why an endpoint gave no samples."""

    REFUSED = "refused"
    TIMEOUT = "timeout"
    HTTP_STATUS = "http_status"
    PARSE = "parse"
    TOO_LARGE = "too_large"
    MISSING_RANK = "missing_rank"
    CONNECTION = "connection"
    NO_SLOT = "no_slot"
    """The operator's scrape slots stayed busy (with other slow endpoints) past the timeout."""


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
    """Bytes of the body (on a failure: the bytes received and thrown away)."""
    frame: Frame | None = None
    """The payload boiled down to window rows (set on every successful scrape)."""
    dropped_series: int = 0
    """Series the payload carried that this target may not speak for (see `guard`)."""
    dropped_values: int = 0
    """Non-finite or implausible values turned into "absent"."""
    notes: tuple[tuple[str, str], ...] = ()
    """(kind, words) of what was dropped (`guard.Admitted.notes`)."""

    @property
    def ok(self) -> bool:
        return self.error is None


class _Failure(Exception):
    def __init__(self, kind: ErrorKind, message: str, size: int = 0) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.size = size
        """Bytes received and thrown away."""


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
        self.body = bytearray()
        """The decoded body of a chunked response so far."""
        self.max_bytes = 0
        self.head_end = -1
        self.scanned = 0
        """Where to resume the search for the end of the head."""
        self.chunk_state = _SIZE
        self.chunk_left = 0
        self.trailer_bytes = 0
        self.received = 0
        """Bytes received for the current request (for the dropped-bytes count)."""
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
        self.received += len(data)
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
        self.body = bytearray()
        self.max_bytes = max_bytes
        self.head_end = -1
        self.scanned = 0
        self.chunk_state = _SIZE
        self.chunk_left = 0
        self.trailer_bytes = 0
        self.received = 0
        self.uses += 1
        self.transport.write(head)
        return fut

    def abort(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.abort()

    def _fail(self, exc: BaseException) -> None:
        if isinstance(exc, _Failure):
            exc.size = max(exc.size, self.received)
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
        # Linear in the bytes received, however they are split: the head is searched only in
        # what arrived since the last look, and a chunked body is decoded as it arrives.
        buf = self.buf
        if self.head_end < 0:
            end = buf.find(b"\r\n\r\n", self.scanned)
            if end < 0:
                if len(buf) > _MAX_HEAD or eof:
                    raise _Failure(ErrorKind.CONNECTION, "malformed or incomplete HTTP response")
                self.scanned = max(0, len(buf) - 3)
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
            if self.chunked:
                del buf[: self.head_end]
                self.head_end = 0
        start = self.head_end
        if self.length is not None:
            if len(buf) - start >= self.length:
                if len(buf) - start > self.length:
                    self.keep = False  # more than announced: do not trust the connection
                self._done(bytes(buf[start : start + self.length]))
            elif eof:
                raise _Failure(ErrorKind.CONNECTION, "connection closed before the body ended")
            return
        if self.chunked:
            if self._dechunk():
                self._done(bytes(self.body))
            elif eof:
                raise _Failure(ErrorKind.CONNECTION, "connection closed before the body ended")
            return
        if len(buf) - start > self.max_bytes:
            raise _Failure(ErrorKind.TOO_LARGE, f"body exceeds the {self.max_bytes}-byte cap")
        if eof:  # no length and not chunked: the body runs until the server closes
            self.keep = False
            self._done(bytes(buf[start:]))

    def _dechunk(self) -> bool:
        """Decode the chunked body received so far into `body`, consuming `buf`; True at its end.

        Only an incomplete chunk-size line, chunk end or trailer line stays in `buf`, so
        every byte is looked at once (a body trickled in tiny chunks costs what one costs).
        """
        buf, body = self.buf, self.body
        pos, n = 0, len(buf)
        done = False
        while pos < n:
            state = self.chunk_state
            if state == _DATA:
                take = min(self.chunk_left, n - pos)
                body += buf[pos : pos + take]
                pos += take
                self.chunk_left -= take
                if len(body) > self.max_bytes:
                    raise _Failure(
                        ErrorKind.TOO_LARGE, f"body exceeds the {self.max_bytes}-byte cap"
                    )
                if self.chunk_left == 0:
                    self.chunk_state = _DATA_END
                continue
            if state == _DATA_END:
                if n - pos < 2:
                    break
                if buf[pos : pos + 2] != b"\r\n":
                    raise _Failure(ErrorKind.CONNECTION, "chunk data not followed by CRLF")
                pos += 2
                self.chunk_state = _SIZE
                continue
            eol = buf.find(b"\r\n", pos)
            if eol < 0:
                if n - pos > _MAX_CHUNK_LINE:
                    raise _Failure(ErrorKind.CONNECTION, "chunk-size or trailer line too long")
                break
            line = bytes(buf[pos:eol])
            pos = eol + 2
            if state == _TRAILER:
                self.trailer_bytes += len(line) + 2
                if self.trailer_bytes > _MAX_HEAD:
                    raise _Failure(ErrorKind.CONNECTION, "chunked trailers too long")
                if not line:
                    done = True
                    break
                continue
            size_text = line.split(b";", 1)[0].strip()
            if not size_text or len(size_text) > 16:
                raise _Failure(ErrorKind.CONNECTION, f"bad chunk size {size_text[:20]!r}")
            try:
                size = int(size_text, 16)
            except ValueError:
                raise _Failure(ErrorKind.CONNECTION, f"bad chunk size {size_text[:20]!r}") from None
            if size == 0:
                self.chunk_state = _TRAILER
            elif len(body) + size > self.max_bytes:
                raise _Failure(ErrorKind.TOO_LARGE, f"body exceeds the {self.max_bytes}-byte cap")
            else:
                self.chunk_state = _DATA
                self.chunk_left = size
        if done and pos < n:
            self.keep = False  # bytes after the message: do not trust the connection
        del buf[:pos]
        return done

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
            raise _Failure(
                ErrorKind.TOO_LARGE,
                f"the {encoding.decode()} body decodes to more than the {max_bytes}-byte cap",
                len(body),
            )
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
        max_lines: int = DEFAULT_MAX_LINES,
        max_samples: int = DEFAULT_MAX_SAMPLES,
        per_call: int | None = None,
        wanted: frozenset[str] | None = NEEDED,
        clock: Callable[[], float] = time.time,
        idle_limit: int | None = None,
    ) -> None:
        self.concurrency = concurrency
        self.timeout = timeout
        self.max_bytes = max_bytes
        self.max_lines = max_lines
        self.max_samples = max_samples
        if per_call is None:
            per_call = max(1, min(concurrency // 2, max(4, concurrency // 4)))
        self.per_call = per_call
        """Slots one `scrape_all` call (one job) may hold at once."""
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
        """Scrape every target concurrently; results in the targets' order.

        The whole call ends within `timeout` (waiting for slots included), and one call holds
        at most `per_call` of the shared slots: a job whose endpoints never answer neither
        waits longer than that nor takes every slot from the other jobs.
        """
        deadline = time.monotonic() + self.timeout
        share = asyncio.Semaphore(self.per_call) if len(targets) > self.per_call else None
        return list(await asyncio.gather(*(self._scrape(t, deadline, share) for t in targets)))

    async def scrape(self, target: ScrapeTarget) -> ScrapeResult:
        """Scrape one endpoint within `timeout`; never raises (except cancellation)."""
        return await self._scrape(target, time.monotonic() + self.timeout, None)

    async def _scrape(
        self, target: ScrapeTarget, deadline: float, share: asyncio.Semaphore | None
    ) -> ScrapeResult:
        sem = self._ensure()
        loop = asyncio.get_running_loop()
        start = time.monotonic()
        held: list[asyncio.Semaphore] = []
        try:
            try:
                if (share is None or not share.locked()) and not sem.locked():
                    for s in (share, sem):  # free slots: taken at once, no timer needed
                        if s is not None:
                            await s.acquire()
                            held.append(s)
                else:
                    async with asyncio.timeout_at(loop.time() + (deadline - start)):
                        for s in (share, sem):
                            if s is not None:
                                await s.acquire()
                                held.append(s)
            except TimeoutError:
                waited = time.monotonic() - start
                return ScrapeResult(
                    target,
                    self._clock(),
                    error=ErrorKind.NO_SLOT,
                    message=f"no free scrape slot within {waited:.3g}s: all "
                    f"{self.concurrency} slots are busy with slow endpoints",
                    seconds=waited,
                )
            begun = time.monotonic()
            result = await self._fetch(target, deadline)
            result.seconds = time.monotonic() - begun
            return result
        finally:
            for s in held:
                s.release()

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
                if reused and not conn.received:
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

    async def _fetch(self, target: ScrapeTarget, deadline: float) -> ScrapeResult:
        def fail(kind: ErrorKind, message: str, size: int = 0) -> ScrapeResult:
            return ScrapeResult(target, self._clock(), error=kind, message=message, size=size)

        try:
            ep = self._endpoints.get(target.url)
            if ep is None:
                ep = _endpoint(target.url)
                if len(self._endpoints) > 65536:
                    self._endpoints.clear()
                self._endpoints[target.url] = ep
            resp = await self._exchange(ep, deadline)
            if resp.status != 200:
                return fail(ErrorKind.HTTP_STATUS, f"HTTP {resp.status} {resp.reason}")
            body = _decode_body(resp.body, resp.encoding, self.max_bytes)
            _check_shape(body, self.max_lines, self.max_samples)
        except TimeoutError:
            return fail(ErrorKind.TIMEOUT, f"no complete response within {self.timeout:g}s")
        except _Failure as exc:
            return fail(exc.kind, exc.message, exc.size)
        t = self._clock()
        samples: list[expfmt.Sample] = []
        try:
            if len(body) > INLINE_PARSE_BYTES:
                # Parsed on one thread of its own: the event loop (other jobs, watches, the
                # health probe) keeps running; the caps above bound the work.
                loop = asyncio.get_running_loop()
                samples, fr = await loop.run_in_executor(_parser(), self._parse, body, t)
            else:
                samples, fr = self._parse(body, t)
        except expfmt.ParseError as exc:
            return ScrapeResult(target, t, error=ErrorKind.PARSE, message=str(exc), size=len(body))
        missing = _missing_rank(target, fr)
        if missing:
            return ScrapeResult(
                target, t, error=ErrorKind.MISSING_RANK, message=missing, size=len(body)
            )
        adm = guard.admit(fr, target.rank, t)
        if target.rank is not None and target.rank not in adm.frame.ranks:
            found = ",".join(str(r) for r in sorted(fr.ranks)[:5]) or "none"
            return ScrapeResult(
                target,
                t,
                error=ErrorKind.MISSING_RANK,
                message=f"expected rank {target.rank}, the endpoint exports rank(s) {found}",
                size=len(body),
                dropped_series=adm.dropped_series,
            )
        return ScrapeResult(
            target,
            t,
            samples=samples,
            size=len(body),
            frame=adm.frame,
            dropped_series=adm.dropped_series,
            dropped_values=adm.dropped_values,
            notes=adm.notes,
        )

    def _parse(self, body: bytes, t: float) -> tuple[list[expfmt.Sample], Frame]:
        if self.wanted is NEEDED:
            return [], frame_payload(body, t)
        samples = expfmt.parse(body, self.wanted)
        return samples, frame(samples, t)


def _expire(conn: _Conn, fut: asyncio.Future[_Response]) -> None:
    if not fut.done():
        conn.waiter = None
        conn.abort()
        fut.set_exception(TimeoutError())


_PARSER: ThreadPoolExecutor | None = None


def _parser() -> ThreadPoolExecutor:
    """One thread for large payloads (shared by every scraper; API calls use others)."""
    global _PARSER
    if _PARSER is None:
        _PARSER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="gpujob-parse")
    return _PARSER


_OURS_AT_LINE: Final = b"\n" + common_prefix(NEEDED).encode()


def _check_shape(body: bytes, max_lines: int, max_samples: int) -> None:
    """Refuse a payload with more lines, or more lines of the contract, than any trainer's.

    Counted at C speed before anything is parsed: parsing costs per line, so these caps
    (with the byte cap) bound the CPU one scrape can take.
    """
    lines = body.count(b"\n")
    if lines > max_lines:
        raise _Failure(
            ErrorKind.TOO_LARGE, f"{lines} lines exceed the cap of {max_lines}", len(body)
        )
    ours = body.count(_OURS_AT_LINE) + body.startswith(_OURS_AT_LINE[1:])
    if ours > max_samples:
        raise _Failure(
            ErrorKind.TOO_LARGE,
            f"{ours} gpujob samples exceed the cap of {max_samples} per endpoint",
            len(body),
        )


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
