"""The ports a job's ranks listen on: the spec's, or on the host network a block of their own.

On the pod network every pod has its own ports, so ``training.metricsPort`` and
``masterPort`` serve every job. With ``spec.template.hostNetwork`` the ranks share their
node's ports with every other host-network job there: two jobs with the default ports could
never share a node, and a process outside Kubernetes might hold them. So by default
(``training.hostNetworkPorts: Auto``) such a job gets a block of :data:`BLOCK` ports of its
own, chosen from its UID in :data:`RANGE`: the metrics ports first, the rendezvous port
last. A pure function of the job, so an operator restart, the webhook and the scraper all
agree without storing anything. Two jobs whose UIDs pick the same block are kept apart by
the scheduler, because the builder declares every port as a hostPort.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Final

from gpujob_operator.api.spec import GPUTrainingJobSpec

RANGE: Final = (20000, 30000)
"""Above the well-known and registered ports that node daemons use (kubelet 10250, node
exporter 9100), below the NodePort range (30000-32767) and Linux's ephemeral ports."""
BLOCK: Final = 16
"""Blocks are aligned, so two jobs' blocks are either the same or apart."""


METRICS_PORT_PREFIX: Final = "metrics-"
"""Local rank i's container port is named ``metrics-<i>``: the builder names it, the
scraper reads each rank's port back from the pod by that name."""


def metrics_port_name(local_rank: int) -> str:
    return f"{METRICS_PORT_PREFIX}{local_rank}"


def metrics_port_rank(name: str) -> int | None:
    """The local rank a container port's name stands for (None: not a metrics port)."""
    suffix = name.removeprefix(METRICS_PORT_PREFIX)
    return int(suffix) if suffix != name and suffix.isdigit() else None


@dataclass(frozen=True)
class RankPorts:
    """Where local rank i serves metrics (``metrics + i``) and rank 0 its rendezvous."""

    metrics: int
    master: int
    on_host: bool


def rank_ports(spec: GPUTrainingJobSpec, identity: str) -> RankPorts:
    """The job's ports; `identity` is its UID (or namespace/name where no UID exists yet)."""
    t = spec.training
    on_host = bool(spec.template and spec.template.host_network)
    if not on_host or t.host_network_ports == "Spec":
        return RankPorts(metrics=t.metrics_port, master=t.master_port, on_host=on_host)
    size = -(-(spec.procs_per_node + 1) // BLOCK) * BLOCK
    blocks = (RANGE[1] - RANGE[0]) // size
    digest = int(hashlib.sha256(identity.encode()).hexdigest()[:12], 16)
    base = RANGE[0] + (digest % blocks) * size
    return RankPorts(metrics=base, master=base + spec.procs_per_node, on_host=True)
