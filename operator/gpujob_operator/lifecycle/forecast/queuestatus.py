"""Forecasts into ``status.gang.startForecast`` patches, and each started job's forecast error.

Pure: the jobs as last seen and the forecasts in, the patches to write out. A forecast is
written only when it moved (see :data:`MOVE_FRACTION`, or its confidence, basis or
queue position changed), so a fleet of waiting jobs costs the API server nothing while
nothing changes. Once a job that had a forecast starts, its block keeps the last estimate
and gains ``forecastErrorSeconds`` (actual start minus forecast), written once.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final

from gpujob_operator.api import conditions as c
from gpujob_operator.api.display import format_start, render_display
from gpujob_operator.api.events import Event
from gpujob_operator.api.status import start_forecast
from gpujob_operator.lifecycle.forecast.queueview import (
    World,
    key,
    kueue_view,
    node_view,
    split_waiting,
)
from gpujob_operator.lifecycle.forecast.simulation import UNKNOWN, Forecast, forecast_all

MOVE_SECONDS: Final = 5.0
MOVE_FRACTION: Final = 0.05
"""A forecast that moved less than the larger of :data:`MOVE_SECONDS` and this fraction of
the wait still ahead is not rewritten: a start two hours away moves by minutes as the
holders' ETAs breathe, and rewriting each breath only churns the API server."""
STARTED_PHASES: Final = frozenset({c.PHASE_RUNNING, c.PHASE_SUCCEEDED, c.PHASE_FAILED})


@dataclass(frozen=True)
class QueueUpdate:
    """One job's status patch (``gang.startForecast`` and, where it changes, ``display``)."""

    namespace: str
    name: str
    patch: dict[str, Any]
    error_seconds: float | None = None
    """Set once the job started: actual minus forecast start (for the operator metric)."""
    event: Event | None = None
    """Posted on the job: the first forecast, a change of confidence, the start."""


def _time(epoch: float | None) -> str | None:
    return None if epoch is None else c.format_time(datetime.fromtimestamp(round(epoch), UTC))


def _epoch(value: Any) -> float | None:
    try:
        when = c.parse_time(value)
    except (TypeError, ValueError):
        return None
    return when.timestamp() if when is not None else None


def block(f: Forecast, now: float) -> dict[str, Any]:
    """``status.gang.startForecast`` for one forecast (every key present: a merge patch clears
    the rest)."""
    return {
        "estimatedStartTime": _time(f.start),
        "latestStartTime": _time(f.latest),
        "confidence": f.confidence,
        "basis": f.basis[:1024],
        "reason": f.reason[:1024] or None,
        "ahead": f.ahead,
        "waitsFor": list(f.waits_for[:8]) or None,
        "computedAt": _time(now),
        "forecastErrorSeconds": None,
    }


def unknown(reason: str, now: float) -> dict[str, Any]:
    """The block of a waiting job that cannot be forecast (cannot read nodes, no queue)."""
    return block(Forecast("", None, None, UNKNOWN, "", reason=reason), now)


def forecast_blocks(
    now: float, jobs: Sequence[Mapping[str, Any]], world: World, default_gang: str
) -> dict[str, dict[str, Any]]:
    """``status.gang.startForecast`` of every waiting job, by ``ns/name``: native and unmanaged
    gangs on the nodes, Kueue gangs in their ClusterQueues. A read that failed makes its jobs'
    forecasts Unknown with the reason, instead of silently absent."""
    out: dict[str, dict[str, Any]] = {}
    waiting = split_waiting(jobs, default_gang)
    native, kueue = ([key(j) for j in kind] for kind in waiting)
    if native:
        _section(
            out, native, now, world.nodes_error, lambda: _native(now, jobs, world, default_gang)
        )
    if kueue:
        _section(out, kueue, now, world.kueue_error, lambda: _kueue(now, jobs, world))
    return out


def _section(
    out: dict[str, dict[str, Any]],
    keys: Sequence[str],
    now: float,
    read_error: str | None,
    compute: Callable[[], dict[str, dict[str, Any]]],
) -> None:
    """One kind of wait's forecasts into ``out``; a failed read, or input the forecast cannot
    use, makes that kind's jobs Unknown with the reason instead of stopping the pass."""
    if read_error:
        out.update({k: unknown(read_error, now) for k in keys})
        return
    try:
        out.update(compute())
    except Exception as e:  # odd input must cost this kind of forecast, never the operator
        out.update(
            {k: unknown(f"cannot forecast: {type(e).__name__}: {e}"[:512], now) for k in keys}
        )


def _native(
    now: float, jobs: Sequence[Mapping[str, Any]], world: World, default_gang: str
) -> dict[str, dict[str, Any]]:
    view = node_view(now, jobs, world.nodes, world.pods, default_gang)
    found = forecast_all(now, view.capacity, view.holders, view.waiters)
    return {name.removeprefix("job "): block(f, now) for name, f in found.items()}


def _kueue(
    now: float, jobs: Sequence[Mapping[str, Any]], world: World
) -> dict[str, dict[str, Any]]:
    view = kueue_view(now, jobs, world.cluster_queues, world.local_queues, world.workloads)
    found = forecast_all(now, view.capacity, view.holders, view.waiters)
    out = {name.removeprefix("job "): block(f, now) for name, f in found.items()}
    out.update({k: unknown(why, now) for k, why in view.unplaceable.items()})
    return out


def _moved(old: Mapping[str, Any], new: Mapping[str, Any], now: float) -> bool:
    """Whether the new forecast is news: another confidence or place in the queue, or a
    start (earliest or latest) that moved by more than the larger of :data:`MOVE_SECONDS`
    and :data:`MOVE_FRACTION` of the wait. Times in the past read as now (a start "now" is
    "now" on every pass), and names alone (two holders' ETAs crossing) are not news."""
    if old.get("forecastErrorSeconds") is not None:
        return True
    for k in ("confidence", "ahead"):
        if old.get(k) != new.get(k):
            return True
    for k in ("estimatedStartTime", "latestStartTime"):
        a, b = _epoch(old.get(k)), _epoch(new.get(k))
        if (a is None) != (b is None):
            return True
        if a is not None and b is not None:
            a, b = max(a, now), max(b, now)
            if abs(a - b) >= max(MOVE_SECONDS, MOVE_FRACTION * (b - now)):
                return True
    return False


def _event(new: Mapping[str, Any]) -> Event:
    """What ``kubectl describe`` shows: "starts ~14:20 (Exact): after job ml/a end"."""
    if new["confidence"] == UNKNOWN:
        return Event("Normal", c.START_FORECAST, f"cannot forecast its start: {new['reason']}")
    text = f"{format_start(new)} ({new['confidence']}): {new['basis']}"
    if new.get("reason"):
        text += f"; {new['reason']}"
    return Event("Normal", c.START_FORECAST, text[:1024])


def _with_display(job: Mapping[str, Any], forecast: dict[str, Any] | None) -> dict[str, Any]:
    """The patch of ``status.gang.startForecast`` (``forecast``: a merge patch of it, None
    deletes it), with ``display`` where the ETA column would read differently."""
    status = dict(job.get("status") or {})
    gang = dict(status.get("gang") or {})
    if forecast is None:
        gang.pop("startForecast", None)
    else:
        merged = {**(gang.get("startForecast") or {}), **forecast}
        gang["startForecast"] = {k: v for k, v in merged.items() if v is not None}
    status["gang"] = gang
    patch: dict[str, Any] = {"gang": {"startForecast": forecast}}
    want = render_display(status)
    have = status.get("display") or {}
    if want.get("eta") != have.get("eta"):
        patch["display"] = {"eta": want.get("eta")}
    return patch


def _started_at(status: Mapping[str, Any], computed: float, now: float) -> float:
    """When the job started, as its user saw it: all ranks ``Running`` (the condition's
    transition), else its pods' ``startTime``; neither counts when older than the forecast
    (an earlier attempt's). ``now`` is the last resort, and the pass interval late."""
    running = c.find(status.get("conditions"), c.RUNNING) or {}
    for value in (
        running.get("lastTransitionTime") if running.get("status") == c.TRUE else None,
        status.get("startTime"),
    ):
        when = _epoch(value)
        if when is not None and when >= computed:
            return when
    return now


def updates(
    now: float,
    jobs: Sequence[Mapping[str, Any]],
    forecasts: Mapping[str, dict[str, Any]],
) -> list[QueueUpdate]:
    """What to write for every job: waiting ones (``forecasts``, by ``ns/name``) get their
    block where it moved; started ones that still carry an open forecast get their error;
    anything else that carries an open forecast (suspended, deleted queue) loses it."""
    out = []
    for job in jobs:
        meta, status = job.get("metadata") or {}, job.get("status") or {}
        ns, name = str(meta.get("namespace", "")), str(meta.get("name", ""))
        old = start_forecast(status)
        new = forecasts.get(key(job))
        if new is not None:
            if not old or _moved(old, new, now):
                news = (
                    not old
                    or old.get("confidence") != new["confidence"]
                    or old.get("forecastErrorSeconds") is not None
                )
                patch = _with_display(job, dict(new))
                out.append(QueueUpdate(ns, name, patch, event=_event(new) if news else None))
            elif (status.get("display") or {}).get("eta") != render_display(status).get("eta"):
                out.append(QueueUpdate(ns, name, _with_display(job, {})))
            continue
        if not old or old.get("forecastErrorSeconds") is not None:
            continue
        estimate = _epoch(old.get("estimatedStartTime"))
        if status.get("phase") in STARTED_PHASES and estimate is not None:
            actual = _started_at(status, _epoch(old.get("computedAt")) or now, now)
            error = round(actual - estimate, 1)
            # The whole block: a status of the previous shape still has it in status.queue.
            patch = {**old, "forecastErrorSeconds": error}
            word = "after" if error >= 0 else "before"
            event = Event(
                "Normal",
                c.START_FORECAST,
                f"started {abs(error):.0f}s {word} its forecast start "
                f"{old.get('estimatedStartTime')} ({old.get('confidence')})",
            )
            out.append(QueueUpdate(ns, name, _with_display(job, patch), error, event))
        elif status.get("phase") not in (None, c.PHASE_PENDING, c.PHASE_RESTARTING):
            out.append(QueueUpdate(ns, name, _with_display(job, None)))
    return out
