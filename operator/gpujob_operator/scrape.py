"""Concurrent scraping of the ranks' /metrics (the I/O edge of the monitoring path).

One `Scraper` serves every job of the operator: one aiohttp session (pooled sockets), one
semaphore bounding scrapes in flight across all jobs, a timeout per request and a cap on the
response size, so a thousand jobs with dead or slow endpoints cannot exhaust sockets or
memory. Each endpoint's outcome is a `ScrapeResult`; no endpoint's failure touches another.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from types import TracebackType
from typing import Final

import aiohttp

from gpujob_operator import expfmt
from gpujob_trainer import contract

DEFAULT_CONCURRENCY: Final = 256
DEFAULT_TIMEOUT: Final = 5.0
DEFAULT_MAX_BYTES: Final = 4 * 2**20
ACCEPT: Final = "text/plain;version=0.0.4;q=1,*/*;q=0.1"


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
    """The outcome of one scrape: samples, or an error kind and message."""

    target: ScrapeTarget
    t: float
    """When the response arrived (or the attempt failed), seconds since the epoch."""
    samples: list[expfmt.Sample] = field(default_factory=list)
    error: ErrorKind | None = None
    message: str = ""
    seconds: float = 0.0
    """How long the request took (after waiting for a slot)."""
    size: int = 0

    @property
    def ok(self) -> bool:
        return self.error is None


class Scraper:
    """Scrapes endpoints through one session, at most `concurrency` at a time."""

    def __init__(
        self,
        *,
        concurrency: int = DEFAULT_CONCURRENCY,
        timeout: float = DEFAULT_TIMEOUT,
        max_bytes: int = DEFAULT_MAX_BYTES,
        wanted: frozenset[str] | None = expfmt.WANTED,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.concurrency = concurrency
        self.timeout = timeout
        self.max_bytes = max_bytes
        self.wanted = wanted
        self._clock = clock
        self._session: aiohttp.ClientSession | None = None
        self._sem: asyncio.Semaphore | None = None

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

    def _ensure(self) -> tuple[aiohttp.ClientSession, asyncio.Semaphore]:
        # Created lazily, inside the running loop, as aiohttp requires.
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(
                limit=self.concurrency, limit_per_host=0, ttl_dns_cache=60, force_close=False
            )
            self._session = aiohttp.ClientSession(
                connector=connector,
                headers={"Accept": ACCEPT},
                auto_decompress=True,
                raise_for_status=False,
            )
        if self._sem is None:
            self._sem = asyncio.Semaphore(self.concurrency)
        return self._session, self._sem

    async def close(self) -> None:
        """Close the shared session (idempotent)."""
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def scrape_all(self, targets: Sequence[ScrapeTarget]) -> list[ScrapeResult]:
        """Scrape every target concurrently; results in the targets' order."""
        return list(await asyncio.gather(*(self.scrape(t) for t in targets)))

    async def scrape(self, target: ScrapeTarget) -> ScrapeResult:
        """Scrape one endpoint; never raises (except cancellation)."""
        session, sem = self._ensure()
        async with sem:
            start = time.monotonic()
            result = await self._fetch(session, target)
            result.seconds = time.monotonic() - start
            return result

    async def _fetch(self, session: aiohttp.ClientSession, target: ScrapeTarget) -> ScrapeResult:
        def fail(kind: ErrorKind, message: str) -> ScrapeResult:
            return ScrapeResult(target, self._clock(), error=kind, message=message)

        try:
            async with asyncio.timeout(self.timeout):
                async with session.get(target.url) as resp:
                    if resp.status != 200:
                        return fail(ErrorKind.HTTP_STATUS, f"HTTP {resp.status} {resp.reason}")
                    if resp.content_length is not None and resp.content_length > self.max_bytes:
                        return fail(
                            ErrorKind.TOO_LARGE,
                            f"{resp.content_length} bytes exceed the {self.max_bytes}-byte cap",
                        )
                    body = bytearray()
                    async for chunk in resp.content.iter_chunked(65536):
                        body += chunk
                        if len(body) > self.max_bytes:
                            return fail(
                                ErrorKind.TOO_LARGE, f"body exceeds the {self.max_bytes}-byte cap"
                            )
        except TimeoutError:
            return fail(ErrorKind.TIMEOUT, f"no complete response within {self.timeout:g}s")
        except aiohttp.ClientConnectorError as exc:
            refused = isinstance(exc.os_error, ConnectionRefusedError)
            kind = ErrorKind.REFUSED if refused else ErrorKind.CONNECTION
            return fail(kind, str(exc.os_error or exc))
        except (aiohttp.ClientError, OSError, ValueError) as exc:
            return fail(ErrorKind.CONNECTION, f"{type(exc).__name__}: {exc}")
        t = self._clock()
        try:
            samples = expfmt.parse(bytes(body), self.wanted)
        except expfmt.ParseError as exc:
            return ScrapeResult(target, t, error=ErrorKind.PARSE, message=str(exc), size=len(body))
        missing = _missing_rank(target, samples)
        if missing:
            return ScrapeResult(
                target, t, error=ErrorKind.MISSING_RANK, message=missing, size=len(body)
            )
        return ScrapeResult(target, t, samples=samples, size=len(body))


def _missing_rank(target: ScrapeTarget, samples: Sequence[expfmt.Sample]) -> str:
    """Why the payload is not the expected rank's ("" when it is)."""
    steps = [s for s in samples if s.name == contract.STEPS.name]
    if not steps:
        return f"no {contract.STEPS.name} series: not a gpujob trainer endpoint"
    if target.local_rank >= 0:
        want = str(target.local_rank)
        if not any(s.labels.get(contract.LABEL_LOCAL_RANK) == want for s in steps):
            got = sorted({s.labels.get(contract.LABEL_LOCAL_RANK, "?") for s in steps})
            return f"expected local_rank {want}, the endpoint exports {','.join(got)}"
    return ""
