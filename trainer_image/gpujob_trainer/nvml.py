"""GPU telemetry for all GPUs of the node through NVML (the `pynvml` module of nvidia-ml-py).

Read at scrape time, at most once per `min_interval` (the last reading is served in between),
so a busy scraper cannot make the exporter hammer the driver. NVML is injectable, as
client_python's process collector takes a proc root: tests pass a fake module. Without NVML
or GPUs the collector exports only `gpujob_gpu_telemetry_available 0` with the reason, logs
that reason once, and never raises.

Two optional counter groups ride along when NVML works: PCIe throughput (`pcie`) and the GPU
Performance Monitoring counters of Hopper and later (`gpm`: SM and tensor pipe activity). Each
group is all or nothing per node: `gpujob_gpu_profiling_available{counter=...}` is 1 with
reason "ok" and the group's series exist for every GPU, or it is 0 with the reason and the
group exports no series on this node.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from gpujob_trainer import contract
from gpujob_trainer.families import family

log = logging.getLogger("gpujob_trainer")

_MAX_EVENTS_PER_READ = 256

# nvmlReturn_t values (NVML's C ABI; pynvml's NVMLError carries them in `.value`)
_NVML_ERROR_NOT_SUPPORTED = 3
_NVML_ERROR_FUNCTION_NOT_FOUND = 13  # pynvml has the call, the driver's libnvidia-ml lacks it

_PCIE_NAMES = ("nvmlDeviceGetPcieThroughput", "NVML_PCIE_UTIL_RX_BYTES", "NVML_PCIE_UTIL_TX_BYTES")
_GPM_NAMES = (
    "nvmlGpmQueryDeviceSupport",
    "nvmlGpmSampleAlloc",
    "nvmlGpmSampleGet",
    "nvmlGpmSampleFree",
    "nvmlGpmMetricsGet",
    "c_nvmlGpmMetricsGet_t",
    "NVML_GPM_METRICS_GET_VERSION",
    "NVML_GPM_METRIC_SM_UTIL",
    "NVML_GPM_METRIC_ANY_TENSOR_UTIL",
)
# GPM metric (pynvml constant name) -> exported ratio; NVML reports percent (0-100)
_GPM_METRICS = (
    ("NVML_GPM_METRIC_SM_UTIL", contract.GPU_SM_ACTIVE),  # 2: share of SMs busy
    ("NVML_GPM_METRIC_ANY_TENSOR_UTIL", contract.GPU_TENSOR_ACTIVE),  # 5: any tensor pipe
)
_REASON_ORDER = (contract.COUNTER_NVML_TOO_OLD, contract.COUNTER_NOT_SUPPORTED)


class _Unavailable(Exception):
    """A counter group cannot be read on a device; `permanent` ones are not tried again."""

    def __init__(self, reason: str, why: str, *, permanent: bool = True) -> None:
        super().__init__(why)
        self.reason = reason
        self.permanent = permanent


@dataclass
class _Device:
    index: int
    handle: Any
    uuid: str
    events: Any = None  # NVML event set registered for critical XIDs, when supported
    xid_errors: int = 0
    off: dict[str, str] = field(default_factory=dict)  # counter group -> reason, for good
    gpm_checked: bool = False  # nvmlGpmQueryDeviceSupport said yes
    gpm_prev: Any = None  # the GPM sample of the last read: the start of the next interval
    gpm_spare: Any = None  # a second sample buffer, filled by the next read


def _load_pynvml() -> Any:
    return importlib.import_module("pynvml")


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class NvmlCollector(Collector):
    """Per-GPU gauges and counters of the node, labelled by NVML index and UUID."""

    def __init__(
        self,
        *,
        node_rank: int = 0,
        nvml: Any = None,
        min_interval: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._node_rank = str(node_rank)
        self._nvml = nvml
        self._min_interval = min_interval
        self._clock = clock
        self._lock = threading.Lock()
        self._started = False
        self._reason = contract.TELEMETRY_OK
        self._devices: list[_Device] = []
        self._cache: list[Metric] = []
        self._cache_time: float | None = None
        self._logged: set[tuple[str, str]] = set()

    @property
    def reason(self) -> str:
        """Why telemetry is unavailable (`contract.TELEMETRY_*`), or "ok"."""
        return self._reason

    def _start(self) -> None:
        self._started = True
        try:
            nvml = self._nvml if self._nvml is not None else _load_pynvml()
        except Exception as exc:  # ImportError, or a broken install
            self._give_up(contract.TELEMETRY_NVML_MISSING, f"cannot import pynvml: {exc}")
            return
        self._nvml = nvml
        try:
            nvml.nvmlInit()
            count = int(nvml.nvmlDeviceGetCount())
        except Exception as exc:  # no driver, no library, no permission
            self._give_up(contract.TELEMETRY_NVML_INIT_FAILED, f"NVML init failed: {exc}")
            return
        for index in range(count):
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                device = _Device(index, handle, _text(nvml.nvmlDeviceGetUUID(handle)))
            except Exception as exc:
                log.warning("gpujob: skipping GPU %d: %s", index, exc)
                continue
            try:
                events = nvml.nvmlEventSetCreate()
                nvml.nvmlDeviceRegisterEvents(handle, nvml.nvmlEventTypeXidCriticalError, events)
                device.events = events
            except Exception as exc:
                log.info("gpujob: no XID events for GPU %d: %s", index, exc)
            self._devices.append(device)
        if not self._devices:
            self._give_up(contract.TELEMETRY_NO_DEVICES, "NVML sees no GPUs")

    def _give_up(self, reason: str, why: str) -> None:
        self._reason = reason
        log.warning("gpujob: GPU telemetry unavailable (%s): %s", reason, why)

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            now = self._clock()
            if self._cache_time is None or now - self._cache_time >= self._min_interval:
                if not self._started:
                    self._start()
                self._cache = self._read()
                self._cache_time = now
            cached = list(self._cache)
        yield from cached

    def _read(self) -> list[Metric]:
        available = family(contract.GPU_TELEMETRY_AVAILABLE)
        ok = self._reason == contract.TELEMETRY_OK
        available.add_metric([self._node_rank, self._reason], 1.0 if ok else 0.0)  # type: ignore[attr-defined]
        if not ok:
            return [available]
        fams = {spec.name: family(spec) for spec in contract.GPU_METRICS}
        groups: dict[str, Callable[[_Device], list[tuple[contract.MetricSpec, float]]]] = {
            contract.COUNTER_PCIE: self._read_pcie,
            contract.COUNTER_GPM: self._read_gpm,
        }
        reasons: dict[str, set[str]] = {group: set() for group in groups}
        values: dict[str, list[tuple[list[str], contract.MetricSpec, float]]] = {
            group: [] for group in groups
        }
        for device in self._devices:
            self._read_device(device, fams)
            labels = [self._node_rank, str(device.index), device.uuid]
            for group, read in groups.items():
                reason, got = self._read_group(device, group, read)
                reasons[group].add(reason)
                values[group].extend((labels, spec, value) for spec, value in got)
        profiling = family(contract.GPU_PROFILING_AVAILABLE)
        for group in contract.COUNTERS:
            bad = [r for r in _REASON_ORDER if r in reasons[group]]
            reason = bad[0] if bad else contract.COUNTER_OK
            profiling.add_metric([self._node_rank, group, reason], 0.0 if bad else 1.0)  # type: ignore[attr-defined]
            if bad:  # all or nothing: no partial group on a node
                continue
            for labels, spec, value in values[group]:
                fams[spec.name].add_metric(labels, value)  # type: ignore[attr-defined]
        return [available, profiling, *(f for f in fams.values() if f.samples)]

    def _read_group(
        self,
        device: _Device,
        group: str,
        read: Callable[[_Device], list[tuple[contract.MetricSpec, float]]],
    ) -> tuple[str, list[tuple[contract.MetricSpec, float]]]:
        """One counter group of one device: ("ok", values) or (reason, []); never raises."""
        if group in device.off:
            return device.off[group], []
        try:
            return contract.COUNTER_OK, read(device)
        except _Unavailable as exc:
            failure = exc
        except Exception as exc:  # an NVML error, or anything else: the group is off this read
            failure = _classify(exc)
        if failure.permanent:
            device.off[group] = failure.reason
            if group == contract.COUNTER_GPM:
                self._free_gpm(device)
        key = (group, failure.reason)
        if key not in self._logged:  # once per reason, not on every scrape
            self._logged.add(key)
            log.info(
                "gpujob: GPU %s counters unavailable (%s) on GPU %d: %s",
                group,
                failure.reason,
                device.index,
                failure,
            )
        return failure.reason, []

    def _require(self, names: tuple[str, ...]) -> None:
        missing = [name for name in names if getattr(self._nvml, name, None) is None]
        if missing:
            raise _Unavailable(contract.COUNTER_NVML_TOO_OLD, f"pynvml lacks {', '.join(missing)}")

    def _read_pcie(self, device: _Device) -> list[tuple[contract.MetricSpec, float]]:
        """PCIe throughput, NVML KB/s -> bytes/s.

        Each nvmlDeviceGetPcieThroughput call counts bytes over a 20 ms window, so it blocks
        about 20 ms in the driver (two calls per GPU). Like every read here it runs at scrape
        time at most once per `min_interval`; the cache serves the scrapes in between.
        """
        self._require(_PCIE_NAMES)
        nvml = self._nvml
        h = device.handle
        rx = nvml.nvmlDeviceGetPcieThroughput(h, nvml.NVML_PCIE_UTIL_RX_BYTES)
        tx = nvml.nvmlDeviceGetPcieThroughput(h, nvml.NVML_PCIE_UTIL_TX_BYTES)
        return [
            (contract.GPU_PCIE_RX, float(rx) * 1024.0),
            (contract.GPU_PCIE_TX, float(tx) * 1024.0),
        ]

    def _read_gpm(self, device: _Device) -> list[tuple[contract.MetricSpec, float]]:
        """SM and tensor activity between the last read's GPM sample and a new one.

        GPM metrics need two samples: the first read only takes one and exports nothing; each
        later read covers the time since the read before. Two sample buffers per device take
        turns, so no sample is allocated per scrape.
        """
        self._require(_GPM_NAMES)
        nvml = self._nvml
        h = device.handle
        if not device.gpm_checked:
            if not int(nvml.nvmlGpmQueryDeviceSupport(h).isSupportedDevice):
                raise _Unavailable(contract.COUNTER_NOT_SUPPORTED, "the device has no GPM")
            device.gpm_checked = True
        if device.gpm_spare is None:
            device.gpm_spare = nvml.nvmlGpmSampleAlloc()
        nvml.nvmlGpmSampleGet(h, device.gpm_spare)
        # the new sample starts the next interval; the old buffer (None on the first read,
        # then allocated by the next one) is refilled next time
        previous = device.gpm_prev
        device.gpm_prev, device.gpm_spare = device.gpm_spare, previous
        if previous is None:
            return []
        query = nvml.c_nvmlGpmMetricsGet_t()
        query.version = nvml.NVML_GPM_METRICS_GET_VERSION
        query.numMetrics = len(_GPM_METRICS)
        query.sample1 = previous
        query.sample2 = device.gpm_prev
        for i, (name, _) in enumerate(_GPM_METRICS):
            query.metrics[i].metricId = getattr(nvml, name)
        result = nvml.nvmlGpmMetricsGet(query)
        result = query if result is None else result
        out: list[tuple[contract.MetricSpec, float]] = []
        for i, (name, spec) in enumerate(_GPM_METRICS):
            metric = result.metrics[i]
            status = int(getattr(metric, "nvmlReturn", 0))
            if status != 0:  # per-metric status: the call as a whole succeeded
                raise _classify(_NvmlStatus(status, f"{name}: NVML error {status}"))
            out.append((spec, float(metric.value) / 100.0))
        return out

    def _free_gpm(self, device: _Device) -> None:
        for sample in (device.gpm_prev, device.gpm_spare):
            if sample is None:
                continue
            with contextlib.suppress(Exception):  # nothing more to do with it
                self._nvml.nvmlGpmSampleFree(sample)
        device.gpm_prev = device.gpm_spare = None

    def _read_device(self, device: _Device, fams: dict[str, Metric]) -> None:
        nvml = self._nvml
        h = device.handle
        labels = [self._node_rank, str(device.index), device.uuid]

        def put(
            spec: contract.MetricSpec, read: Callable[[], float], extra: tuple[str, ...] = ()
        ) -> None:
            try:
                value = float(read())
            except Exception:  # NotSupported on this GPU, or a transient NVML error
                return
            fams[spec.name].add_metric([*labels, *extra], value)  # type: ignore[attr-defined]

        put(contract.GPU_UTILIZATION, lambda: nvml.nvmlDeviceGetUtilizationRates(h).gpu / 100.0)
        try:
            memory = nvml.nvmlDeviceGetMemoryInfo(h)
        except Exception:
            memory = None
        if memory is not None:
            put(contract.GPU_MEMORY_USED, lambda: memory.used)
            put(contract.GPU_MEMORY_TOTAL, lambda: memory.total)
        put(contract.GPU_POWER, lambda: nvml.nvmlDeviceGetPowerUsage(h) / 1000.0)
        put(contract.GPU_POWER_LIMIT, lambda: nvml.nvmlDeviceGetEnforcedPowerLimit(h) / 1000.0)
        put(
            contract.GPU_TEMPERATURE,
            lambda: nvml.nvmlDeviceGetTemperature(h, nvml.NVML_TEMPERATURE_GPU),
        )
        put(contract.GPU_SM_CLOCK, lambda: nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_SM) * 1e6)
        reasons = self._clock_event_reasons(h)
        if reasons is not None:
            for name, bit in contract.CLOCK_EVENT_REASONS.items():
                active = 1.0 if reasons & bit else 0.0
                put(contract.GPU_CLOCK_EVENT, lambda active=active: active, (name,))  # type: ignore[misc]
        if device.events is not None:
            device.xid_errors += self._drain_xids(device.events)
            put(contract.GPU_XID_ERRORS, lambda: device.xid_errors)
        put(
            contract.GPU_ECC_UNCORRECTED,
            lambda: nvml.nvmlDeviceGetTotalEccErrors(
                h, nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nvml.NVML_VOLATILE_ECC
            ),
        )

    def _clock_event_reasons(self, handle: Any) -> int | None:
        nvml = self._nvml
        read = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or getattr(
            nvml, "nvmlDeviceGetCurrentClocksThrottleReasons", None
        )
        if read is None:
            return None
        try:
            return int(read(handle))
        except Exception:
            return None

    def _drain_xids(self, events: Any) -> int:
        """Count critical XID events queued since the last read, without waiting."""
        nvml = self._nvml
        seen = 0
        for _ in range(_MAX_EVENTS_PER_READ):
            try:
                data = nvml.nvmlEventSetWait_v2(events, 0)
            except Exception:  # NVML_ERROR_TIMEOUT: nothing queued
                break
            if int(getattr(data, "eventType", 0)) & int(nvml.nvmlEventTypeXidCriticalError):
                seen += 1
        return seen


class _NvmlStatus(Exception):
    """An NVML return code reported inside a result struct rather than raised by pynvml."""

    def __init__(self, value: int, why: str) -> None:
        super().__init__(why)
        self.value = value


def _classify(exc: Exception) -> _Unavailable:
    """Why an NVML call failed, as a counter reason; only "not supported" answers are final."""
    value = getattr(exc, "value", None)
    if value == _NVML_ERROR_FUNCTION_NOT_FOUND:
        return _Unavailable(contract.COUNTER_NVML_TOO_OLD, str(exc))
    if value == _NVML_ERROR_NOT_SUPPORTED:
        return _Unavailable(contract.COUNTER_NOT_SUPPORTED, str(exc))
    # a transient or unexpected error: off for this read, tried again on the next one
    return _Unavailable(contract.COUNTER_NOT_SUPPORTED, str(exc) or repr(exc), permanent=False)
