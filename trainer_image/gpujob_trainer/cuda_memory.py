"""Allocator pressure of the rank's own CUDA device, from `torch.cuda.memory_stats`.

Reads host-side allocator counters only (no device sync). Exports nothing unless the process
already uses CUDA: it never imports torch nor initialises CUDA for the sake of a scrape.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from gpujob_trainer import contract
from gpujob_trainer.env import RankInfo
from gpujob_trainer.families import family, rank_values

StatsReader = Callable[[], tuple[str, Mapping[str, Any]] | None]
"""Returns (device UUID, memory_stats dict), or None when CUDA is not in use."""


def _torch_stats(
    local_rank: int, device_fn: Callable[[], int | None]
) -> Callable[[], tuple[str, Mapping[str, Any]] | None]:
    uuid_cache: dict[int, str] = {}

    def read() -> tuple[str, Mapping[str, Any]] | None:
        torch = sys.modules.get("torch")
        if torch is None or not torch.cuda.is_initialized():
            return None
        # The scrape thread's current device is not the trainer's: use the model's device,
        # else torchrun's convention (one device per local rank) within what is visible.
        device = device_fn()
        if device is None:
            device = local_rank % max(torch.cuda.device_count(), 1)
        if device not in uuid_cache:
            uuid = str(torch.cuda.get_device_properties(device).uuid)
            uuid_cache[device] = uuid if uuid.startswith("GPU-") else f"GPU-{uuid}"
        return uuid_cache[device], torch.cuda.memory_stats(device)

    return read


def render_stats(rank: RankInfo, uuid: str, stats: Mapping[str, Any]) -> list[Metric]:
    """The allocator series for one device's `memory_stats` (pure)."""
    labels = [*rank_values(rank), uuid]
    out: list[Metric] = []
    for spec, key in (
        (contract.CUDA_MEMORY_RESERVED, "reserved_bytes.all.current"),
        (contract.CUDA_ALLOC_RETRIES, "num_alloc_retries"),
        (contract.CUDA_OOMS, "num_ooms"),
    ):
        fam = family(spec)
        fam.add_metric(labels, float(stats.get(key, 0)))  # type: ignore[attr-defined]
        out.append(fam)
    return out


class CudaMemoryCollector(Collector):
    """Allocator gauges/counters for the rank's device, read at scrape time."""

    def __init__(
        self,
        rank: RankInfo,
        stats: StatsReader | None = None,
        device_fn: Callable[[], int | None] = lambda: None,
    ) -> None:
        self._rank = rank
        self._stats = stats if stats is not None else _torch_stats(rank.local_rank, device_fn)

    def collect(self) -> Iterator[Metric]:
        try:
            got = self._stats()
        except Exception:  # telemetry must never break a scrape, let alone training
            return
        if got is not None:
            yield from render_stats(self._rank, *got)
