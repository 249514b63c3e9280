"""Dashboards and alert rules: every query names an exported series (test_generate compares the committed files)."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
import yaml

from gpujob_operator.observability import alerts, dashboards, opfamilies
from gpujob_trainer import contract

REPO = Path(__file__).resolve().parents[4]

# PromQL words that look like metric names but are functions, keywords or label names.
_NOT_METRICS = {
    "sum",
    "max",
    "min",
    "avg",
    "count",
    "rate",
    "increase",
    "by",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "histogram_quantile",
    "quantile",
    "scalar",
    "vector",
    "time",
    "or",
    "and",
    "unless",
    "label_values",
    "avg_over_time",
    "absent",
    "bool",
    "le",
    "changes",
    "topk",
    "sort_desc",
}
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_SELECTOR_BODY = re.compile(r"\{[^{}]*\}")
_RANGE = re.compile(r"\[[^\]]*\]")
_GROUPING = re.compile(r"\b(?:by|on|ignoring|without|group_left|group_right)\s*\([^)]*\)")
_IDENT = re.compile(r"\b[a-zA-Z_:][a-zA-Z0-9_:]*\b")


def metric_names(expr: str) -> set[str]:
    """Metric names an expression reads (labels, functions and grouping clauses removed)."""
    text = re.sub(r"label_values\((.*),\s*\w+\)$", r"\1", expr.strip())
    text = _STRING.sub('""', text)
    text = _SELECTOR_BODY.sub("{}", text)
    text = _RANGE.sub("", text)
    text = _GROUPING.sub("", text)
    names = {n for n in _IDENT.findall(text) if n not in _NOT_METRICS and not n.startswith("__")}
    return {n for n in names if not re.fullmatch(r"[0-9.e]+", n)}


def exported() -> set[str]:
    """Every series name something in gpujob exports, plus Prometheus' and the process's own."""
    names = set(opfamilies.exported_names()) | {"up"}
    names |= {"process_cpu_seconds_total", "process_resident_memory_bytes", "process_open_fds"}
    for spec in contract.ALL_METRICS:
        if spec.type == "histogram":
            names |= {f"{spec.name}_bucket", f"{spec.name}_sum", f"{spec.name}_count"}
        else:
            names.add(spec.name)
    return names


def all_exprs() -> list[tuple[str, str]]:
    out = []
    for uid, make in dashboards.DASHBOARDS.items():
        out += [(f"{uid}: {title}", expr) for title, expr in dashboards.queries(make())]
    for group in alerts.groups()["groups"]:
        out += [(f"alert {r['alert']}", r["expr"]) for r in group["rules"]]
    return out


def test_metric_name_extraction() -> None:
    expr = (
        'sum by (rank, phase) (rate(gpujob_train_phase_seconds_total{namespace="$namespace", '
        'phase=~"a|b"}[$__rate_interval])) / on (rank) group_left up{job="x"} or vector(0)'
    )
    assert metric_names(expr) == {"gpujob_train_phase_seconds_total", "up"}


@pytest.mark.parametrize(("where", "expr"), all_exprs(), ids=[w for w, _ in all_exprs()])
def test_every_query_reads_only_exported_metrics(where: str, expr: str) -> None:
    names = metric_names(expr)
    assert names, f"{where}: no metric found in {expr!r}"
    unknown = names - exported()
    assert not unknown, f"{where} reads metrics nobody exports: {sorted(unknown)}"


@pytest.mark.parametrize("uid", sorted(dashboards.DASHBOARDS))
def test_dashboard_shape(uid: str) -> None:
    d = dashboards.DASHBOARDS[uid]()
    assert d["uid"] == uid and d["title"].startswith("gpujob / ")
    variables = {v["name"]: v for v in d["templating"]["list"]}
    assert (
        variables["datasource"]["type"] == "datasource"
        and variables["datasource"]["query"] == "prometheus"
    )
    ids = [p["id"] for p in d["panels"]]
    assert len(ids) == len(set(ids))
    for p in d["panels"]:
        assert p["gridPos"]["x"] + p["gridPos"]["w"] <= 24
        if p["type"] == "row":
            continue
        assert p["description"] and p["targets"], p["title"]
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert p["fieldConfig"]["defaults"]["unit"], p["title"]
        exprs = " ".join(t["expr"] for t in p["targets"])
        if uid == "gpujob-job":
            assert ("$namespace" in exprs and "$job" in exprs) or "up{" in exprs, p["title"]
    if uid != "gpujob-operator":
        assert "namespace" in variables
    if uid == "gpujob-job":
        assert "job" in variables


def test_units_are_set_where_they_matter() -> None:
    units = {}
    for make in dashboards.DASHBOARDS.values():
        for p in make()["panels"]:
            if p["type"] != "row":
                units[p["title"]] = p["fieldConfig"]["defaults"]["unit"]
    assert units["Progress"] == "percentunit" and units["ETA"] == "s"
    assert units["GPU memory used"] == "bytes" and units["Power"] == "watt"
    assert units["Temperature"] == "celsius" and units["SM clock"] == "hertz"
    assert (
        units["Step time breakdown per rank"] == "s" and units["GPU utilization"] == "percentunit"
    )


def test_job_dashboard_covers_the_issue() -> None:
    titles = {p["title"] for p in dashboards.DASHBOARDS["gpujob-job"]()["panels"]}
    for needed in (
        "Step time breakdown per rank",
        "Relative speed per rank",
        "GPU utilization",
        "GPU memory used",
        "Power",
        "Temperature",
        "Throttling",
    ):
        assert needed in titles


def test_every_alert_has_summary_description_and_severity() -> None:
    rules = [r for g in alerts.groups()["groups"] for r in g["rules"]]
    names = {r["alert"] for r in rules}
    assert {
        "GPUJobStalled",
        "GPUJobFailed",
        "GPUJobBottleneckPersisting",
        "GPUJobGPUsUnderutilized",
        "GPUJobMetricsUnavailable",
        "GPUJobOperatorDown",
    } <= names
    for r in rules:
        assert r["labels"]["severity"] in ("info", "warning", "critical")
        assert r["annotations"]["summary"] and len(r["annotations"]["description"]) > 100


def _no_constants(name: str) -> None:
    raise AssertionError(f"{name} is not JSON (Grafana and jq refuse it)")


def _plain(value: object) -> bool:
    """Only what strict JSON holds: no NaN/Infinity, string keys, no other types."""
    if isinstance(value, dict):
        return all(isinstance(k, str) and _plain(v) for k, v in value.items())
    if isinstance(value, list):
        return all(_plain(v) for v in value)
    if isinstance(value, float):
        return math.isfinite(value)
    return value is None or isinstance(value, str | int | bool)


def test_dashboard_json_is_plain_json() -> None:
    for name, text in dashboards.render_all().items():
        # json.loads accepts NaN, Infinity and -Infinity by default: refuse them here
        doc = json.loads(text, parse_constant=_no_constants)
        assert _plain(doc), name
        assert json.dumps(doc, indent=2, allow_nan=False) + "\n" == text, name
    for maker in dashboards.DASHBOARDS.values():
        assert _plain(maker()), "the dashboard model holds only JSON values"
    assert _plain(yaml.safe_load((REPO / alerts.RULES_FILE).read_text()))


def test_plain_json_check_catches_nan() -> None:
    with pytest.raises(AssertionError, match="NaN is not JSON"):
        json.loads(json.dumps({"max": math.nan}), parse_constant=_no_constants)
    assert not _plain({"max": math.inf}) and not _plain({1: "x"}) and not _plain({"t": (1,)})
