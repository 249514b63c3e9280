"""What one observation of a job produces, and the status merge patch it writes (pure).

`JobMonitor.observe` returns a `MonitorUpdate`: the status parts (progress, bottleneck,
GPUs, conditions), the Events, the analysis and the failed scrapes. `status_patch` returns
a JSON merge patch only when something changed meaningfully (or the last write is older
than `refresh_seconds`), so a thousand jobs do not flood the API server with a write per
job per scrape; `api.patches.json_safe` is the last guard against a NaN or an infinity in it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final

from gpujob_operator.api import conditions as c
from gpujob_operator.api.display import render_display
from gpujob_operator.api.events import Event
from gpujob_operator.api.patches import json_safe, replacing_patch
from gpujob_operator.monitoring.scrape.result import ScrapeResult
from gpujob_operator.monitoring.verdicts.analysis import Analysis

REFRESH_SECONDS: Final = 60.0
"""Rewrite status at most this often when only noise changed."""
PERCENT_STEP: Final = 0.1
ETA_RELATIVE: Final = 0.10
ETA_ABSOLUTE: Final = 30.0
RATE_RELATIVE: Final = 0.05
UTIL_ABSOLUTE: Final = 0.05


@dataclass(slots=True)
class PatchClock:
    """When status was last written (shared by a job's updates, for the refresh timer)."""

    last: float = -math.inf


@dataclass
class MonitorUpdate:
    """What one observation produced; all dicts are camelCase status parts."""

    now: float
    progress: dict[str, Any]
    bottleneck: dict[str, Any] | None
    """The published verdict (None until the first evaluation after warm-up)."""
    gpus: dict[str, Any]
    conditions: list[dict[str, Any]]
    """Observability conditions to set (conditions.make dicts); merge with set_condition."""
    events: list[Event]
    analysis: Analysis
    failures: list[ScrapeResult] = field(default_factory=list)
    dropped_series: int = 0
    """Series refused this round (a rank not the target's, over a cap)."""
    dropped_values: int = 0
    """Non-finite or implausible values refused this round."""
    refresh_seconds: float = REFRESH_SECONDS
    _clock: PatchClock = field(default_factory=PatchClock, repr=False)

    def status_patch(self, old_status: Mapping[str, Any] | None) -> dict[str, Any] | None:
        """A merge patch for status, or None when nothing changed meaningfully.

        It writes ``progress``, ``bottleneck``, ``gang.gpus``, the ETA's basis
        (``operatorState.rateSince``), ``display`` and the conditions. Each part is written
        whole (removed keys set to null); `conditions` (a list, replaced whole by a merge
        patch) is the old list with ours merged in; `display` follows the new values.
        Calling it counts as a write for the refresh timer.
        """
        raw = dict(old_status or {})
        old = _view(raw)
        new = dict(old)
        if self.progress:
            new["progress"] = self.progress
        if self.bottleneck is not None:
            new["bottleneck"] = self.bottleneck
        if self.gpus:
            new["gpus"] = self.gpus
        when = datetime.fromtimestamp(self.now, UTC)
        new["conditions"] = c.merge_conditions(old.get("conditions"), self.conditions, when)
        progress, rate = _split(new.get("progress"))
        display = render_display({**raw, "progress": progress, "bottleneck": new["bottleneck"]})
        meaningful = _meaningful(old, new)
        due = self.now - self._clock.last >= self.refresh_seconds
        if not meaningful and not (due and _differs(old, new)):
            return None
        self._clock.last = self.now
        patch: dict[str, Any] = {}
        for key, value in (
            ("progress", progress),
            ("bottleneck", new["bottleneck"]),
            ("display", display),
        ):
            if value is not None and value != raw.get(key):
                patch[key] = replacing_patch(raw.get(key), value)
        old_gpus = (raw.get("gang") or {}).get("gpus")
        if new["gpus"] is not None and new["gpus"] != old_gpus:
            patch["gang"] = {"gpus": replacing_patch(old_gpus, new["gpus"])}
        old_rate = (raw.get("operatorState") or {}).get("rateSince")
        if self.progress and rate != old_rate:
            patch["operatorState"] = {"rateSince": rate}
        if new["conditions"] != raw.get("conditions"):
            patch["conditions"] = new["conditions"]
        return json_safe(patch) or None


def _view(status: Mapping[str, Any]) -> dict[str, Any]:
    """The parts of a status an update writes, side by side: progress with the ETA's basis in
    it (as the analysis keeps it), the verdict, the GPUs, the conditions."""
    progress = dict(status.get("progress") or {})
    rate = (status.get("operatorState") or {}).get("rateSince")
    if rate is not None:
        progress["rateSince"] = rate
    return {
        "progress": progress or None,
        "bottleneck": status.get("bottleneck"),
        "gpus": (status.get("gang") or {}).get("gpus"),
        "conditions": status.get("conditions"),
    }


def _split(progress: Mapping[str, Any] | None) -> tuple[dict[str, Any] | None, Any]:
    """``status.progress`` and ``operatorState.rateSince`` of the analysis' progress."""
    if progress is None:
        return None, None
    out = dict(progress)
    return out, out.pop("rateSince", None)


# ---- what counts as a change worth writing ------------------------------------------------


def _num(d: Mapping[str, Any] | None, key: str) -> float | None:
    v = (d or {}).get(key)
    return float(v) if isinstance(v, int | float) else None


def _moved(old: float | None, new: float | None, rel: float, abs_: float = 0.0) -> bool:
    if (old is None) != (new is None):
        return True
    if old is None or new is None:
        return False
    return abs(new - old) > max(abs_, rel * abs(old))


def _meaningful(old: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    op, np_ = old.get("progress") or {}, new.get("progress") or {}
    if set(op) != set(np_):
        return True
    for key in ("totalSteps", "epoch", "rateSince", "resumedFromStep"):
        if op.get(key) != np_.get(key):
            return True
    if _why_word(op) != _why_word(np_):  # restarting -> resuming -> measuring
        return True
    if "percent" in np_:
        if abs(float(np_["percent"]) - float(op.get("percent", 0.0))) >= PERCENT_STEP:
            return True
    elif _moved(_num(op, "step"), _num(np_, "step"), 0.01, 0.5):
        return True
    # ETA: both more than 10% and more than 30 s, so neither a long ETA's 30 s jitter nor a
    # short ETA's few-second countdown rewrites status every scrape.
    if _moved(_num(op, "etaSeconds"), _num(np_, "etaSeconds"), ETA_RELATIVE, ETA_ABSOLUTE):
        return True
    for key in ("samplesPerSecond", "tokensPerSecond"):
        if _moved(_num(op, key), _num(np_, key), RATE_RELATIVE):
            return True
    ob, nb = old.get("bottleneck") or {}, new.get("bottleneck") or {}
    for key in ("verdict", "severity", "rank", "pod", "node", "gpuUUID"):
        if ob.get(key) != nb.get(key):
            return True
    og, ng = old.get("gpus") or {}, new.get("gpus") or {}
    for key in ("requested", "observed", "telemetry"):
        if og.get(key) != ng.get(key):
            return True
    for key in ("meanUtilizationRatio", "maxMemoryUsedRatio"):
        if _moved(_num(og, key), _num(ng, key), 0.0, UTIL_ABSOLUTE):
            return True
    return _conditions_changed(old.get("conditions"), new.get("conditions"))


def _why_word(progress: Mapping[str, Any]) -> str:
    return str(progress.get("etaUnavailable") or "").split(":", 1)[0]


def _conditions_changed(old: Any, new: Any) -> bool:
    def key(conds: Any) -> set[tuple[Any, ...]]:
        out = set()
        for cond in conds or ():
            msg = cond.get("message") if cond.get("type") == c.METRICS_AVAILABLE else None
            out.add((cond.get("type"), cond.get("status"), cond.get("reason"), msg))
        return out

    return key(old) != key(new)


def _differs(old: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    return any(old.get(k) != new.get(k) for k in ("progress", "bottleneck", "gpus", "conditions"))
