"""Overhead of gpujob_trainer instrumentation on a training step, resolved to 0.5%.

Three measurements, each with a 95% confidence interval:

1. bookkeeping: the tracker calls one instrumented step makes (nine phase marks, the step's
   attribution, a loss log), driven directly with no model: the library's own Python cost;
2. fixed cost: a near-empty DDP step (one-sample, 8-wide model), bare and instrumented,
   alternated step by step many thousand times: what the hooks add to a real step, in wall
   and in process CPU time (CPU time is what a loaded machine's preemptions do not inflate);
3. ratio: the same loop at realistic ~10 ms steps (CPU) or the batch giving that (CUDA),
   bare and instrumented alternated pair by pair until the interval on the median
   instrumented/bare ratio is narrower than `--ci-width` (default 0.005, the target's size)
   or `--max-seconds` runs out.

Alternating single steps makes machine load hit both sides alike; medians with distribution-
free (order-statistic) intervals shrug off the preempted steps. With a GPU it also counts
host-device synchronisations per step through `torch.cuda.set_sync_debug_mode` and shows the
instrumentation adds none. The last line is the instrumented/bare wall-time ratio at the
first target step time (target <= 1.005 at 10 ms).

    python bench/trainer_overhead.py [--device cpu|cuda] [--targets 0.01 0.1] [--max-seconds 90]
                                     [--by-part]
"""

from __future__ import annotations

import argparse
import copy
import math
import statistics
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from gpujob_trainer import contract
from gpujob_trainer.env import RankInfo
from gpujob_trainer.tracker import Tracker

HIDDEN, LAYERS, CLASSES = 256, 4, 10
PARTS: frozenset[str] = frozenset({"model", "optimizer", "loader", "log"})
"""What the library instruments: model hooks (forward, backward, comm wait), the optimizer
step hooks that end a step, the DataLoader wrapper, and the loss log."""
Z95 = 1.96


def make_model(device: torch.device, width: int = HIDDEN, layers: int = LAYERS) -> nn.Module:
    torch.manual_seed(0)
    body: list[nn.Module] = []
    for _ in range(layers):
        body += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*body, nn.Linear(width, CLASSES)).to(device)


def median_ci(values: Sequence[float]) -> tuple[float, float, float]:
    """Median and its distribution-free 95% interval (order statistics of a sign test)."""
    v = sorted(values)
    n = len(v)
    k = max(0, math.floor((n - Z95 * math.sqrt(n)) / 2) - 1)
    return statistics.median(v), v[k], v[n - 1 - k]


class Loop:
    """One model + optimizer + a ring of ready batches; `step()` does one training step."""

    def __init__(
        self,
        base: nn.Module,
        batch: int,
        device: torch.device,
        tracker: Tracker | None,
        parts: frozenset[str] = PARTS,
    ):
        self.device = device
        model = DDP(
            copy.deepcopy(base), device_ids=[device.index] if device.type == "cuda" else None
        )
        use = parts if tracker is not None else frozenset()
        self.model = tracker.wrap_model(model) if tracker is not None and "model" in use else model
        opt = torch.optim.SGD(self.model.parameters(), lr=1e-3)
        self.opt = (
            tracker.watch_optimizer(opt) if tracker is not None and "optimizer" in use else opt
        )
        self.tracker = tracker
        self.parts = use
        g = torch.Generator().manual_seed(1)
        linears = [m for m in base.modules() if isinstance(m, nn.Linear)]
        width, classes = linears[0].in_features, linears[-1].out_features
        batches = [
            (
                torch.randn(batch, width, generator=g),
                torch.randint(0, classes, (batch,), generator=g),
            )
            for _ in range(4)
        ]
        self.batches = [(x.to(device), y.to(device)) for x, y in batches]
        self._source = self._endless()

    def _endless(self) -> Any:
        def ring() -> Any:
            i = 0
            while True:
                yield self.batches[i % len(self.batches)]
                i += 1

        if self.tracker is not None and "loader" in self.parts:
            return iter(self.tracker.wrap_loader(ring()))
        return iter(ring())

    def step(self) -> None:
        x, y = next(self._source)
        loss = nn.functional.cross_entropy(self.model(x), y)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()
        if self.tracker is not None and "log" in self.parts:
            self.tracker.log(loss=loss)

    def run(self, n: int) -> None:
        for _ in range(n):
            self.step()


@dataclass
class Pairs:
    """Per-pair (bare, instrumented) block times on two clocks."""

    wall: list[tuple[float, float]]
    cpu: list[tuple[float, float]]
    seconds: float


def alternate(
    bare: Loop,
    inst: Loop,
    block: int,
    *,
    min_pairs: int,
    max_pairs: int,
    max_seconds: float,
    enough: Callable[[Pairs], bool] | None = None,
    sync: Callable[[], None] = lambda: None,
) -> Pairs:
    """Time `block` steps bare then instrumented (order swapped every pair) until `enough`."""
    out = Pairs([], [], 0.0)
    start = time.perf_counter()
    wall, cpu = time.perf_counter, time.process_time
    for i in range(max_pairs):
        got: dict[str, tuple[float, float]] = {}
        for name, loop in (("b", bare), ("i", inst)) if i % 2 == 0 else (("i", inst), ("b", bare)):
            sync()
            w0, c0 = wall(), cpu()
            loop.run(block)
            sync()
            got[name] = (wall() - w0, cpu() - c0)
        out.wall.append((got["b"][0] / block, got["i"][0] / block))
        out.cpu.append((got["b"][1] / block, got["i"][1] / block))
        if inst.tracker is not None and i % 500 == 499:
            inst.tracker.snapshot()  # what a scrape does, outside the timed blocks
        out.seconds = time.perf_counter() - start
        checkpoint = i + 1 >= min_pairs and (i + 1) % 100 == 0
        if checkpoint and (out.seconds > max_seconds or (enough is not None and enough(out))):
            break
    return out


def bookkeeping(reps: int) -> dict[str, float]:
    """The tracker's own cost per step: the calls one instrumented DDP step makes."""
    tracker = Tracker(rank=RankInfo(), hook_optimizers=False)
    opt = object()
    tracker._step_optimizers.add(id(opt))
    d, f, b, c = (
        contract.PHASE_DATA_WAIT,
        contract.PHASE_FORWARD,
        contract.PHASE_BACKWARD,
        contract.PHASE_COMM_WAIT,
    )

    def one_step() -> None:
        tracker._enter(d)
        tracker._exit(d)
        tracker.add_samples(32)
        tracker._enter(f)
        tracker._exit(f)
        tracker._enter(b)
        tracker._switch(b, c)
        tracker._exit(c)
        tracker._optimizer_begin(opt, watched=True)
        tracker._optimizer_end(opt, watched=True)
        tracker.log(loss=1.0)

    walls, cpus = [], []
    chunk = max(1, reps // 20)
    for _ in range(20):
        w0, c0 = time.perf_counter(), time.process_time()
        for _ in range(chunk):
            one_step()
        walls.append((time.perf_counter() - w0) / chunk)
        cpus.append((time.process_time() - c0) / chunk)
    assert tracker.snapshot().steps == 20 * chunk
    tracker.close()
    return {"wall_us": 1e6 * min(walls), "cpu_us": 1e6 * statistics.median(cpus)}


def fixed_cost(device: torch.device, max_seconds: float) -> dict[str, Any]:
    """Added seconds per step on a near-empty step, alternated step by step."""
    tiny = make_model(device, width=8, layers=1)
    tracker = Tracker(rank=RankInfo(), hook_optimizers=False)
    bare, inst = Loop(tiny, 1, device, None), Loop(tiny, 1, device, tracker)
    bare.run(50)
    inst.run(50)
    block = 10 if device.type == "cuda" else 1
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    pairs = alternate(
        bare,
        inst,
        block,
        min_pairs=2000,
        max_pairs=20000,
        max_seconds=max_seconds,
        sync=sync,
    )
    tracker.close()
    out: dict[str, Any] = {"pairs": len(pairs.wall)}
    for name, values in (("wall", pairs.wall), ("cpu", pairs.cpu)):
        added = [1e6 * (i - b) for b, i in values]
        out[name] = median_ci(added)
        out[name + "_bare_us"] = 1e6 * statistics.median(b for b, _ in values)
    return out


def calibrate(base: nn.Module, device: torch.device, target: float) -> int:
    """A batch size whose bare step takes about `target` seconds (CPU time on CPU)."""
    batch = 64
    clock = time.process_time if device.type == "cpu" else time.perf_counter
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    for _ in range(4):
        loop = Loop(base, batch, device, None)
        loop.run(3)
        sync()
        t0 = clock()
        loop.run(10)
        sync()
        per_step = (clock() - t0) / 10
        batch = max(1, round(batch * target / per_step))
    return batch


def ratio(
    base: nn.Module,
    device: torch.device,
    batch: int,
    ci_width: float,
    max_seconds: float,
    parts: frozenset[str] = PARTS,
) -> dict[str, Any]:
    tracker = Tracker(rank=RankInfo(), hook_optimizers=False)
    bare, inst = Loop(base, batch, device, None), Loop(base, batch, device, tracker, parts)
    bare.run(5)
    inst.run(5)
    cuda = device.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)

    def enough(p: Pairs) -> bool:
        _, lo, hi = median_ci([i / b for b, i in p.wall])
        return hi - lo < ci_width

    pairs = alternate(
        bare,
        inst,
        5 if cuda else 1,
        min_pairs=200,
        max_pairs=1_000_000,
        max_seconds=max_seconds,
        enough=enough,
        sync=sync,
    )
    tracker.close()
    out: dict[str, Any] = {"pairs": len(pairs.wall), "seconds": pairs.seconds}
    out["bare_ms"] = 1000 * statistics.median(b for b, _ in pairs.wall)
    out["wall"] = median_ci([i / b for b, i in pairs.wall])
    if not cuda:  # on CUDA the host's CPU time measures launches, not the step
        out["cpu"] = median_ci([i / b for b, i in pairs.cpu])
    return out


def count_syncs(base: nn.Module, device: torch.device, steps: int) -> dict[str, float]:
    """Synchronising CUDA calls per step, bare vs instrumented (sync debug mode warnings)."""
    tracker = Tracker(rank=RankInfo(), hook_optimizers=False)
    out: dict[str, float] = {}
    for name, loop in (
        ("bare", Loop(base, 256, device, None)),
        ("instrumented", Loop(base, 256, device, tracker)),
    ):
        loop.run(3)
        torch.cuda.synchronize()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                for _ in range(steps):
                    loop.step()
                    if loop.tracker is not None:
                        loop.tracker.snapshot()  # a scrape mid-run must not sync either
            finally:
                torch.cuda.set_sync_debug_mode(0)
        out[name] = sum("synchroniz" in str(w.message) for w in caught) / steps
    torch.cuda.synchronize()
    tracker.close()
    out["added"] = out["instrumented"] - out["bare"]
    return out


def _ci(name: str, m: tuple[float, float, float], fmt: str) -> str:
    return f"{name} {m[0]:{fmt}} (95% CI {m[1]:{fmt}}..{m[2]:{fmt}})"


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--targets", type=float, nargs="+", default=[0.01], help="step seconds")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    p.add_argument("--ci-width", type=float, default=0.005, help="stop when the CI is narrower")
    p.add_argument("--max-seconds", type=float, default=90.0, help="time cap per ratio measurement")
    p.add_argument("--fixed-seconds", type=float, default=20.0, help="time cap, fixed cost")
    p.add_argument(
        "--by-part",
        action="store_true",
        help="also the ratio with one instrumented part at a time (where the cost lies), and "
        "an uninstrumented A/A control that shows the bench's own bias",
    )
    args = p.parse_args(argv)
    use_cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    device = torch.device("cuda", 0) if use_cuda else torch.device("cpu")
    torch.set_num_threads(1)
    dist.init_process_group(
        "nccl" if use_cuda else "gloo", store=dist.HashStore(), rank=0, world_size=1
    )
    try:
        print(f"device={device} torch={torch.__version__} threads={torch.get_num_threads()}")
        k = bookkeeping(100_000)
        print(
            f"bookkeeping (tracker calls of one step, no model): {k['wall_us']:.1f} us wall, "
            f"{k['cpu_us']:.1f} us CPU per step"
        )
        f = fixed_cost(device, args.fixed_seconds)
        print(
            f"fixed cost on a near-empty step ({f['pairs']} alternated pairs; bare "
            f"{f['wall_bare_us']:.0f} us): {_ci('added wall us/step', f['wall'], '.1f')}; "
            f"{_ci('added CPU us/step', f['cpu'], '.1f')}"
        )
        added = f["cpu" if not use_cuda else "wall"]
        base = make_model(device)
        last = math.nan
        for target in args.targets:
            predicted = 1 + added[0] / (1e6 * target)
            batch = calibrate(base, device, target)
            r = ratio(base, device, batch, args.ci_width, args.max_seconds)
            lo, hi = r["wall"][1], r["wall"][2]
            verdict = "resolved" if hi - lo < args.ci_width else "NOT resolved (time cap)"
            line = (
                f"step ~{target * 1000:.0f} ms (batch {batch}, bare {r['bare_ms']:.2f} ms, "
                f"{r['pairs']} alternated pairs in {r['seconds']:.0f} s): "
                f"{_ci('instrumented/bare wall', r['wall'], '.4f')}"
            )
            if "cpu" in r:
                line += f"; {_ci('CPU', r['cpu'], '.4f')}"
            line += (
                f"; CI width {hi - lo:.4f} {verdict}; from the fixed cost: {predicted:.4f}; "
                f"target <= 1.005: {'met' if hi <= 1.005 else 'not shown'}"
            )
            print(line)
            if args.by_part:
                for part in (*sorted(PARTS), "none (A/A control)"):
                    pr = ratio(
                        base,
                        device,
                        batch,
                        args.ci_width,
                        args.max_seconds / 3,
                        frozenset({part}) & PARTS,
                    )
                    print(f"  only {part}: {_ci('wall', pr['wall'], '.4f')}")
            if math.isnan(last):
                last = r["wall"][0]
        if use_cuda:
            s = count_syncs(base, device, steps=50)
            print(
                f"CUDA syncs per step: bare {s['bare']:.2f}, instrumented {s['instrumented']:.2f}, "
                f"added {s['added']:.2f}"
            )
        else:
            print("CUDA sync count: skipped (no CUDA device)")
        print(f"{last:.4f}")
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
