"""Bench: what hostile hang-evidence endpoints cost the operator (the metrics one's sibling).

    python bench/evidence_hostile.py

When a job stalls the operator asks every rank for ``/debug/evidence`` (JSON) through the
scraper, then parses and compares the answers off the event loop, as
``runtime/hangcapture.py`` does. A raw asyncio server on 127.0.0.1 plays ranks that answer
well (recorded evidence), hugely, deeply nested, in 1-byte chunks, as a gzip bomb, or never.
Prints wall and CPU time, the event loop's longest stall and the RSS growth per case, and
how long another job's scrape waits behind eight silent ranks. Asserts nothing.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import sys
import time
from pathlib import Path

from gpujob_operator.monitoring.hang import hangdump
from gpujob_operator.monitoring.scrape.result import ScrapeTarget
from gpujob_operator.monitoring.scrape.scraper import Scraper
from gpujob_operator.runtime.hangcapture import compare_and_render
from scrape_hostile import (
    PAYLOAD,
    Server,
    Ticker,
    another_job_behind,
    hang,
    ok,
    rss_mb,
    send,
    trickle,
)

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data" / "evidence"


async def case(name: str, scraper: Scraper, targets: list[ScrapeTarget]) -> None:
    rss0 = rss_mb()
    cpu0, wall0 = time.process_time(), time.perf_counter()
    with Ticker() as tick:
        fetched = await scraper.fetch_all(targets, hangdump.MAX_BYTES)
        answers, _, data = await asyncio.to_thread(compare_and_render, targets, fetched)
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    errors = sorted({a.error.split(":")[0] for a in answers if a.error}) or ["ok"]
    size = sum(map(len, data.values()))
    print(
        f"{name:<40} {wall:6.2f} s wall {cpu:6.2f} s CPU  loop stalled up to "
        f"{tick.max_lag * 1000:6.1f} ms  RSS +{rss_mb() - rss0:4.0f} MB  ConfigMap "
        f"{size / 1024:5.0f} KiB  -> {','.join(errors)}"
    )


def frame(file: str, function: str = "f") -> dict[str, object]:
    return {"file": file, "line": 1, "function": function}


def as_rank(doc: bytes, rank: int) -> bytes:
    """A recorded rank's document, saying it is ``rank`` (the operator checks)."""
    return json.dumps({**json.loads(doc), "rank": rank}).encode()


async def main() -> None:
    server = Server()
    base = await server.start()
    waiting = (DATA / "sleep-rank0.json").read_bytes()
    asleep = (DATA / "sleep-rank1.json").read_bytes()
    threads = [
        {"name": f"t{i}", "main": i == 0, "frames": [frame("f" * 150)] * 60} for i in range(6)
    ]
    near_cap = json.dumps({"rank": None, "threads": threads}).encode()[: hangdump.MAX_BYTES - 2]
    one = [{"name": "t", "main": True, "frames": [frame("x" * 100)] * 400}]
    valid_big = json.dumps({"rank": None, "threads": one}).encode()
    server.replies.update(
        {
            **{b"/w%d" % r: send(ok(as_rank(waiting, r))) for r in range(256)},
            b"/a7": send(ok(as_rank(asleep, 7))),
            b"/huge": send(ok(b"[" + b"1," * 5_000_000 + b"1]")),
            b"/deep": send(ok(b"[" * 30_000 + b"]" * 30_000)),
            b"/cut": send(ok(near_cap)),
            b"/big": send(ok(valid_big)),
            b"/trickle": trickle(valid_big, 1, 1),
            b"/bomb": send(ok(gzip.compress(b" " * (256 * 2**20)), b"Content-Encoding: gzip")),
            b"/hang": hang,
            b"/metrics": send(ok(PAYLOAD)),
        }
    )

    def t(path: str, rank: int, pod: str = "p") -> ScrapeTarget:
        return ScrapeTarget(f"{base}{path}", f"{pod}-{rank}", "node", rank, 0, rank)

    print(f"valid document {len(valid_big)} bytes; cap {hangdump.MAX_BYTES} bytes per rank")
    async with Scraper(timeout=10) as s:
        eight = [t(f"/w{r}", r) for r in range(7)] + [t("/a7", 7)]
        await case("8 ranks, recorded evidence (baseline)", s, eight)
        await case("256 ranks, recorded evidence", s, [t(f"/w{r}", r) for r in range(256)])
        await case("64 ranks, 57 KB valid documents", s, [t("/big", r) for r in range(64)])
        await case("10 MB document", s, [t("/huge", 0), t("/w1", 1)])
        await case("30,000 nested brackets", s, [t("/deep", 0), t("/w1", 1)])
        await case("document cut at the cap", s, [t("/cut", 0), t("/w1", 1)])
        await case("57 KB in 1-byte chunks", s, [t("/trickle", 0), t("/w1", 1)])
        await case("gzip bomb (256 MiB of spaces)", s, [t("/bomb", 0), t("/w1", 1)])
    async with Scraper(concurrency=4, timeout=3) as s:
        await case("8 ranks that never answer (3 s timeout)", s, [t("/hang", r) for r in range(8)])
        silent = s.fetch_all([t("/hang", r, "dead") for r in range(8)], hangdump.MAX_BYTES)
        other = ScrapeTarget(f"{base}/metrics", "other", "n", 0, 1, 1)
        await another_job_behind(s, silent, other, "8 silent ranks", 40)
    assert server.srv is not None
    server.srv.close()


if __name__ == "__main__":
    asyncio.run(main())
    sys.exit(0)
