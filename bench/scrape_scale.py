"""Bench: the operator's scrape-and-analyze path over many trainer endpoints, vs Prometheus.

    python bench/scrape_scale.py [--jobs 1000] [--ranks 8] [--rounds 10] [--prom-targets 2000]

A light HTTP server (a child process, loopback only) serves N realistic payloads: rank
payloads recorded from the example trainer, and for local rank 0 a synthetic one with 8 GPUs
(~160 GPU samples, ~22 KB). The driver holds a `JobMonitor` per job and scrapes every rank
through one shared `Scraper`, as the operator does, for a few rounds (enough to fill the
windows). Then a real Prometheus (the Debian package) scrapes the same endpoints and its CPU
is read from /proc. Prints figures; asserts nothing (numbers belong in benchmarks).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing as mp
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from gpujob_localcluster.hollow.payloads import gpu_series
from gpujob_localcluster.ports import free_port
from gpujob_operator.monitoring.monitor import JobMonitor
from gpujob_operator.monitoring.scrape.result import ScrapeTarget
from gpujob_operator.monitoring.scrape.scraper import Scraper
from gpujob_operator.monitoring.verdicts.analysis_settings import Settings
from gpujob_trainer import contract

ROOT = Path(__file__).resolve().parents[1]
PAYLOADS = ROOT / "tests" / "data" / "payloads"
LOOPBACK = "127.0.0.1"


# ---- payloads --------------------------------------------------------------------------------


def rank_payload(local_rank: int) -> bytes:
    """A recorded rank payload relabelled as local rank `local_rank` (node 0)."""
    text = (PAYLOADS / f"healthy-scrape2-rank{min(local_rank, 1)}.prom").read_text()
    text = re.sub(r'local_rank="\d+"', f'local_rank="{local_rank}"', text)
    text = re.sub(r'(?<![a-z_])rank="\d+"', f'rank="{local_rank}"', text)
    labels = f'local_rank="{local_rank}",node_rank="0",rank="{local_rank}"'
    text += f"{contract.HEARTBEAT_TIMESTAMP.name}{{{labels}}} 1.8e+09\n"
    for phase in contract.PHASES:  # the liveness series (not in the recorded payloads)
        on = 1.0 if phase == contract.PHASE_FORWARD else 0.0
        text += f'{contract.CURRENT_PHASE.name}{{{labels},phase="{phase}"}} {on}\n'
    if local_rank == 0:
        text = text.replace('reason="nvml_init_failed"} 0.0', 'reason="ok"} 1.0')
        text += gpu_series(8)
    return text.encode()


# ---- the light server --------------------------------------------------------------------------


def serve(port_queue: mp.Queue, ranks: int) -> None:
    """HTTP/1.1 keep-alive server of precomputed responses; /stats counts by user agent."""
    bodies = [rank_payload(r) for r in range(ranks)]
    heads = [
        (
            "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n"
            f"Content-Length: {len(b)}\r\n\r\n"
        ).encode()
        for b in bodies
    ]
    counts = {"prometheus": 0, "other": 0}
    path_re = re.compile(rb"GET /j\d+/r(\d+)")

    class Proto(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            self.t = transport
            self.buf = b""

        def data_received(self, data: bytes) -> None:
            self.buf += data
            while b"\r\n\r\n" in self.buf:
                req, self.buf = self.buf.split(b"\r\n\r\n", 1)
                if req.startswith(b"GET /stats"):
                    body = json.dumps(counts).encode()
                    head = f"HTTP/1.1 200 OK\r\nContent-Length: {len(body)}\r\n\r\n".encode()
                    self.t.write(head + body)  # type: ignore[attr-defined]
                    continue
                m = path_re.match(req)
                r = int(m.group(1)) % ranks if m else 0
                counts["prometheus" if b"Prometheus" in req else "other"] += 1
                self.t.write(heads[r] + bodies[r])  # type: ignore[attr-defined]

    async def main() -> None:
        server = await asyncio.get_running_loop().create_server(
            Proto, LOOPBACK, 0, backlog=4096, reuse_address=True
        )
        port_queue.put(server.sockets[0].getsockname()[1])
        await server.serve_forever()

    asyncio.run(main())


# ---- the operator's path -------------------------------------------------------------------------


async def operator_rounds(
    port: int, jobs: int, ranks: int, rounds: int, interval: float, timeout: float
) -> dict[str, float]:
    settings = Settings(window_seconds=120, scrape_interval_seconds=15, warmup_steps=0)
    monitors = [JobMonitor(settings) for _ in range(jobs)]
    targets = [
        [
            ScrapeTarget(
                f"http://{LOOPBACK}:{port}/j{j}/r{r}/metrics", f"job{j}-node-0", "node", 0, r, r
            )
            for r in range(ranks)
        ]
        for j in range(jobs)
    ]
    async with Scraper(concurrency=256, timeout=timeout) as scraper:

        async def one(j: int, now: float) -> int:
            results = await scraper.scrape_all(targets[j])
            update = monitors[j].observe(results, now)
            update.status_patch({})
            return sum(r.ok for r in results)

        cpu0, wall0 = time.process_time(), time.perf_counter()
        ok = 0
        for i in range(rounds):
            now = time.time() + i * interval  # windows fill as if 15 s apart
            ok += sum(await asyncio.gather(*(one(j, now) for j in range(jobs))))
        cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    scrapes = jobs * ranks * rounds
    return {
        "scrapes": scrapes,
        "ok": ok,
        "cpu_s": cpu,
        "wall_s": wall,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "monitors": len(monitors),
    }


# ---- Prometheus ----------------------------------------------------------------------------------


def proc_cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def stats(port: int) -> dict[str, int]:
    with urllib.request.urlopen(f"http://{LOOPBACK}:{port}/stats", timeout=10) as r:
        return dict(json.loads(r.read()))


def prometheus_run(
    port: int, targets: int, ranks: int, seconds: float, interval: int
) -> dict[str, float] | str:
    binary = shutil.which("prometheus") or "/usr/bin/prometheus"
    if not Path(binary).exists():
        return "prometheus not installed (apt-get install -y prometheus)"
    tmp = Path(tempfile.mkdtemp(prefix="bench-prom-"))
    groups = []
    for i in range(targets):
        j, r = divmod(i, ranks)
        groups.append(
            f"  - targets: ['{LOOPBACK}:{port}']\n"
            f"    labels: {{__metrics_path__: '/j{j}/r{r}/metrics', job_i: 'j{j}r{r}'}}\n"
        )
    (tmp / "prometheus.yml").write_text(
        f"global: {{scrape_interval: {interval}s, scrape_timeout: {min(interval, 10)}s}}\n"
        "scrape_configs:\n- job_name: trainers\n  static_configs:\n" + "".join(groups)
    )
    web = free_port()
    log = open(tmp / "prometheus.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen(
        [
            binary,
            f"--config.file={tmp / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp / 'data'}",
            f"--web.listen-address={LOOPBACK}:{web}",
            "--log.level=warn",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        # Let it load the config and spread its first scrapes (Prometheus staggers targets
        # over one interval), then measure over whole intervals.
        deadline = time.monotonic() + 60
        while stats(port)["prometheus"] < targets and time.monotonic() < deadline:
            time.sleep(0.5)  # polling a condition with a deadline
        c0, s0, t0 = proc_cpu(proc.pid), stats(port)["prometheus"], time.perf_counter()
        time.sleep(seconds)  # the measurement period itself
        c1, s1, t1 = proc_cpu(proc.pid), stats(port)["prometheus"], time.perf_counter()
        rss = int(Path(f"/proc/{proc.pid}/status").read_text().split("VmRSS:")[1].split()[0])
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
        log.close()
        shutil.rmtree(tmp, ignore_errors=True)
    return {"scrapes": s1 - s0, "cpu_s": c1 - c0, "wall_s": t1 - t0, "rss_mb": rss / 1024}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--jobs", type=int, default=1000)
    p.add_argument("--ranks", type=int, default=8)
    p.add_argument("--rounds", type=int, default=10, help="scrape rounds (9 fill a window)")
    p.add_argument("--prom-targets", type=int, default=2000)
    p.add_argument("--prom-seconds", type=float, default=30.0)
    p.add_argument("--prom-interval", type=int, default=5)
    p.add_argument("--no-prometheus", action="store_true")
    p.add_argument(
        "--timeout",
        type=float,
        default=10.0,
        help="scrape timeout; it covers the wait for a slot, and every job scrapes at once here",
    )
    args = p.parse_args()

    sizes = [len(rank_payload(r)) for r in range(2)]
    q: mp.Queue = mp.Queue()
    server = mp.Process(target=serve, args=(q, args.ranks), daemon=True)
    server.start()
    port = q.get(timeout=30)
    lines0 = rank_payload(0).count(b"\n")
    print(f"payloads: local rank 0 {sizes[0]} B ({lines0} lines), other ranks {sizes[1]} B")
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    op = asyncio.run(operator_rounds(port, args.jobs, args.ranks, args.rounds, 15.0, args.timeout))
    per_1000 = op["cpu_s"] / op["scrapes"] * 1000
    print(
        f"operator: {op['scrapes']:.0f} scrapes ({op['ok']:.0f} ok) of {args.jobs} jobs x "
        f"{args.ranks} ranks, {args.rounds} rounds, in {op['wall_s']:.1f} s wall, "
        f"{op['cpu_s']:.1f} s CPU"
    )
    print(
        f"operator: {op['scrapes'] / op['cpu_s']:.0f} endpoints/s per core; "
        f"{per_1000:.3f} CPU s per 1,000 scrapes (scrape + parse + window + analysis + patch)"
    )
    print(
        f"operator: {15 * op['scrapes'] / op['cpu_s']:.0f} endpoints per 15 s on one core "
        "(target >= 10,000)"
    )
    print(
        f"operator: peak RSS {op['peak_rss_mb']:.0f} MB holding the windows of "
        f"{args.jobs} jobs x {args.ranks} ranks (before: {rss0:.0f} MB; target <= 100 MB)"
    )
    if not args.no_prometheus:
        prom = prometheus_run(
            port, args.prom_targets, args.ranks, args.prom_seconds, args.prom_interval
        )
        if isinstance(prom, str):
            print(f"prometheus: skipped: {prom}")
        else:
            pp = prom["cpu_s"] / max(1, prom["scrapes"]) * 1000
            print(
                f"prometheus: {prom['scrapes']:.0f} scrapes of {args.prom_targets} targets in "
                f"{prom['wall_s']:.0f} s, {prom['cpu_s']:.1f} s CPU, RSS {prom['rss_mb']:.0f} MB"
            )
            print(f"prometheus: {pp:.3f} CPU s per 1,000 scrapes")
            print(f"ratio operator/prometheus CPU per scrape: {per_1000 / pp:.2f} (target <= 0.5)")
    server.terminate()
    server.join(timeout=10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
