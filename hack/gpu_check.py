"""Prove the CUDA and NVML paths on a machine with one NVIDIA GPU; print what held.

`hack/gpu-check.sh` runs this with the venv's python. It installs nothing. On CUDA it:

1. runs the example trainer under torchrun on the GPU, one rank, and scrapes it twice;
2. checks the `gpujob_gpu_*` series carry the GPU's real UUID (NVML's, torch's and
   nvidia-smi's agree) and reports its product name; that the CUDA-event phase times add
   up to the step time and to the wall-clock time between the scrapes; that the caching
   allocator's series name the same UUID;
3. runs `gpujob diagnose` on it and expects a sane verdict (no Stalled, no HardwareFault);
   reads its `/debug/evidence` and expects the Flight Recorder's NCCL trace (SKIPPED, with
   why, where the rank does not run NCCL);
4. runs two processes sharing the GPU (gloo, since NCCL refuses a shared GPU) and checks
   both ranks' series;
5. runs `bench/trainer_overhead.py --device cuda`: zero host-device synchronisations
   added by the library (`torch.cuda.set_sync_debug_mode`, the h2d copy included), and the
   overhead ratio;
6. MFU of the matmul-heavy single-rank run: counted FLOPs over the table's peak for the
   product NVML names, in a plausible range;
7. a copy-heavy run (`--copy-mb`: pageable batches copied every step) judged TransferBound
   with NVML's PCIe receive bytes/s reported;
8. nn.DataParallel over every visible GPU: the rank names each GPU it drives and the first
   one carries the most (SKIPPED, with why, on a one-GPU machine);
9. a profile capture of the single-rank run asked over `/debug/profile` (issue 41): its trace
   holds CUDA kernels, NCCL kernels where NCCL runs between two ranks or more, and the
   summary (device cuda) has parts that add up to its step time.

Without CUDA every check is SKIPPED with the reason and the exit code is 3; otherwise 0
when all held and 1 when one failed. Checks are pure functions of scrapes and outputs, so
the unit tests feed them synthetic ones.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "trainer"))

from trainer_harness import Scrape, scrape, torchrun_example, wait_for  # noqa: E402

from gpujob_trainer import contract  # noqa: E402

PASS, FAIL, SKIPPED = "PASS", "FAIL", "SKIPPED"
EXIT_OK, EXIT_FAILED, EXIT_NO_GPU = 0, 1, 3
RATIO_TARGET = 1.005
SANE_VERDICTS_EXCLUDED = ("Stalled", "HardwareFault")
SIZE = ["--hidden=1024", "--layers=6", "--batch-size=2048", "--steps=100000"]

CHECKS = (
    "cuda device",
    "gpu series + UUID",
    "phase timing adds up",
    "allocator series",
    "diagnose verdict",
    "two ranks share the GPU",
    "no syncs added",
    "overhead ratio",
    "nccl collective trace",
    "mfu in range",
    "transfer bound + PCIe",
    "dataparallel devices",
    "profile capture",
)
PROFILE_STEPS = 5
MFU_RANGE = (0.02, 1.0)
"""A matmul-heavy fp32/TF32 MLP on a data-centre GPU: a few percent (small layers, launch
bound) to most of the peak; 0 or above 1 means the count or the peak is wrong."""
COPY = ["--copy-mb=512", "--batch-size=64"]
"""512 MiB of pageable memory per step against a tiny compute: the copy is the step."""


@dataclass(frozen=True)
class Check:
    name: str
    status: str
    detail: str


@dataclass(frozen=True)
class Device:
    name: str
    uuid: str
    smi_uuid: str | None = None
    smi_name: str | None = None


# ---- pure checks ----------------------------------------------------------------------


def gpu_series(s: Scrape, device: Device) -> Check:
    """NVML series present, telemetry ok, and labelled with the GPU's real UUID."""
    name = "gpu series + UUID"
    ok = s.get(contract.GPU_TELEMETRY_AVAILABLE.name, reason=contract.TELEMETRY_OK)
    if ok != 1.0:
        reasons = sorted(
            dict(ls).get(contract.LABEL_REASON, "?")
            for n, ls in s.samples
            if n == contract.GPU_TELEMETRY_AVAILABLE.name
        )
        return Check(name, FAIL, f"GPU telemetry not available: {reasons or 'not exported'}")
    uuids = {
        dict(ls).get(contract.LABEL_UUID, "")
        for n, ls in s.samples
        if n.startswith("gpujob_gpu_") and n != contract.GPU_TELEMETRY_AVAILABLE.name
    }
    missing = [
        spec.name
        for spec in (contract.GPU_UTILIZATION, contract.GPU_MEMORY_USED, contract.GPU_MEMORY_TOTAL)
        if s.get(spec.name) is None
    ]
    if missing:
        return Check(name, FAIL, f"missing {missing}")
    if uuids != {device.uuid}:
        return Check(name, FAIL, f"UUID labels {sorted(uuids)} != torch's {device.uuid}")
    if device.smi_uuid is not None and device.smi_uuid != device.uuid:
        return Check(name, FAIL, f"nvidia-smi says {device.smi_uuid}, torch {device.uuid}")
    used = s.value(contract.GPU_MEMORY_USED.name) / 2**30
    total = s.value(contract.GPU_MEMORY_TOTAL.name) / 2**30
    return Check(
        name,
        PASS,
        f"{device.uuid} ({device.smi_name or device.name}); memory {used:.1f}/{total:.0f} GiB, "
        f"utilization {100 * s.value(contract.GPU_UTILIZATION.name):.0f}%",
    )


def phase_timing(first: Scrape, second: Scrape, seconds: float, rank: str = "0") -> Check:
    """Phases sum to the step time, and the steps fill the wall time between two scrapes."""
    name = "phase timing adds up"

    def totals(s: Scrape) -> tuple[float, float, float]:
        phases = sum(
            s.value(contract.PHASE_SECONDS.name, phase=p, rank=rank) for p in contract.PHASES
        )
        return (
            phases,
            s.value(contract.STEP_DURATION.name + "_sum", rank=rank),
            s.value(contract.STEP_DURATION.name + "_count", rank=rank),
        )

    p1, s1, c1 = totals(first)
    p2, s2, c2 = totals(second)
    if c2 - c1 < 3:
        return Check(name, FAIL, f"only {c2 - c1:.0f} steps attributed between the scrapes")
    dp, ds = p2 - p1, s2 - s1
    compute = second.value(contract.COMPUTE_SECONDS.name, rank=rank) - first.value(
        contract.COMPUTE_SECONDS.name, rank=rank
    )
    detail = (
        f"{c2 - c1:.0f} steps: phases {dp:.3f}s, steps {ds:.3f}s, wall {seconds:.3f}s, "
        f"compute {compute:.3f}s"
    )
    if not math.isclose(dp, ds, rel_tol=1e-3, abs_tol=1e-4):
        return Check(name, FAIL, "phases != step time: " + detail)
    if not 0.8 <= ds / seconds <= 1.1:  # attribution lags by the steps still on the GPU
        return Check(name, FAIL, "step time does not fill the wall time: " + detail)
    if compute <= 0:
        return Check(name, FAIL, "no forward/backward/optimizer time: " + detail)
    return Check(name, PASS, detail)


def allocator(s: Scrape, device: Device) -> Check:
    """The caching allocator's series, labelled with the same UUID as NVML's."""
    name = "allocator series"
    reserved = [
        (dict(ls), v) for (n, ls), v in s.samples.items() if n == contract.CUDA_MEMORY_RESERVED.name
    ]
    if not reserved:
        return Check(name, FAIL, f"no {contract.CUDA_MEMORY_RESERVED.name}")
    labels, value = reserved[0]
    if labels.get(contract.LABEL_UUID) != device.uuid:
        return Check(name, FAIL, f"UUID {labels.get(contract.LABEL_UUID)} != {device.uuid}")
    missing = [
        spec.name
        for spec in (contract.CUDA_ALLOC_RETRIES, contract.CUDA_OOMS)
        if s.get(spec.name) is None
    ]
    if missing or value <= 0:
        return Check(name, FAIL, f"missing {missing}, reserved {value}")
    return Check(name, PASS, f"reserved {value / 2**20:.0f} MiB, retries/OOM series present")


def diagnose_verdict(report: dict[str, Any]) -> Check:
    name = "diagnose verdict"
    b = report.get("bottleneck") or {}
    verdict = b.get("verdict")
    gpus = report.get("gpus") or {}
    detail = f"{verdict}: {b.get('summary', '')}; telemetry {gpus.get('telemetry')}"
    if not verdict or verdict in SANE_VERDICTS_EXCLUDED:
        return Check(name, FAIL, detail)
    if gpus.get("telemetry") != "Available" or not gpus.get("observed"):
        return Check(name, FAIL, detail)
    return Check(name, PASS, detail)


def shared_gpu(scrapes: Sequence[Scrape], device: Device) -> Check:
    name = "two ranks share the GPU"
    uuids, steps = [], []
    for s in scrapes:
        steps.append(s.get(contract.STEPS.name) or 0)
        uuids += [
            dict(ls).get(contract.LABEL_UUID)
            for n, ls in s.samples
            if n == contract.CUDA_MEMORY_RESERVED.name
        ]
    if len(scrapes) != 2 or min(steps) < 1:
        return Check(name, FAIL, f"steps per rank {steps}")
    if set(uuids) != {device.uuid} or len(uuids) != 2:
        return Check(name, FAIL, f"allocator UUIDs {uuids}")
    gpu = gpu_series(scrapes[0], device)
    if gpu.status != PASS:
        return Check(name, FAIL, "local rank 0: " + gpu.detail)
    return Check(name, PASS, f"steps {steps}; both ranks' allocator series on {device.uuid}")


SYNC_LINE = re.compile(
    r"CUDA syncs per step: bare ([\d.]+), instrumented ([\d.]+), added ([-\d.]+)"
)


def syncs(bench_output: str) -> Check:
    name = "no syncs added"
    m = SYNC_LINE.search(bench_output)
    if m is None:
        return Check(name, FAIL, "the bench printed no sync count")
    added = float(m.group(3))
    return Check(name, PASS if added <= 0 else FAIL, m.group(0))


def overhead(bench_output: str) -> Check:
    name = "overhead ratio"
    lines = [ln for ln in bench_output.strip().splitlines() if ln.strip()]
    try:
        ratio = float(lines[-1])
    except (IndexError, ValueError):
        return Check(name, FAIL, "the bench's last line is not a ratio")
    detail = next((ln for ln in lines if "instrumented/bare wall" in ln), "")
    status = PASS if ratio <= RATIO_TARGET else FAIL
    return Check(name, status, f"{ratio:.4f} (target <= {RATIO_TARGET}); {detail}")


def mfu_check(report: dict[str, Any]) -> Check:
    name = "mfu in range"
    p = report.get("progress") or {}
    if "mfu" not in p:
        return Check(name, FAIL, f"no MFU: {p.get('mfuUnavailable', 'no progress')}")
    mfu = float(p["mfu"])
    detail = (
        f"MFU {100 * mfu:.1f}% ({p.get('achievedTFLOPSPerGPU')} of "
        f"{p.get('peakTFLOPSPerGPU')} TFLOP/s)"
    )
    ok = MFU_RANGE[0] <= mfu <= MFU_RANGE[1]
    return Check(name, PASS if ok else FAIL, detail + f"; expected {MFU_RANGE}")


def transfer_check(report: dict[str, Any], s: Scrape) -> Check:
    name = "transfer bound + PCIe"
    verdicts = [c.get("verdict") for c in report.get("candidates") or []]
    rx = [v for (n, _), v in s.samples.items() if n == contract.GPU_PCIE_RX.name and v == v]
    b = report.get("bottleneck") or {}
    detail = (
        f"verdict {b.get('verdict')}, candidates {verdicts}; h2dRatio "
        f"{(b.get('evidence') or {}).get('h2dRatio')}; PCIe rx "
        f"{', '.join(f'{v / 1e9:.1f} GB/s' for v in rx) or 'not exported'}"
    )
    ok = "TransferBound" in verdicts and bool(rx) and max(rx) > 0
    return Check(name, PASS if ok else FAIL, detail)


def dataparallel_check(result: dict[str, Any], gpus: int) -> Check:
    name = "dataparallel devices"
    if gpus < 2:
        return Check(name, SKIPPED, f"{gpus} GPU visible: nn.DataParallel needs two or more")
    devices = result.get("devices") or []
    used = result.get("used") or []
    detail = f"{len(devices)} of {gpus} GPUs named; memory used {used}"
    ok = len(devices) == gpus and bool(used) and used[0] >= max(used)
    return Check(name, PASS if ok else FAIL, detail)


DATAPARALLEL_SCRIPT = """
import json, torch
from torch import nn
from gpujob_trainer.env import RankInfo
from gpujob_trainer.exporter import render_snapshot
from gpujob_trainer.tracker import Tracker
t = Tracker(rank=RankInfo())
net = nn.Sequential(*[nn.Linear(2048, 2048) for _ in range(4)], nn.Linear(2048, 10)).cuda()
model = t.wrap_model(nn.DataParallel(net))
opt = torch.optim.Adam(model.parameters())
for _ in range(20):
    x = torch.randn(4096, 2048).cuda()
    loss = nn.functional.cross_entropy(model(x), torch.randint(0, 10, (4096,)).cuda())
    opt.zero_grad(); loss.backward(); opt.step()
torch.cuda.synchronize()
used = [torch.cuda.memory_reserved(i) for i in range(torch.cuda.device_count())]
names = [s.labels["UUID"] for f in render_snapshot(t.snapshot()) for s in f.samples
         if s.name == "gpujob_train_device_info"]
print(json.dumps({"devices": names, "used": used}))
"""


def profile_check(doc: dict[str, Any], trace: Any, backend: str | None, world: int) -> Check:
    """A finished capture on CUDA: kernels in its trace, NCCL's where NCCL runs between
    ranks, and a summary whose parts add up to its step time."""
    name = "profile capture"
    if doc.get("state") != "done":
        return Check(name, FAIL, f"state {doc.get('state')}: {doc.get('error') or '-'}")
    events = trace.get("traceEvents") if isinstance(trace, dict) else None
    if not isinstance(events, list):
        return Check(name, FAIL, f"the trace {doc.get('trace')} holds no traceEvents list")
    kernels = [e for e in events if isinstance(e, dict) and e.get("cat") == "kernel"]
    if not kernels:
        return Check(name, FAIL, "no CUDA kernel in the trace (CUPTI off or not captured?)")
    nccl = [k for k in kernels if str(k.get("name", "")).lower().startswith("nccl")]
    if backend == "nccl" and world > 1 and not nccl:
        return Check(name, FAIL, f"NCCL runs between {world} ranks, yet no NCCL kernel")
    s = doc.get("summary") or {}
    if s.get("device") != "cuda":
        return Check(name, FAIL, f"summary device {s.get('device')!r}, not cuda")
    step = float(s.get("stepSeconds") or 0.0)
    parts = s.get("parts") or {}
    total = sum(float(parts.get(p, 0.0)) for p in contract.PROFILE_PARTS)
    if not step > 0 or not math.isclose(total, step, rel_tol=1e-6):
        return Check(name, FAIL, f"parts add up to {total:.6f} s, the step is {step:.6f} s")
    if backend == "nccl" and world > 1:
        comm = f"{len(nccl)} NCCL"
    else:
        comm = f"{len(nccl)} NCCL; {backend or 'no backend'} on {world} rank(s): none required"
    split = ", ".join(f"{p} {100 * float(parts.get(p, 0.0)) / step:.0f}%" for p in parts)
    top = (s.get("top") or [{}])[0].get("name", "-")
    return Check(
        name,
        PASS,
        f"{len(kernels)} kernels ({comm}); step {1000 * step:.1f} ms: {split}; top {top[:60]}",
    )


def skipped_all(reason: str) -> list[Check]:
    return [Check(n, SKIPPED, reason) for n in CHECKS]


def table(checks: Sequence[Check]) -> str:
    width = max(len(c.name) for c in checks)
    rows = [f"{'check'.ljust(width)}  result   detail", f"{'-' * width}  -------  ------"]
    rows += [f"{c.name.ljust(width)}  {c.status.ljust(7)}  {c.detail}" for c in checks]
    return "\n".join(rows)


def exit_code(checks: Sequence[Check]) -> int:
    if any(c.status == FAIL for c in checks):
        return EXIT_FAILED
    if checks and all(c.status == SKIPPED for c in checks):
        return EXIT_NO_GPU
    return EXIT_OK


# ---- the I/O shell -----------------------------------------------------------------------


def _steps(port: int) -> float:
    return scrape(port).get(contract.STEPS.name) or 0.0


def probe_device() -> tuple[Device | None, str]:
    """The GPU, or None with why not (no torch, no CUDA build, no device)."""
    try:
        import torch
    except ImportError as exc:
        return None, f"no torch in {sys.executable}: {exc}"
    if not torch.cuda.is_available():
        why = "torch built without CUDA" if torch.version.cuda is None else "no CUDA device"
        return None, f"{why} (torch {torch.__version__}, torch.cuda.is_available() is False)"
    props = torch.cuda.get_device_properties(0)
    uuid = str(props.uuid)
    uuid = uuid if uuid.startswith("GPU-") else f"GPU-{uuid}"
    smi_uuid = smi_name = None
    if shutil.which("nvidia-smi"):
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=uuid,name", "--format=csv,noheader", "-i", "0"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        if out.returncode == 0 and "," in out.stdout:
            smi_uuid, smi_name = (x.strip() for x in out.stdout.strip().split(",", 1))
    return Device(torch.cuda.get_device_name(0), uuid, smi_uuid, smi_name), ""


def nccl_trace(doc: dict[str, Any]) -> Check:
    """The rank's /debug/evidence holds Flight Recorder entries read from NCCL."""
    name = "nccl collective trace"
    col = doc.get("collectives") or {}
    if col.get("backend") != "nccl":
        why = col.get("why") or "no process group"
        return Check(name, SKIPPED, f"the rank runs {col.get('backend') or 'no backend'}: {why}")
    entries = col.get("entries") or []
    if not col.get("available") or not entries:
        return Check(name, FAIL, f"no NCCL trace: {col.get('why') or 'empty'}")
    last = entries[-1]
    return Check(name, PASS, f"{len(entries)} entries, last {last['op']} #{last['seq']}")


def _evidence(port: int) -> dict[str, Any]:
    url = f"http://127.0.0.1:{port}{contract.EVIDENCE_PATH}"
    with urllib.request.urlopen(url, timeout=10) as r:
        return dict(json.loads(r.read()))


def _guard(name: str, fn: Callable[[], Check]) -> Check:
    try:
        return fn()
    except Exception as exc:  # a check that could not run is a failed check, with why
        return Check(name, FAIL, f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}")


def run_checks(device: Device, work: Path, bench_seconds: float) -> list[Check]:
    checks = [Check("cuda device", PASS, f"{device.name} {device.uuid}")]
    one: dict[str, Any] = {}

    def single_rank() -> Check:
        recorder = dict(contract.flight_recorder_env(set()))
        with torchrun_example([*SIZE, "--device=cuda"], work, nproc=1, env=recorder) as run:
            port = run.ports()[0]
            wait_for("10 steps", lambda: _steps(port) >= 10 or None, 180)
            one["evidence"] = _evidence(port)
            t1 = time.monotonic()
            first = scrape(port)
            wait_for("3 s of training", lambda: time.monotonic() - t1 >= 3.0 or None, 10)
            second = scrape(port)
            one["seconds"] = time.monotonic() - t1
            one["first"], one["second"] = first, second
            one["diagnose"], one["diagnose_err"] = _diagnose(port)
            one["profile"] = _guard("profile capture", lambda: _profile(port, one["evidence"]))
        return Check("single rank", PASS, "")

    started = _guard("single rank", single_rank)
    if started.status == FAIL:
        checks += [Check(n, FAIL, "single-rank run: " + started.detail) for n in CHECKS[1:5]]
        nccl = Check("nccl collective trace", FAIL, "single-rank run: " + started.detail)
    else:
        checks.append(_guard("gpu series + UUID", lambda: gpu_series(one["second"], device)))
        checks.append(
            _guard(
                "phase timing adds up",
                lambda: phase_timing(one["first"], one["second"], one["seconds"]),
            )
        )
        checks.append(_guard("allocator series", lambda: allocator(one["second"], device)))
        checks.append(
            _guard(
                "diagnose verdict",
                lambda: (
                    diagnose_verdict(one["diagnose"])
                    if one["diagnose"]
                    else Check("diagnose verdict", FAIL, one["diagnose_err"])
                ),
            )
        )

        nccl = _guard("nccl collective trace", lambda: nccl_trace(one["evidence"]))

    def two_ranks() -> Check:
        with torchrun_example([*SIZE, "--device=cuda"], work, nproc=2) as run:
            ports = run.ports()
            wait_for(
                "5 steps on both ranks",
                lambda: all(_steps(p) >= 5 for p in ports) or None,
                180,
            )
            return shared_gpu([scrape(p) for p in ports], device)

    checks.append(_guard("two ranks share the GPU", two_ranks))

    bench = subprocess.run(
        [
            sys.executable,
            str(REPO / "bench" / "trainer_overhead.py"),
            "--device=cuda",
            f"--max-seconds={bench_seconds}",
            "--fixed-seconds=10",
        ],
        capture_output=True,
        text=True,
        timeout=bench_seconds * 3 + 120,
        check=False,
    )
    (work / "bench.out").write_text(bench.stdout + bench.stderr)
    checks.append(_guard("no syncs added", lambda: syncs(bench.stdout)))
    checks.append(_guard("overhead ratio", lambda: overhead(bench.stdout)))
    checks.append(nccl)
    checks.append(
        _guard(
            "mfu in range",
            lambda: (
                mfu_check(one["diagnose"])
                if one.get("diagnose")
                else Check("mfu in range", FAIL, "no diagnose report")
            ),
        )
    )

    def copy_heavy() -> Check:
        with torchrun_example([*SIZE, *COPY, "--device=cuda"], work, nproc=1) as run:
            port = run.ports()[0]
            wait_for("10 steps", lambda: _steps(port) >= 10 or None, 180)
            report, why = _diagnose(port)
            if not report:
                return Check("transfer bound + PCIe", FAIL, why)
            return transfer_check(report, scrape(port))

    checks.append(_guard("transfer bound + PCIe", copy_heavy))

    def dataparallel() -> Check:
        import torch

        gpus = torch.cuda.device_count()
        if gpus < 2:
            return dataparallel_check({}, gpus)
        out = subprocess.run(
            [sys.executable, "-c", DATAPARALLEL_SCRIPT],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        lines = out.stdout.strip().splitlines()
        result = json.loads(lines[-1]) if lines else {}
        return (
            dataparallel_check(result, gpus)
            if result
            else Check("dataparallel devices", FAIL, out.stderr[-300:])
        )

    checks.append(_guard("dataparallel devices", dataparallel))
    if started.status == FAIL:
        checks.append(Check("profile capture", FAIL, "single-rank run: " + started.detail))
    else:
        checks.append(one["profile"])
    return checks


def _profile(port: int, evidence: dict[str, Any]) -> Check:
    """Ask the rank for a capture of PROFILE_STEPS steps, wait for it, check it."""
    url = f"http://127.0.0.1:{port}{contract.PROFILE_PATH}?id=gpucheck&steps={PROFILE_STEPS}"

    def ask() -> dict[str, Any]:
        with urllib.request.urlopen(url, timeout=10) as r:
            return dict(json.loads(r.read()))

    doc = wait_for(
        "the capture to finish",
        lambda: d if (d := ask())["state"] in ("done", "failed") else None,
        180,
    )
    trace: Any = None
    if doc.get("trace") and doc.get("traceBytes"):
        trace = json.loads(Path(doc["trace"]).read_text())
    backend = (evidence.get("collectives") or {}).get("backend")
    return profile_check(doc, trace, backend, world=1)


def _diagnose(port: int) -> tuple[dict[str, Any], str]:
    """`gpujob diagnose --json` on one rank: the report ({} if none) and why not."""
    diag = subprocess.run(
        [
            *(sys.executable, "-m", "gpujob_operator.cli", "diagnose"),
            f"127.0.0.1:{port}",
            *("--window=8", "--interval=1", "--warmup-steps=5", "--hysteresis=1"),
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    report = dict(json.loads(diag.stdout)) if diag.stdout.strip() else {}
    return report, diag.stderr[-300:] or f"exit {diag.returncode}"


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--bench-seconds", type=float, default=40.0)
    p.add_argument("--work", type=Path, help="folder for logs (default: a temporary one)")
    args = p.parse_args(argv)
    device, why = probe_device()
    if device is None or os.environ.get("GPUJOB_GPU_CHECK_FORCE_SKIP"):
        checks = skipped_all(why or "skip forced by GPUJOB_GPU_CHECK_FORCE_SKIP")
    else:
        work = args.work or Path(tempfile.mkdtemp(prefix="gpujob-gpu-check-"))
        work.mkdir(parents=True, exist_ok=True)
        checks = run_checks(device, work, args.bench_seconds)
        print(f"logs in {work}")
    print(table(checks))
    return exit_code(checks)


if __name__ == "__main__":
    sys.exit(main())
