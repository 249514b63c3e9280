"""Overhead of gpujob_trainer instrumentation on a training step, resolved to 0.5%.

Three measurements, each with a 95% confidence interval:

1. bookkeeping: the tracker calls one instrumented step makes (nine phase marks, the step's
   attribution, a loss log), driven directly with no model: the library's own Python cost;
2. fixed cost: a near-empty DDP step (one-sample, 8-wide model), bare and instrumented, many
   thousand rounds: what the hooks add to a real step, in wall and in process CPU time (CPU
   time is what a loaded machine's preemptions do not inflate);
3. ratio: the same loop at realistic ~10 ms steps (CPU) or the batch giving that (CUDA),
   bare and instrumented, in blocks of `--block` steps (default 4), round after round until
   the interval on the median instrumented/bare ratio is narrower than `--ci-width`
   (default 0.005, the target's size) or `--max-seconds` runs out. Each block follows a
   fresh attach and one untimed step: `--block 1` times the second step after
   instrumenting, every time, with the new hook objects still cold in the caches.

One model, one optimizer and one set of batches serve every variant: between timed blocks
the instrumentation is attached (a fresh tracker wraps the model, the optimizer and the
loader) or removed (`Tracker.close()`), so a variant differs from bare only by the library.
Two copies of a model differ by their memory layout alone by up to 1% at 10 ms steps, more
than the target, which is why the bench does not compare copies. The variants run in a
rotating order each round, so machine load and cache warmth hit them alike; medians with
distribution-free (order-statistic) intervals shrug off the preempted steps. `--by-part`
adds each instrumented part alone and an A/A control (bare against bare), which shows the
bench's own bias. With a GPU it also counts host-device synchronisations per step through
`torch.cuda.set_sync_debug_mode` and shows the instrumentation adds none. The last line is
the instrumented/bare wall-time ratio at the first target step time, plus the cost of
attributing the steps at scrape time (target <= 1.005 at 10 ms).

    python bench/trainer_overhead.py [--device cpu|cuda] [--targets 0.01 0.1] [--max-seconds 90]
                                     [--by-part]
"""

from __future__ import annotations

import argparse
import copy
import itertools
import math
import statistics
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from gpujob_trainer import contract
from gpujob_trainer.env import RankInfo
from gpujob_trainer.timing import CudaEventClock
from gpujob_trainer.tracker import Tracker

HIDDEN, LAYERS, CLASSES = 256, 4, 10
PARTS: frozenset[str] = frozenset({"model", "optimizer", "loader", "log"})
"""What the library instruments: model hooks (forward, backward, comm wait), the optimizer
step hooks that end a step, the DataLoader wrapper, and the loss log."""
BARE, ALL, CONTROL = "bare", "instrumented", "A/A control"
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
    """One DDP model + optimizer + a ring of ready batches; `step()` does one training step.

    `attach(parts)` instruments it with a fresh tracker, `detach()` removes that again.
    """

    def __init__(self, base: nn.Module, batch: int, device: torch.device):
        self.device = device
        self.model = DDP(
            copy.deepcopy(base), device_ids=[device.index] if device.type == "cuda" else None
        )
        self.opt = torch.optim.SGD(self.model.parameters(), lr=1e-3)
        g = torch.Generator().manual_seed(1)
        linears = [m for m in base.modules() if isinstance(m, nn.Linear)]
        width, classes = linears[0].in_features, linears[-1].out_features
        self.batches = [
            (
                torch.randn(batch, width, generator=g).to(device),
                torch.randint(0, classes, (batch,), generator=g).to(device),
            )
            for _ in range(4)
        ]
        self._ring: Iterator[tuple[torch.Tensor, torch.Tensor]] = itertools.cycle(self.batches)
        self._source = self._ring
        self.tracker: Tracker | None = None
        self._log = False
        # One event pool for every tracker attached here: a fresh one would create CUDA events
        # inside the timed blocks.
        self._clock = CudaEventClock() if device.type == "cuda" else None

    def attach(self, parts: frozenset[str]) -> Tracker:
        self.detach()
        # A process reads its precision and counts its model's FLOPs once, in its first
        # steps; a fresh tracker per block would do it in every block, so each starts as a
        # tracker past that step (`flop_count_cost` measures the step that does it).
        tracker = Tracker(
            rank=RankInfo(), hook_optimizers=False, clock=self._clock, measure_flops=False
        )
        tracker._flops_countdown = 0
        if "model" in parts:
            tracker.wrap_model(self.model)
        if "optimizer" in parts:
            # What `wrap_model` installs in the README's loop (`hook_optimizers=True`): the
            # global step hooks, which see every optimizer in the process.
            tracker._install_optimizer_hooks()
        if "loader" in parts:  # the wrapper also moves each batch (the h2d phase)
            self._source = iter(tracker.wrap_loader(self._ring, device=self.device))
        self._log = "log" in parts
        self.tracker = tracker
        return tracker

    def detach(self) -> None:
        if self.tracker is not None:
            self.tracker.close()
        self.tracker, self._source, self._log = None, self._ring, False

    def step(self) -> None:
        x, y = next(self._source)
        if self._source is self._ring:  # bare: the loop's own copy, as the wrapper makes it
            x, y = x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)
        loss = nn.functional.cross_entropy(self.model(x), y)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()
        if self._log:
            self.tracker.log(loss=loss)  # type: ignore[union-attr]

    def run(self, n: int) -> None:
        for _ in range(n):
            self.step()


@dataclass
class Rounds:
    """Per-round block times of each variant, on two clocks."""

    wall: dict[str, list[float]] = field(default_factory=dict)
    cpu: dict[str, list[float]] = field(default_factory=dict)
    seconds: float = 0.0

    def ratios(self, variant: str, clock: str = "wall") -> list[float]:
        times = self.wall if clock == "wall" else self.cpu
        return [v / b for b, v in zip(times[BARE], times[variant], strict=True)]

    def added(self, variant: str, clock: str = "wall") -> list[float]:
        times = self.wall if clock == "wall" else self.cpu
        return [v - b for b, v in zip(times[BARE], times[variant], strict=True)]


def rotate(
    loop: Loop,
    variants: dict[str, frozenset[str] | None],
    block: int,
    *,
    min_rounds: int,
    max_rounds: int,
    max_seconds: float,
    enough: Callable[[Rounds], bool] | None = None,
    sync: Callable[[], None] = lambda: None,
    warmup: int = 1,
) -> Rounds:
    """Time `block` steps of each variant per round, in a rotating order, until `enough`.

    A variant is the set of instrumented parts, or None for bare. Attaching and detaching
    happen outside the timed blocks; so does a scrape-like snapshot after each block.
    """
    names = list(variants)
    out = Rounds({n: [] for n in names}, {n: [] for n in names})
    start = time.perf_counter()
    wall, cpu = time.perf_counter, time.process_time
    for i in range(max_rounds):
        for j in range(len(names)):
            name = names[(i + j) % len(names)]
            parts = variants[name]
            if parts is None:
                loop.detach()
            else:
                loop.attach(parts)
            loop.run(warmup)  # untimed: the variant's code paths as warm as in a run
            sync()
            w0, c0 = wall(), cpu()
            loop.run(block)
            sync()
            w1, c1 = wall(), cpu()
            if loop.tracker is not None:
                loop.tracker.snapshot()  # what a scrape does, outside the timed block
            out.wall[name].append((w1 - w0) / block)
            out.cpu[name].append((c1 - c0) / block)
        out.seconds = time.perf_counter() - start
        checkpoint = i + 1 >= min_rounds and (i + 1) % 100 == 0
        if checkpoint and (out.seconds > max_seconds or (enough is not None and enough(out))):
            break
    loop.detach()
    return out


def bookkeeping(reps: int) -> dict[str, float]:
    """The tracker's own cost per step: the calls the hooks of one DDP step make, in order."""
    tracker = Tracker(rank=RankInfo(), hook_optimizers=False)
    d, f, b, c, o = (
        contract.PHASE_DATA_WAIT,
        contract.PHASE_FORWARD,
        contract.PHASE_BACKWARD,
        contract.PHASE_COMM_WAIT,
        contract.PHASE_OPTIMIZER,
    )

    def one_step() -> None:
        tracker._enter(d)  # loader
        tracker._exit(d)
        tracker._samples += 32
        tracker._enter(f)  # forward hooks
        tracker._exit(f)
        tracker._enter(b)  # Tensor.backward, then the split callback, then its return
        tracker._switch(b, c)
        tracker._exit(c)
        tracker._enter(o)  # optimizer hooks
        tracker._pop(o)
        tracker.end_step()
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
    # Attribution happens at scrape time (or every few thousand steps without scrapes): what
    # a scrape costs per step it attributes, on the same training thread's GIL.
    scrapes = []
    for _ in range(5):
        for _ in range(1000):
            one_step()
        t0 = time.process_time()
        tracker.snapshot()
        scrapes.append((time.process_time() - t0) / 1000)
    tracker.close()
    return {
        "wall_us": 1e6 * min(walls),
        "cpu_us": 1e6 * statistics.median(cpus),
        "scrape_us": 1e6 * statistics.median(scrapes),
    }


def _sync(device: torch.device) -> Callable[[], None]:
    return torch.cuda.synchronize if device.type == "cuda" else (lambda: None)


def fixed_cost(device: torch.device, max_seconds: float) -> dict[str, Any]:
    """Added seconds per step on a near-empty step, bare and instrumented in turn."""
    loop = Loop(make_model(device, width=8, layers=1), 1, device)
    loop.run(50)
    rounds = rotate(
        loop,
        {BARE: None, ALL: PARTS},
        10 if device.type == "cuda" else 1,
        min_rounds=2000,
        max_rounds=20000,
        max_seconds=max_seconds,
        sync=_sync(device),
    )
    out: dict[str, Any] = {"rounds": len(rounds.wall[BARE])}
    for clock in ("wall", "cpu"):
        out[clock] = median_ci([1e6 * a for a in rounds.added(ALL, clock)])
        out[clock + "_bare_us"] = 1e6 * statistics.median(getattr(rounds, clock)[BARE])
    return out


def next_batch(seen: Sequence[tuple[int, float]], target: float, grow: int = 64) -> int:
    """The batch to try next for a `target`-second step, from (batch, seconds) seen so far.

    A step is a fixed cost (launches, Python) plus a per-sample cost: proportional scaling
    alone crawls when the fixed cost dominates (a GPU step is launch-bound at small batches),
    so two points give the line to solve. Growth is capped per try.
    """
    batch, seconds = seen[-1]
    guess = batch * target / seconds
    if len(seen) >= 2:
        (b1, t1), (b2, t2) = seen[-2], seen[-1]
        if b2 != b1 and (t2 - t1) / (b2 - b1) > 0:
            guess = b2 + (target - t2) * (b2 - b1) / (t2 - t1)
    return max(1, round(min(guess, batch * grow)))


def search_batch(
    measure: Callable[[int], float], target: float, tries: int = 12
) -> tuple[int, float]:
    """The (batch, seconds) closest to a `target`-second step among up to `tries` measured,
    stopping once one is within 5%."""
    seen = [(64, measure(64))]
    while len(seen) < tries and abs(seen[-1][1] / target - 1) >= 0.05:
        batch = next_batch(seen, target)
        seen.append((batch, measure(batch)))
    return min(seen, key=lambda s: abs(s[1] / target - 1))


def calibrate(base: nn.Module, device: torch.device, target: float) -> int:
    """A batch size whose bare step takes about `target` seconds of wall time, the clock the
    ratio is taken on (process CPU time counts DDP's and gloo's other threads too: a "10 ms"
    step by that clock ran 6-12 ms). Each size is timed three times, the median kept, so
    one preempted measurement does not halve or double the step the ratio is taken at."""
    sync = _sync(device)

    def measure(batch: int) -> float:
        loop = Loop(base, batch, device)
        loop.run(3)
        times = []
        for _ in range(3):
            sync()
            t0 = time.perf_counter()
            loop.run(10)
            sync()
            times.append((time.perf_counter() - t0) / 10)
        return statistics.median(times)

    return search_batch(measure, target)[0]


def ratio(
    base: nn.Module,
    device: torch.device,
    batch: int,
    ci_width: float,
    max_seconds: float,
    by_part: bool = False,
    block: int = 4,
) -> dict[str, Any]:
    """Instrumented/bare step time (and, `by_part`, each part alone and an A/A control)."""
    variants: dict[str, frozenset[str] | None] = {BARE: None, ALL: PARTS}
    if by_part:
        variants |= {part: frozenset({part}) for part in sorted(PARTS)}
        variants[CONTROL] = None
    loop = Loop(base, batch, device)
    loop.run(5)
    cuda = device.type == "cuda"

    def enough(r: Rounds) -> bool:
        _, lo, hi = median_ci(r.ratios(ALL))
        return hi - lo < ci_width

    rounds = rotate(
        loop,
        variants,
        block,
        min_rounds=200,
        max_rounds=1_000_000,
        max_seconds=max_seconds,
        enough=enough,
        sync=_sync(device),
    )
    out: dict[str, Any] = {"rounds": len(rounds.wall[BARE]), "seconds": rounds.seconds}
    out["block"] = block
    out["bare_ms"] = 1000 * statistics.median(rounds.wall[BARE])
    for name in variants:
        if name != BARE:
            out[name] = median_ci(rounds.ratios(name))
    if not cuda:  # on CUDA the host's CPU time measures launches, not the step
        out["cpu"] = median_ci(rounds.ratios(ALL, "cpu"))
    return out


def count_syncs(base: nn.Module, device: torch.device, steps: int) -> dict[str, float]:
    """Synchronising CUDA calls per step, bare vs instrumented (sync debug mode warnings)."""
    loop = Loop(base, 256, device)
    out: dict[str, float] = {}
    for name, parts in (("bare", None), ("instrumented", PARTS)):
        tracker = loop.attach(parts) if parts is not None else None
        if tracker is None:
            loop.detach()
        loop.run(3)
        torch.cuda.synchronize()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                for _ in range(steps):
                    loop.step()
                    if tracker is not None:
                        tracker.snapshot()  # a scrape mid-run must not sync either
            finally:
                torch.cuda.set_sync_debug_mode(0)
        out[name] = sum("synchroniz" in str(w.message) for w in caught) / steps
    torch.cuda.synchronize()
    loop.detach()
    out["added"] = out["instrumented"] - out["bare"]
    return out


def flop_count_cost(base: nn.Module, device: torch.device, steps: int = 12) -> dict[str, float]:
    """What counting the model's FLOPs costs, once per process: the counted step's time
    against the median of the others (a fresh tracker that counts, as `init()` makes)."""
    loop = Loop(base, 256, device)
    tracker = Tracker(rank=RankInfo(), hook_optimizers=False, clock=loop._clock)
    tracker.wrap_model(loop.model)
    times = []
    sync = _sync(device)
    for _ in range(steps):
        sync()
        t0 = time.perf_counter()
        loop.step()
        sync()
        times.append(time.perf_counter() - t0)
    counted = tracker.flops.per_pass is not None
    tracker.close()
    loop.detach()
    at = 2  # the third forward is counted (flops.MEASURE_AT)
    others = statistics.median(t for i, t in enumerate(times) if i not in (0, at))
    return {"counted_ms": 1000 * times[at], "others_ms": 1000 * others, "ok": float(counted)}


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
        "--block",
        type=int,
        default=4,
        help="steps per timed block at the realistic step: each block follows a fresh attach "
        "and one untimed step, so 1 times the first steps after instrumenting",
    )
    p.add_argument(
        "--by-part",
        action="store_true",
        help="also each instrumented part alone (where the cost lies), and an A/A control "
        "(bare against bare) that shows the bench's own bias",
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
            f"{k['cpu_us']:.1f} us CPU per step; attribution at scrape time "
            f"{k['scrape_us']:.1f} us CPU per step attributed"
        )
        f = fixed_cost(device, args.fixed_seconds)
        print(
            f"fixed cost on a near-empty step ({f['rounds']} rounds; bare "
            f"{f['wall_bare_us']:.0f} us): {_ci('added wall us/step', f['wall'], '.1f')}; "
            f"{_ci('added CPU us/step', f['cpu'], '.1f')}"
        )
        added = f["cpu" if not use_cuda else "wall"]
        base = make_model(device)
        last = math.nan
        for target in args.targets:
            predicted = 1 + added[0] / (1e6 * target)
            batch = calibrate(base, device, target)
            r = ratio(
                base, device, batch, args.ci_width, args.max_seconds, args.by_part, args.block
            )
            lo, hi = r[ALL][1], r[ALL][2]
            verdict = "resolved" if hi - lo < args.ci_width else "NOT resolved (time cap)"
            line = (
                f"step ~{target * 1000:.0f} ms (batch {batch}, bare {r['bare_ms']:.2f} ms, "
                f"{r['rounds']} rounds of {r['block']} steps in {r['seconds']:.0f} s): "
                f"{_ci('instrumented/bare wall', r[ALL], '.4f')}"
            )
            if "cpu" in r:
                line += f"; {_ci('CPU', r['cpu'], '.4f')}"
            line += (
                f"; CI width {hi - lo:.4f} {verdict}; from the fixed cost: {predicted:.4f}; "
                f"target <= 1.005: {'met' if hi <= 1.005 else 'not shown'}"
            )
            print(line)
            if args.by_part:
                for part in (*sorted(PARTS), CONTROL):
                    print(f"  only {part}: {_ci('wall', r[part], '.4f')}")
            # The steps' attribution runs when the exporter is scraped (outside the timed
            # blocks), on the same process's GIL: charge it to every step.
            deferred = k["scrape_us"] / (1000 * r["bare_ms"])
            total = r[ALL][0] + deferred
            print(
                f"  with the scrape-time attribution ({k['scrape_us']:.1f} us per step, "
                f"+{deferred:.4f}): {total:.4f}"
            )
            if math.isnan(last):
                last = total
        fc = flop_count_cost(base, device)
        print(
            f"model FLOPs counted once per process ({'done' if fc['ok'] else 'FAILED'}): "
            f"that step {fc['counted_ms']:.2f} ms against {fc['others_ms']:.2f} ms for the "
            "others; no other step pays for it"
        )
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
