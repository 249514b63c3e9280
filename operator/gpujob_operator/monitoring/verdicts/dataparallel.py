"""DataParallelImbalance: one process drives several GPUs and loads the first one most.

`nn.DataParallel` scatters each batch from the first GPU, gathers the outputs back to it,
and computes the loss and the optimizer step there, so that GPU holds more memory and works
longer than the replicas (users report 4 GB on GPU 0 against 0.7 GB on the others). The
trainer names the GPUs a rank drives (`gpujob_train_device_info`, the first one first); this
compares the first GPU's memory in use and utilization with the others' median, from the
node's NVML series.
"""

from __future__ import annotations

import math
import statistics
from array import array
from collections.abc import Mapping
from typing import Any, Final

from gpujob_operator import api
from gpujob_operator.monitoring.rows import G_MEM_USED, G_UTIL, latest, mean
from gpujob_operator.monitoring.verdicts.device import gpu_rows
from gpujob_operator.monitoring.verdicts.formatting import pct, round4
from gpujob_operator.monitoring.verdicts.verdict import (
    ADVICE,
    DATA_PARALLEL_IMBALANCE,
    WARNING,
    Evidence,
    Verdict,
)
from gpujob_operator.monitoring.window import Window

MIN_MEMORY_GAP: Final = 512 * 2**20
"""Below this absolute gap a memory ratio says nothing (a tiny model's few hundred MiB).

The bound itself (`dataParallelBalanceRatio`, 0.67: the first GPU holding 1.5x the others'
median) sits far from both sides: DDP ranks on identical GPUs agree within about 10%, while
nn.DataParallel's first GPU holds the gathered outputs, the loss and the optimizer state on
top of its replica, commonly 2-6x the others."""
MIN_UTIL_GAP: Final = 0.20
"""The first GPU's utilization must also exceed the others' by this many points."""
MAX_LISTED: Final = 8
"""GPUs listed in the evidence's per-GPU table."""


def _gib(n: float) -> str:
    return f"{n / 2**30:.1f} GiB"


def data_parallel_imbalance(
    window: Window,
    ready: Mapping[Any, list[array[float]]],
    since: float | None,
    th: api.Thresholds,
) -> Verdict | None:
    """The first rank whose first GPU is far above its other GPUs' median (memory or
    utilization), or None."""
    warm = gpu_rows(window, since)
    by_uuid = {g.uuid: g for g in window.gpus.values() if g.uuid}
    bound = th.data_parallel_balance_ratio
    for key in sorted(ready, key=lambda k: window.ranks[k].rank):
        s = window.ranks[key]
        gpus = [by_uuid[u] for u in s.devices if u in by_uuid]
        if len(s.devices) < 2 or len(gpus) < 2 or gpus[0].uuid != s.devices[0]:
            continue
        mem = [latest(g.rows, G_MEM_USED) for g in gpus]
        util = [mean(warm[(g.pod, g.gpu)], G_UTIL) for g in gpus]
        other_mem = [m for m in mem[1:] if not math.isnan(m)]
        other_util = [u for u in util[1:] if not math.isnan(u)]
        mem_med = statistics.median(other_mem) if other_mem else math.nan
        util_med = statistics.median(other_util) if other_util else math.nan
        mem_ratio = mem_med / mem[0] if mem[0] > 0 else math.nan
        util_ratio = util_med / util[0] if util[0] > 0 else math.nan
        by_mem = mem_ratio < bound and mem[0] - mem_med >= MIN_MEMORY_GAP
        by_util = util_ratio < bound and util[0] - util_med >= MIN_UTIL_GAP
        if not (by_mem or by_util):
            continue
        table = "; ".join(
            f"GPU {g.gpu} {_gib(m) if not math.isnan(m) else '?'}"
            + (f" {pct(u)} busy" if not math.isnan(u) else "")
            for g, m, u in list(zip(gpus, mem, util, strict=True))[:MAX_LISTED]
        )
        what = []
        if by_mem:
            what.append(f"{_gib(mem[0])} in use against a median {_gib(mem_med)}")
        if by_util:
            what.append(f"{pct(util[0])} busy against a median {pct(util_med)}")
        summary = (
            f"rank {s.rank} (pod {s.pod}) drives {len(s.devices)} GPUs with one process and "
            f"loads its first, GPU {gpus[0].gpu}, most: " + " and ".join(what) + f" ({table})"
        )
        ev: Evidence = {
            "devices": len(s.devices),
            "firstMemoryBytes": round(mem[0]) if not math.isnan(mem[0]) else -1,
            "othersMemoryBytes": round(mem_med) if not math.isnan(mem_med) else -1,
            "memoryBalance": round4(mem_ratio),
            "utilizationBalance": round4(util_ratio),
            "firstUtilization": round4(util[0]),
            "othersUtilization": round4(util_med),
            "perGPU": table,
            "boundRatio": bound,
        }
        return Verdict(
            DATA_PARALLEL_IMBALANCE,
            WARNING,
            summary,
            ev,
            ADVICE[DATA_PARALLEL_IMBALANCE],
            rank=s.rank,
            pod=s.pod,
            node=s.node or None,
            gpu_uuid=gpus[0].uuid,
        )
    return None
