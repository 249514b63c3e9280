"""Empty metric families for contract entries: the one piece every collector of the trainer shares.

A leaf under the collectors, as prometheus_client's `metrics_core` is under its own: the trainer
collector (`exporter.py`), the NVML collector (`nvml.py`) and the CUDA allocator collector
(`cuda_memory.py`) build their families here and import nothing of each other. The families
carry the names, help, units and labels of `contract.py`.
"""

from __future__ import annotations

from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from gpujob_trainer import contract
from gpujob_trainer.env import RankInfo


def family(spec: contract.MetricSpec, extra_labels: tuple[str, ...] = ()) -> Metric:
    """An empty metric family for a contract entry (labels: the contract's, in order)."""
    labels = [*spec.labels]
    for name in extra_labels:
        if name not in labels:
            labels.append(name)
    if spec.type == "counter":
        return CounterMetricFamily(spec.name, spec.help, labels=labels, unit=spec.unit)
    if spec.type == "gauge":
        return GaugeMetricFamily(spec.name, spec.help, labels=labels, unit=spec.unit)
    return HistogramMetricFamily(spec.name, spec.help, labels=labels, unit=spec.unit)


def rank_values(rank: RankInfo) -> list[str]:
    """The values of `contract.RANK_LABELS` for `rank`, in order: a rank's series begin so."""
    labels = rank.labels()
    return [labels[name] for name in contract.RANK_LABELS]
