"""A finished job's story in a few bounded numbers: ``status.summary`` (pure).

When a job ends its live parts go (the verdict, the ETA); the summary keeps what the run was
like, from the goodput ledger (:mod:`.goodput`) and the last progress: how long it took, how
much of it made kept steps, its mean throughput, the verdicts it had and for how long, the
rank named most, its MFU.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from datetime import datetime
from typing import Any, Final

from gpujob_operator.lifecycle.goodput import MAX_VERDICTS, Ledger

MAX_LISTED_VERDICTS: Final = MAX_VERDICTS


def build(
    ledger: Ledger,
    progress: Mapping[str, Any] | None,
    gpus: int,
    restarts: int,
    finished_at: datetime | None,
) -> dict[str, Any]:
    """``status.summary`` (camelCase) of a finished job.

    Mean throughput is the kept samples (the published samples/s integrated over the time
    the job stepped) over that time (productive, checkpoint and eval seconds): what the job
    did while it ran, not diluted by its waits, which the goodput ratio already tells.
    """
    progress = progress or {}
    end = finished_at or ledger.until
    stepping = ledger.stepping
    out: dict[str, Any] = {
        "wallSeconds": round(max(0.0, (end - ledger.since).total_seconds()), 1),
        "gpuHours": round(ledger.total * max(gpus, 0) / 3600.0, 3),
        "lostGPUHours": round((ledger.total - ledger.productive) * max(gpus, 0) / 3600.0, 3),
        "restarts": restarts,
    }
    if ledger.ratio is not None:
        out["goodputRatio"] = round(ledger.ratio, 4)
    if stepping > 0 and ledger.samples > 0:
        out["meanSamplesPerSecond"] = round(ledger.samples / stepping, 3)
    if stepping > 0 and ledger.tokens > 0:
        out["meanTokensPerSecond"] = round(ledger.tokens / stepping, 3)
    step = progress.get("step")
    if isinstance(step, int) and not isinstance(step, bool):
        out["steps"] = step
    mfu = progress.get("mfu")
    if isinstance(mfu, int | float) and not isinstance(mfu, bool) and math.isfinite(mfu):
        out["lastMFU"] = round(float(mfu), 4)
    verdicts = verdict_shares(ledger.verdict_seconds)
    if verdicts:
        out["verdicts"] = verdicts
    worst = worst_rank(ledger.rank_seconds)
    if worst is not None:
        out["worstRank"], out["worstRankSeconds"] = worst
    return out


def verdict_shares(seconds: Mapping[str, float]) -> list[dict[str, Any]]:
    """Each verdict with its seconds and its share of the time a verdict was published,
    longest first (at most :data:`MAX_LISTED_VERDICTS`)."""
    total = sum(seconds.values())
    if total <= 0:
        return []
    order = sorted(seconds.items(), key=lambda kv: (-kv[1], kv[0]))[:MAX_LISTED_VERDICTS]
    return [
        {"verdict": v, "seconds": round(s, 1), "share": round(s / total, 4)}
        for v, s in order
        if s > 0
    ]


def worst_rank(seconds: Mapping[str, float]) -> tuple[int, float] | None:
    """The rank the verdicts named longest, with those seconds (ties: the lowest rank)."""
    named = [(int(k), s) for k, s in seconds.items() if k.lstrip("-").isdigit() and s > 0]
    if not named:
        return None
    rank, s = min(named, key=lambda kv: (-kv[1], kv[0]))
    return rank, round(s, 1)
