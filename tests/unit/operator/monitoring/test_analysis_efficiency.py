"""The data-transfer and compute verdicts, MFU, step latency and DataParallel, on synthetic
windows (rank and fake NVML series as exposition text, parsed like a scrape)."""

from __future__ import annotations

import io
from dataclasses import dataclass

import pytest

from gpujob_operator import api
from gpujob_operator.monitoring import diagnose
from gpujob_operator.monitoring.rows import R_FLOPS, R_PEAK
from gpujob_operator.monitoring.scrape import expfmt
from gpujob_operator.monitoring.scrape.frame import NEEDED, _canonical, frame, frame_payload
from gpujob_operator.monitoring.scrape.guard import admit
from gpujob_operator.monitoring.update import MonitorUpdate
from gpujob_operator.monitoring.verdicts.analysis import Analysis
from gpujob_operator.monitoring.verdicts.analysis_settings import Settings
from gpujob_operator.monitoring.verdicts.latency import BOUNDS, quantile
from gpujob_operator.monitoring.verdicts.transfer import PCIE_BUSY_BYTES
from gpujob_operator.monitoring.verdicts.verdict import (
    COMMUNICATION_BOUND,
    COMPUTE_BOUND,
    DATA_PARALLEL_IMBALANCE,
    HEALTHY,
    INFO,
    INPUT_BOUND,
    STRAGGLER,
    TRANSFER_BOUND,
    WARNING,
)
from gpujob_trainer import contract
from tests.unit.operator.monitoring.test_analysis import (
    GIB,
    SETTINGS,
    GPUSim,
    Job,
    RankSim,
    run,
    verdict,
)

H100 = "NVIDIA H100 80GB HBM3"


@dataclass
class FlopsRank(RankSim):
    """A rank that also exports model FLOPs, its peak and the GPUs it drives."""

    flops_per_sample: float | None = None
    peak: float | None = None
    reason: str = contract.PEAK_OK
    device: str = H100
    dtype: str = "bf16"
    devices: tuple[str, ...] = ()

    def text(self) -> str:
        lab = f'local_rank="{self.local_rank}",node_rank="{self.node_rank}",rank="{self.rank}"'
        lines = [super().text().rstrip("\n")]
        if self.flops_per_sample is not None:
            flops = self.flops_per_sample * self.steps * self.batch
            lines.append(f"{contract.MODEL_FLOPS.name}{{{lab}}} {flops}")
        if self.peak is not None:
            peak_labels = (
                f'{lab},device="{self.device}",dtype="{self.dtype}",reason="{self.reason}"'
            )
            lines.append(f"{contract.PEAK_FLOPS.name}{{{peak_labels}}} {self.peak}")
        for i, uuid in enumerate(self.devices):
            lines.append(f'{contract.RANK_DEVICE.name}{{{lab},UUID="{uuid}"}} {i}')
        return "\n".join(lines) + "\n"


@dataclass
class BusGPU(GPUSim):
    """A GPU that also exports PCIe traffic and GPM SM activity."""

    pcie_rx: float | None = None
    sm_active: float | None = None

    def text(self, node_rank: int = 0) -> str:
        lab = f'node_rank="{node_rank}",gpu="{self.gpu}",UUID="{self.uuid}"'
        out = super().text(node_rank)
        if self.pcie_rx is not None:
            out += f"{contract.GPU_PCIE_RX.name}{{{lab}}} {self.pcie_rx}\n"
            out += f"{contract.GPU_PCIE_TX.name}{{{lab}}} 1e8\n"
        if self.sm_active is not None:
            out += f"{contract.GPU_SM_ACTIVE.name}{{{lab}}} {self.sm_active}\n"
            out += f"{contract.GPU_TENSOR_ACTIVE.name}{{{lab}}} {self.sm_active / 2}\n"
        return out


COMPUTE_HEAVY = {
    "data_wait": 0.001,
    "forward": 0.03,
    "backward": 0.05,
    "optimizer": 0.005,
    "comm_wait": 0.001,
    "other": 0.0,
}
"""Forward, backward and optimizer are 98.8% of the step."""


def ranks(n: int = 2, **kw: object) -> list[FlopsRank]:
    out = []
    for i in range(n):
        mine = {k: dict(v) if isinstance(v, dict) else v for k, v in kw.items()}
        out.append(FlopsRank(i, i, **mine))  # type: ignore[arg-type]
    return out


def names(a: Analysis) -> list[str]:
    return [c.verdict for c in a.candidates]


def settings(**th: float) -> Settings:
    return Settings(
        warmup_steps=SETTINGS.warmup_steps,
        min_scrapes=SETTINGS.min_scrapes,
        thresholds=api.Thresholds(**th),  # type: ignore[arg-type]
    )


# ---- latency ------------------------------------------------------------------------------


def test_quantile_interpolates_within_its_bucket_like_histogram_quantile() -> None:
    i = BOUNDS.index(0.05)
    counts = [0.0] * i + [10.0] + [110.0] * (len(BOUNDS) - i)  # 10 <= 50 ms, 100 in (50, 100]
    assert quantile(0.5, counts) == pytest.approx(0.05 + 0.05 * 45 / 100)
    assert quantile(0.95, counts) == pytest.approx(0.05 + 0.05 * 94.5 / 100)
    assert quantile(0.5, [0.0] * (len(BOUNDS) + 1)) is None
    beyond = [0.0] * len(BOUNDS) + [5.0]  # every step slower than the last bound
    assert quantile(0.5, beyond) == BOUNDS[-1]
    # a restart can leave a bucket's increase below the one before it: made monotone
    dented = [0.0] * i + [10.0, 4.0] + [10.0] * (len(BOUNDS) - i - 1)
    assert quantile(0.5, dented) == pytest.approx(BOUNDS[i - 1] + (0.05 - BOUNDS[i - 1]) / 2)


def test_progress_has_step_latency_and_time_per_sample() -> None:
    a = run(Job(ranks()))
    p = a.progress
    step = sum(RankSim(0).phases.values())  # 0.1 s, in the (0.05, 0.1] bucket
    assert 0.05 < p["stepSecondsP50"] <= step and p["stepSecondsP50"] <= p["stepSecondsP95"]
    # The time per sample is derived where it is shown (diagnose's table), from the throughput.
    update = MonitorUpdate(
        now=0.0, progress=p, bottleneck=None, gpus={}, conditions=[], events=[], analysis=a
    )
    table = io.StringIO()
    diagnose.render_text(update, table)
    assert f"; {1000 / p['samplesPerSecond']:.3g} ms per sample" in table.getvalue()
    assert_fits_the_status(p)


def assert_fits_the_status(p: dict[str, object]) -> None:
    """Every key of the analysis' progress survives the status schema: in status.progress,
    but the ETA's basis, which goes to status.operatorState.rateSince."""
    public = {k: v for k, v in p.items() if k != "rateSince"}
    dumped = api.Progress.model_validate(public).model_dump(by_alias=True, exclude_none=True)
    assert set(dumped) == set(public)
    if "rateSince" in p:
        state = api.parse_status({"operatorState": {"rateSince": p["rateSince"]}}).operator_state
        assert state is not None and state.rate_since is not None


# ---- MFU and ComputeBound ---------------------------------------------------------------


def test_mfu_from_the_flops_counter_and_the_exported_peak() -> None:
    # 1e9 FLOPs a sample, 32 samples a step, 10 steps per 15 s scrape: 2.133e10 FLOP/s
    job = Job(ranks(flops_per_sample=1e9, peak=1e11))
    a = run(job)
    p = a.progress
    assert p["mfu"] == pytest.approx(1e9 * 32 * 10 / 15 / 1e11, rel=1e-3)
    assert p["achievedTFLOPSPerGPU"] == pytest.approx(0.02133, rel=1e-3)
    assert p["peakTFLOPSPerGPU"] == 0.1 and "mfuUnavailable" not in p
    assert a.verdict is not None and a.verdict.verdict == HEALTHY  # 85% compute: below 90%
    assert [b.mfu for b in a.verdict.breakdown] == [pytest.approx(0.2133, abs=1e-4)] * 2
    assert_fits_the_status(p)


def test_the_jobs_peak_overrides_the_trainers_and_stands_in_for_none() -> None:
    job = Job(ranks(flops_per_sample=1e9, peak=0.0, reason=contract.PEAK_NO_GPU))
    plain = run(job)
    assert "mfu" not in plain.progress
    assert "no GPU" in plain.progress["mfuUnavailable"]
    job = Job(ranks(flops_per_sample=1e9, peak=0.0, reason=contract.PEAK_NO_GPU))
    a = run(job, settings=Settings(warmup_steps=20, min_scrapes=3, peak_tflops=0.04))
    assert a.progress["mfu"] == pytest.approx(2.1333e10 / 4e10, rel=1e-3)


def test_fp8_gets_no_mfu_even_against_the_jobs_peak() -> None:
    job = Job(ranks(flops_per_sample=1e9, peak=0.0, reason=contract.PEAK_FP8, dtype="fp8"))
    a = run(job, settings=Settings(warmup_steps=20, min_scrapes=3, peak_tflops=1979.0))
    assert "mfu" not in a.progress and "FP8" in a.progress["mfuUnavailable"]


def test_an_implausible_mfu_is_withheld_and_said_so() -> None:
    # a count per batch taken for per sample: 32x the truth, above any GPU's peak
    a = run(Job(ranks(flops_per_sample=32e9, peak=1e11)))
    assert "mfu" not in a.progress
    assert a.progress["mfuUnavailable"].startswith("implausible: 6.83 times the peak")
    tiny = run(Job(ranks(flops_per_sample=1e9, peak=1e-300)))  # no GPU's peak
    assert "mfu" not in tiny.progress


@pytest.mark.parametrize(
    ("kw", "words"),
    [
        ({"peak": 1e11}, "no model FLOP count"),
        ({"flops_per_sample": 1e9, "peak": 0.0, "reason": contract.PEAK_FP8}, "FP8"),
        (
            {"flops_per_sample": 1e9, "peak": 0.0, "reason": contract.PEAK_UNKNOWN_DEVICE},
            f"no peak FLOP/s known for {H100}",
        ),
        ({"flops_per_sample": 1e9}, "exports no peak"),
    ],
)
def test_no_mfu_says_why(kw: dict[str, object], words: str) -> None:
    a = run(Job(ranks(**kw)))
    assert "mfu" not in a.progress
    assert words in a.progress["mfuUnavailable"]


@pytest.mark.parametrize(
    ("peak", "grade"),
    [(1e12, "is low"), (4e10, "near what the hardware gives"), (5e10, "some headroom")],
)
def test_compute_bound_is_info_with_mfu_and_advice_graded_by_it(peak: float, grade: str) -> None:
    job = Job(ranks(flops_per_sample=1e9, peak=peak, phases=dict(COMPUTE_HEAVY)))
    a = run(job)
    assert a.verdict is not None and a.verdict.verdict == COMPUTE_BOUND
    assert a.verdict.severity == INFO
    ev = a.verdict.evidence
    assert ev["computeRatio"] == pytest.approx(0.085 / 0.087, abs=1e-3)
    assert ev["mfu"] == pytest.approx(2.1333e10 / peak, abs=1e-4)
    assert grade in a.verdict.advice and "MFU" in a.verdict.summary


def test_compute_bound_without_mfu_still_advises_and_says_why() -> None:
    a = run(Job(ranks(phases=dict(COMPUTE_HEAVY))))
    assert a.verdict is not None and a.verdict.verdict == COMPUTE_BOUND
    assert "mfu" not in a.verdict.evidence
    assert "no model FLOP count" in str(a.verdict.evidence["mfuUnavailable"])
    assert "MFU is unknown" in a.verdict.advice and "torch.compile" in a.verdict.advice


def test_an_input_bound_job_that_is_also_compute_bound_is_input_bound() -> None:
    phases = {**COMPUTE_HEAVY, "data_wait": 0.04}  # 32% data wait, 68% compute
    a = run(Job(ranks(phases=phases)), settings=settings(compute_bound_ratio=0.6))
    assert names(a) == [INPUT_BOUND, COMPUTE_BOUND]
    assert verdict(a) == INPUT_BOUND
    assert a.verdict is not None and a.verdict.evidence["alsoDetected"] == COMPUTE_BOUND


# ---- TransferBound ------------------------------------------------------------------------


def test_h2d_share_over_the_bound_is_transfer_bound_with_its_numbers() -> None:
    phases = {**COMPUTE_HEAVY, "h2d": 0.05}  # 0.05 of 0.137 s
    a = run(Job(ranks(phases=phases)))
    assert verdict(a) == TRANSFER_BOUND
    assert a.verdict is not None and a.verdict.severity == WARNING
    ev = a.verdict.evidence
    assert ev["h2dRatio"] == pytest.approx(0.05 / 0.137, abs=1e-3)
    assert ev["h2dSecondsPerStep"] == pytest.approx(0.05)
    assert "pin_memory=True" in a.verdict.advice and "non_blocking" in a.verdict.advice
    assert {b.h2d for b in a.verdict.breakdown} == {0.05}
    slowest = a.verdict.breakdown[0].to_status()
    assert slowest["h2dSeconds"] == 0.05 and slowest["otherSeconds"] == 0.0
    # the status schema keeps every key the analysis writes (a CRD prunes unknown ones)
    kept = api.RankBreakdown.model_validate(slowest).model_dump(by_alias=True, exclude_none=True)
    assert kept == slowest


def test_h2d_below_the_bound_is_not_transfer_bound() -> None:
    a = run(Job(ranks(phases={**COMPUTE_HEAVY, "h2d": 0.01})))  # 10%
    assert TRANSFER_BOUND not in names(a)


def test_a_straggler_that_is_also_transfer_bound_is_named_as_the_straggler() -> None:
    job = Job(ranks(4, phases={**COMPUTE_HEAVY, "h2d": 0.05}))
    job.ranks[2].phases.update(forward=0.12, backward=0.2)  # 3.5x the others' own time
    a = run(job)
    assert verdict(a) == STRAGGLER and TRANSFER_BOUND in names(a)
    assert a.verdict is not None and a.verdict.rank == 2
    assert TRANSFER_BOUND in str(a.verdict.evidence["alsoDetected"])


def _pcie_job(sm: float) -> Job:
    gpus = [
        BusGPU(i, f"GPU-{i}", util=0.5, pcie_rx=2 * PCIE_BUSY_BYTES, sm_active=sm) for i in range(2)
    ]
    return Job(ranks(phases=dict(COMPUTE_HEAVY)), gpus=list(gpus))


def test_heavy_pcie_traffic_while_the_sms_idle_is_transfer_bound_unseen_by_the_phases() -> None:
    a = run(_pcie_job(sm=0.1))
    assert verdict(a) == TRANSFER_BOUND
    assert a.verdict is not None
    ev = a.verdict.evidence
    assert ev["pcieRxBytesPerSecond"] == 2 * PCIE_BUSY_BYTES and ev["smActiveRatio"] == 0.1
    assert "PCIe receives 8.0 GB/s per GPU while the SMs are active 10%" in a.verdict.summary


def test_heavy_pcie_traffic_with_busy_sms_is_not_transfer_bound() -> None:
    a = run(_pcie_job(sm=0.8))
    assert TRANSFER_BOUND not in names(a)


def test_pcie_traffic_of_a_job_waiting_for_its_peers_is_the_network_not_batches() -> None:
    job = _pcie_job(sm=0.1)  # GPUDirect RDMA crosses PCIe with few SMs busy
    for r in job.ranks:
        r.phases["comm_wait"] = 0.05  # 37% of the step waiting in all-reduce
    a = run(job)
    assert TRANSFER_BOUND not in names(a) and verdict(a) == COMMUNICATION_BOUND


# ---- DataParallel -------------------------------------------------------------------------


def _dp_job(first_used: float, first_util: float = 0.9) -> Job:
    uuids = tuple(f"GPU-dp{i}" for i in range(4))
    gpus = [GPUSim(0, uuids[0], util=first_util, used=first_used)]
    gpus += [GPUSim(i, uuids[i], util=0.9, used=0.7 * GIB) for i in range(1, 4)]
    return Job([FlopsRank(0, 0, devices=uuids)], gpus=gpus)


def test_dataparallel_with_a_heavy_first_gpu_is_named_with_the_per_gpu_table() -> None:
    a = run(_dp_job(first_used=4 * GIB))
    assert verdict(a) == DATA_PARALLEL_IMBALANCE
    v = a.verdict
    assert v is not None and v.severity == WARNING
    assert (v.rank, v.pod, v.gpu_uuid) == (0, "pod-0", "GPU-dp0")
    ev = v.evidence
    assert ev["devices"] == 4 and ev["firstMemoryBytes"] == 4 * GIB
    assert ev["memoryBalance"] == pytest.approx(0.7 / 4)
    assert ev["perGPU"] == "GPU 0 4.0 GiB 90% busy; GPU 1 0.7 GiB 90% busy; " + (
        "GPU 2 0.7 GiB 90% busy; GPU 3 0.7 GiB 90% busy"
    )
    assert "torchrun" in v.advice and "DistributedDataParallel" in v.advice


def test_dataparallel_with_a_busier_first_gpu_is_named_too() -> None:
    job = _dp_job(first_used=0.8 * GIB, first_util=0.95)
    for g in job.gpus[1:]:
        g.util = 0.3
    a = run(job)
    assert verdict(a) == DATA_PARALLEL_IMBALANCE
    assert a.verdict is not None and "95% busy against a median 30%" in a.verdict.summary


@pytest.mark.parametrize("used", [0.9 * GIB, 0.7 * GIB + 400 * 2**20])
def test_balanced_or_tiny_dataparallel_is_not_an_imbalance(used: float) -> None:
    # 0.9 GiB: within the bound; 1.1 GiB: over it, but a gap below 512 MiB says nothing
    assert DATA_PARALLEL_IMBALANCE not in names(run(_dp_job(first_used=used)))


def test_one_gpu_per_rank_is_never_a_dataparallel_imbalance() -> None:
    uuids = ("GPU-a", "GPU-b")
    job = Job(
        [FlopsRank(0, 0, devices=uuids[:1]), FlopsRank(1, 1, devices=uuids[1:])],
        gpus=[GPUSim(0, uuids[0], used=8 * GIB), GPUSim(1, uuids[1], used=GIB)],
    )
    assert DATA_PARALLEL_IMBALANCE not in names(run(job))


# ---- the new series through the scraper's paths -----------------------------------------


def test_both_frame_paths_read_flops_peak_devices_buckets_and_pcie_alike() -> None:
    r = FlopsRank(0, 0, flops_per_sample=2e9, peak=9.894e14, devices=("GPU-a", "GPU-b"))
    r.advance(30, 100.0)
    text = r.text() + BusGPU(0, "GPU-a", pcie_rx=5e9, sm_active=0.4).text()
    slow = frame(expfmt.parse(text, NEEDED), 1.0)
    fast = frame_payload(text, 1.0)
    assert repr(fast) == repr(slow)
    assert _canonical(text)  # a product name with spaces keeps the payload on the fast path
    assert fast.devices == {0: ("GPU-a", "GPU-b")} and fast.device_names == {0: H100}
    row = fast.ranks[0]
    assert row[R_FLOPS] == 2e9 * 30 * 32 and row[R_PEAK] == 9.894e14


def test_implausible_flops_and_peaks_are_dropped_at_the_edge() -> None:
    r = FlopsRank(0, 0, flops_per_sample=1e60, peak=1e30)
    r.advance(3, 100.0)
    got = admit(frame_payload(r.text(), 101.0), 0, 101.0)
    assert got.dropped_values == 2
    row = got.frame.ranks[0]
    assert row[R_FLOPS] != row[R_FLOPS] and row[R_PEAK] != row[R_PEAK]  # NaN: absent
