"""Grafana dashboards of the chart, generated from code: fleet, job, operator health.

Why code: every query names metrics from :mod:`gpujob_trainer.contract` and
:mod:`gpujob_operator.observability.opfamilies`, and tests check each name against what is
actually exported and evaluate each query against a real Prometheus. The committed JSON under
``charts/gpujob/dashboards/`` is the output of ``python -m gpujob_operator.generate``; a
unit test fails when it drifts from this package.

One module per dashboard (:mod:`.fleet`, :mod:`.job`, :mod:`.operator_health`), each built on
the small model of :mod:`.model`; this module is their registry (:data:`DASHBOARDS`) and
renders them. Template variables: ``datasource`` (any Prometheus), ``namespace`` and ``job``
(from the operator's ``gpujob_job_phase`` series). Queries use ``$__rate_interval`` for rates.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

from gpujob_operator.observability.dashboards import fleet, job, operator_health

DASHBOARD_DIR: Final = Path("charts") / "gpujob" / "dashboards"
DASHBOARDS: Final = {
    "gpujob-fleet": fleet.build,
    "gpujob-job": job.build,
    "gpujob-operator": operator_health.build,
}


def render_all() -> dict[str, str]:
    """File name -> JSON text of every dashboard (stable formatting, trailing newline)."""
    return {
        f"{name}.json": json.dumps(make(), indent=2, sort_keys=False, allow_nan=False) + "\n"
        for name, make in DASHBOARDS.items()
    }


def queries(dashboard: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(panel title, expr) of every query, template variables included (for tests)."""
    for panel in dashboard["panels"]:
        for target in panel.get("targets", ()):
            yield panel["title"], target["expr"]
    for var in dashboard["templating"]["list"]:
        if var["type"] == "query":
            yield f"variable {var['name']}", var["definition"]


def artefacts() -> dict[Path, str]:
    """Every committed dashboard JSON of the chart."""
    return {DASHBOARD_DIR / name: text for name, text in render_all().items()}
