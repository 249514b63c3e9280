"""hack/gpu_check.py without a GPU: its checks on synthetic scrapes, and the script's skip mode.

The checks are pure functions of scrapes and command outputs, so each is fed what a real
CUDA run would export (and the ways it could be wrong). The script itself is run once with
the skip forced, as on a machine without CUDA: every check SKIPPED, exit code 3.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hack import gpu_check as gc

from gpujob_trainer import contract

REPO = Path(__file__).resolve().parents[3]
UUID = "GPU-6f1e2d3c-0000-4000-8000-000000000001"
DEVICE = gc.Device("NVIDIA H200", UUID, UUID, "NVIDIA H200")
RANK = 'rank="0",local_rank="0",node_rank="0"'


def exposition(
    *,
    uuid: str = UUID,
    telemetry: str = "ok",
    steps: float = 100,
    step_sum: float = 10.0,
    phase_sum: float | None = None,
    reserved: float = 2**30,
    rank: str = RANK,
) -> str:
    gpu = f'node_rank="0",gpu="0",UUID="{uuid}"'
    lines = [
        f'{contract.GPU_TELEMETRY_AVAILABLE.name}{{node_rank="0",reason="{telemetry}"}} '
        f"{1 if telemetry == 'ok' else 0}",
        f"{contract.GPU_UTILIZATION.name}{{{gpu}}} 0.93",
        f"{contract.GPU_MEMORY_USED.name}{{{gpu}}} {20 * 2**30}",
        f"{contract.GPU_MEMORY_TOTAL.name}{{{gpu}}} {141 * 2**30}",
        f"{contract.STEPS.name}{{{rank}}} {steps}",
        f"{contract.STEP_DURATION.name}_sum{{{rank}}} {step_sum}",
        f"{contract.STEP_DURATION.name}_count{{{rank}}} {steps}",
        f"{contract.COMPUTE_SECONDS.name}{{{rank}}} {0.8 * step_sum}",
        f'{contract.CUDA_MEMORY_RESERVED.name}{{{rank},UUID="{uuid}"}} {reserved}',
        f'{contract.CUDA_ALLOC_RETRIES.name}{{{rank},UUID="{uuid}"}} 0',
        f'{contract.CUDA_OOMS.name}{{{rank},UUID="{uuid}"}} 0',
    ]
    total = step_sum if phase_sum is None else phase_sum
    shares = dict.fromkeys(contract.PHASES, 0.0)
    shares.update(forward=0.3, backward=0.5, comm_wait=0.1, other=0.1)
    lines += [
        f'{contract.PHASE_SECONDS.name}{{{rank},phase="{p}"}} {share * total}'
        for p, share in shares.items()
    ]
    return "\n".join(lines) + "\n"


def scrape(**kw: object) -> gc.Scrape:
    return gc.Scrape.parse(exposition(**kw))  # type: ignore[arg-type]


def test_gpu_series_need_the_real_uuid() -> None:
    ok = gc.gpu_series(scrape(), DEVICE)
    assert ok.status == gc.PASS and UUID in ok.detail and "H200" in ok.detail
    wrong = gc.gpu_series(scrape(uuid="GPU-other"), DEVICE)
    assert wrong.status == gc.FAIL and "GPU-other" in wrong.detail
    off = gc.gpu_series(scrape(telemetry="nvml_init_failed"), DEVICE)
    assert off.status == gc.FAIL and "nvml_init_failed" in off.detail
    smi = gc.Device("NVIDIA H200", UUID, "GPU-smi", "NVIDIA H200")
    assert gc.gpu_series(scrape(), smi).status == gc.FAIL


def test_phase_timing_adds_up_to_steps_and_wall() -> None:
    first, second = scrape(steps=100, step_sum=10.0), scrape(steps=130, step_sum=13.0)
    assert gc.phase_timing(first, second, seconds=3.05).status == gc.PASS
    # steps that cover a third of the wall time: timing lost somewhere
    assert gc.phase_timing(first, second, seconds=9.0).status == gc.FAIL
    # phases that do not partition the step
    bad = scrape(steps=130, step_sum=13.0, phase_sum=12.0)
    assert gc.phase_timing(first, bad, seconds=3.0).status == gc.FAIL
    assert gc.phase_timing(first, scrape(steps=101, step_sum=10.1), 0.1).status == gc.FAIL


def test_allocator_series_name_the_same_gpu() -> None:
    assert gc.allocator(scrape(), DEVICE).status == gc.PASS
    assert gc.allocator(scrape(uuid="GPU-x"), DEVICE).status == gc.FAIL
    assert gc.allocator(scrape(reserved=0), DEVICE).status == gc.FAIL


def test_diagnose_verdict_must_be_sane() -> None:
    gpus = {"telemetry": "Available", "observed": 1}
    healthy = {"bottleneck": {"verdict": "Healthy", "summary": "no bottleneck"}, "gpus": gpus}
    assert gc.diagnose_verdict(healthy).status == gc.PASS
    stalled = {"bottleneck": {"verdict": "Stalled"}, "gpus": gpus}
    assert gc.diagnose_verdict(stalled).status == gc.FAIL
    blind = {"bottleneck": {"verdict": "Healthy"}, "gpus": {"telemetry": "Unavailable: x"}}
    assert gc.diagnose_verdict(blind).status == gc.FAIL


def test_shared_gpu_needs_both_ranks_on_it() -> None:
    rank1 = 'rank="1",local_rank="1",node_rank="0"'
    both = [scrape(), scrape(rank=rank1)]
    assert gc.shared_gpu(both, DEVICE).status == gc.PASS
    assert gc.shared_gpu([scrape(), scrape(rank=rank1, uuid="GPU-x")], DEVICE).status == gc.FAIL
    assert gc.shared_gpu(both[:1], DEVICE).status == gc.FAIL


def test_bench_output_parsing() -> None:
    out = (
        "step ~10 ms (...): instrumented/bare wall 1.0021 (95% CI 1.0001..1.0040)\n"
        "CUDA syncs per step: bare 1.00, instrumented 1.00, added 0.00\n1.0021\n"
    )
    assert gc.syncs(out).status == gc.PASS
    assert gc.syncs(out.replace("added 0.00", "added 2.00")).status == gc.FAIL
    assert gc.syncs("nothing").status == gc.FAIL
    ratio = gc.overhead(out)
    assert ratio.status == gc.PASS and "1.0021" in ratio.detail
    assert gc.overhead(out.replace("\n1.0021\n", "\n1.0300\n")).status == gc.FAIL
    assert gc.overhead("Traceback ...").status == gc.FAIL


def test_exit_codes() -> None:
    assert gc.exit_code(gc.skipped_all("no CUDA")) == gc.EXIT_NO_GPU
    assert gc.exit_code([gc.Check("a", gc.PASS, ""), gc.Check("b", gc.SKIPPED, "")]) == 0
    assert gc.exit_code([gc.Check("a", gc.PASS, ""), gc.Check("b", gc.FAIL, "")]) == 1


@pytest.mark.timeout(180)
def test_script_skips_every_check_without_cuda(tmp_path: Path) -> None:
    env = {**os.environ, "GPUJOB_GPU_CHECK_FORCE_SKIP": "1", "PYTHON": sys.executable}
    done = subprocess.run(
        ["bash", str(REPO / "hack" / "gpu-check.sh")],
        capture_output=True,
        text=True,
        env=env,
        timeout=170,
        check=False,
    )
    assert done.returncode == gc.EXIT_NO_GPU, done.stderr
    rows = [ln for ln in done.stdout.splitlines() if ln.split()[:1] and "SKIPPED" in ln]
    assert len(rows) == len(gc.CHECKS), done.stdout
    assert all(name in done.stdout for name in gc.CHECKS)


def test_the_nccl_trace_check_passes_skips_and_fails_as_the_evidence_says() -> None:
    entries = [{"seq": 3, "op": "all_reduce", "retired": True}]
    got = gc.nccl_trace({"collectives": {"available": True, "backend": "nccl", "entries": entries}})
    assert got.status == gc.PASS and got.detail == "1 entries, last all_reduce #3"
    gloo = gc.nccl_trace({"collectives": {"available": False, "backend": "gloo", "why": "x"}})
    assert gloo.status == gc.SKIPPED and "runs gloo" in gloo.detail
    empty = {"collectives": {"available": False, "backend": "nccl", "why": "buffer 0"}}
    assert gc.nccl_trace(empty).status == gc.FAIL


def test_mfu_must_exist_and_be_plausible() -> None:
    def report(**progress: object) -> dict[str, object]:
        return {"progress": progress}

    ok = gc.mfu_check(report(mfu=0.41, achievedTFLOPSPerGPU=27.4, peakTFLOPSPerGPU=66.9))
    assert ok.status == gc.PASS and "MFU 41.0% (27.4 of 66.9 TFLOP/s)" in ok.detail
    assert gc.mfu_check(report(mfu=1.7)).status == gc.FAIL  # a wrong count or peak
    assert gc.mfu_check(report(mfu=0.001)).status == gc.FAIL
    missing = gc.mfu_check(report(mfuUnavailable="no peak FLOP/s known for NVIDIA X"))
    assert missing.status == gc.FAIL and "NVIDIA X" in missing.detail


def test_transfer_check_needs_the_verdict_and_pcie_bytes() -> None:
    gpu = f'node_rank="0",gpu="0",UUID="{UUID}"'
    with_rx = gc.Scrape.parse(exposition() + f"{contract.GPU_PCIE_RX.name}{{{gpu}}} 1.2e10\n")
    report = {
        "candidates": [{"verdict": "TransferBound"}],
        "bottleneck": {"verdict": "TransferBound", "evidence": {"h2dRatio": 0.8}},
    }
    ok = gc.transfer_check(report, with_rx)
    assert ok.status == gc.PASS and "12.0 GB/s" in ok.detail and "0.8" in ok.detail
    assert gc.transfer_check(report, gc.Scrape.parse(exposition())).status == gc.FAIL
    healthy = {"candidates": [{"verdict": "ComputeBound"}], "bottleneck": {}}
    assert gc.transfer_check(healthy, with_rx).status == gc.FAIL


def test_dataparallel_check_skips_on_one_gpu_and_wants_every_gpu_named() -> None:
    assert gc.dataparallel_check({}, 1).status == gc.SKIPPED
    good = {"devices": ["GPU-a", "GPU-b"], "used": [4 * 2**30, 2**30]}
    assert gc.dataparallel_check(good, 2).status == gc.PASS
    assert gc.dataparallel_check({**good, "devices": ["GPU-a"]}, 2).status == gc.FAIL
    assert gc.dataparallel_check({**good, "used": [2**30, 4 * 2**30]}, 2).status == gc.FAIL


def _capture(**summary: object) -> dict[str, object]:
    parts = {"compute": 0.06, "communication": 0.01, "copy": 0.01, "idle": 0.02}
    s: dict[str, object] = {"device": "cuda", "stepSeconds": 0.1, "parts": parts}
    s.update(summary)
    s["top"] = [{"name": "sm90_xmma_gemm", "kind": "compute", "seconds": 0.05, "share": 0.5}]
    return {"state": "done", "trace": "/t.json", "traceBytes": 10, "summary": s, "error": None}


def test_the_profile_check_wants_kernels_nccl_where_it_runs_and_parts_that_add_up() -> None:
    gemm = {"ph": "X", "cat": "kernel", "name": "sm90_xmma_gemm", "ts": 0, "dur": 5}
    nccl = {"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllReduce_Sum", "ts": 5, "dur": 1}
    trace = {"traceEvents": [gemm, nccl]}
    ok = gc.profile_check(_capture(), trace, "nccl", 2)
    assert ok.status == gc.PASS and "2 kernels (1 NCCL)" in ok.detail and "compute 60%" in ok.detail
    one = gc.profile_check(_capture(), {"traceEvents": [gemm]}, "nccl", 1)
    assert one.status == gc.PASS and "none required" in one.detail
    missing = gc.profile_check(_capture(), {"traceEvents": [gemm]}, "nccl", 2)
    assert missing.status == gc.FAIL and "no NCCL kernel" in missing.detail
    cpu_only = {"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "aten::mm"}]}
    assert gc.profile_check(_capture(), cpu_only, "gloo", 1).status == gc.FAIL
    assert gc.profile_check(_capture(), None, "gloo", 1).status == gc.FAIL
    assert gc.profile_check(_capture(stepSeconds=0.2), trace, "gloo", 1).status == gc.FAIL
    assert gc.profile_check(_capture(device="cpu"), trace, "gloo", 1).status == gc.FAIL
    failed = {"state": "failed", "error": "the profiler did not start: CUPTI"}
    got = gc.profile_check(failed, None, "nccl", 1)
    assert got.status == gc.FAIL and "CUPTI" in got.detail
