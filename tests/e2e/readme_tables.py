"""The README's reference tables, generated from the modules that own the facts.

README.md holds each table between ``<!-- BEGIN GENERATED: key -->`` and
``<!-- END GENERATED: key -->``; ``test_readme.py`` fails when one differs from what this
module renders. ``python -m tests.e2e.readme_tables`` rewrites them in place.

- trainer metrics: :mod:`gpujob_trainer.contract` (names, types, units, labels, help);
- operator metrics: what :class:`gpujob_operator.observability.opmetrics.JobMetrics` actually exports for a
  job whose status has every field, collected from its registry (so types and labels are the
  exported ones, not a second spelling);
- dashboards: :data:`gpujob_operator.observability.dashboards.DASHBOARDS`; alerts: :mod:`gpujob_operator.observability.alerts`.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Final

from gpujob_operator.observability import alerts, dashboards, opfamilies, opmetrics
from gpujob_trainer import contract

README: Final = Path(__file__).resolve().parents[2] / "README.md"
BLOCK: Final = re.compile(
    r"(<!-- BEGIN GENERATED: (?P<key>[a-z-]+) -->\n)(?P<body>.*?)"
    r"(<!-- END GENERATED: (?P=key) -->)",
    re.S,
)


TEMPLATE: Final = re.compile(r"\{\{ \$(?:labels\.(\w+)|value[^}]*) \}\}")


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _labels(names: tuple[str, ...] | list[str]) -> str:
    return ", ".join(f"`{n}`" for n in names) if names else ""


def trainer_metrics() -> str:
    rows = ["| metric | type | unit | labels | meaning |", "|---|---|---|---|---|"]
    for m in contract.ALL_METRICS:
        rows.append(
            f"| `{m.name}` | {m.type} | {m.unit or ''} | {_labels(m.labels)} | {_cell(m.help)} |"
        )
    return "\n".join(rows) + "\n"


FULL_STATUS: Final = {
    "phase": "Running",
    "startTime": "2026-01-01T00:00:00Z",
    "conditions": [
        {"type": "MetricsAvailable", "status": "True"},
        {"type": "Stalled", "status": "False"},
    ],
    "progress": {
        "step": 10,
        "totalSteps": 100,
        "percent": 10.0,
        "etaSeconds": 60.0,
        "samplesPerSecond": 100.0,
        "tokensPerSecond": 1000.0,
        "loss": 1.0,
        "mfu": 0.4,
        "stepSecondsP50": 0.4,
        "stepSecondsP95": 0.5,
        "lastStepTime": "2026-01-01T00:01:00Z",
    },
    "bottleneck": {"verdict": "InputBound"},
    "gang": {
        "restarts": 1,
        "gpus": {"requested": 16, "meanUtilizationRatio": 0.5},
        "replicas": {"desired": 2, "pending": 0, "running": 2, "succeeded": 0, "failed": 0},
        "startForecast": {
            "estimatedStartTime": "2026-01-01T00:00:05Z",
            "forecastErrorSeconds": -5.0,
        },
    },
    "goodput": {"ratio": 0.5, "seconds": {"queued": 30.0, "restart": 30.0, "productive": 60.0}},
}
"""A status with every field the operator's job series read."""
WAITING_STATUS: Final = {
    "phase": "Pending",
    "gang": {
        "startForecast": {"estimatedStartTime": "2026-01-01T02:00:00Z", "confidence": "Exact"}
    },
}
"""A waiting job's: the start forecast, which a started job no longer has."""
UNOBSERVED_STATUS: Final = {
    "phase": "Running",
    "gang": {"gpus": {"requested": 8}},
    "goodput": {"seconds": {"startup": 120.0, "unobserved": 600.0}},
}
"""A job whose steps the operator cannot see: unobserved time, no ratio."""


def operator_metrics() -> str:
    jm = opmetrics.JobMetrics()  # with the process's own families, of which ours are listed
    jm.update("ns", "job", FULL_STATUS)
    jm.update("ns", "waiting", WAITING_STATUS)
    jm.update("ns", "deaf", UNOBSERVED_STATUS)
    jm.observe_reconcile(0.01)
    jm.observe_scrape(0.01, ok=False, reason="timeout")
    jm.observe_api_error("create_pod", "QuotaExceeded")
    rows = ["| metric | type | labels | meaning |", "|---|---|---|---|"]
    for fam in jm.registry.collect():
        if not fam.name.startswith("gpujob_"):
            continue  # client_python's process_* and python_gc_*, documented by it
        name = fam.name + ("_total" if fam.type == "counter" else "")
        labels = sorted(
            {k for s in fam.samples for k in s.labels if k != "le"},
            key=lambda k: (
                k not in opfamilies.JOB_LABELS,
                opfamilies.JOB_LABELS.index(k) if k in opfamilies.JOB_LABELS else 0,
                k,
            ),
        )
        rows.append(f"| `{name}` | {fam.type} | {_labels(labels)} | {_cell(fam.documentation)} |")
    return "\n".join(rows) + "\n"


def dashboard_table() -> str:
    rows = ["| dashboard (uid) | title | shows |", "|---|---|---|"]
    for uid, make in dashboards.DASHBOARDS.items():
        d = make()
        rows.append(f"| `{uid}` | {d['title']} | {_cell(d['description'])} |")
    return "\n".join(rows) + "\n"


def alert_table() -> str:
    rows = ["| alert | severity | for | summary |", "|---|---|---|---|"]
    for a in (*alerts.JOB_ALERTS, *alerts.OPERATOR_ALERTS):
        summary = TEMPLATE.sub(lambda m: f"${m[1] or 'value'}", a.summary)
        rows.append(f"| `{a.name}` | {a.severity} | {a.for_} | {_cell(summary)} |")
    return "\n".join(rows) + "\n"


TABLES: Final[dict[str, Callable[[], str]]] = {
    "trainer-metrics": trainer_metrics,
    "operator-metrics": operator_metrics,
    "dashboards": dashboard_table,
    "alerts": alert_table,
}


def blocks(text: str) -> dict[str, str]:
    """Key -> body of every generated block in ``text``."""
    return {m["key"]: m["body"] for m in BLOCK.finditer(text)}


def rewrite(text: str) -> str:
    """``text`` with every generated block re-rendered."""
    return BLOCK.sub(lambda m: m[1] + TABLES[m["key"]]() + m[4], text)


def main() -> int:
    README.write_text(rewrite(README.read_text()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
