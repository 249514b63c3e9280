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


NOT_SUPPORTED, TIMEOUT = 3, 10


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


class FakeNvml:
    """Just enough of pynvml for the collector; counts calls to check the scrape cache."""

    NVMLError = NVMLError
    NVML_TEMPERATURE_GPU = 0
    NVML_CLOCK_SM = 1
    NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
    NVML_VOLATILE_ECC = 0
    nvmlEventTypeXidCriticalError = 8

    def __init__(self, gpus: list[FakeGpu]) -> None:
        self.gpus = gpus
        self.calls = 0
        self.inits = 0

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


UUID0 = "GPU-11111111-2222-3333-4444-555555555555"
UUID1 = "GPU-66666666-7777-8888-9999-000000000000"
