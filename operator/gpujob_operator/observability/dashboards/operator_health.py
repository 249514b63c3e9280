"""The operator dashboard (``gpujob-operator``): the operator's own health.

Is it up, does it keep up, what fails: reconcile and scrape rates, durations and errors, and
the operator process, from the operator's own target (its ``job`` label is
:data:`~gpujob_operator.observability.opfamilies.OPERATOR_JOB`). Template variable:
``datasource``.
"""

from __future__ import annotations

from typing import Any

from gpujob_operator.observability import opfamilies
from gpujob_operator.observability.dashboards.model import (
    RATE,
    Panel,
    Row,
    Target,
    dashboard,
    datasource_var,
    t,
)

OP = f'job="{opfamilies.OPERATOR_JOB}"'


def build() -> dict[str, Any]:
    """The operator's own health: is it up, does it keep up, what fails."""
    rec, scr = opfamilies.RECONCILE_DURATION.name, opfamilies.SCRAPE_DURATION.name

    def quantiles(metric: str) -> list[Target]:
        return [
            t(
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
                    [t(f"sum(up{{{OP}}})")],
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
                    [t(f"sum({opfamilies.JOBS.name}{{{OP}}})")],
                    kind="stat",
                    w=6,
                    h=4,
                ),
                Panel(
                    "Error rate",
                    "Failed reconciles and scrapes per second.",
                    [t(f"sum(rate({opfamilies.ERRORS.name}{{{OP}}}[{RATE}])) or vector(0)")],
                    kind="stat",
                    unit="reqps",
                    w=6,
                    h=4,
                ),
                Panel(
                    "Version",
                    "Build of the running operator.",
                    [t(f"{opfamilies.BUILD_INFO.name}{{{OP}}}", "{{version}}", instant=True)],
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
                        t(
                            f"sum by (result) (rate({opfamilies.RECONCILES.name}{{{OP}}}[{RATE}]))",
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
                        t(
                            f"sum by (source, reason) (rate({opfamilies.ERRORS.name}"
                            f"{{{OP}}}[{RATE}])) "
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
                        t(
                            f"sum by (call, reason) (rate({opfamilies.API_ERRORS.name}"
                            f"{{{OP}}}[{RATE}])) "
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
                        t(
                            f"sum by (result) (rate({opfamilies.SCRAPES.name}{{{OP}}}[{RATE}]))",
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
                        t(
                            f"sum(rate({m.name}{{{OP}}}[{RATE}])) or vector(0)",
                            legend,
                        )
                        for m, legend in (
                            (opfamilies.DROPPED_SERIES, "series"),
                            (opfamilies.DROPPED_VALUES, "values"),
                        )
                    ],
                    unit="ops",
                    w=12,
                ),
                Panel(
                    "Bytes refused from rank payloads",
                    "Bytes of rank responses thrown away for exceeding the size, line or "
                    "sample caps: a trickled, compressed-bomb or oversized endpoint.",
                    [t(f"sum(rate({opfamilies.DROPPED_BYTES.name}{{{OP}}}[{RATE}])) or vector(0)")],
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
                    [t(f"rate(process_cpu_seconds_total{{{OP}}}[{RATE}])", "{{instance}}")],
                    unit="short",
                    w=6,
                ),
                Panel(
                    "Memory",
                    "Resident memory of the operator process.",
                    [t(f"process_resident_memory_bytes{{{OP}}}", "{{instance}}")],
                    unit="bytes",
                    w=6,
                ),
                Panel(
                    "Event-loop lag",
                    "How late the operator's event loop wakes a 100 ms timer (p50, p99): "
                    "every job's handling waits behind whatever holds the loop. Seconds "
                    "here mean the operator is overloaded (see the README's Scale).",
                    quantiles(opfamilies.LOOP_LAG.name),
                    unit="s",
                    w=6,
                ),
                Panel(
                    "What held the event loop",
                    "Wake-ups over 100 ms late per second, by cause: loop (the operator's own "
                    "work on the loop), gil (its other threads held the GIL), cpu (the loop "
                    "thread waited for a CPU: the node is busy, or the CPU limit throttles "
                    "it), blocked (a system call or a lock on the loop).",
                    [
                        t(
                            f"sum by (cause) (rate({opfamilies.LOOP_LAGS.name}{{{OP}}}[{RATE}]))",
                            "{{cause}}",
                        )
                    ],
                    unit="short",
                    w=6,
                ),
                Panel(
                    "Garbage-collection pauses",
                    "The longest pause (p99) of each collector generation: a full (2) one walks "
                    "every object the operator holds, and the event loop waits it out. When "
                    "the loop lag climbs with it, the operator holds too many objects.",
                    [
                        t(
                            "histogram_quantile(0.99, sum by (le, generation) "
                            f"(rate({opfamilies.GC_PAUSE.name}_bucket{{{OP}}}[{RATE}])))",
                            "generation {{generation}}",
                        )
                    ],
                    unit="s",
                    w=6,
                ),
                Panel(
                    "Open file descriptors",
                    "Sockets and files the operator holds open.",
                    [t(f"process_open_fds{{{OP}}}", "{{instance}}")],
                    w=6,
                ),
            ],
        ),
    ]
    return dashboard(
        "gpujob-operator",
        "gpujob / Operator",
        "The gpujob operator's health: reconcile and scrape rates, durations and errors.",
        rows,
        [datasource_var()],
        time_from="now-6h",
    )
