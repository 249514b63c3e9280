"""The operator's own /metrics: a fleet view of every job, and the operator's health.

One Prometheus target (the operator) answers "how far is every job, and what limits it"
without scraping every rank: the job loop hands each job's freshly computed status to
:meth:`JobMetrics.update` (read into a :class:`~gpujob_operator.observability.jobsample.JobSample`),
and a collector renders the latest values at scrape time. A job's series vanish with
:meth:`JobMetrics.forget` when the job is deleted. The families' names, help texts and labels
are spelled once, in :mod:`~gpujob_operator.observability.opfamilies`.

Everything lives in a private :class:`CollectorRegistry` and is rendered by custom
collectors, so no ``_created`` series are emitted (design, pitfalls) and tests can make a
fresh :class:`JobMetrics` each time.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, Final

from prometheus_client import CollectorRegistry, GCCollector, ProcessCollector
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from gpujob_operator.observability.gcpause import GC_PAUSES, GENERATIONS
from gpujob_operator.observability.histogram import Histogram as _Histogram
from gpujob_operator.observability.jobsample import JobSample
from gpujob_operator.observability.looplag import COUNTED_LAG, LAG_CAUSES
from gpujob_operator.observability.opfamilies import (
    API_ERRORS,
    BUILD_INFO,
    DROPPED_BYTES,
    DROPPED_SERIES,
    DROPPED_VALUES,
    ERRORS,
    FORECAST_DURATION,
    FORECAST_ERROR,
    GC_PAUSE,
    GHOST_POD_PROOFS,
    GHOST_PODS,
    HANG_CAPTURE_RESULTS,
    HANG_CAPTURES,
    JOB_ETA,
    JOB_GOODPUT,
    JOB_GPU_UTILIZATION,
    JOB_GPUS,
    JOB_LABELS,
    JOB_LAST_STEP,
    JOB_LOSS,
    JOB_LOST_GPU_SECONDS,
    JOB_METRICS_AVAILABLE,
    JOB_MFU,
    JOB_PHASE,
    JOB_PRODUCTIVE_GPU_SECONDS,
    JOB_PROGRESS,
    JOB_REPLICAS,
    JOB_RESTARTS,
    JOB_SAMPLES_RATE,
    JOB_STALLED,
    JOB_START,
    JOB_START_FORECAST,
    JOB_START_FORECAST_ERROR,
    JOB_STEP,
    JOB_STEP_P50,
    JOB_STEP_P95,
    JOB_TARGET_STEPS,
    JOB_TOKENS_RATE,
    JOB_UNOBSERVED_GPU_SECONDS,
    JOB_VERDICT,
    JOBS,
    LOOP_LAG,
    LOOP_LAGS,
    PHASES,
    RECONCILE_DURATION,
    RECONCILES,
    SCRAPE_DURATION,
    SCRAPES,
    VERDICT_OTHER,
    VERDICTS,
    WORKLOAD_READ_SOURCES,
    WORKLOAD_READS,
    Family,
)

log = logging.getLogger("gpujob.opmetrics")

DEFAULT_PORT: Final = 8081
ENV_PORT: Final = "GPUJOB_OPERATOR_METRICS_PORT"
ENV_ADDR: Final = "GPUJOB_OPERATOR_METRICS_ADDR"

RECONCILE_BUCKETS: Final = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
SCRAPE_BUCKETS: Final = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
FORECAST_ERROR_BUCKETS: Final = (10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0, 7200.0)
FORECAST_BUCKETS: Final = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
LOOP_LAG_BUCKETS: Final = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
MAX_ERROR_REASONS: Final = 32
"""Distinct error reasons kept; later new ones count as ``other`` (bounded cardinality)."""
REASON_OTHER: Final = "other"
_REASON_RE = re.compile(r"[^A-Za-z0-9_]+")


def _label(text: str) -> str:
    """A label value from a fixed vocabulary (no cardinality cap needed), made safe."""
    return _REASON_RE.sub("_", text).strip("_")[:64] or "unknown"


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
            JOB_MFU: "mfu",
            JOB_STEP_P50: "step_p50_seconds",
            JOB_STEP_P95: "step_p95_seconds",
            JOB_LAST_STEP: "last_step_timestamp",
            JOB_START: "start_timestamp",
            JOB_METRICS_AVAILABLE: "metrics_available",
            JOB_STALLED: "stalled",
            JOB_GPUS: "gpus",
            JOB_GPU_UTILIZATION: "gpu_utilization",
            JOB_START_FORECAST_ERROR: "start_forecast_error",
            JOB_GOODPUT: "goodput_ratio",
            JOB_PRODUCTIVE_GPU_SECONDS: "productive_gpu_seconds",
            JOB_UNOBSERVED_GPU_SECONDS: "unobserved_gpu_seconds",
        }
        fams: dict[Family, GaugeMetricFamily] = {m: _gauge(m, JOB_LABELS) for m in simple}
        phase = _gauge(JOB_PHASE, (*JOB_LABELS, "phase"))
        verdict = _gauge(JOB_VERDICT, (*JOB_LABELS, "verdict"))
        replicas = _gauge(JOB_REPLICAS, (*JOB_LABELS, "state"))
        forecast = _gauge(JOB_START_FORECAST, (*JOB_LABELS, "confidence"))
        lost = _gauge(JOB_LOST_GPU_SECONDS, (*JOB_LABELS, "cause"))
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
            if s.start_forecast is not None and s.start_forecast_confidence is not None:
                forecast.add_metric([*key, s.start_forecast_confidence], s.start_forecast)
            for cause, value in s.lost_gpu_seconds.items():
                lost.add_metric([*key, cause], value)
            restarts.add_metric(key, s.restarts)
        yield from fams.values()
        yield from (phase, verdict, replicas, restarts, forecast, lost)


class _HealthCollector(Collector):
    def __init__(self, owner: JobMetrics) -> None:
        self._owner = owner

    def collect(self) -> Iterator[Metric]:
        o = self._owner
        with o._lock:
            reconciles = dict(o._reconciles)
            scrapes = dict(o._scrapes)
            hangs = dict(o._hang_captures)
            ghosts = dict(o._ghost_pods)
            workload_reads = dict(o._workload_reads)
            lags = dict(o._loop_lags)
            errors = dict(o._errors)
            dropped = dict(o._dropped)
            api_errors = dict(o._api_errors)
            hists = [
                (m, h.buckets(), h.sum)
                for m, h in (
                    (RECONCILE_DURATION, o._reconcile_hist),
                    (SCRAPE_DURATION, o._scrape_hist),
                    (FORECAST_ERROR, o._forecast_error_hist),
                    (FORECAST_DURATION, o._forecast_hist),
                    (LOOP_LAG, o._loop_lag_hist),
                )
            ]
            jobs = len(o._jobs)
        for m, counts in ((RECONCILES, reconciles), (SCRAPES, scrapes)):
            fam = CounterMetricFamily(m.name, m.help, labels=["result"])
            for result in ("ok", "error"):
                fam.add_metric([result], counts.get(result, 0.0))
            yield fam
        fam = CounterMetricFamily(HANG_CAPTURES.name, HANG_CAPTURES.help, labels=["result"])
        for result in HANG_CAPTURE_RESULTS:
            fam.add_metric([result], hangs.get(result, 0.0))
        yield fam
        fam = CounterMetricFamily(GHOST_PODS.name, GHOST_PODS.help, labels=["proof"])
        for proof in GHOST_POD_PROOFS:
            fam.add_metric([proof], ghosts.get(proof, 0.0))
        yield fam
        fam = CounterMetricFamily(WORKLOAD_READS.name, WORKLOAD_READS.help, labels=["source"])
        for source in WORKLOAD_READ_SOURCES:
            fam.add_metric([source], workload_reads.get(source, 0.0))
        yield fam
        fam = CounterMetricFamily(LOOP_LAGS.name, LOOP_LAGS.help, labels=["cause"])
        for cause in LAG_CAUSES:
            fam.add_metric([cause], lags.get(cause, 0.0))
        yield fam
        for m, buckets, total in hists:
            hist = HistogramMetricFamily(m.name, m.help, unit=m.unit)
            hist.add_metric([], buckets, total)
            yield hist
        if o.process:
            gc_hist = HistogramMetricFamily(
                GC_PAUSE.name, GC_PAUSE.help, labels=["generation"], unit=GC_PAUSE.unit
            )
            for generation in GENERATIONS:
                gc_hist.add_metric(
                    [str(generation)],
                    GC_PAUSES.buckets(generation),
                    GC_PAUSES.sums[generation],
                )
            yield gc_hist
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
        self._hang_captures: dict[str, float] = {}
        self._ghost_pods: dict[str, float] = {}
        self._workload_reads: dict[str, float] = {}
        self._loop_lags: dict[str, float] = {}
        self._scrapes: dict[str, float] = {}
        self._errors: dict[tuple[str, str], float] = {}
        self._dropped: dict[str, float] = {}
        self._api_errors: dict[tuple[str, str], float] = {}
        self._reasons: set[str] = set()
        self._reconcile_hist = _Histogram(RECONCILE_BUCKETS)
        self._scrape_hist = _Histogram(SCRAPE_BUCKETS)
        self._forecast_error_hist = _Histogram(FORECAST_ERROR_BUCKETS)
        self._forecast_hist = _Histogram(FORECAST_BUCKETS)
        self._loop_lag_hist = _Histogram(LOOP_LAG_BUCKETS)
        self.loop_lag_max = 0.0
        """The longest event-loop lag seen since start (the bench reads it)."""
        self._server: Any = None
        self.process = process
        """Whether the process's own families (CPU, memory, collector pauses) are rendered."""
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

    def observe_forecast(self, seconds: float) -> None:
        """One forecast pass over the fleet took ``seconds``."""
        with self._lock:
            self._forecast_hist.observe(max(seconds, 0.0))

    def observe_loop_lag(self, seconds: float, cause: str | None = None) -> None:
        """The event loop woke a timer ``seconds`` late; ``cause`` (`looplag`) what held it,
        counted when the lag is over `looplag.COUNTED_LAG`."""
        with self._lock:
            self._loop_lag_hist.observe(max(seconds, 0.0))
            self.loop_lag_max = max(self.loop_lag_max, seconds)
            if cause is not None and seconds > COUNTED_LAG:
                self._loop_lags[cause] = self._loop_lags.get(cause, 0.0) + 1

    def observe_forecast_error(self, seconds: float) -> None:
        """A job started ``seconds`` after (negative: before) its last forecast."""
        with self._lock:
            self._forecast_error_hist.observe(abs(seconds))

    def observe_hang_capture(self, result: str) -> None:
        """One stall's evidence taken: ``complete``, ``partial`` or ``unrecorded``."""
        with self._lock:
            self._hang_captures[result] = self._hang_captures.get(result, 0.0) + 1

    def observe_ghost_pods(self, proof: str, count: int) -> None:
        """Pods the index held that the API server proved gone: ``delete_404`` or ``listing``."""
        with self._lock:
            self._ghost_pods[proof] = self._ghost_pods.get(proof, 0.0) + count

    def observe_workload_read(self, source: str) -> None:
        """A pass read its Kueue Workload: ``watch`` (the cache) or ``api`` (a GET)."""
        with self._lock:
            self._workload_reads[source] = self._workload_reads.get(source, 0.0) + 1

    def observe_dropped(self, series: int, values: int, bytes_: int) -> None:
        """Count what a scrape refused from an endpoint (see monitoring/scrape/: guard, scraper)."""
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
        classified reason (:mod:`~gpujob_operator.lifecycle.apiserver.refusals`); both come
        from small fixed sets."""
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
"""The process-wide instance the operator serves and the job loops update."""
