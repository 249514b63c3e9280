"""How the analysis writes numbers and times into status, evidence and summaries."""

from __future__ import annotations

import math
from datetime import UTC, datetime

from gpujob_operator.api.conditions import format_time


def pct(ratio: float) -> str:
    """A ratio as a percentage: whole percent, one decimal below 1%."""
    return f"{100 * ratio:.0f}%" if ratio >= 0.01 or ratio == 0 else f"{100 * ratio:.1f}%"


def round4(value: float) -> float:
    """Rounded to four decimals (NaN and infinities as they are)."""
    return round(value, 4) if math.isfinite(value) else value


def iso(t: float) -> str:
    """A Unix time as the status' RFC 3339 UTC timestamp."""
    return format_time(datetime.fromtimestamp(t, UTC))


def sig4(value: float) -> float:
    """Four significant digits (TFLOP/s from 0.02 on a CPU to 2,250 on a B200)."""
    return float(f"{value:.4g}")
