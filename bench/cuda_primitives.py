"""What each CUDA call the trainer library makes costs the training thread, next to a launch.

The instrumented step's added cost on CUDA is mostly a handful of these calls per step; a
kernel launch is the unit to compare them with, because the bare step is made of launches
too. Prints one line per primitive (median microseconds per call over blocks of calls, host
wall time) and, with `--step`, what each instrumented part adds to the near-empty step of
`bench/trainer_overhead.py`, and that step under cProfile.

    python bench/cuda_primitives.py [--reps 2000] [--step] [--part-seconds 30]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from gpujob_trainer.timing import CudaEventClock, current_stream_reader


def per_call_us(fn: Callable[[], object], reps: int, blocks: int = 9) -> float:
    """Median over `blocks` of the mean wall time of `reps` calls, in microseconds."""
    out = []
    for _ in range(blocks):
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        out.append((time.perf_counter() - t0) / reps)
        torch.cuda.synchronize()
    return 1e6 * statistics.median(out)


def primitives(reps: int) -> list[tuple[str, float]]:
    """(name, microseconds per call) of each primitive; the GPU is idle between blocks."""
    dev = torch.device("cuda", torch.cuda.current_device())
    x = torch.zeros(1, device=dev)
    stream = torch.cuda.current_stream()
    pool = [torch.cuda.Event(enable_timing=True) for _ in range(64)]
    for e in pool:
        e.record()
    plain = [torch.cuda.Event() for _ in range(64)]
    for e in plain:
        e.record()
    torch.cuda.synchronize()
    i = [0]

    def cycle(events: list[torch.cuda.Event]) -> torch.cuda.Event:
        i[0] = (i[0] + 1) % len(events)
        return events[i[0]]

    def new_record() -> None:
        torch.cuda.Event(enable_timing=True).record()  # created, recorded, destroyed

    a, b = pool[0], pool[1]
    fast = current_stream_reader(torch)
    clock = CudaEventClock()
    rows: list[tuple[str, float]] = [
        ("python call (baseline)", per_call_us(lambda: None, reps)),
        ("kernel launch x.add_(1)", per_call_us(lambda: x.add_(1), reps)),
        ("torch.cuda.current_stream()", per_call_us(torch.cuda.current_stream, reps)),
        ("Event(enable_timing) construct", per_call_us(lambda: torch.cuda.Event(True), reps)),
        ("Event create+record+destroy", per_call_us(new_record, reps)),
        ("pooled timing Event.record()", per_call_us(lambda: cycle(pool).record(), reps)),
        ("pooled Event.record(stream)", per_call_us(lambda: cycle(pool).record(stream), reps)),
        ("pooled plain Event.record()", per_call_us(lambda: cycle(plain).record(), reps)),
        ("current_stream_reader()()", per_call_us(fast, reps)),
        ("CudaEventClock record+release", per_call_us(lambda: clock.release(clock.record()), reps)),
    ]
    torch.cuda.synchronize()
    rows += [
        ("Event.query() (done)", per_call_us(a.query, reps)),
        ("Event.elapsed_time() (done)", per_call_us(lambda: a.elapsed_time(b), reps)),
        ("torch.cuda.memory_stats()", per_call_us(torch.cuda.memory_stats, max(1, reps // 20))),
        ("torch.cuda.synchronize() (idle)", per_call_us(torch.cuda.synchronize, reps)),
    ]
    return rows


PROBES = ("model, host clock", "no-op grad hook", "no-op hook+callback", "no-op fwd wrapper")
"""Pieces of the model part alone: its hooks with host timing (no events), a no-op
post-accumulate-grad hook on the last parameter (autograd calls into Python from its device
thread), the same queueing a no-op final callback, and a no-op forward wrapper."""


def probe_loop(bench: Any) -> Any:
    """The overhead bench's Loop, which also attaches the PROBES by name."""
    from gpujob_trainer.timing import HostClock

    class Probe(bench.Loop):  # type: ignore[misc,name-defined]
        def __init__(self, *args: Any) -> None:
            self.undo: list[Callable[[], None]] = []
            super().__init__(*args)

        def attach(self, parts: frozenset[str]) -> Any:
            (name,) = parts if len(parts) == 1 else (None,)
            if name not in PROBES:
                return super().attach(parts)
            self.detach()
            model = self.model
            if name == "model, host clock":
                tracker = super().attach(frozenset({"model"}))
                tracker._clock_fixed = True
                tracker._set_clock(HostClock())
                return tracker
            last = [p for p in model.parameters() if p.requires_grad][-1]
            queue = torch.autograd.Variable._execution_engine.queue_callback
            if name == "no-op grad hook":
                handle = last.register_post_accumulate_grad_hook(lambda p: None)
                self.undo.append(handle.remove)
            elif name == "no-op hook+callback":
                handle = last.register_post_accumulate_grad_hook(lambda p: queue(lambda: None))
                self.undo.append(handle.remove)
            else:
                inner = model.forward

                def forward(*args: Any, **kwargs: Any) -> Any:
                    return inner(*args, **kwargs)

                model.__dict__["forward"] = forward
                self.undo.append(lambda: model.__dict__.pop("forward", None))
            return None

        def detach(self) -> None:
            while self.undo:
                self.undo.pop()()
            super().detach()

    return Probe


def near_empty_step(steps: int, part_seconds: float, dev: torch.device) -> str:
    """The near-empty instrumented step of the overhead bench: the microseconds each part
    adds (bare and each part in rotation), then a cProfile of the whole, with the number
    of events recorded per step. The profile sees the training thread only: hooks that
    autograd runs on its device thread show up inside `run_backward`."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import torch.distributed as dist

    import trainer_overhead as bench  # the same loop and model the overhead bench times

    cuda = dev.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    lines = []
    dist.init_process_group(
        "nccl" if cuda else "gloo", store=dist.HashStore(), rank=0, world_size=1
    )
    try:
        loop = probe_loop(bench)(bench.make_model(dev, width=8, layers=1), 1, dev)
        loop.run(50)
        variants: dict[str, frozenset[str] | None] = {bench.BARE: None}
        variants.update({part: frozenset({part}) for part in sorted(bench.PARTS)})
        variants[bench.ALL] = bench.PARTS
        variants.update({probe: frozenset({probe}) for probe in PROBES})
        rounds = bench.rotate(
            loop,
            variants,
            10,
            min_rounds=100,
            max_rounds=5000,
            max_seconds=part_seconds,
            sync=sync,
        )
        bare = statistics.median(rounds.wall[bench.BARE])
        lines.append(
            f"near-empty step, bare {1e6 * bare:.0f} us ({len(rounds.wall[bench.BARE])} rounds)"
        )
        for name in list(variants)[1:]:
            wall = statistics.median(rounds.added(name))
            cpu = statistics.median(rounds.added(name, "cpu"))
            lines.append(f"  + {name:20s} {1e6 * wall:7.1f} us wall {1e6 * cpu:7.1f} us CPU")

        tracker = bench.Loop.attach(loop, bench.PARTS)
        counted = [0]
        record = tracker._record

        def counting_record() -> object:
            counted[0] += 1
            return record() if record is not None else None

        if record is not None:  # on CPU no event is recorded
            tracker._record = counting_record
        loop.run(20)
        counted[0] = 0
        prof = cProfile.Profile()
        sync()
        t0 = time.perf_counter()
        prof.enable()
        loop.run(steps)
        prof.disable()
        sync()
        took = time.perf_counter() - t0
        loop.detach()
    finally:
        dist.destroy_process_group()
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(25)
    lines.append(
        f"{steps} instrumented near-empty steps: {1e6 * took / steps:.0f} us/step (profiled), "
        f"{counted[0] / steps:.1f} events recorded per step"
    )
    return "\n".join(lines) + "\n" + buf.getvalue()


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--reps", type=int, default=2000)
    p.add_argument("--step", action="store_true", help="each part's cost, and a profile")
    p.add_argument("--part-seconds", type=float, default=30.0, help="time cap, by part")
    p.add_argument("--cpu", action="store_true", help="the near-empty step on CPU only")
    args = p.parse_args(argv)
    if args.cpu:
        print(near_empty_step(2000, args.part_seconds, torch.device("cpu")))
        return 0
    if not torch.cuda.is_available():
        print("no CUDA device: nothing to measure")
        return 3
    print(f"{torch.cuda.get_device_name()} torch={torch.__version__}")
    for name, us in primitives(args.reps):
        print(f"{name:34s} {us:9.2f} us")
    if args.step:
        dev = torch.device("cuda", torch.cuda.current_device())
        print(near_empty_step(2000, args.part_seconds, dev))
    return 0


if __name__ == "__main__":
    sys.exit(main())
