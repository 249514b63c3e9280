"""The operator's own /metrics: a fleet view of every job, and the operator's health.

One Prometheus target (the operator) answers "how far is every job, and what limits it"
without scraping every rank: the reconciler hands each job's freshly computed status to
:meth:`JobMetrics.update`, and a collector renders the latest values at scrape time. Labels
are only ``namespace`` and ``job_name`` (plus small fixed sets such as ``phase`` and
``verdict``), so cardinality grows with the number of jobs and nothing else. A job's series
vanish with :meth:`JobMetrics.forget` when the job is deleted.

``job_name`` rather than ``job``: Prometheus owns the ``job`` label (the scrape job). The
ServiceMonitor scrapes with ``honorLabels`` so our ``namespace`` (the job's) wins over the
target's (the operator's).

Everything lives in a private :class:`CollectorRegistry` and is rendered by custom
collectors, so no ``_created`` series are emitted (design, pitfalls) and tests can make a
fresh :class:`JobMetrics` each time.
"""

from __future__ import annotations

import logging
import math
import re
import threading
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final

from prometheus_client import CollectorRegistry, GCCollector, ProcessCollector
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

log = logging.getLogger("gpujob.opmetrics")

DEFAULT_PORT: Final = 8081
ENV_PORT: Final = "GPUJOB_OPERATOR_METRICS_PORT"
ENV_ADDR: Final = "GPUJOB_OPERATOR_METRICS_ADDR"

LABEL_NAMESPACE: Final = "namespace"
LABEL_JOB: Final = "job_name"
JOB_LABELS: Final = (LABEL_NAMESPACE, LABEL_JOB)

PHASES: Final = ("Pending", "Running", "Restarting", "Suspended", "Succeeded", "Failed")
"""Display phases (``status.phase``); one 0/1 series each, so a phase change is one flip."""
VERDICTS: Final = (
    "Healthy",
    "InputBound",
    "CheckpointBound",
    "EvalBound",
    "CommunicationBound",
    "Straggler",
    "MemoryPressure",
    "GPUUnderutilized",
    "Throttled",
    "Stalled",
    "HardwareFault",
)
"""Bottleneck verdicts (design section 5). An unknown verdict is rendered as ``Other``."""
VERDICT_OTHER: Final = "Other"
REPLICA_STATES: Final = ("desired", "pending", "running", "succeeded", "failed")

RECONCILE_BUCKETS: Final = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
SCRAPE_BUCKETS: Final = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
MAX_ERROR_REASONS: Final = 32
"""Distinct error reasons kept; later new ones count as ``other`` (bounded cardinality)."""
REASON_OTHER: Final = "other"
_REASON_RE = re.compile(r"[^A-Za-z0-9_]+")


def _label(text: str) -> str:
    """A label value from a fixed vocabulary (no cardinality cap needed), made safe."""
    return _REASON_RE.sub("_", text).strip("_")[:64] or "unknown"


@dataclass(frozen=True)
class Family:
    """Name, help and unit of one exported family: the single spelling dashboards use."""

    name: str
    help: str
    unit: str = ""


# ---- job-level families --------------------------------------------------------------
JOB_PROGRESS = Family(
    "gpujob_job_progress_ratio", "Steps completed / target steps, 0..1 (status.progress).", "ratio"
)
JOB_STEP = Family("gpujob_job_step", "Optimizer steps completed (min over ranks).")
JOB_TARGET_STEPS = Family("gpujob_job_target_steps", "Optimizer steps the job means to run.")
JOB_ETA = Family("gpujob_job_eta_seconds", "Estimated seconds until the target step.", "seconds")
JOB_SAMPLES_RATE = Family(
    "gpujob_job_samples_per_second", "Global training throughput over the analysis window."
)
JOB_TOKENS_RATE = Family(
    "gpujob_job_tokens_per_second", "Global token throughput over the window, when exported."
)
JOB_LOSS = Family("gpujob_job_loss", "Last reported training loss.")
JOB_LAST_STEP = Family(
    "gpujob_job_last_step_timestamp_seconds", "Unix time a rank last finished a step.", "seconds"
)
JOB_START = Family("gpujob_job_start_time_seconds", "Unix time the pods were created.", "seconds")
JOB_VERDICT = Family(
    "gpujob_job_bottleneck_verdict", "1 for the job's current bottleneck verdict, else 0."
)
JOB_PHASE = Family("gpujob_job_phase", "1 for the job's current display phase, else 0.")
JOB_RESTARTS = Family("gpujob_job_restarts_total", "Gang restarts so far (status.restarts).")
JOB_METRICS_AVAILABLE = Family(
    "gpujob_job_metrics_available",
    "1 while the operator can scrape the job's ranks (MetricsAvailable condition), else 0.",
)
JOB_STALLED = Family("gpujob_job_stalled", "1 while the job is Stalled (no step for too long).")
JOB_GPUS = Family("gpujob_job_gpus", "GPUs requested by the gang (nodes x gpusPerNode).")
JOB_GPU_UTILIZATION = Family(
    "gpujob_job_gpu_utilization_ratio", "Mean GPU utilization of the gang over the window.", "ratio"
)
JOB_REPLICAS = Family("gpujob_job_replicas", "Pods of the current gang attempt by state.")

# ---- operator health -------------------------------------------------------------------
RECONCILES = Family("gpujob_operator_reconciles_total", "Reconcile passes, by result.")
RECONCILE_DURATION = Family(
    "gpujob_operator_reconcile_duration_seconds", "Time one reconcile pass took.", "seconds"
)
SCRAPES = Family("gpujob_operator_scrapes_total", "Scrapes of rank endpoints, by result.")
SCRAPE_DURATION = Family(
    "gpujob_operator_scrape_duration_seconds", "Time one scrape of a rank took.", "seconds"
)
ERRORS = Family("gpujob_operator_errors_total", "Failed reconciles and scrapes, by source/reason.")
DROPPED_SERIES = Family(
    "gpujob_operator_scrape_dropped_series_total",
    "Series refused from rank payloads: a rank label not the target's rank, over a cap.",
)
DROPPED_VALUES = Family(
    "gpujob_operator_scrape_dropped_values_total",
    "Values refused from rank payloads: NaN, infinities, implausible numbers.",
)
DROPPED_BYTES = Family(
    "gpujob_operator_scrape_dropped_bytes_total",
    "Bytes of rank responses thrown away for exceeding a size, line or sample cap.",
    "bytes",
)
API_ERRORS = Family(
    "gpujob_operator_api_errors_total",
    "API calls the server refused or that failed, by call and classified reason "
    "(QuotaExceeded, APIThrottled, ...; see the README's Troubleshooting).",
)
JOBS = Family("gpujob_operator_jobs", "Jobs the operator currently exports series for.")
BUILD_INFO = Family("gpujob_operator_build_info", "Always 1; the version label says which build.")

JOB_FAMILIES: Final = (
    JOB_PROGRESS,
    JOB_STEP,
    JOB_TARGET_STEPS,
    JOB_ETA,
    JOB_SAMPLES_RATE,
    JOB_TOKENS_RATE,
    JOB_LOSS,
    JOB_LAST_STEP,
    JOB_START,
    JOB_VERDICT,
    JOB_PHASE,
    JOB_RESTARTS,
    JOB_METRICS_AVAILABLE,
    JOB_STALLED,
    JOB_GPUS,
    JOB_GPU_UTILIZATION,
    JOB_REPLICAS,
)
HEALTH_FAMILIES: Final = (
    RECONCILES,
    RECONCILE_DURATION,
    SCRAPES,
    SCRAPE_DURATION,
    ERRORS,
    DROPPED_SERIES,
    DROPPED_VALUES,
    DROPPED_BYTES,
    API_ERRORS,
    JOBS,
    BUILD_INFO,
)


def exported_names() -> set[str]:
    """Every series name the operator can export (histograms expanded), for dashboard checks."""
    out: set[str] = set()
    for m in (*JOB_FAMILIES, *HEALTH_FAMILIES):
        if m in (RECONCILE_DURATION, SCRAPE_DURATION):
            out |= {f"{m.name}_bucket", f"{m.name}_sum", f"{m.name}_count"}
        else:
            out.add(m.name)
    return out


# ---- reading a status dict --------------------------------------------------------------


def _num(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    f = float(value)
    return f if math.isfinite(f) else None


def _timestamp(value: Any) -> float | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _condition(status: Mapping[str, Any], type_: str) -> str | None:
    for c in status.get("conditions") or ():
        if isinstance(c, Mapping) and c.get("type") == type_:
            return str(c.get("status"))
    return None


@dataclass(frozen=True)
class JobSample:
    """The numbers of one job's status that become series (None: the series is absent)."""

    progress_ratio: float | None = None
    step: float | None = None
    target_steps: float | None = None
    eta_seconds: float | None = None
    samples_per_second: float | None = None
    tokens_per_second: float | None = None
    loss: float | None = None
    last_step_timestamp: float | None = None
    start_timestamp: float | None = None
    phase: str | None = None
    verdict: str | None = None
    restarts: float = 0.0
    metrics_available: float | None = None
    stalled: float = 0.0
    gpus: float | None = None
    gpu_utilization: float | None = None
    replicas: Mapping[str, float] = field(default_factory=dict)

    @classmethod
    def from_status(cls, status: Mapping[str, Any]) -> JobSample:
        """Read a wire-format (camelCase) status leniently: missing or odd values are absent."""
        progress = status.get("progress") or {}
        bottleneck = status.get("bottleneck") or {}
        gpus = status.get("gpus") or {}
        replicas = status.get("replicas") or {}
        ratio = None
        percent = _num(progress.get("percent"))
        if percent is not None:
            ratio = min(max(percent / 100.0, 0.0), 1.0)
        else:
            step, total = _num(progress.get("step")), _num(progress.get("totalSteps"))
            if step is not None and total:
                ratio = min(max(step / total, 0.0), 1.0)
        phase = status.get("phase")
        verdict = bottleneck.get("verdict") if isinstance(bottleneck, Mapping) else None
        if isinstance(verdict, str) and verdict and verdict not in VERDICTS:
            verdict = VERDICT_OTHER
        available = _condition(status, "MetricsAvailable")
        stalled = _condition(status, "Stalled") == "True" or verdict == "Stalled"
        return cls(
            progress_ratio=ratio,
            step=_num(progress.get("step")),
            target_steps=_num(progress.get("totalSteps")),
            eta_seconds=_num(progress.get("etaSeconds")),
            samples_per_second=_num(progress.get("samplesPerSecond")),
            tokens_per_second=_num(progress.get("tokensPerSecond")),
            loss=_num(progress.get("loss")),
            last_step_timestamp=_timestamp(progress.get("lastStepTime")),
            start_timestamp=_timestamp(status.get("startTime")),
            phase=phase if phase in PHASES else None,
            verdict=verdict if isinstance(verdict, str) and verdict else None,
            restarts=_num(status.get("restarts")) or 0.0,
            metrics_available=None if available is None else float(available == "True"),
            stalled=float(stalled),
            gpus=_num(status.get("totalGPUs", gpus.get("requested"))),
            gpu_utilization=_num(gpus.get("meanUtilizationRatio")),
            replicas={k: v for k in REPLICA_STATES if (v := _num(replicas.get(k))) is not None},
        )


# ---- collectors --------------------------------------------------------------------------


def _gauge(m: Family, labels: Iterable[str]) -> GaugeMetricFamily:
    return GaugeMetricFamily(m.name, m.help, labels=list(labels), unit=m.unit)


class _JobCollector(Collector):
    def __init__(self, owner: JobMetrics) -> None:
        self._owner = owner

    def collect(self) -> Iterator[Metric]:
        jobs = self._owner.snapshot()
        simple = {
            JOB_PROGRESS: "progress_ratio",
            JOB_STEP: "step",
            JOB_TARGET_STEPS: "target_steps",
            JOB_ETA: "eta_seconds",
            JOB_SAMPLES_RATE: "samples_per_second",
            JOB_TOKENS_RATE: "tokens_per_second",
            JOB_LOSS: "loss",
            JOB_LAST_STEP: "last_step_timestamp",
            JOB_START: "start_timestamp",
            JOB_METRICS_AVAILABLE: "metrics_available",
            JOB_STALLED: "stalled",
            JOB_GPUS: "gpus",
            JOB_GPU_UTILIZATION: "gpu_utilization",
        }
        fams: dict[Family, GaugeMetricFamily] = {m: _gauge(m, JOB_LABELS) for m in simple}
        phase = _gauge(JOB_PHASE, (*JOB_LABELS, "phase"))
        verdict = _gauge(JOB_VERDICT, (*JOB_LABELS, "verdict"))
        replicas = _gauge(JOB_REPLICAS, (*JOB_LABELS, "state"))
        restarts = CounterMetricFamily(
            JOB_RESTARTS.name, JOB_RESTARTS.help, labels=list(JOB_LABELS)
        )
        for (ns, name), s in sorted(jobs.items()):
            key = [ns, name]
            for m, attr in simple.items():
                value = getattr(s, attr)
                if value is not None:
                    fams[m].add_metric(key, value)
            if s.phase is not None:
                for p in PHASES:
                    phase.add_metric([*key, p], float(p == s.phase))
            if s.verdict is not None:
                for v in (*VERDICTS, VERDICT_OTHER):
                    if v != VERDICT_OTHER or s.verdict == VERDICT_OTHER:
                        verdict.add_metric([*key, v], float(v == s.verdict))
            for state, value in s.replicas.items():
                replicas.add_metric([*key, state], value)
            restarts.add_metric(key, s.restarts)
        yield from fams.values()
        yield from (phase, verdict, replicas, restarts)


class _Histogram:
    """Cumulative buckets, sum and count; rendered by the health collector."""

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.sum += value
        for i, b in enumerate(self.bounds):
            if value <= b:
                self.counts[i] += 1
                return
        self.counts[-1] += 1

    def buckets(self) -> list[tuple[str, float]]:
        out, running = [], 0
        for b, c in zip([*(repr(float(b)) for b in self.bounds), "+Inf"], self.counts, strict=True):
            running += c
            out.append((b, float(running)))
        return out


class _HealthCollector(Collector):
    def __init__(self, owner: JobMetrics) -> None:
        self._owner = owner

    def collect(self) -> Iterator[Metric]:
        o = self._owner
        with o._lock:
            reconciles = dict(o._reconciles)
            scrapes = dict(o._scrapes)
            errors = dict(o._errors)
            dropped = dict(o._dropped)
            api_errors = dict(o._api_errors)
            rec_h = (o._reconcile_hist.buckets(), o._reconcile_hist.sum)
            scr_h = (o._scrape_hist.buckets(), o._scrape_hist.sum)
            jobs = len(o._jobs)
        for m, counts in ((RECONCILES, reconciles), (SCRAPES, scrapes)):
            fam = CounterMetricFamily(m.name, m.help, labels=["result"])
            for result in ("ok", "error"):
                fam.add_metric([result], counts.get(result, 0.0))
            yield fam
        for m, (buckets, total) in ((RECONCILE_DURATION, rec_h), (SCRAPE_DURATION, scr_h)):
            hist = HistogramMetricFamily(m.name, m.help, unit=m.unit)
            hist.add_metric([], buckets, total)
            yield hist
        err = CounterMetricFamily(ERRORS.name, ERRORS.help, labels=["source", "reason"])
        for (source, reason), value in sorted(errors.items()):
            err.add_metric([source, reason], value)
        yield err
        for m in (DROPPED_SERIES, DROPPED_VALUES, DROPPED_BYTES):
            # CounterMetricFamily appends _total itself; the unit (bytes) is in the name.
            yield CounterMetricFamily(m.name, m.help, value=dropped.get(m.name, 0.0))
        api = CounterMetricFamily(API_ERRORS.name, API_ERRORS.help, labels=["call", "reason"])
        for (call, reason), value in sorted(api_errors.items()):
            api.add_metric([call, reason], value)
        yield api
        yield GaugeMetricFamily(JOBS.name, JOBS.help, value=jobs)
        info = GaugeMetricFamily(BUILD_INFO.name, BUILD_INFO.help, labels=["version"])
        info.add_metric([o.version], 1.0)
        yield info


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("gpujob")
    except Exception:  # running from a source tree that was never installed
        return "unknown"


class JobMetrics:
    """The operator's metrics: thread-safe, cheap to update, rendered only when scraped."""

    def __init__(self, registry: CollectorRegistry | None = None, *, process: bool = True) -> None:
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=False)
        self.version = _version()
        self._lock = threading.Lock()
        self._jobs: dict[tuple[str, str], JobSample] = {}
        self._reconciles: dict[str, float] = {}
        self._scrapes: dict[str, float] = {}
        self._errors: dict[tuple[str, str], float] = {}
        self._dropped: dict[str, float] = {}
        self._api_errors: dict[tuple[str, str], float] = {}
        self._reasons: set[str] = set()
        self._reconcile_hist = _Histogram(RECONCILE_BUCKETS)
        self._scrape_hist = _Histogram(SCRAPE_BUCKETS)
        self._server: Any = None
        self.registry.register(_JobCollector(self))
        self.registry.register(_HealthCollector(self))
        if process:  # process_* (CPU, memory, fds) and python_gc_* for the health dashboard
            ProcessCollector(registry=self.registry)
            GCCollector(registry=self.registry)

    # -- jobs
    def update(self, namespace: str, name: str, status: Mapping[str, Any] | None) -> None:
        """Publish the job's latest status (wire format); call after each status write."""
        sample = JobSample.from_status(status or {})
        with self._lock:
            self._jobs[(namespace, name)] = sample

    def forget(self, namespace: str, name: str) -> None:
        """Drop the job's series (the job was deleted); unknown jobs are fine."""
        with self._lock:
            self._jobs.pop((namespace, name), None)

    def snapshot(self) -> dict[tuple[str, str], JobSample]:
        with self._lock:
            return dict(self._jobs)

    # -- health
    def _reason(self, reason: str | None) -> str:
        text = _REASON_RE.sub("_", reason or "unknown").strip("_")[:64] or "unknown"
        if text not in self._reasons:
            if len(self._reasons) >= MAX_ERROR_REASONS:
                return REASON_OTHER
            self._reasons.add(text)
        return text

    def observe_reconcile(self, seconds: float, error_reason: str | None = None) -> None:
        """Count one reconcile pass and its duration; ``error_reason`` when it failed."""
        with self._lock:
            result = "ok" if error_reason is None else "error"
            self._reconciles[result] = self._reconciles.get(result, 0.0) + 1
            self._reconcile_hist.observe(max(seconds, 0.0))
            if error_reason is not None:
                key = ("reconcile", self._reason(error_reason))
                self._errors[key] = self._errors.get(key, 0.0) + 1

    def observe_scrape(self, seconds: float, ok: bool, reason: str | None = None) -> None:
        """Count one scrape of a rank endpoint; ``reason`` (e.g. ``timeout``) when not ok."""
        with self._lock:
            result = "ok" if ok else "error"
            self._scrapes[result] = self._scrapes.get(result, 0.0) + 1
            self._scrape_hist.observe(max(seconds, 0.0))
            if not ok:
                key = ("scrape", self._reason(reason))
                self._errors[key] = self._errors.get(key, 0.0) + 1

    def observe_dropped(self, series: int, values: int, bytes_: int) -> None:
        """Count what a scrape refused from an endpoint (see guard.py and scrape.py)."""
        if not (series or values or bytes_):
            return
        with self._lock:
            for m, n in (
                (DROPPED_SERIES, series),
                (DROPPED_VALUES, values),
                (DROPPED_BYTES, bytes_),
            ):
                if n:
                    self._dropped[m.name] = self._dropped.get(m.name, 0.0) + n

    def observe_api_error(self, call: str, reason: str) -> None:
        """Count one failed API call: ``call`` (create_pod, patch_status, ...) and the
        classified reason (:mod:`apierrors`); both come from small fixed sets."""
        with self._lock:
            key = (_label(call), _label(reason))
            self._api_errors[key] = self._api_errors.get(key, 0.0) + 1

    # -- HTTP
    def serve(self, port: int = DEFAULT_PORT, addr: str = "0.0.0.0") -> int:
        """Serve /metrics in a daemon thread; returns the bound port (port 0 picks one)."""
        from prometheus_client import start_http_server

        if self._server is None:
            self._server, _ = start_http_server(port, addr=addr, registry=self.registry)
            log.info("operator metrics on http://%s:%d/metrics", addr, self._server.server_port)
        return int(self._server.server_port)

    def stop(self) -> None:
        """Stop serving (tests)."""
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()


def error_reason(exc: BaseException) -> str:
    """A short, bounded reason for an exception: ``api_<status>``, ``timeout``, or its class."""
    status = getattr(exc, "status", None)
    if isinstance(status, int) and not isinstance(status, bool):
        return f"api_{status}"
    if isinstance(exc, TimeoutError):
        return "timeout"
    if isinstance(exc, ConnectionError):
        return "connection"
    return type(exc).__name__


METRICS = JobMetrics()
"""The process-wide instance the operator serves and the reconciler updates."""
