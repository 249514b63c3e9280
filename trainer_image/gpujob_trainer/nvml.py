"""GPU telemetry for all GPUs of the node through NVML (the `pynvml` module of nvidia-ml-py).

Read at scrape time, at most once per `min_interval` (the last reading is served in between),
so a busy scraper cannot make the exporter hammer the driver. NVML is injectable, as
client_python's process collector takes a proc root: tests pass a fake module. Without NVML
or GPUs the collector exports only `gpujob_gpu_telemetry_available 0` with the reason, logs
that reason once, and never raises.
"""

from __future__ import annotations

import importlib
import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from gpujob_trainer import contract
from gpujob_trainer.families import family

log = logging.getLogger("gpujob_trainer")

_MAX_EVENTS_PER_READ = 256


@dataclass
class _Device:
    index: int
    handle: Any
    uuid: str
    events: Any = None  # NVML event set registered for critical XIDs, when supported
    xid_errors: int = 0


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
        for device in self._devices:
            self._read_device(device, fams)
        return [available, *(f for f in fams.values() if f.samples)]

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
