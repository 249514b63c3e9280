"""Human strings for ``kubectl get`` columns, written to ``status.display``.

CRD printer columns are plain JSONPath: they can neither format a float nor multiply, so
the operator renders "41.3%", "18m20s", "2840 samples/s" and "Straggler(r13)" itself.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

TERMINAL_OR_IDLE_PHASES = frozenset({"Succeeded", "Failed", "Suspended"})


def format_duration(seconds: float) -> str:
    """Compact duration with the two largest units: 45s, 18m20s, 2h5m, 3d4h."""
    if seconds is None or math.isnan(seconds) or seconds < 0:
        return ""
    total = round(seconds)
    days, rem = divmod(total, 86400)
    hours, rem = divmod(rem, 3600)
    minutes, secs = divmod(rem, 60)
    if days:
        return f"{days}d{hours}h" if hours else f"{days}d"
    if hours:
        return f"{hours}h{minutes}m" if minutes else f"{hours}h"
    if minutes:
        return f"{minutes}m{secs}s" if secs else f"{minutes}m"
    return f"{secs}s"


def format_percent(percent: float) -> str:
    """One decimal, never 100.0% before the end: 41.3%."""
    value = math.floor(percent * 10) / 10 if percent < 100 else 100.0
    return f"{value:.1f}%"


def format_rate(value: float, unit: str) -> str:
    """A rate with a readable precision: 2.35 samples/s, 2840 samples/s, 12.3k tokens/s."""
    if value >= 1_000_000:
        return f"{value / 1_000_000:.1f}M {unit}/s"
    if value >= 10_000:
        return f"{value / 1000:.1f}k {unit}/s"
    if value >= 100:
        return f"{value:.0f} {unit}/s"
    if value >= 10:
        return f"{value:.1f} {unit}/s"
    return f"{value:.2f} {unit}/s"


def format_bottleneck(bottleneck: Mapping[str, Any]) -> str | None:
    """Verdict, with the rank when one is named: InputBound, Straggler(r13)."""
    verdict = bottleneck.get("verdict")
    if not verdict:
        return None
    rank = bottleneck.get("rank")
    return f"{verdict}(r{rank})" if rank is not None else str(verdict)


def render_display(status: Mapping[str, Any]) -> dict[str, str]:
    """``status.display`` from ``status.progress``/``bottleneck``/``phase``.

    A finished or suspended job keeps its progress but shows no ETA, throughput or
    bottleneck: they describe a run that is no longer happening.
    """
    out: dict[str, str] = {}
    progress = status.get("progress") or {}
    bottleneck = status.get("bottleneck") or {}
    live = status.get("phase") not in TERMINAL_OR_IDLE_PHASES
    percent = progress.get("percent")
    if percent is not None:
        out["progress"] = format_percent(float(percent))
    elif progress.get("step") is not None:
        out["progress"] = f"step {progress['step']}"
    if not live:
        return out
    eta = progress.get("etaSeconds")
    if eta is not None and (text := format_duration(float(eta))):
        out["eta"] = text
    if progress.get("samplesPerSecond") is not None:
        out["throughput"] = format_rate(float(progress["samplesPerSecond"]), "samples")
    elif progress.get("tokensPerSecond") is not None:
        out["throughput"] = format_rate(float(progress["tokensPerSecond"]), "tokens")
    verdict = format_bottleneck(bottleneck)
    if verdict:
        out["bottleneck"] = verdict
    return out
