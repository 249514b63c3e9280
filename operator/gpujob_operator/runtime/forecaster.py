"""The start-time forecast of waiting jobs, on its own clock (I/O).

One task per operator replica that serves jobs. Every ``GPUJOB_FORECAST_INTERVAL`` seconds
(or soon after a new job appears) it reads what the forecast needs, only when some job
waits and only for the kind of wait there is (nodes and GPU pods for native and unmanaged
gangs; ClusterQueues, LocalQueues and Workloads under Kueue), runs the pure forecast over
the whole fleet at once (:mod:`~gpujob_operator.lifecycle.forecast.queuestatus`) and patches only
the jobs whose forecast moved. A refused or failed read makes the affected forecasts
Unknown with the reason (for example a namespaced install without the forecast's
ClusterRole); a failed patch is logged and counted, and the next pass writes it again.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any, Final

from kubernetes.client.rest import ApiException

from gpujob_operator.lifecycle.forecast import queueview
from gpujob_operator.lifecycle.forecast.queuestatus import QueueUpdate, forecast_blocks, updates
from gpujob_operator.lifecycle.forecast.queueview import World, split_waiting
from gpujob_operator.lifecycle.gang import gang
from gpujob_operator.observability.opmetrics import METRICS, error_reason
from gpujob_operator.runtime import listing
from gpujob_operator.runtime.kube import Kube, api_reason, in_api_thread

log = logging.getLogger("gpujob.forecast")

MIN_GAP_SECONDS: Final = 2.0
"""Passes woken by new jobs are at least this far apart (a burst of creates is one pass)."""
ACTIVE_POD_FIELDS: Final = "spec.nodeName!=,status.phase!=Succeeded,status.phase!=Failed"


def _why(what: str, e: Exception) -> str:
    if isinstance(e, ApiException):
        return f"cannot list {what}: {e.status} {api_reason(e)}"
    return f"cannot list {what}: {error_reason(e)}"


class Forecaster:
    """Reads, forecasts and patches; ``jobs`` gives the jobs this replica serves now."""

    def __init__(
        self,
        kube: Kube,
        jobs: Callable[[], Sequence[Mapping[str, Any]]],
        interval: float,
        default_gang: str,
        kueue: bool,
        post_event: Callable[[Mapping[str, Any], str, str, str], None] | None = None,
    ) -> None:
        self.kube = kube
        self.post_event = post_event
        self.jobs = jobs
        self.interval = interval
        self.default_gang = default_gang
        self.kueue = kueue
        self.wake = asyncio.Event()

    async def run(self) -> None:
        """Forecast until cancelled; one pass's failure is logged and the next one runs."""
        while True:
            try:
                await asyncio.wait_for(self.wake.wait(), self.interval)
                await asyncio.sleep(MIN_GAP_SECONDS)  # a rate limit, not synchronisation
            except TimeoutError:
                pass
            self.wake.clear()
            try:
                await self.pass_once(time.time())
            except asyncio.CancelledError:
                raise
            except Exception as e:  # never let one bad pass end the forecasts
                log.warning("forecast pass failed: %s", e, exc_info=True)
                METRICS.observe_api_error("forecast", error_reason(e))

    async def pass_once(self, now: float) -> list[QueueUpdate]:
        """One pass: read what the waiting jobs need, forecast, patch what moved."""
        began = time.monotonic()
        jobs = list(self.jobs())
        # The pure forecast runs in a worker thread: over a thousand jobs (and a wide job's
        # spec) it held the event loop for seconds.
        waiting = await asyncio.to_thread(split_waiting, jobs, self.default_gang)
        native, kueue = (bool(kind) for kind in waiting)
        world = await self.read(native, kueue and self.kueue)
        if kueue and not self.kueue:
            world = replace(
                world, kueue_error="Kueue is not enabled for the operator (GPUJOB_KUEUE=0)"
            )
        blocks, todo = await asyncio.to_thread(self._forecast, now, jobs, world)
        took = time.monotonic() - began
        METRICS.observe_forecast(took)
        log.log(
            logging.INFO if todo else logging.DEBUG,
            "forecast: %d jobs, %d waiting (nodes %s, Kueue %s), %d to write, %.3fs",
            len(jobs),
            len(blocks),
            native,
            kueue,
            len(todo),
            took,
        )
        for update in todo:
            await self._write(update)
        return todo

    def _forecast(
        self, now: float, jobs: list[Any], world: World
    ) -> tuple[dict[str, dict[str, Any]], list[QueueUpdate]]:
        blocks = forecast_blocks(now, jobs, world, self.default_gang)
        return blocks, updates(now, jobs, blocks)

    async def read(self, native: bool, kueue: bool) -> World:
        """Nodes and bound GPU pods (native), Kueue's queues and Workloads (Kueue)."""
        nodes: list[Any] = []
        pods: list[Any] = []
        cqs: list[Any] = []
        lqs: list[Any] = []
        wls: list[Any] = []
        nodes_error = kueue_error = None
        if native:
            try:
                nodes = await self._core("list_node")
                pods = await self._core(
                    "list_pod_for_all_namespaces",
                    queueview.holder_projection,
                    field_selector=ACTIVE_POD_FIELDS,
                )
            except Exception as e:
                nodes_error = _why("nodes and pods", e)
                METRICS.observe_api_error("list_for_forecast", error_reason(e))
        if kueue:
            try:
                cqs = await self._kueue("clusterqueues")
                lqs = await self._kueue("localqueues")
                wls = await self._kueue("workloads")
            except Exception as e:
                kueue_error = _why("Kueue queues and Workloads", e)
                METRICS.observe_api_error("list_for_forecast", error_reason(e))
        return World(nodes, pods, cqs, lqs, wls, nodes_error, kueue_error)

    async def _core(
        self, call: str, project: Callable[[Any], Any] | None = None, **kw: Any
    ) -> list[Any]:
        """A core list as plain camelCase dicts (the raw JSON: no model round trip), read
        page by page, each page decoded and (with ``project``) reduced to what the forecast
        reads in a worker thread: a cluster of thousands of pods never sits whole in
        memory, nor is decoded on the event loop."""
        call_api = getattr(self.kube.core, call)
        listed = await in_api_thread(listing.list_pages, call_api, project, **kw)
        return listed.items

    async def _kueue(self, plural: str) -> list[Any]:
        got: Any = await in_api_thread(
            self.kube.custom.list_cluster_custom_object,
            gang.KUEUE_GROUP,
            gang.KUEUE_VERSION,
            plural,
            _request_timeout=listing.READ_TIMEOUT,
        )
        return list(got.get("items") or [])

    async def _write(self, update: QueueUpdate) -> None:
        try:
            written = await self.kube.patch_status(update.namespace, update.name, update.patch)
        except Exception as e:
            log.warning("job %s/%s: cannot write its start forecast: %s", update.namespace,
                        update.name, e)  # fmt: skip
            METRICS.observe_api_error("patch_status", error_reason(e))
            return
        if written is None:
            return
        METRICS.update(update.namespace, update.name, written.get("status") or {})
        if update.event is not None and self.post_event is not None:
            ev = update.event
            try:
                self.post_event(written, ev.type, ev.reason, ev.message)
            except Exception as e:  # an Event is a courtesy; the status already says it
                log.warning("job %s/%s: cannot post its forecast Event: %s", update.namespace,
                            update.name, e)  # fmt: skip
        if update.error_seconds is not None:
            METRICS.observe_forecast_error(update.error_seconds)
            log.info("job %s/%s started %+.0fs from its forecast", update.namespace,
                     update.name, update.error_seconds)  # fmt: skip
