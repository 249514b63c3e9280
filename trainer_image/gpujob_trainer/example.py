"""Example DDP training on synthetic data, instrumented with gpujob_trainer.

    torchrun --nproc-per-node 2 -m gpujob_trainer.example --steps 200

A small MLP on synthetic data (gloo on CPU, nccl on GPU). Switches create bottlenecks on
purpose, strong enough to show on a loaded 2-core machine:

    --slow-input S          each batch takes S seconds to load: input bound
    --slow-rank R --slow-factor F
                            rank R computes F times the work per step: a straggler (the
                            others wait inside all-reduce)
    --comm-heavy            a large, cheap embedding whose gradient is ready last: the
                            all-reduce is long and cannot overlap compute
    --slow-loss-rank R --slow-loss-seconds S
                            rank R spends S more seconds computing its loss, outside the
                            wrapped model (a large-vocabulary head): a straggler
    --slow-preprocess-rank R --slow-preprocess-seconds S
                            rank R spends S seconds preprocessing each batch on its device
                            after loading it (GPU augmentation; tensor work on CPU): a straggler
    --checkpoint-every N --checkpoint-seconds S [--checkpoint-rank R]
                            every N steps every rank (only rank R with --checkpoint-rank, as
                            DDP loops save from rank 0) saves a checkpoint taking S seconds
                            in tracker.phase("checkpoint"): busy, not stalled; checkpoint
                            bound when S/N is large
    --eval-every N --eval-seconds S
                            every N steps every rank evaluates for S seconds (forward passes
                            under no_grad, then an all-reduce of the metrics) inside
                            tracker.phase("eval"): busy, not stalled; eval bound when large
    --hang-rank R --hang-after N [--hang-how HOW]
                            rank R blocks forever before step N+1: a stall. HOW: sleep (in
                            the loop, outside any collective; the default), loader (inside
                            the DataLoader's fetch), collective (in an all-reduce of another
                            process group than its peers'), gil (a native call that never
                            releases the GIL, so even its exporter cannot answer)
    --startup-seconds S     the first step takes S seconds longer (compilation, init, a
                            data download): busy, not stalled
    --slow-copy S           each batch's copy to the device takes S seconds (copies of host
                            memory stand in for a synchronous copy of oversized, pageable
                            batches) inside tracker.transfer(): transfer bound
    --copy-mb MB            every batch also carries MB of pageable host memory, copied to
                            the device with it (a real synchronous copy on a GPU; nothing
                            on a CPU): transfer bound
    --peak-tflops T         the peak MFU is taken against (a CPU has none in the table)
    --checkpoint-dir DIR    checkpoints (--checkpoint-every) go to DIR/checkpoint.pt, saved
                            by rank 0; a start finding one resumes from its step (the
                            model, the optimizer, tracker.init(start_step=...))
    --fail-rank R --fail-at-step N
                            rank R exits 1 before step N+1, once per --checkpoint-dir (a
                            marker file there remembers it): a crash the gang restarts from

Batches reach the device through `tracker.wrap_loader(loader, device=...)`, so the copy is
timed as the h2d phase; the model's FLOPs are counted once by the tracker (MFU).
"""

from __future__ import annotations

import argparse
import io
import logging
import math
import os
import signal
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import BatchSampler, DataLoader, Dataset, DistributedSampler

import gpujob_trainer
from gpujob_trainer import env as trainer_env

log = logging.getLogger("gpujob_trainer.example")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="gpujob_trainer.example", description=__doc__.split("\n")[0])
    size = p.add_argument_group("size")
    size.add_argument(
        "--steps", type=int, help="training steps (default: $GPUJOB_TOTAL_STEPS, else epochs)"
    )
    size.add_argument("--epochs", type=int, default=1, help="epochs when --steps is not given")
    size.add_argument("--steps-per-epoch", type=int, default=100)
    size.add_argument("--batch-size", type=int, default=1024, help="samples per rank per step")
    size.add_argument("--hidden", type=int, default=256)
    size.add_argument("--layers", type=int, default=4)
    size.add_argument(
        "--step-time",
        type=float,
        help="choose the batch size so one rank's compute takes about this many seconds",
    )
    size.add_argument("--lr", type=float, default=0.01)
    size.add_argument("--workers", type=int, default=0, help="DataLoader workers")
    size.add_argument("--seed", type=int, default=0)
    cond = p.add_argument_group("conditions")
    cond.add_argument("--slow-input", type=float, default=0.0, metavar="SECONDS")
    cond.add_argument("--slow-rank", type=int, metavar="R")
    cond.add_argument("--slow-factor", type=float, default=4.0, metavar="F")
    cond.add_argument("--comm-heavy", action="store_true")
    cond.add_argument(
        "--comm-mb", type=float, default=32.0, help="gradient size of --comm-heavy, MiB"
    )
    cond.add_argument("--slow-loss-rank", type=int, metavar="R")
    cond.add_argument("--slow-loss-seconds", type=float, default=0.5, metavar="S")
    cond.add_argument("--slow-preprocess-rank", type=int, metavar="R")
    cond.add_argument("--slow-preprocess-seconds", type=float, default=0.5, metavar="S")
    cond.add_argument("--checkpoint-every", type=int, default=0, metavar="N")
    cond.add_argument("--checkpoint-seconds", type=float, default=1.0, metavar="S")
    cond.add_argument("--checkpoint-rank", type=int, metavar="R")
    cond.add_argument("--eval-every", type=int, default=0, metavar="N")
    cond.add_argument("--eval-seconds", type=float, default=1.0, metavar="S")
    cond.add_argument("--hang-rank", type=int, metavar="R")
    cond.add_argument("--hang-after", type=int, default=10, metavar="N")
    cond.add_argument(
        "--hang-how", choices=("sleep", "loader", "collective", "gil"), default="sleep"
    )
    cond.add_argument("--startup-seconds", type=float, default=0.0, metavar="S")
    cond.add_argument("--slow-copy", type=float, default=0.0, metavar="S")
    cond.add_argument("--copy-mb", type=float, default=0.0, metavar="MB")
    cond.add_argument("--checkpoint-dir", metavar="DIR")
    cond.add_argument("--fail-rank", type=int, metavar="R")
    cond.add_argument("--fail-at-step", type=int, metavar="N")
    mfu = p.add_argument_group("mfu")
    mfu.add_argument("--peak-tflops", type=float, metavar="T")
    run = p.add_argument_group("run")
    run.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    run.add_argument("--threads", type=int, help="torch threads per rank (CPU default: 1)")
    run.add_argument("--metrics-port", type=int, help="base port (default: $GPUJOB_METRICS_PORT)")
    run.add_argument(
        "--linger",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="keep serving metrics this long after the last step (SIGTERM ends it early)",
    )
    run.add_argument("--log-every", type=int, default=50)
    args = p.parse_args(argv)
    if args.slow_factor < 1:
        p.error("--slow-factor must be >= 1")
    for name in (
        "slow_loss_seconds",
        "slow_preprocess_seconds",
        "checkpoint_seconds",
        "slow_copy",
        "copy_mb",
    ):
        if getattr(args, name) < 0:
            p.error(f"--{name.replace('_', '-')} must be >= 0")
    if args.eval_seconds < 0 or args.checkpoint_every < 0 or args.eval_every < 0:
        p.error("--eval-seconds, --checkpoint-every and --eval-every must be >= 0")
    if (args.fail_rank is None) != (args.fail_at_step is None):
        p.error("--fail-rank and --fail-at-step go together")
    if args.fail_rank is not None and not args.checkpoint_dir:
        p.error("--fail-rank needs --checkpoint-dir (where the one failure is remembered)")
    return args


def target_steps(args: argparse.Namespace) -> int:
    """--steps, else the operator's GPUJOB_TOTAL_STEPS, else epochs x steps per epoch."""
    if args.steps is not None:
        return int(args.steps)
    from_env = trainer_env.total_steps_from_env()
    if from_env is not None:
        return from_env
    return int(args.epochs * args.steps_per_epoch)


def build_model(args: argparse.Namespace, classes: int) -> nn.Module:
    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            vocab = int(args.comm_mb * 2**20 / 4 / args.hidden) if args.comm_heavy else 0
            # Used first in forward, so its gradient is ready last and its all-reduce is
            # exposed; a gather is cheap, its dense gradient is large.
            self.embed = nn.Embedding(vocab, args.hidden) if vocab else None
            layers: list[nn.Module] = []
            for _ in range(args.layers):
                layers += [nn.Linear(args.hidden, args.hidden), nn.ReLU()]
            self.body = nn.Sequential(*layers)
            self.head = nn.Linear(args.hidden, classes)

        def forward(self, x: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
            if self.embed is not None:
                x = x + self.embed(ids % self.embed.num_embeddings)
            return self.head(self.body(x))

    return Net()


class SyntheticData(Dataset[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]):
    """Random rows from a fixed pool, fetched a whole batch per call (indices -> tensors)."""

    def __init__(self, length: int, hidden: int, classes: int, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        pool = 4096
        self.length = length
        self.x = torch.randn(pool, hidden, generator=g)
        self.y = torch.randint(0, classes, (pool,), generator=g)
        self.ids = torch.randint(0, 2**31 - 1, (pool,), generator=g)

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, batch: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        j = torch.as_tensor(batch) % len(self.x)
        return self.x[j], self.y[j], self.ids[j]


def busy(seconds: float, x: torch.Tensor) -> torch.Tensor:
    """Real tensor work on x's device for about `seconds` of wall time (no device sync).

    Stands in for work a loop does outside the wrapped model: a large-vocabulary loss head,
    augmentation on the GPU, metrics. On CUDA the host queues kernels until the deadline.
    """
    deadline = time.perf_counter() + seconds
    y = x.detach()
    while time.perf_counter() < deadline:
        y = torch.tanh(y * 0.5 + 0.1)
    return y


def slow_copy(seconds: float, batch: tuple[torch.Tensor, ...]) -> None:
    """Copies of the batch's host memory for about `seconds` of wall time: what a synchronous
    copy of a batch far larger than the step needs costs the loop."""
    deadline = time.perf_counter() + seconds
    staging = [torch.empty_like(t) for t in batch]
    while time.perf_counter() < deadline:
        for dst, src in zip(staging, batch, strict=True):
            dst.copy_(src)


def save_checkpoint(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    seconds: float,
    step: int = 0,
    path: Path | None = None,
) -> int:
    """Serialise the state (to `path` when given, atomically; else to memory), then wait out
    `seconds` as slow storage would."""
    t0 = time.perf_counter()
    buf = io.BytesIO()
    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step}
    torch.save(state, buf)
    if path is not None:
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(buf.getvalue())
        os.replace(tmp, path)  # a reader never sees half a checkpoint
    time.sleep(max(0.0, seconds - (time.perf_counter() - t0)))
    return buf.tell()


def load_checkpoint(
    path: Path | None, model: nn.Module, optimizer: torch.optim.Optimizer, device: torch.device
) -> int:
    """The step of the checkpoint at `path`, its state loaded into model and optimizer; 0
    (fresh) when there is none."""
    if path is None or not path.exists():
        return 0
    state = torch.load(path, map_location=device)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    return int(state["step"])


def evaluate(model: nn.Module, batch: tuple[torch.Tensor, ...], seconds: float) -> float:
    """Forward passes under no_grad for about `seconds`, then the loss averaged over ranks.

    The all-reduce of the metrics ends the evaluation together on every rank, as real loops
    do, so a rank that evaluates longer is waited for inside eval, not in the next step.
    """
    x, y, ids = batch
    deadline = time.perf_counter() + seconds
    sums = torch.zeros(2, device=x.device)  # loss sum, batches
    model.eval()
    with torch.no_grad():
        while True:
            sums[0] += F.cross_entropy(model(x, ids), y)
            sums[1] += 1
            if time.perf_counter() >= deadline:
                break
        dist.all_reduce(sums)
    model.train()
    return float(sums[0] / sums[1])  # eval's own sync, once per evaluation


class SlowInput:
    """Stands in for an expensive decode/augment: each batch takes `seconds` to assemble;
    with `block_after`, the batch after that many blocks forever (a hung data loader)."""

    def __init__(
        self, seconds: float, block_after: int | None = None, extra_mb: float = 0.0
    ) -> None:
        self.seconds = seconds
        self.block_after = block_after
        self.calls = 0
        self.extra = torch.zeros(int(extra_mb * 2**20 / 4)) if extra_mb > 0 else None
        """Rides along with every batch (--copy-mb): pageable, copied to the device each step."""

    def __call__(self, batch: Any) -> Any:
        self.calls += 1
        if self.block_after is not None and self.calls > self.block_after:
            log.warning("the data loader blocks (--hang-how loader)")
            threading.Event().wait()
        if self.seconds > 0:
            time.sleep(self.seconds)
        if self.extra is not None:
            return (*batch, self.extra)
        return batch


def hang(how: str, side: Any) -> None:
    """Block this rank forever, the way --hang-how says (see the usage above)."""
    if how == "collective":  # peers wait in the default group's next all-reduce
        dist.all_reduce(torch.ones(1), group=side)
    elif how == "gil":  # native code that never lets the GIL go: nothing of Python runs
        sum(range(1 << 62))
    threading.Event().wait()


def calibrate_batch(
    args: argparse.Namespace, model: nn.Module, device: torch.device, classes: int
) -> int:
    """Batch size whose forward+backward takes about --step-time on this rank (min over ranks)."""
    probe = 64
    x = torch.randn(probe, args.hidden, device=device)
    y = torch.randint(0, classes, (probe,), device=device)
    ids = torch.zeros(probe, dtype=torch.long, device=device)
    for i in range(4):
        if i == 1:  # first pass warms up
            t0 = time.perf_counter()
        F.cross_entropy(model(x, ids), y).backward()
    if device.type == "cuda":
        torch.cuda.synchronize(device)  # calibration only, before training starts
    per_sample = (time.perf_counter() - t0) / 3 / probe
    model.zero_grad(set_to_none=True)
    batch = torch.tensor([max(1, round(args.step_time / per_sample))], device=device)
    dist.all_reduce(batch, op=dist.ReduceOp.MIN)
    return int(batch.item())


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")

    rank = trainer_env.RankInfo.from_env()
    use_cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    backend = "gloo"
    if use_cuda:
        gpus = torch.cuda.device_count()
        # More local ranks than GPUs (a check on a one-GPU machine): ranks share GPUs, which
        # NCCL refuses, so every rank uses gloo (the choice must agree across ranks).
        shared = int(os.environ.get("LOCAL_WORLD_SIZE", "1")) > gpus
        backend = "gloo" if shared else "nccl"
        torch.cuda.set_device(rank.local_rank % gpus)
        device = torch.device("cuda", rank.local_rank % gpus)
    else:
        device = torch.device("cpu")
        torch.set_num_threads(args.threads or 1)
    if args.threads and use_cuda:
        torch.set_num_threads(args.threads)
    dist.init_process_group(backend=backend)
    torch.manual_seed(args.seed)

    steps = target_steps(args)
    classes = 10
    net = build_model(args, classes).to(device)
    if args.step_time:
        args.batch_size = calibrate_batch(args, net, device, classes)
    if rank.rank == 0:
        log.info(
            "world=%d device=%s steps=%d batch=%d hidden=%d layers=%d",
            rank.world_size,
            device,
            steps,
            args.batch_size,
            args.hidden,
            args.layers,
        )

    data = SyntheticData(
        args.steps_per_epoch * args.batch_size * rank.world_size, args.hidden, classes, args.seed
    )
    sampler: DistributedSampler[Any] = DistributedSampler(data, shuffle=True, seed=args.seed)
    loader = DataLoader(  # batch_size=None: the sampler yields index batches, fetched at once
        data,
        batch_size=None,
        sampler=BatchSampler(sampler, args.batch_size, drop_last=True),
        num_workers=args.workers,
        collate_fn=SlowInput(
            args.slow_input,
            args.hang_after if args.hang_how == "loader" and args.hang_rank == rank.rank else None,
            args.copy_mb,
        ),
        pin_memory=use_cuda and not args.copy_mb,  # --copy-mb: pageable on purpose
    )

    ckpt_dir = Path(args.checkpoint_dir) if args.checkpoint_dir else None
    ckpt = ckpt_dir / "checkpoint.pt" if ckpt_dir is not None else None
    if ckpt_dir is not None:
        ckpt_dir.mkdir(parents=True, exist_ok=True)
    optimizer = torch.optim.SGD(net.parameters(), lr=args.lr)
    resumed = load_checkpoint(ckpt, net, optimizer, device)
    if resumed:
        log.info("rank %d resumes from step %d (%s)", rank.rank, resumed, ckpt)
    tracker = gpujob_trainer.init(
        total_steps=steps,
        port=_port(args, rank),
        peak_tflops=args.peak_tflops,
        start_step=resumed,
    )
    model = tracker.wrap_model(DDP(net, device_ids=[device.index] if use_cuda else None))
    # The loader moves each batch to the device (the h2d phase); with --slow-copy the loop
    # copies it itself, inside tracker.transfer().
    batches = tracker.wrap_loader(loader, device=None if args.slow_copy else device)
    repeat = args.slow_factor if args.slow_rank == rank.rank else 1.0

    how = args.hang_how if args.hang_rank is not None else ""
    # a second group every rank must create; only a "collective" hang ever uses it
    side = dist.new_group(backend="gloo") if how == "collective" else None
    step, epoch = resumed, 0
    failed_once = ckpt_dir / f"failed-rank{args.fail_rank}" if ckpt_dir is not None else None
    t_log = time.perf_counter()
    while step < steps:
        sampler.set_epoch(epoch)
        for x, y, ids, *_extra in batches:  # --copy-mb's payload rides along, unused
            if (
                args.fail_rank == rank.rank
                and step == args.fail_at_step
                and failed_once is not None
                and not failed_once.exists()
            ):
                failed_once.touch()
                log.error("rank %d fails at step %d (--fail-at-step)", rank.rank, step)
                os._exit(1)  # a crash: no clean shutdown of the process group
            if args.hang_rank == rank.rank and step == args.hang_after and how != "loader":
                log.warning("rank %d hangs after %d steps (--hang-how %s)", rank.rank, step, how)
                hang(how, side)  # forever; peers block in their next all-reduce
            if args.slow_copy:
                with tracker.transfer():
                    slow_copy(args.slow_copy, (x, y, ids))
                    x, y, ids = (t.to(device, non_blocking=True) for t in (x, y, ids))
            if step == 0 and args.startup_seconds > 0:  # stands in for torch.compile & co.
                log.info("first step %.0fs longer (--startup-seconds)", args.startup_seconds)
                time.sleep(args.startup_seconds)
            if args.slow_preprocess_rank == rank.rank:  # augmentation on the device
                x = x + 0 * busy(args.slow_preprocess_seconds, x)
            if repeat > 1:  # a straggler: the same step, `repeat` times the work
                rows = max(1, round(len(x) * repeat))
                k = math.ceil(repeat)
                x, y, ids = (t.repeat(k, *([1] * (t.dim() - 1)))[:rows] for t in (x, y, ids))
            out = model(x, ids)
            loss = F.cross_entropy(out, y)  # the loss head, outside the wrapped model
            if args.slow_loss_rank == rank.rank:
                loss = loss + 0 * busy(args.slow_loss_seconds, out).mean()
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            tracker.log(loss=loss)
            step += 1
            saves = args.checkpoint_rank is None or args.checkpoint_rank == rank.rank
            if ckpt is not None:
                saves = rank.rank == (args.checkpoint_rank or 0)  # one writer of the file
            if args.checkpoint_every and step % args.checkpoint_every == 0 and saves:
                with tracker.checkpointing():
                    save_checkpoint(net, optimizer, args.checkpoint_seconds, step, ckpt)
            if args.eval_every and step % args.eval_every == 0:
                with tracker.evaluating():  # every rank evaluates its shard
                    eval_loss = evaluate(model, (x, y, ids), args.eval_seconds)
                if rank.rank == 0:
                    log.info("step %d eval loss %.4f", step, eval_loss)
            if rank.rank == 0 and args.log_every and step % args.log_every == 0:
                now = time.perf_counter()
                last_loss = tracker.snapshot().loss  # the lazily read value: no device sync
                log.info(
                    "step %d/%d loss %s %.1f ms/step",
                    step,
                    steps,
                    "-" if last_loss is None else f"{last_loss:.4f}",
                    1000 * (now - t_log) / args.log_every,
                )
                t_log = now
            if step >= steps:
                break
        epoch += 1

    dist.destroy_process_group()
    if args.linger > 0 and tracker.exporter is not None:
        exporter = tracker.exporter
        signal.signal(signal.SIGTERM, lambda signum, frame: exporter.request_stop())
        log.info("rank %d done; serving metrics for up to %.0fs", rank.rank, args.linger)
    tracker.close(linger=args.linger)
    return 0


def _port(args: argparse.Namespace, rank: trainer_env.RankInfo) -> int | None:
    if args.metrics_port is None:
        return None
    return args.metrics_port + rank.local_rank


if __name__ == "__main__":
    sys.exit(main())
