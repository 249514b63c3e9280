"""A rank's /metrics endpoint gone hostile, run as a job's pod: ``python -m tests.chaos.hostile MODE``.

The operator scrapes every rank of a running job; a rank is code the operator does not control.
This server stands where the trainer's exporter would (the pod IP, ``GPUJOB_METRICS_PORT``)
and answers each scrape in one of these ways:

- ``trickle``: a chunked body of valid lines in 32-byte chunks, a thousand a second, forever;
- ``gzip-bomb``: 1 MiB of gzip that inflates to 1 GiB;
- ``labels``: 10,000 new label sets per scrape (100,000 after ten), each with a rank of its
  own and a long label value, beside a plausible payload for the real rank;
- ``nan``: stepping counters beside NaN, +Inf, 2^63 and a timestamp in milliseconds;
- ``liar``: a full, plausible payload whose ``rank`` label is not this rank (and changes);
- ``silent``: accepts the connection and never answers.

Every request (every connection, for ``silent``) appends a line to ``$HOSTILE_LOG`` so the
test knows the operator has really met the endpoint.
"""

from __future__ import annotations

import gzip
import io
import os
import socket
import sys
import threading
import time

from gpujob_trainer import contract

CHUNK = 32
LIAR_STEP = 123
"""The step the liar claims: progress that shows it came from a rejected series."""
LABEL_SETS_PER_SCRAPE = 10_000


def _log(what: str) -> None:
    path = os.environ.get("HOSTILE_LOG")
    if path:
        with open(path, "a") as f:
            f.write(what + "\n")


def _labels(rank: int | str) -> str:
    return f'rank="{rank}",local_rank="0",node_rank="0"'


def plausible(rank: int | str, step: int, now: float) -> str:
    """A payload a healthy rank could serve (steps, samples, timing), for ``rank``."""
    lb = _labels(rank)
    return (
        f"{contract.STEPS.name}{{{lb}}} {step}\n"
        f"{contract.SAMPLES.name}{{{lb}}} {step * 32}\n"
        f"{contract.TARGET_STEPS.name}{{{lb}}} 100000\n"
        f"{contract.EPOCH.name}{{{lb}}} 0\n"
        f"{contract.LOSS.name}{{{lb}}} 0.5\n"
        f"{contract.LAST_STEP_TIMESTAMP.name}{{{lb}}} {now:.3f}\n"
        f"{contract.HEARTBEAT_TIMESTAMP.name}{{{lb}}} {now:.3f}\n"
    )


def _head(extra: str = "", length: int | None = None) -> bytes:
    lines = ["HTTP/1.1 200 OK", "Content-Type: text/plain; version=0.0.4"]
    if length is not None:
        lines.append(f"Content-Length: {length}")
    if extra:
        lines.append(extra)
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def _read_request(conn: socket.socket) -> bool:
    data = b""
    while b"\r\n\r\n" not in data:
        got = conn.recv(65536)
        if not got:
            return False
        data += got
    return True


class Hostile:
    def __init__(self, mode: str, rank: int) -> None:
        self.mode = mode
        self.rank = rank
        self.requests = 0
        self.label_sets = 0
        self.bomb = self._bomb() if mode == "gzip-bomb" else b""
        self.held: list[socket.socket] = []

    @staticmethod
    def _bomb() -> bytes:
        buf = io.BytesIO()
        with gzip.GzipFile(fileobj=buf, mode="wb", compresslevel=9) as gz:
            block = b"\n" * 2**20
            for _ in range(1024):
                gz.write(block)
        return buf.getvalue()

    def body(self) -> bytes:
        n, now = self.requests, time.time()
        if self.mode == "labels":
            # A rank-keyed store grows by one row per rank value; a cache of label bodies by
            # every long value. Both must be capped (or the series refused) and counted.
            lines = []
            for i in range(LABEL_SETS_PER_SCRAPE):
                fake = 1000 + n * LABEL_SETS_PER_SCRAPE + i
                value = f"{n:04d}-{i:05d}-" + "x" * 160
                lines.append(f'{contract.LOSS.name}{{{_labels(fake)},shard="{value}"}} 1\n')
            self.label_sets += LABEL_SETS_PER_SCRAPE
            return (plausible(self.rank, 10 * (n + 1), now) + "".join(lines)).encode()
        if self.mode == "nan":
            lb = _labels(self.rank)
            target = "+Inf" if n % 2 else str(2**63)
            return (
                f"{contract.STEPS.name}{{{lb}}} {5 * (n + 1)}\n"
                f"{contract.SAMPLES.name}{{{lb}}} {160 * (n + 1)}\n"
                f"{contract.TARGET_STEPS.name}{{{lb}}} {target}\n"
                f"{contract.EPOCH.name}{{{lb}}} +Inf\n"
                f"{contract.LOSS.name}{{{lb}}} NaN\n"
                f"{contract.LAST_STEP_TIMESTAMP.name}{{{lb}}} {now * 1000:.0f}\n"
                f"{contract.HEARTBEAT_TIMESTAMP.name}{{{lb}}} {now:.3f}\n"
            ).encode()
        if self.mode == "liar":
            return plausible(self.rank + 7 + n, LIAR_STEP, now).encode()
        raise ValueError(self.mode)

    def serve(self, conn: socket.socket) -> None:
        if self.mode == "silent":
            self.requests += 1
            _log(f"accepted {self.requests}")
            self.held.append(conn)  # never answered, never closed
            return
        with conn:
            while _read_request(conn):
                self.requests += 1
                if self.mode == "trickle":
                    _log(f"request {self.requests}")
                    self._trickle(conn)
                    return
                if self.mode == "gzip-bomb":
                    conn.sendall(_head("Content-Encoding: gzip", len(self.bomb)) + self.bomb)
                else:
                    body = self.body()
                    conn.sendall(_head(length=len(body)) + body)
                _log(f"request {self.requests} label_sets {self.label_sets}")

    def _trickle(self, conn: socket.socket) -> None:
        """Valid lines cut into 32-byte chunks, 32 chunks a millisecond, until the scraper quits.

        Tiny chunks make a parser that re-reads the body from its first byte on every read
        pay for every chunk again and again (quadratic); an incremental one pays once.
        """
        conn.sendall(_head("Transfer-Encoding: chunked"))
        line = f'{contract.LOSS.name}{{{_labels(self.rank)},pad="{"y" * 60}"}} 1\n'.encode()
        text = line * 64
        pieces = [text[i : i + CHUNK] for i in range(0, len(text) - CHUNK + 1, CHUNK)]
        burst = b"".join(f"{len(p):x}\r\n".encode() + p + b"\r\n" for p in pieces[:32])
        try:
            while True:
                conn.sendall(burst)
                time.sleep(0.001)
        except OSError:
            return  # the scraper gave up: good


def main(argv: list[str]) -> int:
    mode = argv[0]
    host = os.environ.get(contract.ENV_METRICS_ADDR) or "127.0.0.1"
    port = int(os.environ.get(contract.ENV_METRICS_PORT) or contract.DEFAULT_METRICS_PORT)
    rank = int(os.environ.get(contract.ENV_RANK) or 0)
    hostile = Hostile(mode, rank)
    srv = socket.create_server((host, port), reuse_port=False)
    srv.listen(64)
    print(f"hostile endpoint ({mode}) on {host}:{port}", flush=True)
    _log(f"listening {mode}")
    while True:
        conn, _ = srv.accept()
        threading.Thread(target=hostile.serve, args=(conn,), daemon=True).start()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
