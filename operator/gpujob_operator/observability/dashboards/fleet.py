"""The fleet dashboard (``gpujob-fleet``): every job at a glance, from the operator's /metrics.

How many jobs run, how far each is, what limits each, what failed. Template variables:
``datasource`` and ``namespace`` (any number of them).
"""

from __future__ import annotations

from typing import Any

from gpujob_operator.observability import opfamilies
from gpujob_operator.observability.dashboards.model import (
    Panel,
    Row,
    dashboard,
    datasource_var,
    query_var,
    t,
)

NS_ANY = 'namespace=~"$namespace"'


def _per_job(metric: str, sel: str = NS_ANY) -> str:
    return f"{metric}{{{sel}}}"


def build() -> dict[str, Any]:
    """Every job at a glance: how many run, how far each is, what limits each, what failed."""
    ph = opfamilies.JOB_PHASE.name
    summary = Row(
        "Fleet",
        [
            Panel(
                "Running jobs",
                "Jobs whose display phase is Running.",
                [t(f'sum(gpujob_job_phase{{{NS_ANY}, phase="Running"}})')],
                kind="stat",
                w=4,
                h=4,
            ),
            Panel(
                "Pending / restarting",
                "Jobs waiting for pods or restarting the gang.",
                [t(f'sum({ph}{{{NS_ANY}, phase=~"Pending|Restarting"}})')],
                kind="stat",
                w=4,
                h=4,
            ),
            Panel(
                "Failed jobs",
                "Jobs in phase Failed (see the Failures row and the job's status.failure).",
                [t(f'sum({ph}{{{NS_ANY}, phase="Failed"}})')],
                kind="stat",
                w=4,
                h=4,
                options={"colorMode": "background"},
            ),
            Panel(
                "Stalled jobs",
                "Jobs where no rank finished a step for longer than the stall timeout.",
                [t(f"sum({opfamilies.JOB_STALLED.name}{{{NS_ANY}}})")],
                kind="stat",
                w=4,
                h=4,
            ),
            Panel(
                "GPUs in running jobs",
                "GPUs requested by jobs that are Running.",
                [
                    t(
                        f"sum({opfamilies.JOB_GPUS.name}{{{NS_ANY}}} * on (namespace, job_name) "
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
                [t(f"sum({_per_job(opfamilies.JOB_SAMPLES_RATE.name)})")],
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
            t(f"{ph}{{{NS_ANY}}} == 1", table=True),
            t(f"{_per_job(opfamilies.JOB_PROGRESS.name)}", table=True),
            t(f"{_per_job(opfamilies.JOB_ETA.name)}", table=True),
            t(f"{_per_job(opfamilies.JOB_SAMPLES_RATE.name)}", table=True),
            t(f"{opfamilies.JOB_VERDICT.name}{{{NS_ANY}}} == 1", table=True),
            t(f"{_per_job(opfamilies.JOB_RESTARTS.name)}", table=True),
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
                [t(_per_job(opfamilies.JOB_PROGRESS.name), "{{namespace}}/{{job_name}}")],
                unit="percentunit",
                min=0,
                max=1,
                w=8,
            ),
            Panel(
                "ETA",
                "Estimated time to the target step per job.",
                [t(_per_job(opfamilies.JOB_ETA.name), "{{namespace}}/{{job_name}}")],
                unit="s",
                w=8,
            ),
            Panel(
                "Throughput",
                "Global samples/s per job over the operator's analysis window.",
                [t(_per_job(opfamilies.JOB_SAMPLES_RATE.name), "{{namespace}}/{{job_name}}")],
                unit="suffix: samples/s",
                w=8,
            ),
        ],
    )
    queue = Row(
        "Queue",
        [
            Panel(
                "Waiting jobs: time to forecast start",
                "Per waiting job, how long until enough GPUs are free for its whole gang "
                "(status.gang.startForecast): from the ETAs of the jobs that hold them. "
                "LowerBound: holders without an ETA could make it later.",
                [
                    t(
                        f"{opfamilies.JOB_START_FORECAST.name}{{{NS_ANY}}} - time()",
                        "{{namespace}}/{{job_name}} ({{confidence}})",
                        instant=True,
                    )
                ],
                kind="bargauge",
                unit="s",
                w=12,
            ),
            Panel(
                "Start forecast error",
                "How far started jobs' actual starts were from their last forecast "
                "(median and 90th percentile over the rate window, absolute seconds).",
                [
                    t(
                        f"histogram_quantile({q}, sum by (le) "
                        f"(rate({opfamilies.FORECAST_ERROR.name}_bucket[$__rate_interval])))",
                        f"p{round(q * 100)}",
                    )
                    for q in (0.5, 0.9)
                ],
                unit="s",
                w=12,
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
                    t(
                        f"{opfamilies.JOB_VERDICT.name}{{{NS_ANY}}} == 1",
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
                    t(
                        f"increase({_per_job(opfamilies.JOB_RESTARTS.name)}[$__range])",
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
                [t(_per_job(opfamilies.JOB_METRICS_AVAILABLE.name), "{{namespace}}/{{job_name}}")],
                w=8,
                min=0,
                max=1,
            ),
            Panel(
                "Jobs by phase",
                "Number of jobs in each display phase.",
                [t(f"sum by (phase) ({ph}{{{NS_ANY}}})", "{{phase}}")],
                w=12,
                stack=True,
            ),
            Panel(
                "GPU utilization per job",
                "Mean GPU utilization of each gang (operator's window).",
                [t(_per_job(opfamilies.JOB_GPU_UTILIZATION.name), "{{namespace}}/{{job_name}}")],
                unit="percentunit",
                min=0,
                max=1,
                w=12,
            ),
        ],
    )
    lost = opfamilies.JOB_LOST_GPU_SECONDS.name
    productive = opfamilies.JOB_PRODUCTIVE_GPU_SECONDS.name
    unobserved = opfamilies.JOB_UNOBSERVED_GPU_SECONDS.name
    goodput = Row(
        "Goodput",
        [
            Panel(
                "Fleet goodput",
                "Productive GPU-seconds over all accounted GPU-seconds of the selected jobs. "
                "Jobs whose steps the operator cannot see (monitoring off, no step past the "
                "start-up timeout) are left out: see Unobserved GPU-hours.",
                [
                    t(
                        f"sum({_per_job(productive)}) / (sum({_per_job(productive)}) + "
                        f"sum({_per_job(lost)}))"
                    )
                ],
                kind="stat",
                unit="percentunit",
                min=0,
                max=1,
                w=6,
                h=8,
            ),
            Panel(
                "Lost GPU-hours by cause",
                "Every selected job's lost GPU-hours, summed by cause.",
                [t(f"sum by (cause) ({_per_job(lost)}) / 3600", "{{cause}}", instant=True)],
                kind="bargauge",
                unit="suffix: GPU-h",
                w=6,
                h=8,
            ),
            _top_jobs(
                "Jobs losing the most GPU-hours",
                "The ten jobs with the most GPU-hours that made no kept step.",
                lost,
            ),
            Panel(
                "Lost GPU-hours by namespace",
                "Teams ranked by the GPU-hours their jobs lost (all causes).",
                [
                    t(
                        f"sort_desc(sum by (namespace) ({_per_job(lost)})) / 3600",
                        "{{namespace}}",
                        instant=True,
                    )
                ],
                kind="bargauge",
                unit="suffix: GPU-h",
                w=6,
                h=8,
            ),
            _top_jobs(
                "Unobserved GPU-hours",
                "GPU-hours of jobs whose steps the operator cannot see (monitoring off, a "
                "trainer without the library, a blocked metrics port): neither productive nor "
                "lost, and left out of the fleet goodput.",
                unobserved,
            ),
        ],
    )
    return dashboard(
        "gpujob-fleet",
        "gpujob / Fleet",
        "Every GPUTrainingJob: phase, progress, ETA, goodput and lost GPU-hours by cause, waiting "
        "jobs' start forecasts, throughput, bottleneck verdict and failures, from the operator's "
        "own /metrics.",
        [summary, progress, goodput, queue, health],
        [
            datasource_var(),
            query_var("namespace", "Namespace", f"label_values({ph}, namespace)", multi=True),
        ],
    )


def _top_jobs(title: str, description: str, gpu_seconds: str) -> Panel:
    """The ten jobs with the most GPU-hours of a per-job GPU-seconds series, as bars."""
    return Panel(
        title,
        description,
        [
            t(
                f"topk(10, sum by (namespace, job_name) ({_per_job(gpu_seconds)})) / 3600",
                "{{namespace}}/{{job_name}}",
                instant=True,
            )
        ],
        kind="bargauge",
        unit="suffix: GPU-h",
        w=6,
        h=8,
    )
