"""`gpujob diagnose URL...`: the operator's progress and verdict, for live endpoints.

Scrapes trainer endpoints for a window (no cluster needed: a laptop, a pod's port-forward,
a test) and runs the very code the operator runs, window, analysis and hysteresis included,
so what it prints is what the job's status would say. When the ranks are found hung, it
also asks each for its ``/debug/evidence`` and prints the comparison the operator would
record (who is not where the others are, and where each rank is). With ``--profile STEPS``
it asks each rank for a profile of STEPS steps instead and prints the comparison the
operator would record in ``status.profile`` and its ConfigMap.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, TextIO

import yaml
from pydantic import ValidationError

from gpujob_operator import api
from gpujob_operator.api.display import format_duration, format_percent, format_rate
from gpujob_operator.monitoring.hang import hang, hangdump
from gpujob_operator.monitoring.hang.hang import HangReport
from gpujob_operator.monitoring.monitor import JobMonitor
from gpujob_operator.monitoring.profile import profilecompare, profiledoc
from gpujob_operator.monitoring.profile.profilecompare import ProfileReport
from gpujob_operator.monitoring.scrape.result import ScrapeTarget
from gpujob_operator.monitoring.scrape.scraper import Scraper
from gpujob_operator.monitoring.update import MonitorUpdate
from gpujob_operator.monitoring.verdicts.analysis_settings import Settings
from gpujob_operator.monitoring.verdicts.verdict import STALLED
from gpujob_trainer import contract


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The `diagnose` subcommand's options.

    The analysis settings start from the API's defaults, or from a job manifest's
    `spec.monitoring` with `--job`, so a diagnosis judges by the job's own thresholds; a
    flag given on the command line overrides either.
    """
    p.add_argument("urls", nargs="+", metavar="URL", help="rank endpoints (host:port or URL)")
    p.add_argument("--window", type=float, default=30.0, metavar="SECONDS", help="scrape this long")
    p.add_argument("--interval", type=float, default=2.0, metavar="SECONDS", help="between scrapes")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument(
        "--job",
        type=Path,
        metavar="FILE",
        help="a GPUTrainingJob manifest (YAML or JSON): use its spec.monitoring settings, "
        "thresholds and spec.training.totalSteps",
    )
    p.add_argument("--total-steps", type=int, metavar="N", help="target when not exported")
    p.add_argument("--warmup-steps", type=int, metavar="N", help="steps ignored at the start")
    p.add_argument("--min-scrapes", type=int, metavar="N", help="scrapes before a verdict")
    p.add_argument("--hysteresis", type=int, metavar="N", help="windows a new verdict must hold")
    p.add_argument(
        "--peak-tflops",
        type=float,
        metavar="T",
        help="dense peak TFLOP/s of one GPU for MFU (spec.monitoring.peakTFLOPSPerGPU)",
    )
    for name, what in (
        ("stall", "no step on any rank for this long: Stalled"),
        ("startup", "allowed before the first step"),
        ("busy", "allowed in one checkpoint or evaluation"),
    ):
        p.add_argument(f"--{name}-timeout", type=float, metavar="SECONDS", help=what)
    p.add_argument(
        "--threshold",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a spec.monitoring.thresholds field, e.g. commBoundRatio=0.1 (repeatable)",
    )
    p.add_argument("--timeout", type=float, default=5.0, metavar="SECONDS", help="per request")
    p.add_argument(
        "--token",
        default=os.environ.get("GPUJOB_ENDPOINT_TOKEN", ""),
        metavar="TOKEN",
        help="the job's endpoint token, where its ranks require one for /debug/evidence "
        "(kubectl get secret JOB-endpoint-token-UID8 -o jsonpath='{.data.token}' | base64 -d; "
        "default: env GPUJOB_ENDPOINT_TOKEN)",
    )

    p.add_argument(
        "--profile",
        type=int,
        metavar="STEPS",
        help=f"profile the ranks for STEPS training steps (1..{contract.PROFILE_MAX_STEPS}) "
        "instead of scraping: GET /debug/profile on each, wait for every rank, compare them "
        "(the slowest by busy time against the median) and print what the operator would "
        "write in status.profile and its ConfigMap",
    )
    p.add_argument(
        "--profile-timeout",
        type=float,
        metavar="SECONDS",
        help="with --profile, how long to wait for the ranks (default: scaled by STEPS)",
    )


class SettingsError(ValueError):
    """A diagnose option or job manifest the API would refuse; the message names it."""


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


def _job_spec(path: Path) -> api.GPUTrainingJobSpec:
    try:
        doc = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as e:
        raise SettingsError(f"--job {path}: {e}") from e
    spec = doc.get("spec") if isinstance(doc, dict) else None
    if not isinstance(spec, dict):
        raise SettingsError(f"--job {path}: not a GPUTrainingJob manifest (no spec)")
    try:
        return api.parse_spec(spec)
    except ValidationError as e:
        raise SettingsError(f"--job {path}: {api.spec_problems(e)}") from e


def _thresholds(base: api.Thresholds, pairs: Sequence[str]) -> api.Thresholds:
    given: dict[str, str] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name.strip():
            raise SettingsError(f"--threshold {pair!r}: expected NAME=VALUE")
        given[name.strip()] = value.strip()
    if not given:
        return base
    known = {f.alias or n for n, f in api.Thresholds.model_fields.items()}
    unknown = sorted(set(given) - known)
    if unknown:  # the model ignores unknown fields; a typo must not pass silently
        raise SettingsError(
            f"--threshold {', '.join(unknown)}: unknown; one of {', '.join(sorted(known))}"
        )
    try:
        return api.Thresholds.model_validate({**base.model_dump(by_alias=True), **given})
    except ValidationError as e:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or 'thresholds'}: {err['msg']}"
            for err in e.errors()
        )
        raise SettingsError(f"--threshold: {problems}") from e


def settings_from_args(args: argparse.Namespace) -> Settings:
    """The analysis settings: the job's (`--job`) or the API's defaults, then the flags."""
    job = _job_spec(args.job) if args.job else None
    if job is not None:
        base = Settings.from_monitoring(
            job.monitoring, job.training.total_steps, job.total_gpus or None
        )
    else:
        base = Settings.from_monitoring(api.Monitoring())
    flags = {  # Settings field: (flag, value)
        "total_steps": ("total-steps", args.total_steps),
        "warmup_steps": ("warmup-steps", args.warmup_steps),
        "min_scrapes": ("min-scrapes", args.min_scrapes),
        "hysteresis_windows": ("hysteresis", args.hysteresis),
        "stall_timeout_seconds": ("stall-timeout", args.stall_timeout),
        "startup_timeout_seconds": ("startup-timeout", args.startup_timeout),
        "busy_timeout_seconds": ("busy-timeout", args.busy_timeout),
    }
    for flag, value in flags.values():
        if value is not None and value < 0:
            raise SettingsError(f"--{flag}: must be >= 0, got {value}")
    peak = base.peak_tflops
    if args.peak_tflops is not None:
        if not 0 < args.peak_tflops <= 1e6:
            raise SettingsError(f"--peak-tflops: must be > 0 and <= 1e6, got {args.peak_tflops}")
        peak = args.peak_tflops
    return replace(
        base,
        **{k: v for k, (_, v) in flags.items() if v is not None},
        window_seconds=max(args.window, args.interval),
        scrape_interval_seconds=args.interval,
        thresholds=_thresholds(base.thresholds, args.threshold),
        peak_tflops=peak,
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


async def compare_ranks(
    targets: Sequence[ScrapeTarget], timeout: float = 5.0, token: str = ""
) -> HangReport:
    """Every rank's hang evidence, compared (what the operator does when a job stalls)."""
    asked = hang.evidence_targets(targets, token)
    async with Scraper(timeout=timeout, concurrency=64) as scraper:
        fetched = await scraper.fetch_all(asked, hangdump.MAX_BYTES)
    return hang.compare(asked, fetched)[1]


async def profile_ranks(
    targets: Sequence[ScrapeTarget],
    steps: int,
    *,
    capture_id: str | None = None,
    token: str = "",
    timeout: float = 5.0,
    deadline: float | None = None,
    poll: float = 1.0,
) -> ProfileReport:
    """Ask every rank for a capture of ``steps`` steps and poll until each is done or failed
    (or ``deadline`` seconds passed: the rest are reported as not finished), then compare
    them as the operator does."""
    capture_id = capture_id or secrets.token_hex(4)
    asked = profilecompare.profile_targets(targets, capture_id, steps, token)
    loop = asyncio.get_running_loop()
    until = loop.time() + (deadline or profilecompare.capture_deadline(steps))
    async with Scraper(timeout=timeout, concurrency=64) as scraper:
        while True:
            fetched = await scraper.fetch_all(asked, profiledoc.MAX_BYTES)
            answers = profilecompare.answers_of(asked, fetched, capture_id)
            if profilecompare.settled(answers) or loop.time() >= until:
                break
            await asyncio.sleep(max(0.0, min(poll, until - loop.time())))
    return profilecompare.compare(profilecompare.at_deadline(answers))


def profile_json(r: ProfileReport) -> dict[str, Any]:
    return {
        "answer": r.answer,
        "slowestRank": r.slowest_rank,
        "medianRank": r.median_rank,
        "operation": r.operation,
        "ranks": {str(a.rank): a.summary.to_json() for a in r.usable if a.summary is not None},
        "failedRanks": [{"rank": rank, "why": why} for rank, why in r.failed],
    }


def run_profile(args: argparse.Namespace, targets: Sequence[ScrapeTarget]) -> int:
    """``gpujob diagnose --profile STEPS``: 0 when a rank gave a profile, 2 when none did,
    64 for a bad STEPS."""
    steps = int(args.profile)
    if not 1 <= steps <= contract.PROFILE_MAX_STEPS:
        sys.stderr.write(
            f"gpujob diagnose: --profile must be 1..{contract.PROFILE_MAX_STEPS}, got {steps}\n"
        )
        return 64
    report = asyncio.run(
        profile_ranks(
            targets,
            steps,
            token=args.token,
            timeout=args.timeout,
            deadline=getattr(args, "profile_timeout", None),
        )
    )
    if args.json:
        json.dump(profile_json(report), sys.stdout, indent=2, sort_keys=True)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(profilecompare.render_text(report))
    return 0 if report.usable else 2


def stalled(update: MonitorUpdate) -> bool:
    """Whether the diagnosis found the ranks hung (published or just detected)."""
    return any(v.verdict == STALLED for v in update.analysis.candidates)


def hang_json(r: HangReport) -> dict[str, Any]:
    return {
        "summary": r.summary,
        "culprits": r.culprits,
        "silent": r.silent,
        "unusable": r.unusable,
        "where": r.where,
    }


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


def _breakdown_line(r: dict[str, Any]) -> str:
    """One rank's step split, e.g. `rank 1 slowest: step 0.655s = own 0.646 (...) + comm 0.008`."""

    def g(key: str) -> float:
        return float(r.get(key) or 0.0)

    parts = [
        f"own {g('ownSeconds'):.3g} (compute {g('computeSeconds'):.3g}, other {g('otherSeconds'):.3g})"
    ]
    mfu = f", MFU {format_percent(100 * float(r['mfu']))}" if r.get("mfu") is not None else ""
    for key, label in (
        ("dataWaitSeconds", "data"),
        ("h2dSeconds", "h2d"),
        ("commWaitSeconds", "comm"),
        ("checkpointSeconds", "checkpoint"),
        ("evalSeconds", "eval"),
    ):
        if g(key) > 0:
            parts.append(f"{label} {g(key):.3g}")
    where = f" ({r['pod']})" if r.get("pod") else ""
    return (
        f"rank {r.get('rank')} {r.get('role', '')}{where}: step {g('stepSeconds'):.3g}s = "
        + " + ".join(parts)
        + mfu
    )


def render_text(update: MonitorUpdate, out: TextIO, hung: HangReport | None = None) -> None:
    """A readable table of what the operator would write (and the ranks compared, if hung)."""
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
    if "stepSecondsP50" in p:
        latency = f"p50 {p['stepSecondsP50']:.3g}s, p95 {p.get('stepSecondsP95', 0):.3g}s"
        if p.get("samplesPerSecond"):
            latency += f"; {1000 / float(p['samplesPerSecond']):.3g} ms per sample"
        rows.append(("step time", latency))
    if "mfu" in p:
        rows.append(
            (
                "mfu",
                f"{format_percent(100 * float(p['mfu']))} ({p.get('achievedTFLOPSPerGPU', 0):g} "
                f"of {p.get('peakTFLOPSPerGPU', 0):g} TFLOP/s per GPU)",
            )
        )
    elif "mfuUnavailable" in p:
        rows.append(("mfu", f"unknown: {p['mfuUnavailable']}"))
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
        for i, r in enumerate(b.get("breakdown") or []):
            rows.append(("breakdown" if i == 0 else "", _breakdown_line(r)))
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
    if hung is not None:
        rows.append(("hang", hung.summary))
        rows += [("", f"rank {rank} {where}") for rank, where in hung.where.items()]
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        out.write(f"{key.rjust(width)}  {value}\n")


def run(args: argparse.Namespace) -> int:
    """Entry point of `gpujob diagnose`: 0; 2 when no endpoint could be scraped; 64 for a
    bad option or job manifest. With ``--profile STEPS`` it profiles instead
    (:func:`run_profile`)."""
    targets = targets_from_urls(args.urls)
    if getattr(args, "profile", None) is not None:
        return run_profile(args, targets)
    try:
        settings = settings_from_args(args)
    except SettingsError as e:
        sys.stderr.write(f"gpujob diagnose: {e}\n")
        return 64  # EX_USAGE: nothing was scraped
    update = asyncio.run(
        diagnose(
            targets, settings, window=args.window, interval=args.interval, timeout=args.timeout
        )
    )
    hung = (
        asyncio.run(compare_ranks(targets, args.timeout, args.token)) if stalled(update) else None
    )
    if args.json:
        doc = report(update)
        if hung is not None:
            doc["hangEvidence"] = hang_json(hung)
        json.dump(doc, sys.stdout, indent=2, sort_keys=True)
        sys.stdout.write("\n")
    else:
        render_text(update, sys.stdout, hung)
    return 2 if len(update.failures) == len(targets) else 0
