"""A gang's pre-flight check: each node's GEMM rate and one all-reduce, before training.

``spec.runPolicy.preflight`` makes the operator start every pod's command as
``python -m gpujob_trainer.preflight [limits] -- COMMAND...``. Each pod (one process per
node, before torchrun) then:

1. times a GEMM on each of its GPUs (bf16, 4096 x 4096) or, on a CPU node, on the CPU
   (fp32, 512 x 512): the node's rate is its slowest device's;
2. joins the other nodes (at the job's rendezvous address, on the rendezvous port + 1: the
   job's pods reach each other on every port; gloo on CPUs and NCCL on GPUs), gathers every
   node's rate and times one all-reduce (64 MiB on GPUs, 4 MiB on CPUs) for its bus
   bandwidth;
3. judges (:func:`judge`): a node below ``--min-relative`` of the gang's median rate, below
   ``--min-tflops``, or, on a GPU the peak table knows, below ``--min-peak-ratio`` of its
   dense peak, fails; a bus bandwidth below ``--min-bus-gbps`` fails the gang;
4. prints one line (``gpujob preflight: ...``) and either replaces itself with COMMAND
   (``os.execvp``: the trainer keeps the pod's PID and signals) or exits with
   :data:`~gpujob_trainer.contract.PREFLIGHT_EXIT_CODE`, its last line naming the node and
   the numbers. The operator reads that exit code and line, blames the node and keeps the
   next attempt off it. A node that passes goes on to COMMAND even when another failed: the
   operator restarts the gang on that failure.

A gang whose rendezvous does not complete within ``--timeout`` seconds fails the same way,
naming no node (a peer that never came is not this node's fault).
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gpujob_trainer import contract, peaks

GEMM_GPU = 4096
GEMM_CPU = 512
ALLREDUCE_GPU_BYTES = 64 << 20
ALLREDUCE_CPU_BYTES = 4 << 20
ROUNDS = 5
ROUND_SECONDS = 0.05


@dataclass(frozen=True)
class NodeRate:
    """One node's GEMM measurement."""

    node_rank: int
    node: str
    tflops: float
    device: str
    """The slowest device ("cpu", "cuda:3") and its name."""
    peak_tflops: float | None = None


@dataclass(frozen=True)
class Limits:
    min_relative: float = 0.5
    min_tflops: float | None = None
    min_peak_ratio: float | None = 0.25
    min_bus_gbps: float | None = None


def judge(rates: Sequence[NodeRate], bus_gbps: float | None, limits: Limits) -> dict[int, str]:
    """Each failing node rank and why (``-1``: the gang's all-reduce); empty when all pass."""
    out: dict[int, str] = {}
    median = statistics.median(r.tflops for r in rates) if rates else 0.0
    for r in rates:
        why = []
        if len(rates) > 1 and median > 0 and r.tflops < limits.min_relative * median:
            why.append(
                f"{r.tflops:.3g} TFLOP/s on {r.device} is {r.tflops / median:.2f}x the gang's "
                f"median {median:.3g} (below {limits.min_relative:g}x)"
            )
        if limits.min_tflops is not None and r.tflops < limits.min_tflops:
            why.append(
                f"{r.tflops:.3g} TFLOP/s on {r.device} is below minGemmTFLOPS {limits.min_tflops:g}"
            )
        if (
            limits.min_peak_ratio is not None
            and r.peak_tflops
            and r.tflops < limits.min_peak_ratio * r.peak_tflops
        ):
            why.append(
                f"{r.tflops:.3g} TFLOP/s on {r.device} is {r.tflops / r.peak_tflops:.2f}x its "
                f"dense peak {r.peak_tflops:.3g} (below {limits.min_peak_ratio:g}x)"
            )
        if why:
            out[r.node_rank] = "GEMM " + "; ".join(why)
    if bus_gbps is not None and limits.min_bus_gbps is not None and bus_gbps < limits.min_bus_gbps:
        out[-1] = (
            f"all-reduce bus bandwidth {bus_gbps:.3g} GB/s is below minBusBandwidthGBps "
            f"{limits.min_bus_gbps:g}"
        )
    return out


def gemm_tflops(torch: Any, device: Any, n: int, dtype: Any) -> float:
    """TFLOP/s of n x n x n matmuls on ``device``: the best of :data:`ROUNDS` rounds of at
    least :data:`ROUND_SECONDS` each, after a warm-up (a round that a preemption hit does not
    count; a single short matmul would measure the scheduler, not the device)."""
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda *_: None)
    torch.mm(a, b)
    sync(device)
    best = 0.0
    for _ in range(ROUNDS):
        done = 0
        began = time.perf_counter()
        while True:
            torch.mm(a, b)
            done += 1
            if done % 4 == 0:
                sync(device)
                took = time.perf_counter() - began
                if took >= ROUND_SECONDS:
                    break
        best = max(best, 2 * n**3 * done / took / 1e12)
    return best


def measure_node(torch: Any, node_rank: int, node: str) -> NodeRate:
    """The node's rate: its slowest GPU's, or the CPU's."""
    if torch.cuda.is_available() and torch.cuda.device_count() > 0:
        worst: NodeRate | None = None
        for i in range(torch.cuda.device_count()):
            dev = torch.device("cuda", i)
            name = torch.cuda.get_device_name(i)
            tflops = gemm_tflops(torch, dev, GEMM_GPU, torch.bfloat16)
            peak, _ = peaks.lookup(name, "bf16")
            rate = NodeRate(node_rank, node, tflops, f"cuda:{i} ({name})",
                            peak / peaks.TERA if peak else None)  # fmt: skip
            if worst is None or rate.tflops < worst.tflops:
                worst = rate
        assert worst is not None
        return worst
    tflops = gemm_tflops(torch, torch.device("cpu"), GEMM_CPU, torch.float32)
    return NodeRate(node_rank, node, tflops, "cpu")


def allreduce_gbps(torch: Any, dist: Any, world: int, cuda: bool) -> float:
    """Bus bandwidth of one all-reduce (NCCL's busbw: 2(n-1)/n x bytes / time), in GB/s."""
    size = ALLREDUCE_GPU_BYTES if cuda else ALLREDUCE_CPU_BYTES
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    t = torch.ones(size // 4, dtype=torch.float32, device=device)
    dist.all_reduce(t)
    if cuda:
        torch.cuda.synchronize()
    began = time.perf_counter()
    dist.all_reduce(t)
    if cuda:
        torch.cuda.synchronize()
    took = max(time.perf_counter() - began, 1e-9)
    return 2 * (world - 1) / world * size / took / 1e9


def run(limits: Limits, timeout: float, port: int | None = None) -> tuple[int, str]:
    """Measure, gather, judge: (exit code, the line to print last)."""
    import torch
    import torch.distributed as dist

    env = os.environ
    node_rank = int(env.get("PET_NODE_RANK") or env.get("NODE_RANK") or 0)
    world = int(env.get("PET_NNODES") or 1)
    node = env.get(contract.ENV_NODE_NAME) or "?"
    mine = measure_node(torch, node_rank, node)
    rates = [mine]
    bus = None
    cuda = torch.cuda.is_available() and torch.cuda.device_count() > 0
    if world > 1:
        addr = env.get("PET_MASTER_ADDR") or env.get("MASTER_ADDR") or "127.0.0.1"
        # Not the rendezvous port itself (default: one above it): torchrun binds that one
        # next, and a peer's torchrun must never reach this check's store while it stands.
        master = int(env.get("PET_MASTER_PORT") or env.get("MASTER_PORT") or 29500)
        port = port or master + 1
        if cuda:
            torch.cuda.set_device(0)
        try:
            dist.init_process_group(
                "nccl" if cuda else "gloo",
                init_method=f"tcp://{addr}:{port}",
                rank=node_rank,
                world_size=world,
                timeout=datetime.timedelta(seconds=timeout),
            )
        except Exception as e:  # the gang never assembled: no node is to blame
            return contract.PREFLIGHT_EXIT_CODE, (
                f"{contract.PREFLIGHT_MARK} FAILED for the gang: the {world} nodes did not "
                f"meet within {timeout:g}s ({type(e).__name__}: {e})"
            )
        try:
            gathered: list[Any] = [None] * world
            dist.all_gather_object(gathered, mine)
            rates = [r for r in gathered if isinstance(r, NodeRate)]
            bus = allreduce_gbps(torch, dist, world, cuda)
        except Exception as e:  # a peer gone, a fabric NCCL cannot use: the gang's failure
            return contract.PREFLIGHT_EXIT_CODE, (
                f"{contract.PREFLIGHT_MARK} FAILED for the gang: the nodes met but could not "
                f"exchange ({type(e).__name__}: {e})"
            )
        finally:
            dist.destroy_process_group()
    failed = judge(rates, bus, limits)
    median = statistics.median(r.tflops for r in rates)
    summary = (
        f"GEMM {mine.tflops:.3g} TFLOP/s on {mine.device} (gang median {median:.3g}, "
        f"{len(rates)} nodes)" + (f", all-reduce {bus:.3g} GB/s bus bandwidth" if bus else "")
    )
    if node_rank in failed:
        return contract.PREFLIGHT_EXIT_CODE, (
            f"{contract.PREFLIGHT_MARK} FAILED on node {node} (node rank {node_rank}): "
            f"{failed[node_rank]}"
        )
    if -1 in failed:
        return contract.PREFLIGHT_EXIT_CODE, (
            f"{contract.PREFLIGHT_MARK} FAILED for the gang: {failed[-1]}"
        )
    others = sorted(k for k in failed if k >= 0)
    note = f"; node ranks {others} failed theirs" if others else ""
    return (
        0,
        f"{contract.PREFLIGHT_MARK}: node {node} (node rank {node_rank}) passed: {summary}{note}",
    )


def parse(argv: Sequence[str]) -> tuple[Limits, float, int | None, list[str]]:
    p = argparse.ArgumentParser(prog="python -m gpujob_trainer.preflight")
    p.add_argument("--min-relative", type=float, default=0.5)
    p.add_argument("--min-tflops", type=float, default=None)
    p.add_argument("--min-peak-ratio", type=float, default=0.25)
    p.add_argument("--min-bus-gbps", type=float, default=None)
    p.add_argument("--timeout", type=float, default=600.0)
    p.add_argument("--port", type=int, default=None, help="where the nodes meet (rendezvous + 1)")
    p.add_argument("command", nargs=argparse.REMAINDER)
    a = p.parse_args(list(argv))
    command = a.command[1:] if a.command[:1] == ["--"] else a.command
    if not command:
        p.error("a command to run after the check is required (after --)")
    limits = Limits(a.min_relative, a.min_tflops, a.min_peak_ratio, a.min_bus_gbps)
    return limits, a.timeout, a.port, command


def main(argv: Sequence[str] | None = None) -> int:
    limits, timeout, port, command = parse(sys.argv[1:] if argv is None else argv)
    began = time.monotonic()
    code, line = run(limits, timeout, port)
    print(f"{line} ({time.monotonic() - began:.1f}s)", file=sys.stderr, flush=True)
    if code != 0:
        return code
    sys.stdout.flush()
    os.execvp(command[0], command)
    return 0  # not reached


if __name__ == "__main__":
    raise SystemExit(main())
