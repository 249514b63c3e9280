"""The scraper against a local aiohttp server on 127.0.0.1: good, garbage, slow, failing,
refusing, oversized and foreign endpoints, all in one round; and the global bound."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path

from aiohttp import web

from gpujob_operator.expfmt import WANTED, parse
from gpujob_operator.scrape import ErrorKind, Scraper, ScrapeTarget
from gpujob_operator.window import NEEDED, R_STEPS, frame

PAYLOAD = (
    Path(__file__).resolve().parents[1] / "data" / "payloads" / "healthy-scrape2-rank1.prom"
).read_bytes()


@asynccontextmanager
async def server(state: dict[str, int]) -> AsyncIterator[str]:
    async def good(_: web.Request) -> web.Response:
        return web.Response(body=PAYLOAD, content_type="text/plain")

    async def garbage(_: web.Request) -> web.Response:
        return web.Response(text="<html>oops</html>", content_type="text/html")

    async def slow(_: web.Request) -> web.Response:
        await asyncio.sleep(30)  # the simulated hung endpoint, cancelled at teardown
        return web.Response(body=PAYLOAD)

    async def error(_: web.Request) -> web.Response:
        return web.Response(status=503, text="unavailable")

    async def huge(_: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse()
        await resp.prepare(_)
        for _i in range(64):
            await resp.write(b"# padding " + b"x" * 16384 + b"\n")
        await resp.write_eof()
        return resp

    async def foreign(_: web.Request) -> web.Response:
        return web.Response(text="process_cpu_seconds_total 1.0\n")

    async def gated(_: web.Request) -> web.Response:
        state["now"] += 1
        state["max"] = max(state["max"], state["now"])
        await asyncio.sleep(0.05)
        state["now"] -= 1
        return web.Response(body=PAYLOAD)

    app = web.Application()
    for path, handler in (
        ("/good", good),
        ("/garbage", garbage),
        ("/slow", slow),
        ("/error", error),
        ("/huge", huge),
        ("/foreign", foreign),
        ("/gated", gated),
    ):
        app.router.add_get(path, handler)
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run(coro: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(coro())  # type: ignore[arg-type]


def test_every_kind_of_endpoint_in_one_round() -> None:
    async def main() -> None:
        async with server({"now": 0, "max": 0}) as base:
            targets = [
                ScrapeTarget(f"{base}/good", "pod-0", local_rank=1),
                ScrapeTarget(f"{base}/garbage", "pod-1"),
                ScrapeTarget(f"{base}/slow", "pod-2"),
                ScrapeTarget(f"{base}/error", "pod-3"),
                ScrapeTarget(f"http://127.0.0.1:{closed_port()}/metrics", "pod-4"),
                ScrapeTarget(f"{base}/huge", "pod-5"),
                ScrapeTarget(f"{base}/foreign", "pod-6"),
                ScrapeTarget(f"{base}/good", "pod-7", local_rank=0),
            ]
            async with Scraper(timeout=1.0, max_bytes=256 * 1024) as scraper:
                results = await scraper.scrape_all(targets)
        kinds = [r.error for r in results]
        assert kinds == [
            None,
            ErrorKind.PARSE,
            ErrorKind.TIMEOUT,
            ErrorKind.HTTP_STATUS,
            ErrorKind.REFUSED,
            ErrorKind.TOO_LARGE,
            ErrorKind.MISSING_RANK,
            ErrorKind.MISSING_RANK,
        ]
        good = results[0]
        assert good.ok and good.size == len(PAYLOAD) and good.frame is not None
        assert good.frame.ranks[1][R_STEPS] == 101 and good.frame.buckets[1][-1] == 101
        assert repr(good.frame) == repr(frame(parse(PAYLOAD, NEEDED), good.t))  # NaN-safe
        assert good.target.pod == "pod-0" and good.t > 0
        assert "503" in results[3].message and "expected local_rank 0" in results[7].message
        assert all(r.message for r in results[1:])

    run(main)


def test_concurrency_is_bounded_across_calls() -> None:
    async def main() -> None:
        state = {"now": 0, "max": 0}
        async with server(state) as base, Scraper(concurrency=3) as scraper:
            jobs = [
                [ScrapeTarget(f"{base}/gated", f"job{j}-pod") for _ in range(4)] for j in range(3)
            ]
            rounds = await asyncio.gather(*(scraper.scrape_all(t) for t in jobs))
        assert all(r.ok for rs in rounds for r in rs)
        assert state["max"] <= 3

    run(main)


def test_connections_are_kept_alive_and_custom_wanted_sets_give_samples() -> None:
    async def main() -> None:
        peers: set[object] = set()

        async def good(request: web.Request) -> web.Response:
            peers.add(request.transport.get_extra_info("peername") if request.transport else None)
            return web.Response(body=PAYLOAD, content_type="text/plain")

        app = web.Application()
        app.router.add_get("/good", good)
        runner = web.AppRunner(app, shutdown_timeout=0.1)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        url = f"http://127.0.0.1:{runner.addresses[0][1]}/good"
        try:
            async with Scraper(concurrency=2) as scraper:
                for _ in range(5):
                    results = await scraper.scrape_all([ScrapeTarget(url, "p")] * 2)
                    assert all(r.ok and r.frame is not None for r in results)
            assert len(peers) <= 2  # ten scrapes over (at most) two connections
            async with Scraper(wanted=WANTED) as scraper:
                (r,) = await scraper.scrape_all([ScrapeTarget(url, "p", local_rank=1)])
            assert r.ok and len(r.samples) > 30 and repr(r.frame) == repr(frame(r.samples, r.t))
        finally:
            await runner.cleanup()

    run(main)


def test_raw_http_shapes_chunked_until_close_gzip_and_junk() -> None:
    """Responses as other servers write them, from a raw socket server."""
    import gzip

    chunked = b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in (PAYLOAD[:1000], PAYLOAD[1000:]))
    replies = {
        b"/chunked": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        + chunked
        + b"0\r\n\r\n",
        b"/http10": b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\n" + PAYLOAD,
        b"/gzip": b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: %d\r\n\r\n"
        % len(gzip.compress(PAYLOAD))
        + gzip.compress(PAYLOAD),
        b"/junk": b"SSH-2.0-OpenSSH_9.0\r\n\r\n",
        b"/short": b"HTTP/1.1 200 OK\r\nContent-Length: 99999\r\n\r\nabc",
    }

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            path = head.split(b" ")[1]
            writer.write(replies[path])
            await writer.drain()
            if path != b"/chunked":
                writer.close()
                return

    async def main() -> None:
        srv = await asyncio.start_server(handle, "127.0.0.1", 0)
        base = f"http://127.0.0.1:{srv.sockets[0].getsockname()[1]}"
        try:
            async with Scraper(timeout=2.0) as scraper:
                names = ["chunked", "http10", "gzip", "junk", "short", "chunked"]
                results = await scraper.scrape_all(
                    [ScrapeTarget(f"{base}/{n}", "p", local_rank=1) for n in names]
                )
        finally:
            srv.close()
        assert [r.error for r in results] == [
            None, None, None, ErrorKind.CONNECTION, ErrorKind.CONNECTION, None
        ]  # fmt: skip
        assert all(r.size == len(PAYLOAD) for r in results if r.ok)
        assert all(r.message for r in results if not r.ok)

    run(main)
