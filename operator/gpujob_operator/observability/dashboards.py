"""Grafana dashboards of the chart, generated from code: fleet, job, operator health.

Why code: every query names metrics from :mod:`gpujob_trainer.contract` and
:mod:`gpujob_operator.observability.opmetrics`, and tests check each name against what is actually
exported and evaluate each query against a real Prometheus. The committed JSON under
``charts/gpujob/dashboards/`` is the output of ``python -m gpujob_operator.generate``; a
unit test fails when it drifts from this module.

Template variables: ``datasource`` (any Prometheus), ``namespace`` and ``job`` (from the
operator's ``gpujob_job_phase`` series). Queries use ``$__rate_interval`` for rates.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from gpujob_operator.observability import opmetrics as om
from gpujob_trainer import contract as c

OPERATOR_JOB: Final = "gpujob-operator"
"""The Prometheus ``job`` label of the operator's target (the ServiceMonitor sets it)."""
DASHBOARD_DIR: Final = Path("charts") / "gpujob" / "dashboards"
DS: Final = {"type": "prometheus", "uid": "${datasource}"}
RATE: Final = "$__rate_interval"
SCHEMA_VERSION: Final = 39

NS_ONE = 'namespace="$namespace"'
JOB_ONE = f'{NS_ONE}, job_name="$job"'
NS_ANY = 'namespace=~"$namespace"'
OP = f'job="{OPERATOR_JOB}"'
THROTTLE = "|".join(c.THROTTLE_REASONS)


@dataclass
class Target:
    """One query of a panel."""

    expr: str
    legend: str = ""
    instant: bool = False
    table: bool = False


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
    title: str
    panels: list[Panel]


def _t(expr: str, legend: str = "", **kw: Any) -> Target:
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


def _datasource_var() -> dict[str, Any]:
    return {
        "name": "datasource",
        "label": "Data source",
        "type": "datasource",
        "query": "prometheus",
        "current": {},
        "hide": 0,
        "refresh": 1,
    }


def _query_var(name: str, label: str, query: str, *, multi: bool) -> dict[str, Any]:
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


def _dashboard(
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


# ---- fleet ---------------------------------------------------------------------------------

_PHASE_COLORS = {
    "Running": "green",
    "Succeeded": "blue",
    "Failed": "red",
    "Pending": "yellow",
    "Restarting": "orange",
    "Suspended": "purple",
}


def _per_job(metric: str, sel: str = NS_ANY) -> str:
    return f"{metric}{{{sel}}}"


def fleet() -> dict[str, Any]:
    """Every job at a glance: how many run, how far each is, what limits each, what failed."""
    ph = om.JOB_PHASE.name
    summary = Row(
        "Fleet",
        [
            Panel(
                "Running jobs",
                "Jobs whose display phase is Running.",
                [_t(f'sum(gpujob_job_phase{{{NS_ANY}, phase="Running"}})')],
                kind="stat",
                w=4,
                h=4,
            ),
            Panel(
                "Pending / restarting",
                "Jobs waiting for pods or restarting the gang.",
                [_t(f'sum({ph}{{{NS_ANY}, phase=~"Pending|Restarting"}})')],
                kind="stat",
                w=4,
                h=4,
            ),
            Panel(
                "Failed jobs",
                "Jobs in phase Failed (see the Failures row and the job's status.failure).",
                [_t(f'sum({ph}{{{NS_ANY}, phase="Failed"}})')],
                kind="stat",
                w=4,
                h=4,
                options={"colorMode": "background"},
            ),
            Panel(
                "Stalled jobs",
                "Jobs where no rank finished a step for longer than the stall timeout.",
                [_t(f"sum({om.JOB_STALLED.name}{{{NS_ANY}}})")],
                kind="stat",
                w=4,
                h=4,
            ),
            Panel(
                "GPUs in running jobs",
                "GPUs requested by jobs that are Running.",
                [
                    _t(
                        f"sum({om.JOB_GPUS.name}{{{NS_ANY}}} * on (namespace, job_name) "
                        f'({ph}{{phase="Running"}} == 1))'
                        f" or vector(0)"
                    )
                ],
                kind="stat",
                w=4,
                h=4,
            ),
            Panel(
                "Fleet throughput",
                "Sum of every job's global samples/s (the operator's analysis window).",
                [_t(f"sum({_per_job(om.JOB_SAMPLES_RATE.name)})")],
                kind="stat",
                unit="suffix: samples/s",
                w=4,
                h=4,
            ),
        ],
    )
    jobs_table = Panel(
        "Jobs",
        "One row per job: phase, progress, ETA, throughput and current bottleneck verdict.",
        [
            _t(f"{ph}{{{NS_ANY}}} == 1", table=True),
            _t(f"{_per_job(om.JOB_PROGRESS.name)}", table=True),
            _t(f"{_per_job(om.JOB_ETA.name)}", table=True),
            _t(f"{_per_job(om.JOB_SAMPLES_RATE.name)}", table=True),
            _t(f"{om.JOB_VERDICT.name}{{{NS_ANY}}} == 1", table=True),
            _t(f"{_per_job(om.JOB_RESTARTS.name)}", table=True),
        ],
        kind="table",
        w=24,
        h=9,
        transformations=[
            {"id": "merge", "options": {}},
            {
                "id": "organize",
                "options": {
                    "excludeByName": {"Time": True, "Value #A": True, "Value #E": True},
                    "indexByName": {
                        "namespace": 0,
                        "job_name": 1,
                        "phase": 2,
                        "Value #B": 3,
                        "Value #C": 4,
                        "Value #D": 5,
                        "verdict": 6,
                        "Value #F": 7,
                    },
                    "renameByName": {
                        "job_name": "job",
                        "Value #B": "progress",
                        "Value #C": "ETA",
                        "Value #D": "samples/s",
                        "Value #F": "restarts",
                    },
                },
            },
        ],
    )
    progress = Row(
        "Progress",
        [
            jobs_table,
            Panel(
                "Progress",
                "Steps completed / target steps per job.",
                [_t(_per_job(om.JOB_PROGRESS.name), "{{namespace}}/{{job_name}}")],
                unit="percentunit",
                min=0,
                max=1,
                w=8,
            ),
            Panel(
                "ETA",
                "Estimated time to the target step per job.",
                [_t(_per_job(om.JOB_ETA.name), "{{namespace}}/{{job_name}}")],
                unit="s",
                w=8,
            ),
            Panel(
                "Throughput",
                "Global samples/s per job over the operator's analysis window.",
                [_t(_per_job(om.JOB_SAMPLES_RATE.name), "{{namespace}}/{{job_name}}")],
                unit="suffix: samples/s",
                w=8,
            ),
        ],
    )
    health = Row(
        "Bottlenecks and failures",
        [
            Panel(
                "Bottleneck verdicts",
                "Current verdict per job (1 = active). Healthy means nothing limits it.",
                [
                    _t(
                        f"{om.JOB_VERDICT.name}{{{NS_ANY}}} == 1",
                        "{{namespace}}/{{job_name}}: {{verdict}}",
                    )
                ],
                w=8,
                min=0,
                max=1,
                stack=True,
            ),
            Panel(
                "Gang restarts",
                "Gang restarts per job within the time range (counted against backoffLimit).",
                [
                    _t(
                        f"increase({_per_job(om.JOB_RESTARTS.name)}[$__range])",
                        "{{namespace}}/{{job_name}}",
                        instant=True,
                    )
                ],
                kind="bargauge",
                w=8,
            ),
            Panel(
                "Metrics available",
                "1 while the operator can scrape the job's ranks; 0 means blind.",
                [_t(_per_job(om.JOB_METRICS_AVAILABLE.name), "{{namespace}}/{{job_name}}")],
                w=8,
                min=0,
                max=1,
            ),
            Panel(
                "Jobs by phase",
                "Number of jobs in each display phase.",
                [_t(f"sum by (phase) ({ph}{{{NS_ANY}}})", "{{phase}}")],
                w=12,
                stack=True,
            ),
            Panel(
                "GPU utilization per job",
                "Mean GPU utilization of each gang (operator's window).",
                [_t(_per_job(om.JOB_GPU_UTILIZATION.name), "{{namespace}}/{{job_name}}")],
                unit="percentunit",
                min=0,
                max=1,
                w=12,
            ),
        ],
    )
    return _dashboard(
        "gpujob-fleet",
        "gpujob / Fleet",
        "Every GPUTrainingJob: phase, progress, ETA, throughput, bottleneck verdict and failures, "
        "from the operator's own /metrics.",
        [summary, progress, health],
        [
            _datasource_var(),
            _query_var("namespace", "Namespace", f"label_values({ph}, namespace)", multi=True),
        ],
    )


# ---- job -----------------------------------------------------------------------------------


def _by_rank(metric: str) -> str:
    return f"sum by (rank) (rate({metric}{{{JOB_ONE}}}[{RATE}]))"


def job() -> dict[str, Any]:
    """One job: where each rank's step time goes, which rank straggles, what each GPU does."""
    steps_per_rank = _by_rank(c.STEPS.name)
    not_own = "|".join((c.PHASE_DATA_WAIT, c.PHASE_COMM_WAIT, c.PHASE_CHECKPOINT, c.PHASE_EVAL))
    # The phases partition a step, so the ones that are not a wait are the rank's own work.
    own_per_step = (
        f'(sum by (rank) (rate({c.PHASE_SECONDS.name}{{{JOB_ONE},phase!~"{not_own}"}}'
        f"[{RATE}])) / {steps_per_rank})"
    )
    outside = f"{c.PHASE_CHECKPOINT}|{c.PHASE_EVAL}"
    outside_share = (
        f"max by (phase) (sum by (rank, phase) (rate({c.PHASE_SECONDS.name}"
        f'{{{JOB_ONE},phase=~"{outside}"}}[{RATE}])) / on (rank) group_left '
        f"sum by (rank) (rate({c.PHASE_SECONDS.name}{{{JOB_ONE}}}[{RATE}])))"
    )
    step_buckets = f"rate({c.STEP_DURATION.name}_bucket{{{JOB_ONE}}}[{RATE}])"
    overview = Row(
        "Overview",
        [
            Panel(
                "Progress",
                "Steps completed / target steps.",
                [_t(f"{om.JOB_PROGRESS.name}{{{JOB_ONE}}}")],
                kind="gauge",
                unit="percentunit",
                min=0,
                max=1,
                w=4,
                h=5,
            ),
            Panel(
                "ETA",
                "Estimated time to the target step.",
                [_t(f"{om.JOB_ETA.name}{{{JOB_ONE}}}")],
                kind="stat",
                unit="s",
                w=4,
                h=5,
            ),
            Panel(
                "Throughput",
                "Global samples/s over the operator's analysis window.",
                [_t(f"{om.JOB_SAMPLES_RATE.name}{{{JOB_ONE}}}")],
                kind="stat",
                unit="suffix: samples/s",
                w=4,
                h=5,
            ),
            Panel(
                "Phase",
                "The job's display phase.",
                [_t(f"{om.JOB_PHASE.name}{{{JOB_ONE}}} == 1", "{{phase}}", instant=True)],
                kind="stat",
                w=4,
                h=5,
                options={
                    "textMode": "name",
                    "colorMode": "background",
                    "reduceOptions": {"calcs": ["lastNotNull"]},
                },
            ),
            Panel(
                "Bottleneck",
                "Current verdict; status.bottleneck has the evidence and advice.",
                [_t(f"{om.JOB_VERDICT.name}{{{JOB_ONE}}} == 1", "{{verdict}}", instant=True)],
                kind="stat",
                w=4,
                h=5,
                options={
                    "textMode": "name",
                    "colorMode": "background",
                    "reduceOptions": {"calcs": ["lastNotNull"]},
                },
            ),
            Panel(
                "Time since last step",
                "Seconds since any rank finished a step (stall detection).",
                [_t(f"time() - max({c.LAST_STEP_TIMESTAMP.name}{{{JOB_ONE}}})")],
                kind="stat",
                unit="s",
                w=4,
                h=5,
            ),
        ],
    )
    steps = Row(
        "Step time",
        [
            Panel(
                "Step time breakdown per rank",
                "Seconds per step spent in each phase, per rank (stacked bars sum to the step "
                "time). Large data_wait: input bound; large comm_wait on fast ranks: a straggler "
                "or the network.",
                [
                    _t(
                        f"sum by (rank, phase) (rate({c.PHASE_SECONDS.name}{{{JOB_ONE}}}[{RATE}])) "
                        f"/ on (rank) group_left {steps_per_rank}",
                        "rank {{rank}} {{phase}}",
                    )
                ],
                unit="s",
                stack=True,
                w=12,
            ),
            Panel(
                "Share of time by phase",
                "Fraction of all ranks' time in each phase.",
                [
                    _t(
                        f"sum by (phase) (rate({c.PHASE_SECONDS.name}{{{JOB_ONE}}}[{RATE}])) "
                        "/ ignoring (phase) "
                        f"group_left sum(rate({c.PHASE_SECONDS.name}{{{JOB_ONE}}}[{RATE}]))",
                        "{{phase}}",
                    )
                ],
                unit="percentunit",
                stack=True,
                min=0,
                max=1,
                w=12,
            ),
            Panel(
                "Step time per rank (p50, p95)",
                "Step time quantiles per rank from the histogram.",
                [
                    _t(
                        f"histogram_quantile(0.5, sum by (rank, le) ({step_buckets}))",
                        "p50 rank {{rank}}",
                    ),
                    _t(
                        f"histogram_quantile(0.95, sum by (rank, le) ({step_buckets}))",
                        "p95 rank {{rank}}",
                    ),
                ],
                unit="s",
                w=12,
            ),
            Panel(
                "Mean step time per rank",
                "Mean step time per rank over the rate interval.",
                [
                    _t(
                        f"{_by_rank(c.STEP_DURATION.name + '_sum')} / "
                        f"{_by_rank(c.STEP_DURATION.name + '_count')}",
                        "rank {{rank}}",
                    )
                ],
                unit="s",
                w=12,
            ),
        ],
    )
    ranks = Row(
        "Ranks",
        [
            Panel(
                "Own time per step per rank",
                "Each rank's own work per step: the step minus its waits (data, exposed "
                "all-reduce) and checkpoint/eval, so a loss head, augmentation or metrics "
                "outside the model count too. The straggler signal: the fast ranks' waits "
                "would blame them.",
                [_t(own_per_step, "rank {{rank}}")],
                unit="s",
                w=8,
            ),
            Panel(
                "Relative speed per rank",
                "Median rank's own time per step / this rank's (1 = typical). Below 0.75 "
                "(stragglerScore): a Straggler verdict names the rank.",
                [_t(f"scalar(quantile(0.5, {own_per_step})) / {own_per_step}", "rank {{rank}}")],
                unit="percentunit",
                min=0,
                max=1,
                w=8,
            ),
            Panel(
                "Checkpoint and eval share",
                "Share of the time between steps spent in the checkpoint and eval phases, on "
                "the rank that spends most in each (the others wait for it). Above 10% "
                "(checkpointBoundRatio): CheckpointBound; above 15% (evalBoundRatio): EvalBound.",
                [_t(outside_share, "{{phase}}")],
                unit="percentunit",
                min=0,
                max=1,
                w=8,
            ),
            Panel(
                "Samples/s per rank",
                "Samples consumed per second by each rank.",
                [_t(_by_rank(c.SAMPLES.name), "rank {{rank}}")],
                unit="suffix: samples/s",
                w=8,
            ),
            Panel(
                "Steps/s per rank",
                "Optimizer steps per second by each rank.",
                [_t(steps_per_rank, "rank {{rank}}")],
                unit="suffix: steps/s",
                w=8,
            ),
            Panel(
                "Loss",
                "Last reported training loss per rank.",
                [_t(f"{c.LOSS.name}{{{JOB_ONE}}}", "rank {{rank}}")],
                w=8,
            ),
            Panel(
                "Epoch",
                "Current epoch per rank.",
                [_t(f"{c.EPOCH.name}{{{JOB_ONE}}}", "rank {{rank}}")],
                w=8,
            ),
        ],
    )
    gpu_sel = JOB_ONE
    gpu_legend = "node {{node_rank}} gpu {{gpu}}"
    gpus = Row(
        "GPUs",
        [
            Panel(
                "GPU utilization",
                "Fraction of time a kernel ran, per GPU (NVML).",
                [_t(f"{c.GPU_UTILIZATION.name}{{{gpu_sel}}}", gpu_legend)],
                unit="percentunit",
                min=0,
                max=1,
                w=8,
            ),
            Panel(
                "GPU memory used",
                "Memory in use per GPU, and installed.",
                [
                    _t(f"{c.GPU_MEMORY_USED.name}{{{gpu_sel}}}", gpu_legend),
                    _t(f"max({c.GPU_MEMORY_TOTAL.name}{{{gpu_sel}}})", "installed"),
                ],
                unit="bytes",
                w=8,
            ),
            Panel(
                "CUDA allocator reserved",
                "Memory each rank's caching allocator holds (MemoryPressure).",
                [_t(f"{c.CUDA_MEMORY_RESERVED.name}{{{gpu_sel}}}", "rank {{rank}}")],
                unit="bytes",
                w=8,
            ),
            Panel(
                "Power",
                "Power draw per GPU and the enforced limit.",
                [
                    _t(f"{c.GPU_POWER.name}{{{gpu_sel}}}", gpu_legend),
                    _t(f"max({c.GPU_POWER_LIMIT.name}{{{gpu_sel}}})", "limit"),
                ],
                unit="watt",
                w=8,
            ),
            Panel(
                "Temperature",
                "GPU core temperature.",
                [_t(f"{c.GPU_TEMPERATURE.name}{{{gpu_sel}}}", gpu_legend)],
                unit="celsius",
                w=8,
            ),
            Panel(
                "SM clock",
                "Current SM clock per GPU; drops under throttling.",
                [_t(f"{c.GPU_SM_CLOCK.name}{{{gpu_sel}}}", gpu_legend)],
                unit="hertz",
                w=8,
            ),
            Panel(
                "Throttling",
                "1 while NVML reports a slowdown reason (power cap, thermal, hardware).",
                [
                    _t(
                        f"max by (node_rank, gpu, reason) "
                        f'({c.GPU_CLOCK_EVENT.name}{{{gpu_sel}, reason=~"{THROTTLE}"}})',
                        "node {{node_rank}} gpu {{gpu}} {{reason}}",
                    )
                ],
                min=0,
                max=1,
                w=8,
            ),
            Panel(
                "Allocator retries and OOMs",
                "cudaMalloc retries and OOMs per rank within the range.",
                [
                    _t(
                        f"increase({c.CUDA_ALLOC_RETRIES.name}{{{gpu_sel}}}[$__range])",
                        "retries rank {{rank}}",
                        instant=True,
                    ),
                    _t(
                        f"increase({c.CUDA_OOMS.name}{{{gpu_sel}}}[$__range])",
                        "OOMs rank {{rank}}",
                        instant=True,
                    ),
                ],
                kind="bargauge",
                w=8,
            ),
            Panel(
                "XID and uncorrected ECC errors",
                "Hardware faults per GPU; any is a reason to drain the node.",
                [
                    _t(f"{c.GPU_XID_ERRORS.name}{{{gpu_sel}}}", "XID " + gpu_legend),
                    _t(f"{c.GPU_ECC_UNCORRECTED.name}{{{gpu_sel}}}", "ECC " + gpu_legend),
                ],
                w=8,
            ),
            Panel(
                "GPU telemetry",
                "1 when the node's NVML telemetry is exported; 0 with the reason.",
                [
                    _t(
                        f"{c.GPU_TELEMETRY_AVAILABLE.name}{{{gpu_sel}}}",
                        "node {{node_rank}} {{reason}}",
                    )
                ],
                min=0,
                max=1,
                w=24,
                h=5,
            ),
        ],
    )
    ph = om.JOB_PHASE.name
    return _dashboard(
        "gpujob-job",
        "gpujob / Job",
        "One GPUTrainingJob: step time by phase per rank, stragglers, and every GPU "
        "(from the ranks' own /metrics, scraped by the chart's PodMonitor).",
        [overview, steps, ranks, gpus],
        [
            _datasource_var(),
            _query_var("namespace", "Namespace", f"label_values({ph}, namespace)", multi=False),
            _query_var(
                "job", "Job", f'label_values({ph}{{namespace="$namespace"}}, job_name)', multi=False
            ),
        ],
        time_from="now-1h",
    )


# ---- operator ------------------------------------------------------------------------------


def operator() -> dict[str, Any]:
    """The operator's own health: is it up, does it keep up, what fails."""
    rec, scr = om.RECONCILE_DURATION.name, om.SCRAPE_DURATION.name

    def quantiles(metric: str) -> list[Target]:
        return [
            _t(
                f"histogram_quantile({q}, sum by (le) (rate({metric}_bucket{{{OP}}}[{RATE}])))",
                f"p{int(q * 100)}",
            )
            for q in (0.5, 0.99)
        ]

    rows = [
        Row(
            "Operator",
            [
                Panel(
                    "Up",
                    "1 when Prometheus can scrape the operator.",
                    [_t(f"sum(up{{{OP}}})")],
                    kind="stat",
                    w=6,
                    h=4,
                    mappings=[
                        {"type": "value", "options": {"0": {"text": "DOWN", "color": "red"}}}
                    ],
                ),
                Panel(
                    "Jobs tracked",
                    "Jobs the operator exports series for.",
                    [_t(f"sum({om.JOBS.name}{{{OP}}})")],
                    kind="stat",
                    w=6,
                    h=4,
                ),
                Panel(
                    "Error rate",
                    "Failed reconciles and scrapes per second.",
                    [_t(f"sum(rate({om.ERRORS.name}{{{OP}}}[{RATE}])) or vector(0)")],
                    kind="stat",
                    unit="reqps",
                    w=6,
                    h=4,
                ),
                Panel(
                    "Version",
                    "Build of the running operator.",
                    [_t(f"{om.BUILD_INFO.name}{{{OP}}}", "{{version}}", instant=True)],
                    kind="stat",
                    w=6,
                    h=4,
                    options={"textMode": "name"},
                ),
            ],
        ),
        Row(
            "Reconcile",
            [
                Panel(
                    "Reconciles",
                    "Reconcile passes per second, by result.",
                    [
                        _t(
                            f"sum by (result) (rate({om.RECONCILES.name}{{{OP}}}[{RATE}]))",
                            "{{result}}",
                        )
                    ],
                    unit="ops",
                    w=8,
                ),
                Panel(
                    "Reconcile duration",
                    "Time one reconcile pass takes (p50, p99).",
                    quantiles(rec),
                    unit="s",
                    w=8,
                ),
                Panel(
                    "Errors by reason",
                    "Failed reconciles and scrapes per second, by source and reason.",
                    [
                        _t(
                            f"sum by (source, reason) (rate({om.ERRORS.name}{{{OP}}}[{RATE}])) "
                            "or vector(0)",
                            "{{source}} {{reason}}",
                        )
                    ],
                    unit="ops",
                    w=8,
                ),
                Panel(
                    "API errors by reason",
                    "API calls the server refused or that failed, per second, by call and "
                    "classified reason (QuotaExceeded, APIThrottled, ...): the jobs' Warning "
                    "Events and conditions say which job; the README's Troubleshooting says "
                    "what to do.",
                    [
                        _t(
                            f"sum by (call, reason) (rate({om.API_ERRORS.name}{{{OP}}}[{RATE}])) "
                            "or vector(0)",
                            "{{call}} {{reason}}",
                        )
                    ],
                    unit="ops",
                    w=24,
                ),
            ],
        ),
        Row(
            "Scrapes of ranks",
            [
                Panel(
                    "Scrapes",
                    "Scrapes of rank endpoints per second, by result.",
                    [
                        _t(
                            f"sum by (result) (rate({om.SCRAPES.name}{{{OP}}}[{RATE}]))",
                            "{{result}}",
                        )
                    ],
                    unit="ops",
                    w=12,
                ),
                Panel(
                    "Scrape duration",
                    "Time one scrape of a rank takes (p50, p99).",
                    quantiles(scr),
                    unit="s",
                    w=12,
                ),
                Panel(
                    "Refused from rank payloads",
                    "Series (a rank label not the endpoint's rank, over a cap) and values "
                    "(NaN, infinities, implausible numbers) thrown away per second. Non-zero "
                    "means a trainer endpoint exports something the operator does not trust: "
                    "the job's MetricsAvailable condition and MetricsRejected Events name it.",
                    [
                        _t(
                            f"sum(rate({m.name}{{{OP}}}[{RATE}])) or vector(0)",
                            legend,
                        )
                        for m, legend in (
                            (om.DROPPED_SERIES, "series"),
                            (om.DROPPED_VALUES, "values"),
                        )
                    ],
                    unit="ops",
                    w=12,
                ),
                Panel(
                    "Bytes refused from rank payloads",
                    "Bytes of rank responses thrown away for exceeding the size, line or "
                    "sample caps: a trickled, compressed-bomb or oversized endpoint.",
                    [_t(f"sum(rate({om.DROPPED_BYTES.name}{{{OP}}}[{RATE}])) or vector(0)")],
                    unit="Bps",
                    w=12,
                ),
            ],
        ),
        Row(
            "Process",
            [
                Panel(
                    "CPU",
                    "Operator process CPU usage (cores).",
                    [_t(f"rate(process_cpu_seconds_total{{{OP}}}[{RATE}])", "{{instance}}")],
                    unit="short",
                    w=8,
                ),
                Panel(
                    "Memory",
                    "Resident memory of the operator process.",
                    [_t(f"process_resident_memory_bytes{{{OP}}}", "{{instance}}")],
                    unit="bytes",
                    w=8,
                ),
                Panel(
                    "Open file descriptors",
                    "Sockets and files the operator holds open.",
                    [_t(f"process_open_fds{{{OP}}}", "{{instance}}")],
                    w=8,
                ),
            ],
        ),
    ]
    return _dashboard(
        "gpujob-operator",
        "gpujob / Operator",
        "The gpujob operator's health: reconcile and scrape rates, durations and errors.",
        rows,
        [_datasource_var()],
        time_from="now-6h",
    )


DASHBOARDS: Final = {"gpujob-fleet": fleet, "gpujob-job": job, "gpujob-operator": operator}


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
