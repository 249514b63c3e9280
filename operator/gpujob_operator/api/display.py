"""Human strings for ``kubectl get`` columns, written to ``status.display``.

CRD printer columns are plain JSONPath: they can neither format a float nor multiply, so
the operator renders "41.3%", "18m20s", "2840 samples/s" and "Straggler(r13)" itself.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, Final

from gpujob_operator.api.status import start_forecast

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


WAITING_PHASES = frozenset({None, "Pending", "Restarting"})


def _clock(value: Any, ref: Any) -> str | None:
    """HH:MM UTC of an RFC 3339 time; with the date when it is not ``ref``'s day."""

    def parse(text: Any) -> datetime | None:
        try:
            t = datetime.fromisoformat(str(text).replace("Z", "+00:00"))
        except ValueError:
            return None
        return (t if t.tzinfo else t.replace(tzinfo=UTC)).astimezone(UTC)

    when = parse(value)
    if when is None:
        return None
    base = parse(ref) or when
    return when.strftime("%H:%M" if when.date() == base.date() else "%b %d %H:%M")


def format_start(queue: Mapping[str, Any]) -> str | None:
    """A waiting job's forecast start: "starts ~14:20", "starts 14:20-14:35",
    "starts >=14:20", or "waits" when it cannot be forecast. None once it started."""
    if queue.get("forecastErrorSeconds") is not None or not queue.get("confidence"):
        return None
    ref = queue.get("computedAt")
    start = _clock(queue.get("estimatedStartTime"), ref)
    if queue.get("confidence") == "Unknown" or start is None:
        return "waits"
    if queue.get("confidence") == "Exact":
        return f"starts ~{start}"
    latest = _clock(queue.get("latestStartTime"), ref)
    return f"starts {start}-{latest}" if latest else f"starts >={start}"


EVIDENCE_MARK = "; evidence: "
"""What joins a stall's message and its hang evidence (the Stalled condition, the failure)."""


def format_hang(evidence: Mapping[str, Any] | None) -> str:
    """ "; evidence: <answer> (every rank: configmap/<name>)", or "" before it was taken."""
    if not evidence or not evidence.get("summary"):
        return ""
    where = f" (every rank: configmap/{evidence['configMap']})" if evidence.get("configMap") else ""
    note = f" ({evidence['note']})" if evidence.get("note") and not where else ""
    return f"{EVIDENCE_MARK}{evidence['summary']}{where}{note}"


ETA_WORDS: Final = frozenset({"restarting", "resuming", "measuring"})
"""The first words of ``progress.etaUnavailable`` the ETA column shows in the ETA's place."""


def render_display(status: Mapping[str, Any]) -> dict[str, str]:
    """``status.display`` from ``status.progress``/``bottleneck``/``phase``.

    A finished or suspended job keeps its progress but shows no ETA, throughput or
    bottleneck: they describe a run that is no longer happening. A job waiting for GPUs
    shows its start forecast (``status.gang.startForecast``) in the ETA column; a running one
    without an ETA the first word of why (``progress.etaUnavailable``: restarting, resuming,
    measuring).
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
    ratio = (status.get("goodput") or {}).get("ratio")
    if isinstance(ratio, int | float) and math.isfinite(ratio):
        out["goodput"] = format_percent(100.0 * float(ratio))
    if not live:
        return out
    eta = progress.get("etaSeconds")
    start = format_start(start_forecast(status)) if status.get("phase") in WAITING_PHASES else None
    if start is not None:
        out["eta"] = start
    elif eta is not None and (text := format_duration(float(eta))):
        out["eta"] = text
    elif (word := str(progress.get("etaUnavailable") or "").split(":", 1)[0]) in ETA_WORDS:
        out["eta"] = word
    if progress.get("samplesPerSecond") is not None:
        out["throughput"] = format_rate(float(progress["samplesPerSecond"]), "samples")
    elif progress.get("tokensPerSecond") is not None:
        out["throughput"] = format_rate(float(progress["tokensPerSecond"]), "tokens")
    verdict = format_bottleneck(bottleneck)
    if verdict:
        out["bottleneck"] = verdict
    if progress.get("mfu") is not None:
        out["mfu"] = format_percent(100 * float(progress["mfu"]))
    p50, p95 = progress.get("stepSecondsP50"), progress.get("stepSecondsP95")
    if p50 is not None and p95 is not None:
        out["stepTime"] = f"{format_seconds(float(p50))}/{format_seconds(float(p95))}"
    return out


def format_seconds(seconds: float) -> str:
    """A step time, short: 41ms, 1.25s, 12.5s."""
    if seconds < 1:
        return f"{seconds * 1000:.0f}ms"
    return f"{seconds:.3g}s"
