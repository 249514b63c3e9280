"""The small dashboard model the generated dashboards share: panels, rows, targets, variables.

A :class:`Panel` holds only what varies between the panels here (queries, kind, unit, size);
:func:`dashboard` flows rows of panels left to right on Grafana's 24-column grid and renders
Grafana's JSON model, with the template variables from :func:`datasource_var` and
:func:`query_var`. Every query reads the ``datasource`` variable (:data:`DS`); rates use
:data:`RATE` (``$__rate_interval``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Final

DS: Final = {"type": "prometheus", "uid": "${datasource}"}
RATE: Final = "$__rate_interval"
SCHEMA_VERSION: Final = 39


@dataclass
class Target:
    """One query of a panel."""

    expr: str
    legend: str = ""
    instant: bool = False
    table: bool = False
    heatmap: bool = False
    """Buckets by `le`, drawn as a heatmap (Grafana's heatmap format)."""


@dataclass
class Panel:
    """A Grafana panel reduced to what varies here; rendered to Grafana's JSON model."""

    title: str
    description: str
    targets: list[Target]
    kind: str = "timeseries"
    unit: str = "short"
    w: int = 12
    h: int = 8
    stack: bool = False
    min: float | None = None
    max: float | None = None
    options: dict[str, Any] = field(default_factory=dict)
    transformations: list[dict[str, Any]] = field(default_factory=list)
    mappings: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class Row:
    """A titled row of panels, flowed left to right."""

    title: str
    panels: list[Panel]


def t(expr: str, legend: str = "", **kw: Any) -> Target:
    """A target whose expression may be written across lines (whitespace collapses to one)."""
    return Target(" ".join(expr.split()), legend, **kw)


def _render_panel(p: Panel, pid: int, x: int, y: int) -> dict[str, Any]:
    defaults: dict[str, Any] = {"unit": p.unit}
    if p.min is not None:
        defaults["min"] = p.min
    if p.max is not None:
        defaults["max"] = p.max
    if p.mappings:
        defaults["mappings"] = p.mappings
    if p.kind == "timeseries":
        defaults["custom"] = {
            "drawStyle": "line",
            "fillOpacity": 30 if p.stack else 10,
            "lineWidth": 1,
            "showPoints": "never",
            "stacking": {"mode": "normal" if p.stack else "none", "group": "A"},
        }
    options = dict(p.options)
    if p.kind == "timeseries":
        options.setdefault(
            "legend",
            {"displayMode": "table", "placement": "bottom", "calcs": ["lastNotNull", "max"]},
        )
        options.setdefault("tooltip", {"mode": "multi", "sort": "desc"})
    targets = []
    for i, t in enumerate(p.targets):
        target: dict[str, Any] = {"datasource": DS, "refId": chr(ord("A") + i), "expr": t.expr}
        if t.legend:
            target["legendFormat"] = t.legend
        if t.instant or t.table:
            target["instant"] = True
            target["range"] = False
        if t.table:
            target["format"] = "table"
        if t.heatmap:
            target["format"] = "heatmap"
        targets.append(target)
    out: dict[str, Any] = {
        "id": pid,
        "type": p.kind,
        "title": p.title,
        "description": p.description,
        "datasource": DS,
        "gridPos": {"x": x, "y": y, "w": p.w, "h": p.h},
        "fieldConfig": {"defaults": defaults, "overrides": []},
        "options": options,
        "targets": targets,
    }
    if p.transformations:
        out["transformations"] = p.transformations
    return out


def _layout(rows: Sequence[Row]) -> list[dict[str, Any]]:
    """Rows of panels flowed left to right, 24 columns wide."""
    out: list[dict[str, Any]] = []
    pid, y = 1, 0
    for row in rows:
        out.append(
            {
                "id": pid,
                "type": "row",
                "title": row.title,
                "collapsed": False,
                "gridPos": {"x": 0, "y": y, "w": 24, "h": 1},
                "panels": [],
            }
        )
        pid, y = pid + 1, y + 1
        x, row_h = 0, 0
        for p in row.panels:
            if x + p.w > 24:
                x, y, row_h = 0, y + row_h, 0
            out.append(_render_panel(p, pid, x, y))
            pid, x, row_h = pid + 1, x + p.w, max(row_h, p.h)
        y += row_h
    return out


def datasource_var() -> dict[str, Any]:
    return {
        "name": "datasource",
        "label": "Data source",
        "type": "datasource",
        "query": "prometheus",
        "current": {},
        "hide": 0,
        "refresh": 1,
    }


def query_var(name: str, label: str, query: str, *, multi: bool) -> dict[str, Any]:
    var: dict[str, Any] = {
        "name": name,
        "label": label,
        "type": "query",
        "datasource": DS,
        "query": {"query": query, "refId": f"{name}-var"},
        "definition": query,
        "refresh": 2,
        "sort": 1,
        "multi": multi,
        "includeAll": multi,
        "current": {},
        "hide": 0,
    }
    if multi:
        var["allValue"] = ".*"
    return var


def dashboard(
    uid: str,
    title: str,
    description: str,
    rows: Sequence[Row],
    variables: list[dict[str, Any]],
    time_from: str = "now-3h",
) -> dict[str, Any]:
    return {
        "uid": uid,
        "title": title,
        "description": description,
        "tags": ["gpujob"],
        "editable": True,
        "graphTooltip": 1,
        "refresh": "30s",
        "schemaVersion": SCHEMA_VERSION,
        "time": {"from": time_from, "to": "now"},
        "timezone": "browser",
        "templating": {"list": variables},
        "annotations": {"list": []},
        "links": [
            {"title": "gpujob", "type": "dashboards", "tags": ["gpujob"], "asDropdown": True}
        ],
        "panels": _layout(rows),
    }
