"""The NVML GPU collector (fake NVML, and none at all) and the CUDA allocator collector."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gpujob_trainer import contract
from gpujob_trainer.cuda_memory import CudaMemoryCollector
from gpujob_trainer.env import RankInfo
from gpujob_trainer.nvml import NvmlCollector
from tests.support.fake_nvml import (  # noqa: F401
    NOT_SUPPORTED,
    TIMEOUT,
    UUID0,
    UUID1,
    FakeGpu,
    FakeNvml,
    NVMLError,
)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def render(collector: Any) -> dict[str, Any]:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    text = generate_latest(registry).decode()
    assert "_created" not in text
    return {f.name: f for f in text_string_to_metric_families(text)}


def samples(fams: dict[str, Any], name: str) -> dict[tuple[tuple[str, str], ...], float]:
    spec = contract.BY_NAME[name]
    return {tuple(sorted(s.labels.items())): s.value for s in fams[spec.family].samples}


def labels(gpu: str, uuid: str, **extra: str) -> tuple[tuple[str, str], ...]:
    return tuple(sorted({"node_rank": "2", "gpu": gpu, "UUID": uuid, **extra}.items()))


def test_fake_nvml_renders_every_gpu_series() -> None:
    throttled = (
        contract.CLOCK_EVENT_REASONS["sw_power_cap"]
        | contract.CLOCK_EVENT_REASONS["hw_thermal_slowdown"]
    )
    gpus = [FakeGpu(UUID0, reasons=throttled, xids=[79, 48]), FakeGpu(UUID1, ecc=None)]
    nvml = FakeNvml(gpus)
    fams = render(NvmlCollector(node_rank=2, nvml=nvml))

    assert samples(fams, "gpujob_gpu_telemetry_available") == {
        (("node_rank", "2"), ("reason", "ok")): 1.0
    }
    g0, g1 = labels("0", UUID0), labels("1", UUID1)
    assert samples(fams, "gpujob_gpu_utilization_ratio") == {g0: 0.87, g1: 0.87}
    assert samples(fams, "gpujob_gpu_memory_used_bytes")[g0] == 30 * 2**30
    assert samples(fams, "gpujob_gpu_memory_total_bytes")[g1] == 80 * 2**30
    assert samples(fams, "gpujob_gpu_power_watts")[g0] == 312.5
    assert samples(fams, "gpujob_gpu_power_limit_watts")[g0] == 400.0
    assert samples(fams, "gpujob_gpu_temperature_celsius")[g0] == 71
    assert samples(fams, "gpujob_gpu_sm_clock_hertz")[g0] == 1410e6
    events = samples(fams, "gpujob_gpu_clock_event_active")
    assert len(events) == 2 * len(contract.CLOCK_EVENT_REASONS)
    active = {dict(k)["reason"] for k, v in events.items() if dict(k)["gpu"] == "0" and v == 1}
    assert active == {"sw_power_cap", "hw_thermal_slowdown"}
    assert all(v == 0 for k, v in events.items() if dict(k)["gpu"] == "1")
    assert samples(fams, "gpujob_gpu_xid_errors_total") == {g0: 2.0, g1: 0.0}
    # NotSupported on GPU 1: the series is absent, not 0
    assert samples(fams, "gpujob_gpu_ecc_uncorrected_errors_total") == {g0: 0.0}
    for name in ("gpujob_gpu_utilization_ratio", "gpujob_gpu_xid_errors_total"):
        assert fams[contract.BY_NAME[name].family].type == contract.BY_NAME[name].type


def test_xid_counter_accumulates_and_unsupported_events_are_absent() -> None:
    gpu = FakeGpu(UUID0, xids=[79])
    other = FakeGpu(UUID1, xid_supported=False)
    clock = Clock()
    collector = NvmlCollector(nvml=FakeNvml([gpu, other]), clock=clock, node_rank=2)
    assert samples(render(collector), "gpujob_gpu_xid_errors_total") == {labels("0", UUID0): 1}
    gpu.xids.append(13)
    clock.now += 1.0
    assert samples(render(collector), "gpujob_gpu_xid_errors_total") == {labels("0", UUID0): 2}


def test_reads_at_most_once_per_interval() -> None:
    nvml = FakeNvml([FakeGpu(UUID0)])
    clock = Clock()
    collector = NvmlCollector(nvml=nvml, clock=clock, min_interval=1.0)
    for _ in range(5):
        render(collector)
    assert nvml.calls == 1
    nvml.gpus[0].util = 20
    clock.now += 0.5
    assert samples(render(collector), "gpujob_gpu_utilization_ratio") != {}
    assert nvml.calls == 1
    clock.now += 0.6
    fams = render(collector)
    assert nvml.calls == 2
    assert list(samples(fams, "gpujob_gpu_utilization_ratio").values()) == [0.2]
    assert nvml.inits == 1


def test_metric_errors_skip_only_that_series() -> None:
    nvml = FakeNvml([FakeGpu(UUID0)])

    def broken(h: FakeGpu) -> int:
        raise NVMLError(NOT_SUPPORTED)

    nvml.nvmlDeviceGetPowerUsage = broken  # type: ignore[method-assign]
    fams = render(NvmlCollector(nvml=nvml))
    assert "gpujob_gpu_power_watts" not in fams
    assert "gpujob_gpu_power_limit_watts" in fams


class RaisingInit(FakeNvml):
    def nvmlInit(self) -> None:
        raise NVMLError(9)  # NVML_ERROR_DRIVER_NOT_LOADED


def broken_import() -> Any:
    raise ImportError("No module named 'pynvml'")


@pytest.mark.parametrize(
    ("nvml", "reason"),
    [
        (RaisingInit([FakeGpu(UUID0)]), contract.TELEMETRY_NVML_INIT_FAILED),
        (FakeNvml([]), contract.TELEMETRY_NO_DEVICES),
        ("import-fails", contract.TELEMETRY_NVML_MISSING),
    ],
)
def test_without_nvml_renders_no_gpu_series_and_logs_once(
    nvml: Any, reason: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    if nvml == "import-fails":
        monkeypatch.setattr("gpujob_trainer.nvml._load_pynvml", broken_import)
        nvml = None
    clock = Clock()
    collector = NvmlCollector(nvml=nvml, clock=clock)
    with caplog.at_level(logging.WARNING, logger="gpujob_trainer"):
        for _ in range(3):
            fams = render(collector)
            clock.now += 2
    assert list(fams) == ["gpujob_gpu_telemetry_available"]
    assert samples(fams, "gpujob_gpu_telemetry_available") == {
        (("node_rank", "0"), ("reason", reason)): 0.0
    }
    assert collector.reason == reason
    assert len([r for r in caplog.records if "GPU telemetry unavailable" in r.message]) == 1


def test_cuda_memory_series() -> None:
    stats = {"reserved_bytes.all.current": 6 * 2**30, "num_alloc_retries": 3, "num_ooms": 1}
    rank = RankInfo(rank=9, local_rank=1, node_rank=1, world_size=16)
    fams = render(CudaMemoryCollector(rank, stats=lambda: (UUID1, stats)))
    want = tuple(sorted({"rank": "9", "local_rank": "1", "node_rank": "1", "UUID": UUID1}.items()))
    assert samples(fams, "gpujob_cuda_memory_reserved_bytes") == {want: 6 * 2**30}
    assert samples(fams, "gpujob_cuda_alloc_retries_total") == {want: 3}
    assert samples(fams, "gpujob_cuda_ooms_total") == {want: 1}


def test_cuda_memory_absent_without_cuda_and_never_raises() -> None:
    rank = RankInfo()
    assert render(CudaMemoryCollector(rank, stats=lambda: None)) == {}

    def boom() -> None:
        raise RuntimeError("CUDA error: device-side assert")

    assert render(CudaMemoryCollector(rank, stats=boom)) == {}
    # the default reader on a CPU-only torch process: no series
    assert render(CudaMemoryCollector(rank)) == {}
