"""The scraper's small HTTP/1.1 client: one kept-alive connection, a bounded read, decoding.

A small HTTP/1.1 client on asyncio protocols rather than a general library: scraping
thousands of endpoints every 15 s is the operator's main CPU cost, and a scrape is always
the same plain GET. A `Conn` carries one request at a time and stays alive between them (as
Prometheus does); the request asks for an uncompressed body (`Accept-Encoding: identity`;
gzip or deflate are still decoded if sent, `decode_body`), and the response is read with
Content-Length, chunked or until-close framing, never past the byte cap. The decoding runs on
the event loop, so what one response may cost is bounded by what arrives, not by what it
decodes to: at most `MAX_HEADERS` header lines, `MAX_CHUNKS` chunks and a wire-byte cap
(framing, extensions and trailers included); a body of 1-byte chunks is refused after the
chunk cap instead of costing seconds of the operator's CPU. Every failure is a `Failure`
carrying the `ErrorKind` the scrape result reports; endpoint-supplied words in its message
are clipped (`ENDPOINT_TEXT_MAX`). The pool of kept-alive connections and the deadlines
belong to the `scraper.Scraper`.
"""

from __future__ import annotations

import asyncio
import zlib
from dataclasses import dataclass
from typing import Final
from urllib.parse import urlsplit

from gpujob_operator.api.conditions import clip
from gpujob_operator.monitoring.scrape.result import ENDPOINT_TEXT_MAX, ErrorKind

ACCEPT: Final = "text/plain;version=0.0.4;q=1,*/*;q=0.1"
USER_AGENT: Final = "gpujob-operator"
MAX_CHUNKS: Final = 4096
"""Chunks of one chunked body. Each costs ~1 us of Python on the event loop whatever its size,
so this bounds a hostile body of 1-byte chunks to ~4 ms per scrape (uncapped, 4 MiB of them
cost ~4-5 s). Honest servers send far fewer: Go's net/http writes small writes through a
2 KiB buffer (`bufferBeforeChunkingSize`), ~2048 chunks for a body at the 4 MiB byte cap;
Python's servers one per write (one per payload or metric family). 4096 is twice Go's worst
case and allows one chunk per line of a payload of up to 4096 lines (a rank's has ~100-600)."""
MAX_HEADERS: Final = 100
"""Header lines of one response (http.client's limit); a scrape's answer has a handful."""
_MAX_HEAD: Final = 65536
_MAX_LINE: Final = 8192
"""Bytes of one header line (what common servers accept; the status line has the head's cap,
its reason phrase is clipped)."""
_MAX_CHUNK_LINE: Final = 4096
_CHUNK_FRAMING: Final = 32
"""Wire bytes allowed per chunk beyond its data (size line, CRLFs, a short extension)."""
# States of the chunked-body decoder.
_SIZE, _DATA, _DATA_END, _TRAILER = 0, 1, 2, 3


class Failure(Exception):
    """Why a request gave no payload: its `ErrorKind`, words, and the bytes thrown away."""

    def __init__(self, kind: ErrorKind, message: str, size: int = 0) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.size = size
        """Bytes received and thrown away."""


class Response:
    """A complete response: status, reason, body (still encoded) and its Content-Encoding."""

    __slots__ = ("body", "encoding", "reason", "status")

    def __init__(self, status: int, reason: str, body: bytes, encoding: bytes) -> None:
        self.status = status
        self.reason = reason
        self.body = body
        self.encoding = encoding


class Conn(asyncio.Protocol):
    """One HTTP/1.1 connection: one request at a time, kept alive between them."""

    def __init__(self, loop: asyncio.AbstractEventLoop, key: tuple[str, int]) -> None:
        self.loop = loop
        self.key = key
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.waiter: asyncio.Future[Response] | None = None
        self._begin(0, 0)
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
        except Failure as exc:
            self._fail(exc)

    def eof_received(self) -> bool:
        if self.waiter is not None:
            try:
                self._progress(eof=True)
            except Failure as exc:
                self._fail(exc)
        self.closed = True
        return False  # let the transport close itself

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.waiter is not None:
            self._fail(ConnectionResetError(str(exc) if exc else "connection closed early"))

    # ---- requests -------------------------------------------------------------------------

    def request(
        self, head: bytes, max_bytes: int, max_chunks: int = MAX_CHUNKS
    ) -> asyncio.Future[Response]:
        assert self.transport is not None
        self.waiter = fut = self.loop.create_future()
        self._begin(max_bytes, max_chunks)
        self.uses += 1
        self.transport.write(head)
        return fut

    def _begin(self, max_bytes: int, max_chunks: int) -> None:
        """The parser's state at the start of a response."""
        self.buf = bytearray()
        self.body = bytearray()
        """The decoded body of a chunked response so far."""
        self.max_bytes = max_bytes
        self.max_chunks = max_chunks
        self.max_wire = wire_cap(max_bytes, max_chunks)
        """Bytes a chunked response may take on the wire, head and framing included."""
        self.chunks = 0
        """Chunks with data decoded so far (the last, empty chunk is not one)."""
        self.head_end = -1
        self.scanned = 0
        """Where to resume the search for the end of the head."""
        self.chunk_state = _SIZE
        self.chunk_left = 0
        self.trailer_bytes = 0
        self.received = 0
        """Bytes received for the current request (for the dropped-bytes count)."""

    def abort(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.abort()

    def _fail(self, exc: BaseException) -> None:
        if isinstance(exc, Failure):
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
            waiter.set_result(Response(self.status, self.reason, body, self.encoding))

    def _progress(self, *, eof: bool) -> None:
        # Linear in the bytes received, however they are split: the head is searched only in
        # what arrived since the last look, and a chunked body is decoded as it arrives.
        buf = self.buf
        if self.head_end < 0:
            end = buf.find(b"\r\n\r\n", self.scanned)
            if end < 0 or end > _MAX_HEAD:
                if len(buf) > _MAX_HEAD:
                    raise Failure(ErrorKind.CONNECTION, f"the HTTP head exceeds {_MAX_HEAD} bytes")
                if eof:
                    raise Failure(ErrorKind.CONNECTION, "malformed or incomplete HTTP response")
                self.scanned = max(0, len(buf) - 3)
                return
            self._head(bytes(buf[:end]))
            self.head_end = end + 4
            if self.status != 200:
                self.keep = False
                self._done(b"")
                return
            if self.length is not None and self.length > self.max_bytes:
                raise Failure(
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
                raise Failure(ErrorKind.CONNECTION, "connection closed before the body ended")
            return
        if self.chunked:
            if self.received > self.max_wire:  # checked before decoding what just came
                raise Failure(
                    ErrorKind.TOO_LARGE,
                    f"the chunked response exceeds the {self.max_wire}-byte cap on the wire "
                    f"(a {self.max_bytes}-byte body and its framing)",
                )
            if self._dechunk():
                self._done(bytes(self.body))
            elif eof:
                raise Failure(ErrorKind.CONNECTION, "connection closed before the body ended")
            return
        if len(buf) - start > self.max_bytes:
            raise Failure(ErrorKind.TOO_LARGE, f"body exceeds the {self.max_bytes}-byte cap")
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
                    raise Failure(
                        ErrorKind.TOO_LARGE, f"body exceeds the {self.max_bytes}-byte cap"
                    )
                if self.chunk_left == 0:
                    self.chunk_state = _DATA_END
                continue
            if state == _DATA_END:
                if n - pos < 2:
                    break
                if buf[pos : pos + 2] != b"\r\n":
                    raise Failure(ErrorKind.CONNECTION, "chunk data not followed by CRLF")
                pos += 2
                self.chunk_state = _SIZE
                continue
            eol = buf.find(b"\r\n", pos)
            if eol < 0:
                if n - pos > _MAX_CHUNK_LINE:
                    raise Failure(ErrorKind.CONNECTION, "chunk-size or trailer line too long")
                break
            line = bytes(buf[pos:eol])
            pos = eol + 2
            if state == _TRAILER:
                self.trailer_bytes += len(line) + 2
                if self.trailer_bytes > _MAX_HEAD:
                    raise Failure(ErrorKind.CONNECTION, "chunked trailers too long")
                if not line:
                    done = True
                    break
                continue
            size_text = line.split(b";", 1)[0].strip()
            if not size_text or len(size_text) > 16:
                raise Failure(ErrorKind.CONNECTION, f"bad chunk size {size_text[:20]!r}")
            try:
                size = int(size_text, 16)
            except ValueError:
                raise Failure(ErrorKind.CONNECTION, f"bad chunk size {size_text[:20]!r}") from None
            if size == 0:
                self.chunk_state = _TRAILER
            elif len(body) + size > self.max_bytes:
                raise Failure(ErrorKind.TOO_LARGE, f"body exceeds the {self.max_bytes}-byte cap")
            elif self.chunks >= self.max_chunks:
                raise Failure(
                    ErrorKind.TOO_MANY_CHUNKS,
                    f"the chunked body exceeds the cap of {self.max_chunks} chunks "
                    f"({len(body)} bytes in the first {self.chunks})",
                )
            else:
                self.chunks += 1
                self.chunk_state = _DATA
                self.chunk_left = size
        if done and pos < n:
            self.keep = False  # bytes after the message: do not trust the connection
        del buf[:pos]
        return done

    def _head(self, head: bytes) -> None:
        lines = head.split(b"\r\n", MAX_HEADERS + 1)
        if len(lines) > MAX_HEADERS + 1:
            raise Failure(ErrorKind.CONNECTION, f"more than {MAX_HEADERS} HTTP header lines")
        if len(lines) > 1 and max(map(len, lines[1:])) > _MAX_LINE:
            raise Failure(ErrorKind.CONNECTION, f"an HTTP header line exceeds {_MAX_LINE} bytes")
        parts = lines[0].split(None, 2)
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
            raise Failure(ErrorKind.CONNECTION, f"not an HTTP response: {lines[0][:80]!r}")
        self.status = int(parts[1])
        # The reason phrase is the endpoint's words, quoted in the job's status: clipped.
        self.reason = clip(parts[2].decode("latin-1"), ENDPOINT_TEXT_MAX) if len(parts) > 2 else ""
        keep = parts[0] == b"HTTP/1.1"
        self.length = None
        self.chunked = False
        self.encoding = b""
        for line in lines[1:]:
            name, sep, value = line.partition(b":")
            if not sep:
                raise Failure(ErrorKind.CONNECTION, f"malformed HTTP header: {line[:80]!r}")
            name = name.strip().lower()
            value = value.strip()
            if name == b"content-length":
                if not value.isdigit():
                    raise Failure(ErrorKind.CONNECTION, f"bad Content-Length: {value[:40]!r}")
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


def decode_body(body: bytes, encoding: bytes, max_bytes: int) -> bytes:
    """The body without its Content-Encoding, at most `max_bytes` once decoded."""
    if not encoding or encoding == b"identity":
        return body
    if encoding not in (b"gzip", b"x-gzip", b"deflate"):
        raise Failure(ErrorKind.CONNECTION, f"unsupported Content-Encoding {encoding[:40]!r}")
    # 47: gzip or zlib header, detected; a raw deflate stream is tried as well.
    for wbits in (47, -15):
        d = zlib.decompressobj(wbits)
        try:
            out = d.decompress(body, max_bytes + 1)
        except zlib.error:
            continue
        if len(out) > max_bytes:
            raise Failure(
                ErrorKind.TOO_LARGE,
                f"the {encoding.decode()} body decodes to more than the {max_bytes}-byte cap",
                len(body),
            )
        return out
    raise Failure(ErrorKind.CONNECTION, "the compressed body does not decode")


def wire_cap(max_bytes: int, max_chunks: int) -> int:
    """Bytes a chunked response may take on the wire: its head, a `max_bytes` body in at
    most `max_chunks` chunks with their framing, and its trailers."""
    return _MAX_HEAD + max_bytes + max_chunks * _CHUNK_FRAMING + _MAX_HEAD


@dataclass(frozen=True, slots=True)
class Endpoint:
    """Where to connect, (host, port), and the request's bytes for one URL."""

    key: tuple[str, int]
    head: bytes


def endpoint(url: str, token: str = "") -> Endpoint:
    """The endpoint of a plain http:// URL (a Failure for any other); with ``token``, the
    request presents it as ``Authorization: Bearer``."""
    parts = urlsplit(url)
    if parts.scheme != "http" or not parts.hostname:
        raise Failure(ErrorKind.CONNECTION, f"unsupported URL {url!r} (plain http only)")
    try:
        port = parts.port or 80
    except ValueError as exc:
        raise Failure(ErrorKind.CONNECTION, f"bad URL {url!r}: {exc}") from None
    path = parts.path or "/"
    if parts.query:
        path += "?" + parts.query
    host = parts.netloc.rsplit("@", 1)[-1]
    if any(ch in token for ch in "\r\n"):
        raise Failure(ErrorKind.CONNECTION, "the endpoint token holds a line break")
    auth = f"Authorization: Bearer {token}\r\n" if token else ""
    head = (
        f"GET {path} HTTP/1.1\r\nHost: {host}\r\nUser-Agent: {USER_AGENT}\r\n"
        f"Accept: {ACCEPT}\r\nAccept-Encoding: identity\r\n{auth}\r\n"
    ).encode("latin-1")
    return Endpoint((parts.hostname, port), head)


def expire(conn: Conn, fut: asyncio.Future[Response]) -> None:
    """The request's deadline passed: abort the connection, fail the waiting request."""
    if not fut.done():
        conn.waiter = None
        conn.abort()
        fut.set_exception(TimeoutError())
