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

On the host network the operator scrapes ``http://<nodeIP>:<port>``: any port of the node,
if it followed the spec blindly. So it scrapes (and asks for hang evidence) only the ports
the job was given: in Auto mode its own block, in Spec mode ``metricsPort`` only within the
operator's allowed host port range (``GPUJOB_HOST_PORT_RANGE``, default :data:`RANGE`), see
:func:`host_port_refusal` and :func:`scrape_port`.
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
    # The metrics ports, the rendezvous port and (runPolicy.preflight) the check's, above it.
    used = spec.procs_per_node + 1 + int(spec.run_policy.preflight.enabled)
    size = -(-used // BLOCK) * BLOCK
    blocks = (RANGE[1] - RANGE[0]) // size
    digest = int(hashlib.sha256(identity.encode()).hexdigest()[:12], 16)
    base = RANGE[0] + (digest % blocks) * size
    return RankPorts(metrics=base, master=base + spec.procs_per_node, on_host=True)


def host_port_refusal(spec: GPUTrainingJobSpec, allowed: tuple[int, int] = RANGE) -> str | None:
    """Why the operator will not scrape this job's ranks on their nodes' ports (None: it will).

    Only ``hostNetworkPorts: Spec`` on the host network can name a port outside the job's
    own: its metrics ports must lie in `allowed` (half-open), the range the operator may
    scrape on a node, not a node daemon's port.
    """
    t = spec.training
    if not (spec.template and spec.template.host_network) or t.host_network_ports != "Spec":
        return None
    lo, hi = allowed
    first, last = t.metrics_port, t.metrics_port + spec.procs_per_node - 1
    if lo <= first and last < hi:
        return None
    return (
        f"spec.training.metricsPort: with spec.template.hostNetwork and "
        f"training.hostNetworkPorts: Spec the metrics ports ({first}-{last}) must lie within "
        f"{lo}-{hi - 1}, the node ports this operator may scrape (GPUJOB_HOST_PORT_RANGE); "
        "the job runs unscraped: pick metricsPort in that range, or hostNetworkPorts: Auto"
    )


def scrape_port(
    spec: GPUTrainingJobSpec,
    identity: str | None,
    local_rank: int,
    declared: int | None,
    on_host: bool,
    allowed: tuple[int, int] = RANGE,
) -> int | None:
    """The port to scrape local rank i of a pod on, or None: not a port the job was given.

    `declared` is the pod's ``metrics-<i>`` port, `on_host` whether the pod uses its node's
    network. Off the host network a pod's ports are its own. On it, the port must be the
    one the operator assigned (`identity`: the job's UID; None: unknown, any port of the
    range) and lie in the job's block (Auto) or in `allowed` (Spec, or a pod that asks for
    the host network the spec does not).
    """
    ports = rank_ports(spec, identity or "")
    port = declared or ports.metrics + local_rank
    if not on_host:
        return port
    auto = ports.on_host and spec.training.host_network_ports == "Auto"
    if identity is not None and port != ports.metrics + local_rank:
        return None
    if auto:
        return port if RANGE[0] <= port < RANGE[1] else None
    if host_port_refusal(spec, allowed) is not None:
        return None
    return port if allowed[0] <= port < allowed[1] else None
