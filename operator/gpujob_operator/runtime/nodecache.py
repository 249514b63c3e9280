"""The cluster's nodes for placement checks, read at most once per TTL for the whole operator.

A job whose next attempt avoids blamed nodes checks that its gang still fits without them
(:mod:`~gpujob_operator.lifecycle.blame`). That needs every node, which at thousands of
nodes is megabytes: the list is made only when such a job is about to create pods, shared
by every job loop (one call in flight; the others wait for it) and kept for
:data:`TTL_SECONDS`. Only what placement reads is kept of each node (name, labels, taints,
unschedulable, allocatable,
declared features). A refused or failed list is remembered for the same time as
the reason, which the job's NodesAvoided condition shows.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any, Final

from kubernetes.client.rest import ApiException

from gpujob_operator.lifecycle.blame import NodeView
from gpujob_operator.observability.opmetrics import METRICS, error_reason
from gpujob_operator.runtime import listing
from gpujob_operator.runtime.kube import Kube, api_reason, in_api_thread

log = logging.getLogger("gpujob.nodes")

TTL_SECONDS: Final = 30.0


def slim(node: Mapping[str, Any]) -> dict[str, Any]:
    """What placement reads of a node; the rest (images, conditions, addresses) is dropped."""
    meta, spec, status = (node.get(k) or {} for k in ("metadata", "spec", "status"))
    return {
        "metadata": {"name": meta.get("name"), "labels": dict(meta.get("labels") or {})},
        "spec": {
            "unschedulable": bool(spec.get("unschedulable")),
            "taints": list(spec.get("taints") or []),
        },
        "status": {
            "allocatable": dict(status.get("allocatable") or {}),
            "declaredFeatures": list(status.get("declaredFeatures") or []),
        },
    }


ERROR_TTL_SECONDS: Final = 5.0
"""A failed list is retried this soon: a job creating pods meanwhile goes without its fit."""
STALE_OK_SECONDS: Final = 300.0
"""After a failed list, the last good one serves this long: nodes change slowly, and a blip
of the API server must not send a gang onto the nodes it blamed."""


def _list_nodes(kube: Kube) -> tuple[dict[str, Any], ...]:
    """List, read and slim every node in the calling thread: the body of thousands of nodes
    is tens of MB, not for the event loop. ``resourceVersion=0`` is served from the API
    server's watch cache, not from etcd."""
    resp: Any = kube.core.list_node(
        _preload_content=False, _request_timeout=listing.READ_TIMEOUT, resource_version="0"
    )
    items = json.loads(resp.data).get("items") or []
    return tuple(slim(n) for n in items if isinstance(n, Mapping))


class NodeCache:
    """``await get()``: the nodes, from one list call per :data:`TTL_SECONDS` at most."""

    def __init__(self, kube: Kube, clock: Callable[[], float] = time.monotonic) -> None:
        self.kube = kube
        self.clock = clock
        self._view: NodeView | None = None
        self._good: NodeView | None = None
        self._good_at = -float("inf")
        self._read_at = -float("inf")
        self._lock = asyncio.Lock()

    async def get(self) -> NodeView:
        async with self._lock:  # one list in flight; the others wait and share it
            now = self.clock()
            ttl = ERROR_TTL_SECONDS if self._view is not None and self._view.error else TTL_SECONDS
            if self._view is None or now - self._read_at >= ttl:
                self._view = await self._read(now)
                self._read_at = self.clock()
            return self._view

    async def _read(self, now: float) -> NodeView:
        try:
            nodes = await in_api_thread(_list_nodes, self.kube)
        except Exception as e:
            why = (
                f"cannot list nodes: {e.status} {api_reason(e)}"
                if isinstance(e, ApiException)
                else f"cannot list nodes: {error_reason(e)}"
            )
            METRICS.observe_api_error("list_nodes", error_reason(e))
            if self._good is not None and now - self._good_at <= STALE_OK_SECONDS:
                log.warning("%s; using the list from %.0fs ago", why, now - self._good_at)
                return self._good
            log.warning("%s; blamed nodes are not avoided until it can", why)
            return NodeView((), why)
        self._good, self._good_at = NodeView(nodes), now
        return self._good
