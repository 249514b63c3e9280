"""Concurrent scraping of the ranks' /metrics (the I/O edge of the monitoring path).

One `Scraper` serves every job of the operator: one pool of kept-alive connections, one
semaphore bounding scrapes in flight across all jobs, a timeout per request and a cap on the
response size, so a thousand jobs with dead or slow endpoints cannot exhaust sockets or
memory. Each endpoint's outcome is a `ScrapeResult`; no endpoint's failure touches another.

The requests go through the small HTTP/1.1 client of `httpclient`; the payload is checked
against line and sample caps, then turned straight into a window frame
(`frame.frame_payload`), without per-sample objects, and admitted by `guard`.
"""

from __future__ import annotations

import asyncio
import resource
import time
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from types import TracebackType
from typing import Any, Final

from gpujob_operator.api.conditions import clip
from gpujob_operator.monitoring.scrape import budget, expfmt, guard
from gpujob_operator.monitoring.scrape.expfmt import common_prefix
from gpujob_operator.monitoring.scrape.frame import NEEDED, Frame, frame, frame_payload
from gpujob_operator.monitoring.scrape.httpclient import (
    MAX_CHUNKS,
    Conn,
    Endpoint,
    Failure,
    Response,
    decode_body,
    endpoint,
    expire,
)
from gpujob_operator.monitoring.scrape.result import (
    ENDPOINT_TEXT_MAX,
    ErrorKind,
    ScrapeResult,
    ScrapeTarget,
)
from gpujob_trainer import contract

Fetch = Callable[[ScrapeTarget, float], Awaitable[ScrapeResult]]
"""What a slot does with a target before its deadline (default: `Scraper._fetch`)."""

DEFAULT_CONCURRENCY: Final = 256
DEFAULT_TIMEOUT: Final = 5.0
DEFAULT_MAX_BYTES: Final = 4 * 2**20
DEFAULT_MAX_LINES: Final = 100_000
"""Lines per payload (a rank's is ~100-300, a node's local rank 0 with 16 GPUs ~600)."""
DEFAULT_MAX_SAMPLES: Final = 10_000
"""Lines of the metrics contract per payload."""
NOT_PROMETHEUS: Final = "the endpoint's reply is not Prometheus text"
"""A payload the parser refused, in a fixed phrase: the body itself is never quoted (its
words would reach the job's status, and on the host network it may be any node service)."""
INLINE_PARSE_BYTES: Final = 256 * 1024
"""Larger payloads are parsed off the event loop."""
IDLE_SECONDS: Final = 60.0
"""Kept-alive connections unused this long are closed (longer than a scrape interval)."""
FETCH_SECONDS_PER_ROUND: Final = 0.25
"""What :meth:`Scraper.fetch_all` adds to its deadline per round of its slots beyond the first."""
FETCH_MAX_SECONDS: Final = 60.0
"""The longest :meth:`Scraper.fetch_all` call, however many endpoints it asks (plus, with a
digest, DIGEST_SECONDS_PER_TARGET a target)."""
DIGEST_SECONDS_PER_TARGET: Final = 0.015
"""What a digesting :meth:`Scraper.fetch_all` adds to its deadline per target: the parse of a
body at the evidence's 64 KiB cap takes ~13 ms (2,048 ranks: +31 s)."""


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
        max_chunks: int = MAX_CHUNKS,
        per_call: int | None = None,
        wanted: frozenset[str] | None = NEEDED,
        clock: Callable[[], float] = time.time,
        idle_limit: int | None = None,
        cpu_cores: float = budget.DEFAULT_CORES,
    ) -> None:
        self.concurrency = concurrency
        self.budget = budget.ScrapeBudget(cpu_cores)
        """The scrape CPU every job shares (`budget.py`): the metrics tasks pace by it."""
        self.timeout = timeout
        self.max_bytes = max_bytes
        self.max_lines = max_lines
        self.max_samples = max_samples
        self.max_chunks = max_chunks
        """Chunks of one chunked body (the CPU a body of tiny chunks may cost)."""
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
        self._idle: dict[tuple[str, int], list[Conn]] = {}
        self._idle_count = 0
        self._swept = 0.0
        self._endpoints: dict[tuple[str, str], Endpoint] = {}

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
        return await self._each(targets, time.monotonic() + self.timeout)

    async def scrape(self, target: ScrapeTarget) -> ScrapeResult:
        """Scrape one endpoint within `timeout`; never raises (except cancellation)."""
        return await self._scrape(target, time.monotonic() + self.timeout)

    def fetch_seconds(self, targets: int) -> float:
        """How long :meth:`fetch_all` may take for ``targets`` endpoints: the timeout, and
        FETCH_SECONDS_PER_ROUND more for each round of this call's share of the slots, up to
        FETCH_MAX_SECONDS (each endpoint still gets at most the timeout)."""
        rounds = -(-targets // max(1, min(self.per_call, self.concurrency)))
        return min(FETCH_MAX_SECONDS, self.timeout + FETCH_SECONDS_PER_ROUND * max(0, rounds - 1))

    async def fetch_all(
        self,
        targets: Sequence[ScrapeTarget],
        max_bytes: int,
        digest: Callable[[int, ScrapeTarget, bytes], Any] | None = None,
    ) -> list[tuple[Any, str | None, str]]:
        """Each target's raw body, or None with the error kind and message: the scrape's
        slots, timeout and pool, with its own byte cap (the hang evidence, which is not
        exposition text). The call's deadline grows with the targets
        (:meth:`fetch_seconds`): 16,384 ranks through 16 slots are many rounds, and a rank
        never asked for want of a slot must not read as one that did not answer.

        `digest(position, target, body)`: what to keep of each body instead of the body,
        run as it arrives, on the event loop (a body is at most `max_bytes`, and a worker
        thread per body made every rank wait on the GIL convoy of a busy loop: at 4,096 ranks
        a third of them were never asked within the deadline), so no body outlives its own
        fetch and thousands of ranks' evidence is never all in memory. The deadline then
        also allows DIGEST_SECONDS_PER_TARGET a target for the operator's own work."""
        seconds = self.fetch_seconds(len(targets))
        if digest is not None:
            seconds += DIGEST_SECONDS_PER_TARGET * len(targets)
        deadline = time.monotonic() + seconds

        async def one(position: int, target: ScrapeTarget, deadline: float) -> ScrapeResult:
            try:
                body = await self._body(target, deadline, max_bytes)
            except (TimeoutError, Failure) as exc:
                return self._failed(target, exc)
            if digest is not None:
                kept = digest(position, target, body)
                return ScrapeResult(target, self._clock(), kept=kept, size=len(body))
            return ScrapeResult(target, self._clock(), raw=body, size=len(body))

        results = await self._each(targets, deadline, lambda i: partial(one, i))
        return [
            (r.raw if digest is None else r.kept, None if r.ok else str(r.error), r.message)
            for r in results
        ]

    async def _each(
        self,
        targets: Sequence[ScrapeTarget],
        deadline: float,
        fetch_of: Callable[[int], Fetch] | None = None,
    ) -> list[ScrapeResult]:
        """Each target's result, in order, within ``deadline``, at most `per_call` at once.

        A wide job's round goes through `per_call` workers that take the targets in turn,
        not a task per target: 4,096 tasks a round, each with its timer while it waited for
        the call's share, were megabytes of short-lived objects every 5 s that the young
        collections promoted. A target whose turn comes after the deadline never got a
        slot, and says so. A call of at most `per_call` targets has a worker for each.
        """
        start = time.monotonic()
        results: list[ScrapeResult | None] = [None] * len(targets)
        turns = iter(range(len(targets)))

        async def worker() -> None:
            for i in turns:
                if time.monotonic() >= deadline:
                    results[i] = self._no_slot(targets[i], time.monotonic() - start)
                    continue
                fetch = None if fetch_of is None else fetch_of(i)
                results[i] = await self._scrape(targets[i], deadline, fetch)

        await asyncio.gather(*(worker() for _ in range(min(self.per_call, len(targets)))))
        done = [r for r in results if r is not None]
        assert len(done) == len(targets), "every target has its result, in order"
        return done

    def _no_slot(self, target: ScrapeTarget, waited: float) -> ScrapeResult:
        return ScrapeResult(
            target,
            self._clock(),
            error=ErrorKind.NO_SLOT,
            message=f"no free scrape slot within {waited:.3g}s: all "
            f"{self.concurrency} slots are busy with slow endpoints",
            seconds=waited,
        )

    async def _scrape(
        self, target: ScrapeTarget, deadline: float, fetch: Fetch | None = None
    ) -> ScrapeResult:
        sem = self._ensure()
        loop = asyncio.get_running_loop()
        start = time.monotonic()
        held = False
        try:
            try:
                if not sem.locked():
                    await sem.acquire()  # a free slot: taken at once, no timer needed
                else:
                    async with asyncio.timeout_at(loop.time() + (deadline - start)):
                        await sem.acquire()
                held = True
            except TimeoutError:
                return self._no_slot(target, time.monotonic() - start)
            begun = time.monotonic()
            # An endpoint gets the timeout from when its slot came, within the call's deadline.
            own = min(deadline, begun + self.timeout)
            result = await (fetch or self._fetch)(target, own)
            result.seconds = time.monotonic() - begun
            return result
        finally:
            if held:
                sem.release()

    # ---- the connection pool -----------------------------------------------------------------

    def _take(self, key: tuple[str, int]) -> Conn | None:
        conns = self._idle.get(key)
        while conns:
            conn = conns.pop()
            self._idle_count -= 1
            if not conn.closed:
                return conn
        return None

    def _give(self, conn: Conn, now: float) -> None:
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

    async def _connect(self, key: tuple[str, int], deadline: float) -> Conn:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout_at(loop.time() + (deadline - time.monotonic())):
                _, conn = await loop.create_connection(lambda: Conn(loop, key), key[0], key[1])
        except ConnectionRefusedError as exc:
            raise Failure(ErrorKind.REFUSED, str(exc)) from None
        except TimeoutError:
            raise
        except OSError as exc:
            raise Failure(ErrorKind.CONNECTION, str(exc)) from None
        return conn

    def _endpoint(self, url: str, token: str = "") -> Endpoint:
        ep = self._endpoints.get((url, token))
        if ep is None:
            ep = endpoint(url, token)
            if len(self._endpoints) > 65536:
                self._endpoints.clear()
            self._endpoints[(url, token)] = ep
        return ep

    async def _body(self, target: ScrapeTarget, deadline: float, max_bytes: int) -> bytes:
        """The decoded body of a 200 answer; :class:`Failure` or TimeoutError otherwise."""
        resp = await self._exchange(self._endpoint(target.url, target.token), deadline, max_bytes)
        if resp.status != 200:
            # The status code only: the reason phrase is the endpoint's own words.
            raise Failure(ErrorKind.HTTP_STATUS, f"HTTP {resp.status}", len(resp.body))
        return decode_body(resp.body, resp.encoding, max_bytes)

    def _failed(self, target: ScrapeTarget, exc: TimeoutError | Failure) -> ScrapeResult:
        if isinstance(exc, Failure):
            kind, message, size = exc.kind, exc.message, exc.size
        else:
            kind, message, size = (
                ErrorKind.TIMEOUT, f"no complete response within {self.timeout:g}s", 0
            )  # fmt: skip
        return ScrapeResult(target, self._clock(), error=kind, message=message, size=size)

    async def _exchange(self, ep: Endpoint, deadline: float, max_bytes: int) -> Response:
        loop = asyncio.get_running_loop()
        for attempt in (0, 1):
            conn = self._take(ep.key) if attempt == 0 else None
            reused = conn is not None
            if conn is None:
                conn = await self._connect(ep.key, deadline)
            fut = conn.request(ep.head, max_bytes, self.max_chunks)
            timer = loop.call_at(loop.time() + (deadline - time.monotonic()), expire, conn, fut)
            try:
                resp = await fut
            except TimeoutError:  # an OSError too, but not a connection failure
                conn.abort()
                raise
            except (ConnectionError, OSError) as exc:
                # A kept-alive connection the server closed meanwhile: once more, afresh.
                if reused and not conn.received:
                    continue
                raise Failure(ErrorKind.CONNECTION, f"{type(exc).__name__}: {exc}") from None
            except BaseException:
                conn.abort()
                raise
            finally:
                timer.cancel()
            self._give(conn, time.monotonic())
            return resp
        raise AssertionError("unreachable")

    async def _fetch(self, target: ScrapeTarget, deadline: float) -> ScrapeResult:
        try:
            body = await self._body(target, deadline, self.max_bytes)
            _check_shape(body, self.max_lines, self.max_samples)
        except (TimeoutError, Failure) as exc:
            return self._failed(target, exc)
        t = self._clock()
        samples: list[expfmt.Sample] = []
        try:
            if len(body) > INLINE_PARSE_BYTES:
                # Parsed on one thread of its own: the event loop (other jobs, watches, the
                # health probe) keeps running; the caps above bound the work.
                loop = asyncio.get_running_loop()
                samples, fr, cpu = await loop.run_in_executor(_parser(), self._parse, body, t)
            else:
                samples, fr, cpu = self._parse(body, t)
        except expfmt.ParseError as exc:
            # Nothing of the body: on the host network it may be any service of the node.
            message = f"{NOT_PROMETHEUS} ({len(body)} bytes)"
            cpu = getattr(exc, "cpu", 0.0)  # charged too: a refused body can cost the most
            return ScrapeResult(
                target, t, error=ErrorKind.PARSE, message=message, size=len(body), cpu=cpu
            )
        missing = _missing_rank(target, fr)
        if missing:
            return ScrapeResult(
                target, t, error=ErrorKind.MISSING_RANK, message=missing, size=len(body), cpu=cpu
            )
        c0 = time.thread_time()
        adm = guard.admit(fr, target.rank, t)
        cpu += time.thread_time() - c0
        if target.rank is not None and target.rank not in adm.frame.ranks:
            found = ",".join(str(r) for r in sorted(fr.ranks)[:5]) or "none"
            return ScrapeResult(
                target,
                t,
                error=ErrorKind.MISSING_RANK,
                message=f"expected rank {target.rank}, the endpoint exports rank(s) {found}",
                size=len(body),
                dropped_series=adm.dropped_series,
                cpu=cpu,
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
            cpu=cpu,
        )

    def _parse(self, body: bytes, t: float) -> tuple[list[expfmt.Sample], Frame, float]:
        """The payload's samples (only with a `wanted` set of our own), its frame, and the
        CPU seconds this thread spent on them."""
        c0 = time.thread_time()
        try:
            if self.wanted is NEEDED:
                return [], frame_payload(body, t), time.thread_time() - c0
            samples = expfmt.parse(body, self.wanted)
            return samples, frame(samples, t), time.thread_time() - c0
        except expfmt.ParseError as exc:
            exc.cpu = time.thread_time() - c0  # type: ignore[attr-defined]
            raise


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
        raise Failure(
            ErrorKind.TOO_LARGE, f"{lines} lines exceed the cap of {max_lines}", len(body)
        )
    ours = body.count(_OURS_AT_LINE) + body.startswith(_OURS_AT_LINE[1:])
    if ours > max_samples:
        raise Failure(
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
            found = clip(",".join(sorted(set(steps))), ENDPOINT_TEXT_MAX)
            return f"expected local_rank {want}, the endpoint exports {found}"
    return ""
