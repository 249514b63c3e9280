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
    UNKNOWN,
    UUID0,
    UUID1,
    FakeGpmMetricsGet,
    FakeGpu,
    FakeNvml,
    NVMLError,
    OldFakeNvml,
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


GPM_NAMES = ("gpujob_gpu_sm_active_ratio", "gpujob_gpu_tensor_active_ratio")
PCIE_NAMES = ("gpujob_gpu_pcie_rx_bytes_per_second", "gpujob_gpu_pcie_tx_bytes_per_second")


def profiling(fams: dict[str, Any]) -> dict[str, tuple[str, float]]:
    """counter group -> (reason, value) of gpujob_gpu_profiling_available."""
    got = samples(fams, "gpujob_gpu_profiling_available")
    out = {}
    for key, value in got.items():
        lab = dict(key)
        assert lab["node_rank"] == "2"
        assert lab["counter"] not in out, "one series per counter group"
        out[lab["counter"]] = (lab["reason"], value)
    return out


def test_pcie_throughput_in_bytes_per_second() -> None:
    gpus = [FakeGpu(UUID0), FakeGpu(UUID1, pcie_rx_kbps=1, pcie_tx_kbps=0)]
    fams = render(NvmlCollector(node_rank=2, nvml=FakeNvml(gpus)))
    g0, g1 = labels("0", UUID0), labels("1", UUID1)
    assert samples(fams, "gpujob_gpu_pcie_rx_bytes_per_second") == {
        g0: 2_000_000 * 1024,
        g1: 1024,
    }
    assert samples(fams, "gpujob_gpu_pcie_tx_bytes_per_second") == {g0: 250_000 * 1024, g1: 0}
    assert fams["gpujob_gpu_pcie_rx_bytes_per_second"].type == "gauge"
    assert profiling(fams)["pcie"] == ("ok", 1.0)


def test_gpm_needs_two_reads_then_exports_ratios() -> None:
    gpus = [FakeGpu(UUID0), FakeGpu(UUID1, sm_util=100.0, tensor_util=0.0)]
    nvml = FakeNvml(gpus)
    clock = Clock()
    collector = NvmlCollector(node_rank=2, nvml=nvml, clock=clock, min_interval=1.0)

    first = render(collector)
    assert not set(GPM_NAMES) & set(first)  # one sample per GPU: nothing to compute yet
    assert profiling(first) == {"pcie": ("ok", 1.0), "gpm": ("ok", 1.0)}
    assert "gpujob_gpu_utilization_ratio" in first

    clock.now += 0.5  # inside min_interval: the cached reading, still no GPM series
    assert not set(GPM_NAMES) & set(render(collector))
    assert nvml.sample_gets == 2

    clock.now += 0.6
    second = render(collector)
    g0, g1 = labels("0", UUID0), labels("1", UUID1)
    assert samples(second, "gpujob_gpu_sm_active_ratio") == {g0: 0.625, g1: 1.0}
    assert samples(second, "gpujob_gpu_tensor_active_ratio") == {g0: 0.375, g1: 0.0}
    assert profiling(second)["gpm"] == ("ok", 1.0)

    gpus[0].sm_util = 10.0
    clock.now += 1.0
    third = render(collector)
    assert samples(third, "gpujob_gpu_sm_active_ratio")[g0] == 0.1
    # two buffers per GPU take turns: no allocation per scrape, nothing freed while in use
    assert len(nvml.samples) == 4
    assert not any(sample.freed for sample in nvml.samples)


def test_gpu_without_gpm_turns_gpm_off_for_the_node(caplog: pytest.LogCaptureFixture) -> None:
    gpus = [FakeGpu(UUID0), FakeGpu(UUID1, gpm_supported=False)]
    clock = Clock()
    collector = NvmlCollector(node_rank=2, nvml=FakeNvml(gpus), clock=clock)
    with caplog.at_level(logging.INFO, logger="gpujob_trainer"):
        for _ in range(3):
            fams = render(collector)
            clock.now += 1.0
    assert profiling(fams) == {"pcie": ("ok", 1.0), "gpm": ("not_supported", 0.0)}
    assert not set(GPM_NAMES) & set(fams)  # not even GPU 0's, which has GPM
    assert len(samples(fams, "gpujob_gpu_pcie_rx_bytes_per_second")) == 2
    logged = [r for r in caplog.records if "gpm counters unavailable" in r.message]
    assert len(logged) == 1
    assert "not_supported" in logged[0].message


def test_pcie_not_supported_on_one_gpu() -> None:
    gpus = [FakeGpu(UUID0), FakeGpu(UUID1, pcie_supported=False)]
    nvml = FakeNvml(gpus)
    clock = Clock()
    collector = NvmlCollector(node_rank=2, nvml=nvml, clock=clock)
    for _ in range(2):
        fams = render(collector)
        clock.now += 1.0
    assert profiling(fams)["pcie"] == ("not_supported", 0.0)
    assert not set(PCIE_NAMES) & set(fams)
    assert len(samples(fams, "gpujob_gpu_sm_active_ratio")) == 2
    # NotSupported is final for that GPU: 2 calls per read for GPU 0, 1 in all for GPU 1
    assert nvml.pcie_calls == 2 * 2 + 1


def test_old_pynvml_reports_nvml_too_old(caplog: pytest.LogCaptureFixture) -> None:
    nvml = OldFakeNvml([FakeGpu(UUID0), FakeGpu(UUID1)])
    assert getattr(nvml, "nvmlGpmMetricsGet", None) is None
    assert getattr(nvml, "nvmlDeviceGetPcieThroughput", None) is None
    clock = Clock()
    collector = NvmlCollector(node_rank=2, nvml=nvml, clock=clock)
    with caplog.at_level(logging.INFO, logger="gpujob_trainer"):
        for _ in range(3):
            fams = render(collector)
            clock.now += 1.0
    assert profiling(fams) == {
        "pcie": ("nvml_too_old", 0.0),
        "gpm": ("nvml_too_old", 0.0),
    }
    assert not (set(GPM_NAMES) | set(PCIE_NAMES)) & set(fams)
    assert samples(fams, "gpujob_gpu_utilization_ratio") == {
        labels("0", UUID0): 0.87,
        labels("1", UUID1): 0.87,
    }
    assert len([r for r in caplog.records if "nvml_too_old" in r.message]) == 2  # per group


def test_driver_without_the_call_is_nvml_too_old() -> None:
    nvml = FakeNvml([FakeGpu(UUID0)])

    def missing(h: FakeGpu) -> Any:
        raise NVMLError(13)  # NVML_ERROR_FUNCTION_NOT_FOUND: libnvidia-ml predates GPM

    nvml.nvmlGpmQueryDeviceSupport = missing  # type: ignore[method-assign]
    fams = render(NvmlCollector(node_rank=2, nvml=nvml))
    assert profiling(fams)["gpm"] == ("nvml_too_old", 0.0)


def test_gpm_metrics_error_keeps_the_other_series() -> None:
    gpus = [FakeGpu(UUID0), FakeGpu(UUID1)]
    nvml = FakeNvml(gpus)
    clock = Clock()
    collector = NvmlCollector(node_rank=2, nvml=nvml, clock=clock)
    render(collector)
    real = nvml.nvmlGpmMetricsGet

    def broken(get: FakeGpmMetricsGet) -> FakeGpmMetricsGet:
        raise NVMLError(UNKNOWN)

    nvml.nvmlGpmMetricsGet = broken  # type: ignore[method-assign]
    clock.now += 1.0
    fams = render(collector)
    assert profiling(fams) == {"pcie": ("ok", 1.0), "gpm": ("not_supported", 0.0)}
    assert not set(GPM_NAMES) & set(fams)
    assert len(samples(fams, "gpujob_gpu_utilization_ratio")) == 2
    assert len(samples(fams, "gpujob_gpu_pcie_tx_bytes_per_second")) == 2
    assert samples(fams, "gpujob_gpu_telemetry_available") == {
        (("node_rank", "2"), ("reason", "ok")): 1.0
    }

    # an unexpected error is not final: the next read computes from the last good sample
    nvml.nvmlGpmMetricsGet = real  # type: ignore[method-assign]
    clock.now += 1.0
    fams = render(collector)
    assert profiling(fams)["gpm"] == ("ok", 1.0)
    assert len(samples(fams, "gpujob_gpu_sm_active_ratio")) == 2


def test_per_metric_not_supported_turns_gpm_off_and_frees_samples() -> None:
    nvml = FakeNvml([FakeGpu(UUID0)])
    nvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL = 99  # a metric this NVML cannot compute
    clock = Clock()
    collector = NvmlCollector(node_rank=2, nvml=nvml, clock=clock)
    for _ in range(3):
        fams = render(collector)
        clock.now += 1.0
    assert profiling(fams)["gpm"] == ("not_supported", 0.0)
    assert not set(GPM_NAMES) & set(fams)
    assert nvml.samples and all(sample.freed for sample in nvml.samples)
    assert nvml.sample_gets == 2  # not sampled again once it is off


def test_no_profiling_series_without_nvml() -> None:
    fams = render(NvmlCollector(nvml=FakeNvml([])))
    assert "gpujob_gpu_profiling_available" not in fams


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
