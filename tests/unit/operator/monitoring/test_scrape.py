"""The scraper against a local aiohttp server on 127.0.0.1: good, garbage, slow, failing,
refusing, oversized and foreign endpoints, all in one round; and the global bound."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager, suppress
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from gpujob_localcluster.ports import free_port
from gpujob_operator.monitoring.rows import R_STEPS
from gpujob_operator.monitoring.scrape.expfmt import WANTED, parse
from gpujob_operator.monitoring.scrape.frame import NEEDED, frame
from gpujob_operator.monitoring.scrape.result import ErrorKind, ScrapeResult, ScrapeTarget
from gpujob_operator.monitoring.scrape.scraper import Scraper
from tests.support.loopback import served

PAYLOAD = (
    Path(__file__).resolve().parents[3] / "data" / "payloads" / "healthy-scrape2-rank1.prom"
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

    app = web.Application()
    for path, handler in (
        ("/good", good),
        ("/garbage", garbage),
        ("/slow", slow),
        ("/error", error),
        ("/huge", huge),
        ("/foreign", foreign),
    ):
        app.router.add_get(path, handler)
    async with served(app) as base:
        yield base


def closed_port() -> int:
    return free_port()  # nothing listens there, and no outgoing connection takes it


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
        # the CPU the operator spent reading it: what the job's share of the budget is charged
        assert good.cpu > 0 and all(r.cpu == 0 for r in results[2:6])  # never parsed
        assert results[1].cpu > 0  # a body refused by the parser is charged too
        assert "503" in results[3].message and "expected local_rank 0" in results[7].message
        assert all(r.message for r in results[1:])

    run(main)


def test_concurrency_is_reached_and_bounded_across_calls() -> None:
    """Three jobs' rounds at once through one scraper of concurrency 3: exactly 3 in flight.

    Each request waits (up to 5 s) until 3 are in flight together, so a serial scraper
    reaches only 1 and fails, and one that ignores the bound exceeds 3 and fails.
    """

    async def main() -> None:
        state = {"now": 0, "max": 0}
        full = asyncio.Event()

        async def barrier(_: web.Request) -> web.Response:
            state["now"] += 1
            state["max"] = max(state["max"], state["now"])
            if state["now"] >= 3:
                full.set()
            with suppress(TimeoutError):
                await asyncio.wait_for(full.wait(), 5.0)
            await asyncio.sleep(0.01)  # a bound-breaking scraper would overlap here
            state["now"] -= 1
            return web.Response(body=PAYLOAD)

        app = web.Application()
        app.router.add_get("/barrier", barrier)
        runner = web.AppRunner(app, shutdown_timeout=0.1)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        base = f"http://127.0.0.1:{runner.addresses[0][1]}"
        try:
            async with Scraper(concurrency=3, timeout=30.0) as scraper:
                jobs = [
                    [ScrapeTarget(f"{base}/barrier", f"job{j}-pod") for _ in range(4)]
                    for j in range(3)
                ]
                rounds = await asyncio.gather(*(scraper.scrape_all(t) for t in jobs))
        finally:
            await runner.cleanup()
        assert all(r.ok for rs in rounds for r in rs), [r.message for rs in rounds for r in rs]
        assert state["max"] == 3, state

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


# ---- hostile endpoints: the scraper's CPU, memory and time stay bounded ----------------------


class _NullTransport(asyncio.Transport):
    def write(self, data: bytes | bytearray | memoryview) -> None:
        pass

    def abort(self) -> None:
        pass


def chunked(body: bytes, piece: int) -> list[bytes]:
    """The wire pieces of `body` sent as chunks of `piece` bytes, then the last chunk."""
    return [b"%x\r\n%s\r\n" % (len(c), c) for c in split(body, piece)] + [b"0\r\n\r\n"]


def split(data: bytes, size: int) -> list[bytes]:
    return [data[i : i + size] for i in range(0, len(data), size)]


def test_a_chunked_body_is_decoded_as_it_arrives_not_reparsed() -> None:
    """1 MB in 16 KiB chunks: each read decodes only the new bytes, so what stays buffered
    is bounded by one chunk header (today's quadratic re-parse kept, and re-read, it all)."""
    from gpujob_operator.monitoring.scrape.httpclient import Conn

    body = (PAYLOAD * (2**20 // len(PAYLOAD) + 1))[: 2**20]

    async def main() -> None:
        loop = asyncio.get_running_loop()
        conn = Conn(loop, ("127.0.0.1", 1))
        conn.connection_made(_NullTransport())
        fut = conn.request(b"GET / HTTP/1.1\r\n\r\n", 2 * 2**20)
        conn.data_received(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        decoded = 0
        for wire in chunked(body, 16384)[:-1]:
            for part in split(wire, 4000):  # a chunk arrives over several reads
                conn.data_received(part)
                assert len(conn.buf) <= 16, "a read left more than a partial chunk header"
            decoded += len(wire) - len(b"%x\r\n\r\n" % (len(wire) - 8))
            assert len(conn.body) == min(decoded, len(body))
        conn.data_received(b"0\r\n\r\n")
        assert (await fut).body == body

    run(main)


def test_chunked_bodies_split_anywhere_decode_the_same() -> None:
    import random

    from gpujob_operator.monitoring.scrape.httpclient import Conn

    rng = random.Random(7)
    message = (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        + b"".join(chunked(PAYLOAD, 333)[:-1])
        + b"0\r\nX-Trailer: 1\r\n\r\n"
    )

    async def main() -> None:
        loop = asyncio.get_running_loop()
        for _ in range(30):
            conn = Conn(loop, ("127.0.0.1", 1))
            conn.connection_made(_NullTransport())
            fut = conn.request(b"GET / HTTP/1.1\r\n\r\n", 2**20)
            cuts = sorted(rng.sample(range(1, len(message)), 40))
            for a, b in zip([0, *cuts], [*cuts, len(message)], strict=True):
                conn.data_received(message[a:b])
            assert (await fut).body == PAYLOAD

    run(main)


async def raw_server(replies: dict[bytes, Callable[[asyncio.StreamWriter], Awaitable[None]]]):  # type: ignore[no-untyped-def]
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                await replies[head.split(b" ")[1]](writer)
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass  # the client went away, or the test ended (a cancelled handler is no error)
        finally:
            writer.close()

    srv = await asyncio.start_server(handle, "127.0.0.1", 0)
    return srv, f"http://127.0.0.1:{srv.sockets[0].getsockname()[1]}"


def send(data: bytes) -> Callable[[asyncio.StreamWriter], Awaitable[None]]:
    async def reply(writer: asyncio.StreamWriter) -> None:
        writer.write(data)
        await writer.drain()

    return reply


def ok(body: bytes, *headers: bytes) -> bytes:
    head = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n" % len(body) + b"".join(
        h + b"\r\n" for h in headers
    )
    return head + b"\r\n" + body


async def hang(_: asyncio.StreamWriter) -> None:
    await asyncio.sleep(3600)  # accepts, reads the request, never answers


def relabel(rank: int) -> bytes:
    return PAYLOAD.replace(b'rank="1"}', b'rank="%d"}' % rank)


def test_a_gzip_bomb_a_flood_of_series_and_lying_ranks_are_contained() -> None:
    import gzip

    bomb = gzip.compress(b"\n" * (64 * 2**20))  # 64 MiB of newlines in ~64 KiB
    flood = b"".join(
        b'gpujob_train_loss{rank="%d"} 1\n' % i
        for i in range(100_000)  # 3.3 MB
    )
    extra = PAYLOAD + b'gpujob_train_loss{local_rank="1",node_rank="0",rank="7"} 1\n'
    replies = {
        b"/bomb": send(ok(bomb, b"Content-Encoding: gzip")),
        b"/flood": send(ok(PAYLOAD + flood)),
        b"/liar": send(ok(relabel(0))),  # local rank 1 claims to be global rank 0
        b"/extra": send(ok(extra)),
        b"/good": send(ok(PAYLOAD)),
    }

    async def main() -> None:
        srv, base = await raw_server(replies)
        try:
            async with Scraper(timeout=5.0) as scraper:
                names = ["bomb", "flood", "liar", "extra", "good"]
                return await scraper.scrape_all(
                    [
                        ScrapeTarget(f"{base}/{n}", "p", node_rank=0, local_rank=1, rank=1)
                        for n in names
                    ]
                )
        finally:
            srv.close()

    bomb_r, flood_r, liar, extra_r, good = asyncio.run(main())  # type: ignore[misc]
    assert bomb_r.error == ErrorKind.TOO_LARGE and bomb_r.size == len(bomb)
    assert flood_r.error == ErrorKind.TOO_LARGE and "cap of 10000" in flood_r.message
    assert liar.error == ErrorKind.MISSING_RANK and "expected rank 1" in liar.message
    assert liar.dropped_series == 1
    assert extra_r.ok and extra_r.dropped_series == 1 and extra_r.frame is not None
    assert list(extra_r.frame.ranks) == [1] and "7" in extra_r.notes[0][1]
    assert good.ok and good.dropped_series == 0 and not good.notes


def test_the_timeout_covers_the_wait_for_a_slot_and_one_call_cannot_take_them_all() -> None:
    async def main() -> None:
        srv, base = await raw_server({b"/hang": hang, b"/good": send(ok(PAYLOAD))})
        try:
            async with Scraper(concurrency=4, per_call=2, timeout=2.0) as scraper:
                dead = [ScrapeTarget(f"{base}/hang", f"dead-{i}") for i in range(8)]
                stuck = asyncio.create_task(scraper.scrape_all(dead))
                await asyncio.sleep(0)  # let the dead job take its slots first
                # Another job is served at once: the dead one holds only its share.
                (other,) = await scraper.scrape_all([ScrapeTarget(f"{base}/good", "live")])
                assert other.ok and not stuck.done()
                results = await stuck
            # The whole round of the dead job ended at its timeout: the six that never got
            # a slot say so instead of waiting behind the others.
            kinds = sorted(str(r.error) for r in results)
            assert kinds == ["no_slot"] * 6 + ["timeout"] * 2, kinds
            assert all("slot" in r.message for r in results if r.error == ErrorKind.NO_SLOT)
        finally:
            srv.close()

    run(main)


def test_evidence_from_many_ranks_gets_a_deadline_that_grows_with_them() -> None:
    """The hang evidence of a wide job takes many rounds of the call's share of the slots;
    a rank not yet asked when a fixed deadline passed read as one that did not answer."""

    async def slow(writer: asyncio.StreamWriter) -> None:
        await asyncio.sleep(0.05)
        writer.write(ok(b"{}"))
        await writer.drain()

    async def main() -> None:
        srv, base = await raw_server({b"/slow": slow, b"/hang": hang})
        try:
            async with Scraper(concurrency=4, per_call=2, timeout=0.3) as scraper:
                # 40 endpoints, 2 at a time, 50 ms each: 1 s, over three timeouts.
                many = [ScrapeTarget(f"{base}/slow", f"r-{i}") for i in range(40)]
                assert scraper.fetch_seconds(40) == pytest.approx(0.3 + 0.25 * 19)
                got = await scraper.fetch_all(many, 1024)
                assert [b for b, _, _ in got] == [b"{}"] * 40, {k for _, k, _ in got}
                # A rank that never answers still costs only the timeout, not the deadline.
                t0 = time.monotonic()
                (dead,) = await scraper.fetch_all([ScrapeTarget(f"{base}/hang", "d")], 1024)
                assert dead[1] == "timeout" and time.monotonic() - t0 < 3.0
            assert Scraper(timeout=5.0, per_call=16).fetch_seconds(16_384) == 60.0
        finally:
            srv.close()

    run(main)


# ---- one tenant's CPU: a body of tiny chunks, long framing, long heads -----------------------


def one_byte_chunks(n: int) -> bytes:
    """`n` chunks of one byte each, as a hostile endpoint sends them (6 wire bytes a byte)."""
    return b"1\r\nx\r\n" * n


def test_a_body_of_one_byte_chunks_is_refused_after_the_chunk_cap() -> None:
    """A real server streams 200,000 one-byte chunks: the scrape fails `too_many_chunks` having
    decoded exactly the cap, and what it read is the cap plus at most one socket read."""
    from gpujob_operator.monitoring.scrape.httpclient import MAX_CHUNKS

    head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    stream = one_byte_chunks(200_000)
    honest = b"".join(chunked(PAYLOAD, 1))  # 4127 chunks: more than this test's cap

    async def hostile(writer: asyncio.StreamWriter) -> None:
        writer.write(head)
        for piece in split(stream, 65536):  # the client hangs up after the cap
            writer.write(piece)
            await writer.drain()
        writer.write(b"0\r\n\r\n")
        await writer.drain()

    async def main() -> None:
        srv, base = await raw_server(
            {b"/tiny": hostile, b"/honest": send(head + honest + b"0\r\n\r\n")}
        )
        try:
            async with Scraper(timeout=10.0) as scraper:
                tiny, tiny2 = await scraper.scrape_all(
                    [ScrapeTarget(f"{base}/tiny", "p"), ScrapeTarget(f"{base}/tiny", "q")]
                )
            async with Scraper(timeout=10.0, max_chunks=len(PAYLOAD)) as scraper:
                (ok_r,) = await scraper.scrape_all([ScrapeTarget(f"{base}/honest", "p")])
            async with Scraper(timeout=10.0, max_chunks=len(PAYLOAD) - 1) as scraper:
                (over,) = await scraper.scrape_all([ScrapeTarget(f"{base}/honest", "p")])
        finally:
            srv.close()
        for r in (tiny, tiny2):
            assert r.error == ErrorKind.TOO_MANY_CHUNKS, (r.error, r.message)
            assert f"exceeds the cap of {MAX_CHUNKS} chunks" in r.message
            # Refused on the first chunk past the cap: the cap's bytes decoded, no more.
            assert f"({MAX_CHUNKS} bytes in the first {MAX_CHUNKS})" in r.message
            # Read: the head, the cap's chunks, and at most the rest of one socket read
            # (asyncio reads 256 KiB at a time): a bound, not the 1.2 MB the server had.
            assert 0 < r.size <= len(head) + 6 * (MAX_CHUNKS + 1) + 256 * 1024, r.size
        # The cap counts chunks with data, not the last empty one: exactly at it decodes.
        assert ok_r.ok and ok_r.size == len(PAYLOAD), (ok_r.error, ok_r.message)
        assert over.error == ErrorKind.TOO_MANY_CHUNKS

    run(main)


def chunked_response(max_body: int, max_chunks: int) -> tuple[Any, asyncio.Future[Any]]:
    """A client connection (no socket) that sent a request and got a chunked head back;
    the test feeds the body to it. Call inside a running loop."""
    from gpujob_operator.monitoring.scrape.httpclient import Conn

    conn = Conn(asyncio.get_running_loop(), ("127.0.0.1", 1))
    conn.connection_made(_NullTransport())
    fut = conn.request(b"GET / HTTP/1.1\r\n\r\n", max_body, max_chunks)
    conn.data_received(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
    return conn, fut


def test_decoding_stops_at_the_chunk_cap_however_the_chunks_arrive() -> None:
    """Fed one chunk per read, the decoder counts chunks up to the cap and refuses the next:
    work per response is bounded by the cap, not by what the endpoint keeps sending."""
    from gpujob_operator.monitoring.scrape.httpclient import Failure

    async def main() -> None:
        conn, fut = chunked_response(2**20, 100)
        fed = 0
        while not fut.done():
            conn.data_received(one_byte_chunks(1))
            fed += 1
            assert fed <= 101, "decoding went on past the cap"
        assert conn.chunks == 100 and len(conn.body) == 100 and fed == 101
        exc = fut.exception()
        assert isinstance(exc, Failure) and exc.kind == ErrorKind.TOO_MANY_CHUNKS
        assert conn.closed

    run(main)


def test_chunk_framing_counts_against_a_wire_byte_cap() -> None:
    """Chunk extensions are framing, not body: a few chunks with 4 KB extensions are refused
    on the wire bytes before they are decoded, long before the body or chunk cap."""
    from gpujob_operator.monitoring.scrape.httpclient import Failure, wire_cap

    async def main() -> None:
        conn, fut = chunked_response(1024, 64)
        cap = wire_cap(1024, 64)
        piece = b"1;" + b"e" * 4000 + b"\r\nx\r\n"
        while not fut.done():
            before = conn.received
            conn.data_received(piece)
        exc = fut.exception()
        assert isinstance(exc, Failure) and exc.kind == ErrorKind.TOO_LARGE
        assert "on the wire" in exc.message
        assert before <= cap < before + len(piece)  # refused on the read that passed the cap
        assert conn.chunks < 64 and len(conn.body) == conn.chunks

    run(main)


def test_heads_are_bounded_in_lines_and_the_reason_phrase_is_never_quoted() -> None:
    from gpujob_operator.monitoring.scrape.httpclient import MAX_HEADERS

    many = b"HTTP/1.1 200 OK\r\n" + b"X: y\r\n" * (MAX_HEADERS + 1) + b"Content-Length: 0\r\n\r\n"
    long_line = b"HTTP/1.1 200 OK\r\nX: " + b"y" * 9000 + b"\r\nContent-Length: 0\r\n\r\n"
    reason = b"HTTP/1.1 503 " + b"r" * 60_000 + b"\r\nContent-Length: 0\r\n\r\n"
    huge_head = b"HTTP/1.1 503 " + b"r" * 100_000 + b"\r\n\r\n"
    replies = {
        b"/many": send(many),
        b"/long": send(long_line),
        b"/reason": send(reason),
        b"/huge": send(huge_head),
    }

    async def main() -> None:
        srv, base = await raw_server(replies)
        try:
            async with Scraper(timeout=5.0) as scraper:
                return await scraper.scrape_all(
                    [ScrapeTarget(f"{base}/{n}", "p") for n in ("many", "long", "reason", "huge")]
                )
        finally:
            srv.close()

    many_r, long_r, reason_r, huge_r = asyncio.run(main())  # type: ignore[misc]
    assert many_r.error == ErrorKind.CONNECTION and "header lines" in many_r.message
    assert long_r.error == ErrorKind.CONNECTION and "header line exceeds" in long_r.message
    assert reason_r.error == ErrorKind.HTTP_STATUS
    assert reason_r.message == "HTTP 503", "the status code, none of the endpoint's words"
    assert huge_r.error == ErrorKind.CONNECTION and "head exceeds" in huge_r.message


def test_endpoint_words_reach_metrics_available_clipped_from_a_real_server() -> None:
    """Real endpoints: 60 KB reason phrases, a 100 KB reason phrase (past the head cap) and a
    100 KB local_rank label. Unclipped, five of them made MetricsAvailable's message ~300 KB and
    the API server refused every status write of the job; now it fits and names each rank."""
    from gpujob_operator.api import conditions as c
    from gpujob_operator.api.status import Condition
    from gpujob_operator.monitoring.monitor import JobMonitor
    from tests.unit.operator.monitoring.test_monitor import SPEC

    long_label = PAYLOAD.replace(b'local_rank="1"', b'local_rank="%s"' % (b"l" * 100_000))
    replies = {
        b"/reason": send(b"HTTP/1.1 503 " + b"r" * 60_000 + b"\r\nContent-Length: 0\r\n\r\n"),
        b"/huge": send(b"HTTP/1.1 503 " + b"r" * 100_000 + b"\r\n\r\n"),
        b"/label": send(ok(long_label)),
    }
    paths = ["reason", "label", "reason", "huge", "label", "reason"]

    async def main() -> list[ScrapeResult]:
        srv, base = await raw_server(replies)
        try:
            async with Scraper(timeout=5.0) as scraper:
                return await scraper.scrape_all(
                    [
                        ScrapeTarget(f"{base}/{p}", f"pod-{i}", "n", 0, 1, 1)
                        for i, p in enumerate(paths)
                    ]
                )
        finally:
            srv.close()

    results = asyncio.run(main())
    kinds = [str(r.error) for r in results]
    assert kinds == [
        "http_status", "missing_rank", "http_status", "connection", "missing_rank", "http_status"
    ], kinds  # fmt: skip
    assert all(len(r.message) < 300 for r in results), [len(r.message) for r in results]
    m = c.find(JobMonitor(SPEC).observe(results, 1e9).conditions, c.METRICS_AVAILABLE)
    assert m is not None and len(m["message"]) <= c.MESSAGE_MAX_LENGTH
    Condition.model_validate(m)
    for i in range(5):
        assert f"pod-{i} " in m["message"]
    assert "http_status: HTTP 503;" in m["message"] and "rrr" not in m["message"]
    assert "missing_rank: expected local_rank 1, the endpoint exports lll" in m["message"]


def test_a_frame_keeps_no_long_endpoint_label_value() -> None:
    """GPU UUIDs, telemetry reasons and local_rank labels reach status fields and verdict
    summaries: the frame keeps at most MAX_LABEL_TEXT characters of each."""
    from gpujob_operator.monitoring.scrape.frame import MAX_LABEL_TEXT, frame_payload

    v = "v" * 100_000
    text = (
        f'gpujob_train_steps_total{{local_rank="{v}",rank="1"}} 3\n'
        f'gpujob_cuda_memory_reserved_bytes{{rank="1",UUID="{v}"}} 1\n'
        f'gpujob_gpu_utilization_ratio{{gpu="0",UUID="{v}"}} 0.5\n'
        f'gpujob_gpu_telemetry_available{{reason="{v}"}} 0\n'
    )
    for fr in (frame_payload(text, 1.0), frame(parse(text, NEEDED), 1.0)):
        texts = [*fr.cuda_uuid.values(), *(u for u, _ in fr.gpus.values()), fr.telemetry or ""]
        texts += list(fr.steps_local_ranks)
        assert len(texts) == 4 and all(0 < len(t) <= MAX_LABEL_TEXT for t in texts), texts


def test_the_evidence_fetch_presents_the_jobs_token_to_a_real_trainer_endpoint() -> None:
    from prometheus_client import CollectorRegistry

    from gpujob_operator.monitoring.hang.hang import evidence_targets
    from gpujob_trainer.exporter import Exporter

    exporter = Exporter(CollectorRegistry(), 0, "127.0.0.1", rank=0, debug=True, token="tok-1")
    port = exporter.start()
    metrics = [ScrapeTarget(f"http://127.0.0.1:{port}/metrics", "p", rank=0)]

    async def main() -> None:
        async with Scraper() as scraper:
            (without,) = await scraper.fetch_all(evidence_targets(metrics), 2**20)
            (wrong,) = await scraper.fetch_all(evidence_targets(metrics, "tok-2"), 2**20)
            (right,) = await scraper.fetch_all(evidence_targets(metrics, "tok-1"), 2**20)
        for body, kind, message in (without, wrong):
            assert body is None and kind == ErrorKind.HTTP_STATUS and "401" in message
        body, kind, _ = right
        assert kind is None and body is not None and json.loads(body)["rank"] == 0

    try:
        run(main)
    finally:
        exporter.stop()


def test_a_token_never_splits_the_request_head() -> None:
    from gpujob_operator.monitoring.scrape.httpclient import Failure, endpoint

    head = endpoint("http://10.0.0.1:9400/debug/evidence", "abc").head
    assert b"\r\nAuthorization: Bearer abc\r\n" in head and head.endswith(b"\r\n\r\n")
    assert b"Authorization" not in endpoint("http://10.0.0.1:9400/metrics").head
    with pytest.raises(Failure):
        endpoint("http://10.0.0.1:9400/debug/evidence", "abc\r\nX-Evil: 1")


def test_a_body_that_is_not_prometheus_text_is_reported_without_a_byte_of_it() -> None:
    """On the host network a metrics port may be any service of the node: what it says must
    not reach the job's status. Before, up to 120 characters of the bad line were quoted."""
    from gpujob_operator.monitoring.scrape.scraper import NOT_PROMETHEUS

    secret = b'{"token": "s3cr3t-node-credential"}\n'
    replies = {b"/metrics": send(ok(secret)), b"/html": send(ok(b"<html>s3cr3t</html>"))}

    async def main() -> list[ScrapeResult]:
        srv, base = await raw_server(replies)
        try:
            async with Scraper(timeout=5.0) as scraper:
                return await scraper.scrape_all(
                    [ScrapeTarget(f"{base}/metrics", "p"), ScrapeTarget(f"{base}/html", "p")]
                )
        finally:
            srv.close()

    for r, body in zip(asyncio.run(main()), (secret, b"<html>s3cr3t</html>"), strict=True):
        assert r.error == ErrorKind.PARSE
        assert r.message == f"{NOT_PROMETHEUS} ({len(body)} bytes)"
        assert "s3cr3t" not in r.message


def test_diagnose_presents_the_token_it_is_given_to_the_ranks_evidence() -> None:
    """`gpujob diagnose --token` against ranks that require one (jobEndpoints.token)."""
    from prometheus_client import CollectorRegistry

    from gpujob_operator.monitoring.diagnose import compare_ranks
    from gpujob_trainer.exporter import Exporter

    exporter = Exporter(CollectorRegistry(), 0, "127.0.0.1", rank=0, debug=True, token="tok-1")
    port = exporter.start()
    metrics = [ScrapeTarget(f"http://127.0.0.1:{port}/metrics", "p", rank=0)]
    try:
        refused = asyncio.run(compare_ranks(metrics, 5.0))
        answered = asyncio.run(compare_ranks(metrics, 5.0, "tok-1"))
    finally:
        exporter.stop()
    assert refused.unusable == [0] or refused.silent == [0], refused
    assert not answered.unusable and not answered.silent, answered


def test_a_wide_round_runs_through_its_share_of_workers_not_a_task_per_rank() -> None:
    """A 4,096-rank job's round made 4,096 tasks, each with a timer while it waited for the
    call's share of the slots; now `per_call` workers take the ranks in turn, in order."""

    async def main() -> None:
        srv, base = await raw_server({b"/good": send(ok(PAYLOAD))})
        try:
            async with Scraper(concurrency=8, per_call=3, timeout=5.0) as scraper:
                targets = [ScrapeTarget(f"{base}/good", f"p-{i}") for i in range(60)]
                most = 0

                async def count() -> None:
                    nonlocal most
                    while True:
                        ours = [
                            t
                            for t in asyncio.all_tasks()
                            if t.get_coro().__qualname__.startswith("Scraper.")  # type: ignore[union-attr]
                        ]
                        most = max(most, len(ours))
                        await asyncio.sleep(0)

                counter = asyncio.create_task(count())
                results = await scraper.scrape_all(targets)
                counter.cancel()
            assert [r.target.pod for r in results] == [t.pod for t in targets]
            assert all(r.ok for r in results), {str(r.error) for r in results}
            assert most == 3, most  # the call's share of the slots, never a task a rank
        finally:
            srv.close()

    run(main)
