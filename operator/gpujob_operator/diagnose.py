"""`gpujob diagnose URL...`: the operator's progress and verdict, for live endpoints.

Scrapes trainer endpoints for a window (no cluster needed: a laptop, a pod's port-forward,
a test) and runs the very code the operator runs, window, analysis and hysteresis included,
so what it prints is what the job's status would say.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any, TextIO

from gpujob_operator import api
from gpujob_operator.analysis import Settings
from gpujob_operator.display import format_duration, format_percent, format_rate
from gpujob_operator.monitor import JobMonitor, MonitorUpdate
from gpujob_operator.scrape import Scraper, ScrapeTarget
from gpujob_trainer import contract


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The `diagnose` subcommand's options."""
    p.add_argument("urls", nargs="+", metavar="URL", help="rank endpoints (host:port or URL)")
    p.add_argument("--window", type=float, default=30.0, metavar="SECONDS", help="scrape this long")
    p.add_argument("--interval", type=float, default=2.0, metavar="SECONDS", help="between scrapes")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--total-steps", type=int, metavar="N", help="target when not exported")
    p.add_argument("--warmup-steps", type=int, default=api.Monitoring().warmup_steps, metavar="N")
    p.add_argument("--min-scrapes", type=int, default=api.Window().min_scrapes, metavar="N")
    p.add_argument(
        "--hysteresis", type=int, default=api.Monitoring().hysteresis_windows, metavar="N"
    )
    p.add_argument(
        "--stall-timeout",
        type=float,
        default=float(api.Monitoring().stall_timeout_seconds),
        metavar="SECONDS",
    )
    p.add_argument("--timeout", type=float, default=5.0, metavar="SECONDS", help="per request")


def targets_from_urls(urls: Sequence[str]) -> list[ScrapeTarget]:
    """Targets for bare endpoints; each is its own "pod" named host:port."""
    out = []
    for url in urls:
        full = url if "://" in url else f"http://{url}"
        rest = full.split("://", 1)[1]
        if "/" not in rest:
            full += contract.METRICS_PATH
        out.append(ScrapeTarget(url=full, pod=rest.split("/", 1)[0]))
    return out


def settings_from_args(args: argparse.Namespace) -> Settings:
    return Settings(
        total_steps=args.total_steps,
        warmup_steps=args.warmup_steps,
        min_scrapes=args.min_scrapes,
        window_seconds=max(args.window, args.interval),
        scrape_interval_seconds=args.interval,
        stall_timeout_seconds=args.stall_timeout,
        hysteresis_windows=args.hysteresis,
    )


async def diagnose(
    targets: Sequence[ScrapeTarget],
    settings: Settings,
    *,
    window: float,
    interval: float,
    timeout: float = 5.0,
    monitor: JobMonitor | None = None,
    on_round: Callable[[MonitorUpdate], None] | None = None,
) -> MonitorUpdate:
    """Scrape every `interval` seconds for `window` seconds; the last round's update.

    Pass the same `monitor` again to continue a previous diagnosis (its window and
    hysteresis carry over), as the operator does scrape after scrape.
    """
    monitor = monitor or JobMonitor(settings)
    rounds = max(1, int(window / interval) + 1)
    loop = asyncio.get_running_loop()
    start = loop.time()
    update: MonitorUpdate | None = None
    async with Scraper(timeout=timeout, concurrency=64) as scraper:
        for i in range(rounds):
            results = await scraper.scrape_all(targets)
            update = monitor.observe(results, time.time())
            if on_round is not None:
                on_round(update)
            if i + 1 < rounds:  # a schedule, not synchronisation
                await asyncio.sleep(max(0.0, start + (i + 1) * interval - loop.time()))
    assert update is not None
    return update


def report(update: MonitorUpdate) -> dict[str, Any]:
    """The JSON shape of a diagnosis: status parts, conditions, candidates, failures."""
    a = update.analysis
    return {
        "progress": update.progress,
        "bottleneck": update.bottleneck,
        "gpus": update.gpus,
        "conditions": update.conditions,
        "candidates": [v.to_status() for v in a.candidates],
        "ready": a.ready,
        "notReadyReason": a.not_ready_reason,
        "failures": [
            {"pod": f.target.pod, "url": f.target.url, "error": str(f.error), "message": f.message}
            for f in update.failures
        ],
    }


def _bar(percent: float, width: int = 30) -> str:
    filled = round(width * min(100.0, max(0.0, percent)) / 100)
    return "[" + "#" * filled + "." * (width - filled) + "]"


def render_text(update: MonitorUpdate, out: TextIO) -> None:
    """A readable table of what the operator would write."""
    p, b, g = update.progress, update.bottleneck or {}, update.gpus
    rows: list[tuple[str, str]] = []
    if "step" in p:
        step = f"{p['step']}" + (f" / {p['totalSteps']}" if "totalSteps" in p else "")
        if "percent" in p:
            step += f"  {_bar(float(p['percent']))} {format_percent(float(p['percent']))}"
        rows.append(("step", step))
    if "epoch" in p:
        rows.append(("epoch", f"{p['epoch']:g}"))
    if "samplesPerSecond" in p:
        rows.append(("throughput", format_rate(float(p["samplesPerSecond"]), "samples")))
    if "tokensPerSecond" in p:
        rows.append(("tokens", format_rate(float(p["tokensPerSecond"]), "tokens")))
    if "etaSeconds" in p:
        eta = format_duration(float(p["etaSeconds"])) or "0s"
        if "estimatedCompletionTime" in p:
            eta += f"  (done at {p['estimatedCompletionTime']})"
        rows.append(("eta", eta))
    if "lastStepTime" in p:
        rows.append(("last step", str(p["lastStepTime"])))
    if "loss" in p:
        rows.append(("loss", f"{p['loss']:.4g}"))
    if b:
        who = "".join(
            f" {k}={b[k]}" for k in ("rank", "pod", "node", "gpuUUID") if b.get(k) is not None
        )
        rows.append(("verdict", f"{b['verdict']} ({b.get('severity', '')}){who}"))
        rows.append(("summary", str(b.get("summary", ""))))
        ev = b.get("evidence") or {}
        if ev:
            rows.append(("evidence", ", ".join(f"{k}={v}" for k, v in ev.items())))
        if b.get("advice"):
            rows.append(("advice", str(b["advice"])))
    else:
        rows.append(("verdict", f"none yet ({update.analysis.not_ready_reason or 'no data'})"))
    pending = [v.verdict for v in update.analysis.candidates]
    if pending and pending[0] != b.get("verdict"):
        rows.append(("candidates", ", ".join(pending) + " (not yet held long enough)"))
    if g:
        gpu = str(g.get("telemetry", ""))
        if g.get("observed"):
            gpu += f"; {g['observed']} GPU(s)"
            if "meanUtilizationRatio" in g:
                gpu += f", mean utilization {100 * float(g['meanUtilizationRatio']):.0f}%"
            if "maxMemoryUsedRatio" in g:
                gpu += f", max memory used {100 * float(g['maxMemoryUsedRatio']):.0f}%"
        rows.append(("gpus", gpu))
    for cond in update.conditions:
        rows.append((cond["type"], f"{cond['status']} {cond['reason']}: {cond['message']}"))
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        out.write(f"{key.rjust(width)}  {value}\n")


def run(args: argparse.Namespace) -> int:
    """Entry point of `gpujob diagnose`: 0, or 2 when no endpoint could be scraped."""
    targets = targets_from_urls(args.urls)
    settings = settings_from_args(args)
    update = asyncio.run(
        diagnose(
            targets, settings, window=args.window, interval=args.interval, timeout=args.timeout
        )
    )
    if args.json:
        json.dump(report(update), sys.stdout, indent=2, sort_keys=True)
        sys.stdout.write("\n")
    else:
        render_text(update, sys.stdout)
    return 2 if len(update.failures) == len(targets) else 0
