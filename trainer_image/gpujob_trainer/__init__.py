"""gpujob_trainer: per-rank progress, phase timing and GPU telemetry for PyTorch training.

    import gpujob_trainer
    tracker = gpujob_trainer.init()            # exporter on GPUJOB_METRICS_PORT + LOCAL_RANK
    model = tracker.wrap_model(DDP(model))     # forward, backward, exposed all-reduce wait
    loader = tracker.wrap_loader(loader, device=device)  # data wait, h2d copy, samples
    ...                                        # an iteration is a step; its last
                                               # optimizer.step() ends it
    tracker.close()

Importing this package imports neither torch nor NVML nor prometheus_client; they load when
used. It never imports the operator.
"""

from __future__ import annotations

import logging

from gpujob_trainer import contract
from gpujob_trainer.env import RankInfo
from gpujob_trainer.snapshot import Snapshot
from gpujob_trainer.tracker import Tracker

__all__ = ["RankInfo", "Snapshot", "Tracker", "contract", "init"]


def init(
    *,
    total_steps: int | None = None,
    port: int | None = None,
    addr: str | None = None,
    rank: RankInfo | None = None,
    gpu_telemetry: bool | None = None,
    hook_optimizers: bool = True,
    start_exporter: bool = True,
    flops_per_sample: float | None = None,
    flops_per_token: float | None = None,
    measure_flops: bool = True,
    peak_tflops: float | None = None,
    start_step: int = 0,
) -> Tracker:
    """Make this rank's tracker and (unless told not to) start its metrics exporter.

    Defaults come from the env the operator and torchrun set: `GPUJOB_TOTAL_STEPS`,
    `GPUJOB_METRICS_PORT` (+ `LOCAL_RANK`), `RANK`, `LOCAL_RANK`, `GROUP_RANK`. GPU telemetry
    defaults to on for local rank 0, which reports every GPU of the node. If the port cannot
    be bound, the error is logged and training goes on without /metrics: telemetry never
    stops a job (`Tracker.start_exporter` itself raises).

    Steps: a training step is one iteration of the loop. With `hook_optimizers` (the
    default) every optimizer in the process is hooked, and an iteration's last optimizer
    step ends its step: the step is counted when the loop reaches its next boundary (the
    next fetch from a wrapped loader, else the next forward of the wrapped model; entering
    eval or checkpoint; `end_step()`; `close()`). Several optimizers, `zero_grad`, a
    scheduler or clipping in one iteration make one step; gradient accumulation makes one
    per optimizer step. `tracker.watch_optimizer(opt)` makes each of that optimizer's steps
    a training step instead; `hook_optimizers=False` hooks nothing: call `end_step()`.

    MFU: the model's FLOPs are counted once over an early training step unless given
    (`flops_per_sample` or `flops_per_token`: forward and backward); the peak comes from the
    GPU's product name and the training precision unless `peak_tflops` is given.

    Resume: `start_step` is the run's global step a loaded checkpoint reached (or call
    `tracker.resume(step)` once it is loaded); the exported global step goes on from there.
    """
    tracker = Tracker(
        total_steps=total_steps,
        rank=rank,
        hook_optimizers=hook_optimizers,
        flops_per_sample=flops_per_sample,
        flops_per_token=flops_per_token,
        measure_flops=measure_flops,
        peak_tflops=peak_tflops,
        start_step=start_step,
    )
    if start_exporter:
        try:
            tracker.start_exporter(port, addr, gpu_telemetry=gpu_telemetry)
        except OSError as exc:
            logging.getLogger("gpujob_trainer").error(
                "gpujob: metrics exporter not started (%s); training continues without it", exc
            )
    return tracker
