"""A fake of the part of pynvml the GPU collector calls, shared by unit and Prometheus tests.

Injected the way client_python's process collector takes a fake /proc: there is no GPU here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any


class NVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(f"NVML error {value}")
        self.value = value


NOT_SUPPORTED, TIMEOUT, UNKNOWN = 3, 10, 999


@dataclass
class FakeGpu:
    uuid: str
    util: int = 87
    used: int = 30 * 2**30
    total: int = 80 * 2**30
    power_mw: int = 312_500
    limit_mw: int = 400_000
    temp: int = 71
    sm_mhz: int = 1410
    reasons: int = 0
    ecc: int | None = 0
    xids: list[int] = field(default_factory=list)
    xid_supported: bool = True
    pcie_rx_kbps: int = 2_000_000  # NVML's unit: KB/s over its 20 ms window
    pcie_tx_kbps: int = 250_000
    pcie_supported: bool = True
    gpm_supported: bool = True  # Hopper or later
    sm_util: float = 62.5  # GPM percents (0-100) over the interval between two samples
    tensor_util: float = 37.5


class FakeGpmSample:
    """An opaque GPM sample buffer: filled by nvmlGpmSampleGet, then holds that GPU and time."""

    def __init__(self) -> None:
        self.gpu: FakeGpu | None = None
        self.seq = 0
        self.freed = False


class FakeGpmMetricsGet:
    """pynvml's c_nvmlGpmMetricsGet_t, with room for a few metrics."""

    def __init__(self) -> None:
        self.version = 0
        self.numMetrics = 0
        self.sample1: FakeGpmSample | None = None
        self.sample2: FakeGpmSample | None = None
        self.metrics = [SimpleNamespace(metricId=0, nvmlReturn=0, value=0.0) for _ in range(8)]


class FakeNvml:
    """Just enough of pynvml for the collector; counts calls to check the scrape cache."""

    NVMLError = NVMLError
    NVML_TEMPERATURE_GPU = 0
    NVML_CLOCK_SM = 1
    NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
    NVML_VOLATILE_ECC = 0
    nvmlEventTypeXidCriticalError = 8
    NVML_PCIE_UTIL_TX_BYTES = 0
    NVML_PCIE_UTIL_RX_BYTES = 1
    NVML_GPM_METRICS_GET_VERSION = 1
    NVML_GPM_METRIC_SM_UTIL = 2
    NVML_GPM_METRIC_SM_OCCUPANCY = 3
    NVML_GPM_METRIC_ANY_TENSOR_UTIL = 5
    c_nvmlGpmMetricsGet_t = FakeGpmMetricsGet

    def __init__(self, gpus: list[FakeGpu]) -> None:
        self.gpus = gpus
        self.calls = 0
        self.inits = 0
        self.pcie_calls = 0
        self.samples: list[FakeGpmSample] = []  # every sample allocated
        self.sample_gets = 0

    def nvmlInit(self) -> None:
        self.inits += 1

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> FakeGpu:
        return self.gpus[i]

    def nvmlDeviceGetUUID(self, h: FakeGpu) -> bytes:
        return h.uuid.encode()  # old pynvml returns bytes

    def nvmlEventSetCreate(self) -> list[Any]:
        return []

    def nvmlDeviceRegisterEvents(self, h: FakeGpu, types: int, es: list[Any]) -> None:
        if not h.xid_supported:
            raise NVMLError(NOT_SUPPORTED)
        es.append(h)

    def nvmlEventSetWait_v2(self, es: list[Any], timeout_ms: int) -> Any:
        assert timeout_ms == 0, "a scrape must never wait for events"
        gpu = es[0]
        if not gpu.xids:
            raise NVMLError(TIMEOUT)
        return SimpleNamespace(
            device=gpu, eventType=self.nvmlEventTypeXidCriticalError, eventData=gpu.xids.pop()
        )

    def nvmlDeviceGetUtilizationRates(self, h: FakeGpu) -> Any:
        self.calls += 1
        return SimpleNamespace(gpu=h.util, memory=10)

    def nvmlDeviceGetMemoryInfo(self, h: FakeGpu) -> Any:
        return SimpleNamespace(used=h.used, total=h.total, free=h.total - h.used)

    def nvmlDeviceGetPowerUsage(self, h: FakeGpu) -> int:
        return h.power_mw

    def nvmlDeviceGetEnforcedPowerLimit(self, h: FakeGpu) -> int:
        return h.limit_mw

    def nvmlDeviceGetTemperature(self, h: FakeGpu, sensor: int) -> int:
        assert sensor == self.NVML_TEMPERATURE_GPU
        return h.temp

    def nvmlDeviceGetClockInfo(self, h: FakeGpu, clock: int) -> int:
        assert clock == self.NVML_CLOCK_SM
        return h.sm_mhz

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: FakeGpu) -> int:
        return h.reasons

    def nvmlDeviceGetTotalEccErrors(self, h: FakeGpu, kind: int, counter: int) -> int:
        assert (kind, counter) == (1, 0)
        if h.ecc is None:
            raise NVMLError(NOT_SUPPORTED)
        return h.ecc

    def nvmlDeviceGetPcieThroughput(self, h: FakeGpu, counter: int) -> int:
        self.pcie_calls += 1
        if not h.pcie_supported:
            raise NVMLError(NOT_SUPPORTED)
        if counter == self.NVML_PCIE_UTIL_RX_BYTES:
            return h.pcie_rx_kbps
        assert counter == self.NVML_PCIE_UTIL_TX_BYTES, counter
        return h.pcie_tx_kbps

    def nvmlGpmQueryDeviceSupport(self, h: FakeGpu) -> Any:
        return SimpleNamespace(version=1, isSupportedDevice=int(h.gpm_supported))

    def nvmlGpmSampleAlloc(self) -> FakeGpmSample:
        sample = FakeGpmSample()
        self.samples.append(sample)
        return sample

    def nvmlGpmSampleFree(self, sample: FakeGpmSample) -> None:
        assert not sample.freed, "GPM sample freed twice"
        sample.freed = True

    def nvmlGpmSampleGet(self, h: FakeGpu, sample: FakeGpmSample) -> FakeGpmSample:
        assert not sample.freed, "GPM sample used after free"
        if not h.gpm_supported:
            raise NVMLError(NOT_SUPPORTED)
        self.sample_gets += 1
        sample.gpu, sample.seq = h, self.sample_gets
        return sample

    def nvmlGpmMetricsGet(self, get: FakeGpmMetricsGet) -> FakeGpmMetricsGet:
        """Fills the requested metrics from sample2's GPU, as NVML does between two samples."""
        one, two = get.sample1, get.sample2
        if get.version != self.NVML_GPM_METRICS_GET_VERSION:
            raise NVMLError(25)  # NVML_ERROR_ARGUMENT_VERSION_MISMATCH
        if one is None or two is None or one is two or one.gpu is None or one.gpu is not two.gpu:
            raise NVMLError(2)  # NVML_ERROR_INVALID_ARGUMENT
        if one.freed or two.freed or one.seq >= two.seq:
            raise NVMLError(2)  # sample1 must be the older of two live samples
        gpu = two.gpu
        # NVML's ids (the class constants), whatever a test sets on an instance
        values = {
            FakeNvml.NVML_GPM_METRIC_SM_UTIL: gpu.sm_util,
            FakeNvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL: gpu.tensor_util,
        }
        for metric in get.metrics[: get.numMetrics]:
            if metric.metricId in values:
                metric.value, metric.nvmlReturn = values[metric.metricId], 0
            else:
                metric.value, metric.nvmlReturn = 0.0, NOT_SUPPORTED
        return get


_PROFILING_NAMES = frozenset(
    name
    for name in vars(FakeNvml)
    if name.startswith(("nvmlGpm", "NVML_GPM_", "NVML_PCIE_", "c_nvmlGpm"))
    or name == "nvmlDeviceGetPcieThroughput"
)


class OldFakeNvml(FakeNvml):
    """A pynvml from before the PCIe throughput and GPM calls: those names are missing."""

    def __getattribute__(self, name: str) -> Any:
        if name in _PROFILING_NAMES:
            raise AttributeError(name)
        return super().__getattribute__(name)


UUID0 = "GPU-11111111-2222-3333-4444-555555555555"
UUID1 = "GPU-66666666-7777-8888-9999-000000000000"
