"""The I/O shell around the pure planner: observe, plan, apply, one job at a time.

One :class:`JobLoop` runs per job (a kopf daemon). It wakes on any event of the job
or its pods and on the plan's own deadline, then applies the plan in the order the
planner demands: status, deletes, creates, Events. The last status this loop wrote is
remembered so that a reconcile that runs before the watch delivers our own write
never counts a gang restart twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from gpujob_operator import planner
from gpujob_operator.kube import Kube

log = logging.getLogger("gpujob.reconciler")

RESYNC_SECONDS = 30.0
DEBOUNCE_SECONDS = 0.05

EventPoster = Callable[[Mapping[str, Any], str, str, str], None]


def _rv(obj: Mapping[str, Any] | None) -> int:
    """The resourceVersion as an int for "which copy is newer" (etcd revisions are ints)."""
    try:
        return int((obj or {}).get("metadata", {}).get("resourceVersion", "0"))
    except ValueError:
        return 0


@dataclass
class JobLoop:
    """Reconciles one GPUTrainingJob until its daemon is stopped."""

    kube: Kube
    post_event: EventPoster
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    last_written: dict[str, Any] | None = None
    reconciles: int = 0
    body: dict[str, Any] = field(default_factory=dict)
    _pods: Callable[[], list[Mapping[str, Any]]] = field(default=lambda: [], repr=False)
    _task: asyncio.Task[None] | None = field(default=None, repr=False)

    def freshest(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """The live body, or our own last write when the watch has not delivered it yet."""
        live = copy.deepcopy(dict(body))
        if self.last_written is not None and _rv(self.last_written) > _rv(live):
            live["status"] = copy.deepcopy(self.last_written.get("status", {}))
        return live

    async def reconcile(self, body: Mapping[str, Any], pods: Iterable[Mapping[str, Any]],
                        now: datetime | None = None) -> planner.Plan:  # fmt: skip
        """Plan from what is observed and apply it; returns the plan for the caller's timing."""
        job = self.freshest(body)
        meta = job["metadata"]
        ns, name = meta["namespace"], meta["name"]
        observed = [planner.observe_pod(p) for p in pods]
        service = await self.kube.service_exists(ns, name)
        plan = planner.plan(job, observed, now or datetime.now(UTC), service_exists=service)
        self.reconciles += 1
        old_status = {k: v for k, v in (job.get("status") or {}).items() if k != "kopf"}
        patch = planner.merge_patch(old_status, plan.status)
        if patch:
            written = await self.kube.patch_status(ns, name, patch)
            if isinstance(written, dict):
                self.last_written = written
        for pod in plan.delete_pods:
            await self.kube.delete_pod(ns, pod)
        if plan.create_service is not None:
            await self.kube.create_service(ns, plan.create_service)
        for pod_body in plan.create_pods:
            await self.kube.create_pod(ns, pod_body)
        for ev in plan.events:
            self.post_event(job, ev.type, ev.reason, ev.message)
        if plan.delete_job:
            log.info("deleting finished job %s/%s (ttlSecondsAfterFinished)", ns, name)
            await self.kube.delete_job(ns, name)
        if plan.create_pods or plan.delete_pods or plan.events:
            log.info(
                "reconciled %s/%s: phase=%s created=%s deleted=%s events=%s", ns, name, plan.phase,
                [p["metadata"]["name"] for p in plan.create_pods], plan.delete_pods,
                [e.reason for e in plan.events],
            )  # fmt: skip
        return plan

    # -- the task that runs the loop -------------------------------------------------------
    def start(self, body: dict[str, Any], pods: Callable[[], list[Mapping[str, Any]]]) -> None:
        """Run the loop as a task; ``pods`` returns the job's pods from the operator's index."""
        self.body = body
        self._pods = pods
        self._task = asyncio.get_running_loop().create_task(self._run(), name=f"job {self.key}")

    def update(self, body: dict[str, Any]) -> None:
        """A newer copy of the job arrived from the watch: keep it and reconcile soon."""
        self.body = body
        self.wake.set()

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()

    @property
    def key(self) -> str:
        meta = self.body.get("metadata", {})
        return f"{meta.get('namespace')}/{meta.get('name')}"

    async def _run(self) -> None:
        while True:
            try:
                plan = await self.reconcile(self.body, self._pods())
                timeout = min(plan.requeue_after or RESYNC_SECONDS, RESYNC_SECONDS)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("reconcile of %s failed; retrying in 5s", self.key)
                timeout = 5.0
            await self.sleep(max(timeout, 0.0))

    async def sleep(self, timeout: float) -> None:
        """Wait for a wake-up or the timeout, then coalesce a burst of events."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.wake.wait(), timeout)
        self.wake.clear()
        await asyncio.sleep(DEBOUNCE_SECONDS)
