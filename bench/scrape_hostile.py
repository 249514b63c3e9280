"""Bench: what hostile metrics endpoints cost the operator's event loop, CPU and memory.

    python bench/scrape_hostile.py

A raw asyncio server on 127.0.0.1 plays trainer endpoints that misbehave: a 1 MB chunked
body of tiny chunks trickled in 16 KiB pieces, a gzip bomb, 100,000 label sets, long unusual label values,
changing rank labels, NaN/Inf values, endpoints that accept and never answer. Each case is
scraped through the operator's `Scraper` and folded into a `JobMonitor`, as the operator
does, while a ticker measures how late the event loop runs (its longest stall). Prints one
line per case; asserts nothing (numbers belong in benchmarks).

"One tenant's CPU" then serves from a child process (so the CPU measured is the operator's
alone) a job whose endpoints send ~4 MiB of 1-byte chunks: the operator's CPU per hostile
scrape with the chunk cap lifted (the client before the cap) and with it, and a healthy
job's scrape latency with no neighbour, with the uncapped hostile neighbour and with the
capped one.
"""

from __future__ import annotations

import asyncio
import gzip
import multiprocessing
import random
import resource
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from multiprocessing.connection import Connection
from pathlib import Path

from gpujob_operator.monitoring.monitor import JobMonitor
from gpujob_operator.monitoring.scrape.httpclient import MAX_CHUNKS
from gpujob_operator.monitoring.scrape.result import ScrapeResult, ScrapeTarget
from gpujob_operator.monitoring.scrape.scraper import Scraper
from gpujob_operator.monitoring.verdicts.analysis_settings import Settings

ROOT = Path(__file__).resolve().parents[1]
PAYLOAD = (ROOT / "tests" / "data" / "payloads" / "healthy-scrape2-rank1.prom").read_bytes()
Reply = Callable[[asyncio.StreamWriter], Awaitable[None]]


def ok(body: bytes, *headers: bytes) -> bytes:
    head = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n" % len(body)
    return head + b"".join(h + b"\r\n" for h in headers) + b"\r\n" + body


def send(data: bytes) -> Reply:
    async def reply(w: asyncio.StreamWriter) -> None:
        w.write(data)
        await w.drain()

    return reply


def trickle(body: bytes, chunk: int, piece: int) -> Reply:
    """`body` as `chunk`-byte chunks, written `piece` bytes at a time (one read each)."""
    wire = b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in split(body, chunk)) + b"0\r\n\r\n"

    async def reply(w: asyncio.StreamWriter) -> None:
        w.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        for p in split(wire, piece):
            w.write(p)
            await w.drain()
            await asyncio.sleep(0.001)  # a slow writer: the client reads each piece apart

    return reply


def split(data: bytes, size: int) -> list[bytes]:
    return [data[i : i + size] for i in range(0, len(data), size)]


async def hang(_: asyncio.StreamWriter) -> None:
    await asyncio.sleep(3600)


class Server:
    def __init__(self) -> None:
        self.replies: dict[bytes, Reply] = {}
        self.srv: asyncio.Server | None = None

    async def start(self) -> str:
        async def handle(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            try:
                while True:
                    head = await r.readuntil(b"\r\n\r\n")
                    await self.replies[head.split(b" ")[1]](w)
            except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
                pass
            finally:
                w.close()

        self.srv = await asyncio.start_server(handle, "127.0.0.1", 0, limit=2**20)
        return f"http://127.0.0.1:{self.srv.sockets[0].getsockname()[1]}"


class Ticker:
    """The event loop's longest lateness while it runs (what every other job would feel)."""

    def __init__(self) -> None:
        self.max_lag = 0.0
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        while True:
            t = time.perf_counter()
            await asyncio.sleep(0.001)
            self.max_lag = max(self.max_lag, time.perf_counter() - t - 0.001)

    def __enter__(self) -> Ticker:
        self._task = asyncio.get_running_loop().create_task(self._run())
        return self

    def __exit__(self, *_: object) -> None:
        assert self._task is not None
        self._task.cancel()


def rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def relabel(text: bytes, rank: int) -> bytes:
    return text.replace(b'rank="1"}', b'rank="%d"}' % rank)


async def another_job_behind(
    s: Scraper, dead: Awaitable[object], other: ScrapeTarget, what: str, width: int
) -> None:
    """How long another job's scrape takes while ``dead`` holds the slots it can."""
    busy = asyncio.ensure_future(dead)
    await asyncio.sleep(0.05)
    t0 = time.perf_counter()
    (got,) = await s.scrape_all([other])
    waited = time.perf_counter() - t0
    await busy
    print(
        f"{'another job behind ' + what:<{width}} its scrape took {waited:5.2f} s "
        f"({got.error or 'ok'}) with {s.concurrency} slots and a {s.timeout:g} s timeout"
    )


async def case(
    name: str,
    scraper: Scraper,
    targets: list[ScrapeTarget],
    rounds: int = 1,
    monitor: JobMonitor | None = None,
) -> None:
    rss0 = rss_mb()
    cpu0, wall0 = time.process_time(), time.perf_counter()
    results: list[ScrapeResult] = []
    note = ""
    with Ticker() as tick:
        for i in range(rounds):
            results = await scraper.scrape_all(targets)
            if monitor is not None:
                try:
                    u = monitor.observe(results, time.time() + 15 * i)
                    note = f"progress {u.progress.get('step')}/{u.progress.get('totalSteps')}"
                except Exception as e:  # what the operator's loop would log every scrape
                    note = f"analysis raised {type(e).__name__}"
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    kinds = sorted({str(r.error or "ok") for r in results})
    print(
        f"{name:<34} {wall:7.2f} s wall {cpu:7.2f} s CPU  loop stalled up to "
        f"{tick.max_lag * 1000:7.1f} ms  RSS +{rss_mb() - rss0:5.0f} MB  -> {','.join(kinds)}"
        + (f"; {note}" if note else "")
    )


# ---- one tenant's CPU: a job of 1-byte chunks beside a healthy job ---------------------------

HOSTILE_BODY = 4 * 2**20 - 4096
"""Bytes of the hostile body: just under the byte cap, so only the chunk cap stops it."""
UNCAPPED = 2**40
"""A chunk cap no body reaches: the client as it was before the cap."""


def serve_in_child(conn: Connection) -> None:
    """The endpoints of both jobs, in a process of their own; sends its base URL, then serves."""

    async def run() -> None:
        server = Server()
        tiny = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        tiny += b"1\r\n#\r\n" * HOSTILE_BODY + b"0\r\n\r\n"
        server.replies.update({b"/good": send(ok(PAYLOAD)), b"/tiny": send(tiny)})
        conn.send(await server.start())
        await asyncio.Event().wait()

    asyncio.run(run())


async def hostile_cpu(base: str, max_chunks: int, scrapes: int, what: str) -> None:
    """Operator CPU (this process only) per scrape of one 1-byte-chunk endpoint."""
    target = ScrapeTarget(f"{base}/tiny", "hostile", "node", 0, 1, 1)
    async with Scraper(timeout=60, max_chunks=max_chunks) as s:
        cpu0, wall0 = time.process_time(), time.perf_counter()
        with Ticker() as tick:
            for _ in range(scrapes):
                (r,) = await s.scrape_all([target])
        cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    print(
        f"hostile scrape, {what:<28} {cpu / scrapes * 1000:8.1f} ms CPU/scrape "
        f"{wall / scrapes * 1000:8.1f} ms wall/scrape  loop stalled up to "
        f"{tick.max_lag * 1000:6.1f} ms  -> {r.error or 'ok'} ({r.size} bytes read)"
    )


async def healthy_beside(base: str, max_chunks: int | None, seconds: float, what: str) -> None:
    """A healthy 4-rank job scraped every 50 ms, beside a 4-rank hostile job scraped every
    second (None: no neighbour), through one `Scraper` with the operator's defaults."""
    healthy = [ScrapeTarget(f"{base}/good", f"good-{i}", "node", 0, 1, 1) for i in range(4)]
    hostile = [ScrapeTarget(f"{base}/tiny", f"bad-{i}", "node", 0, 1, 1) for i in range(4)]
    latencies: list[float] = []
    hostile_kinds: set[str] = set()
    async with Scraper(max_chunks=max_chunks or UNCAPPED) as s:
        await s.scrape_all(healthy)  # connections made and kept alive, as in steady state

        async def neighbour(stop: float) -> None:
            while time.perf_counter() < stop:
                t = time.perf_counter()
                got = await s.scrape_all(hostile)
                hostile_kinds.update(str(r.error or "ok") for r in got)
                await asyncio.sleep(max(0.0, 1.0 - (time.perf_counter() - t)))

        stop = time.perf_counter() + seconds
        cpu0 = time.process_time()
        task = asyncio.ensure_future(neighbour(stop)) if max_chunks is not None else None
        with Ticker() as tick:
            while time.perf_counter() < stop:
                t = time.perf_counter()
                got = await s.scrape_all(healthy)
                latencies.append(time.perf_counter() - t)
                assert all(r.ok for r in got), [r.message for r in got]
                await asyncio.sleep(max(0.0, 0.05 - latencies[-1]))
            if task is not None:
                await task
        cpu = time.process_time() - cpu0
    ms = sorted(x * 1000 for x in latencies)
    p99 = ms[min(len(ms) - 1, int(len(ms) * 0.99))]
    print(
        f"healthy job, {what:<31} scrape p50 {statistics.median(ms):6.1f} ms  p99 {p99:7.1f} ms"
        f"  max {ms[-1]:7.1f} ms  loop stalled up to {tick.max_lag * 1000:7.1f} ms  "
        f"operator CPU {cpu / seconds * 100:5.1f} %  ({len(ms)} rounds"
        + (f"; hostile: {','.join(sorted(hostile_kinds))})" if task is not None else ")")
    )


async def one_tenants_cpu(base: str) -> None:
    print(
        f"\none tenant's CPU: {HOSTILE_BODY} bytes in 1-byte chunks (~{6 * HOSTILE_BODY >> 20} MiB)"
    )
    await hostile_cpu(base, UNCAPPED, 2, "chunk cap lifted (before)")
    await hostile_cpu(base, MAX_CHUNKS, 20, f"capped at {MAX_CHUNKS} chunks")
    await healthy_beside(base, None, 8.0, "no neighbour")
    await healthy_beside(base, UNCAPPED, 8.0, "hostile neighbour, uncapped")
    await healthy_beside(base, MAX_CHUNKS, 8.0, "hostile neighbour, capped")


async def main() -> None:
    server = Server()
    base = await server.start()
    rng = random.Random(1)
    body_1mb = PAYLOAD * (2**20 // len(PAYLOAD))
    flood = b"".join(b'gpujob_train_loss{rank="%d"} 1\n' % i for i in range(100_000))
    server.replies.update(
        {
            b"/good": send(ok(PAYLOAD)),
            b"/trickle": trickle(body_1mb, 16, 16384),
            b"/bomb": send(ok(gzip.compress(b"\n" * (256 * 2**20)), b"Content-Encoding: gzip")),
            b"/flood": send(ok(PAYLOAD + flood)),
            b"/hang": hang,
            b"/inf": send(
                ok(
                    PAYLOAD.replace(b"} 100000.0", b"} +Inf").replace(
                        b'gpujob_train_epoch{local_rank="1",node_rank="0",rank="1"} 12.0',
                        b'gpujob_train_epoch{local_rank="1",node_rank="0",rank="1"} +Inf',
                    )
                )
            ),
        }
    )
    for i in range(5):
        labels = b"".join(
            b'gpujob_train_loss{rank="%d"} 1\n' % rng.randrange(10**9) for _ in range(8_000)
        )
        server.replies[b"/ranks%d" % i] = send(ok(PAYLOAD + labels))
        long = b"".join(
            b'gpujob_train_loss{rank="1",x="%s"} 1\n' % rng.randbytes(600).hex().encode()
            for _ in range(2_500)
        )
        server.replies[b"/long%d" % i] = send(ok(PAYLOAD + long))

    def t(path: str, pod: str = "p") -> ScrapeTarget:
        return ScrapeTarget(f"{base}{path}", pod, "node", 0, 1, 1)

    spec = Settings(warmup_steps=0)
    print(f"load average before: {Path('/proc/loadavg').read_text().split()[:3]}")
    async with Scraper(timeout=30) as s:
        await case("good payload (baseline)", s, [t("/good")])
        await case("1 MB, 16 B chunks, 16 KiB reads", s, [t("/trickle")])
        await case("gzip bomb (256 MiB of newlines)", s, [t("/bomb")])
        await case("100,000 label sets (3.3 MB)", s, [t("/flood")], monitor=JobMonitor(spec))
        mon = JobMonitor(spec)
        for i in range(5):
            await case(f"8,000 changing rank labels #{i + 1}", s, [t(f"/ranks{i}")], monitor=mon)
        mon = JobMonitor(spec)
        for i in range(5):
            await case(f"2,500 long label values #{i + 1}", s, [t(f"/long{i}")], monitor=mon)
        await case(
            "+Inf target steps and epoch", s, [t("/inf")], rounds=3, monitor=JobMonitor(spec)
        )
    async with Scraper(concurrency=4, timeout=3) as s:
        dead = s.scrape_all([t("/hang", f"dead-{i}") for i in range(8)])
        await another_job_behind(s, dead, t("/good", "other-job"), "8 dead endpoints", 34)
    assert server.srv is not None
    server.srv.close()


if __name__ == "__main__":
    asyncio.run(main())
    here, there = multiprocessing.get_context("spawn").Pipe()
    child = multiprocessing.get_context("spawn").Process(
        target=serve_in_child, args=(there,), daemon=True
    )
    child.start()
    try:
        asyncio.run(one_tenants_cpu(here.recv()))
    finally:
        child.terminate()
        child.join()
    sys.exit(0)
