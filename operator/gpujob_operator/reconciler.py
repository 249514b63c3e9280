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
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from gpujob_operator import conditions as c
from gpujob_operator import planner
from gpujob_operator.kube import Kube
from gpujob_operator.monitor import JobMonitor
from gpujob_operator.opmetrics import METRICS
from gpujob_operator.scrape import Scraper

log = logging.getLogger("gpujob.reconciler")

RESYNC_SECONDS = 30.0
IDLE_RESYNC_SECONDS = 300.0
"""A finished job only changes through events (which wake its loop); resync it rarely."""
SERVICE_RECHECK_SECONDS = 300.0
"""How long a seen Service is trusted without a GET (a thousand jobs, one GET each per pass)."""
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
    scraper: Scraper | None = None
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    monitor: JobMonitor | None = None
    monitored: tuple[int, int] | None = (
        None  # (generation, attempt) the monitor's window belongs to
    )
    next_scrape: float = 0.0
    service_seen_at: float = -1e9
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

    async def reconcile(
        self,
        body: Mapping[str, Any],
        pods: Iterable[Mapping[str, Any]],
        now: datetime | None = None,
    ) -> planner.Plan:
        """Plan from what is observed and apply it; returns the plan for the caller's timing."""
        job = self.freshest(body)
        meta = job["metadata"]
        ns, name = meta["namespace"], meta["name"]
        observed = [planner.observe_pod(p) for p in pods]
        started = time.monotonic()
        stale = time.monotonic() - self.service_seen_at > SERVICE_RECHECK_SECONDS
        if stale and await self.kube.service_exists(ns, name):
            self.service_seen_at = time.monotonic()
        service = time.monotonic() - self.service_seen_at <= SERVICE_RECHECK_SECONDS
        plan = planner.plan(job, observed, now or datetime.now(UTC), service_exists=service)
        self.reconciles += 1
        old_status = {k: v for k, v in (job.get("status") or {}).items() if k != "kopf"}
        patch = planner.merge_patch(old_status, plan.status)
        if patch and not await self._write_status(ns, name, patch):
            log.info("job %s/%s is gone; nothing to apply", ns, name)
            return plan
        for pod in plan.delete_pods:
            await self.kube.delete_pod(ns, pod)
        if plan.create_service is not None:
            await self.kube.create_service(ns, plan.create_service)
            self.service_seen_at = time.monotonic()
        for pod_body in plan.create_pods:
            await self.kube.create_pod(ns, pod_body)
        for ev in plan.events:
            self.post_event(job, ev.type, ev.reason, ev.message)
        if plan.delete_job:
            log.info("deleting finished job %s/%s (ttlSecondsAfterFinished)", ns, name)
            await self.kube.delete_job(ns, name)
        METRICS.observe_reconcile(time.monotonic() - started)
        METRICS.update(ns, name, plan.status)
        if plan.create_pods or plan.delete_pods or plan.events:
            log.info(
                "reconciled %s/%s: phase=%s created=%s deleted=%s events=%s",
                ns,
                name,
                plan.phase,
                [p["metadata"]["name"] for p in plan.create_pods],
                plan.delete_pods,
                [e.reason for e in plan.events],
            )
        return plan

    async def _write_status(self, ns: str, name: str, patch: dict[str, Any]) -> bool:
        """Patch status; False when the job no longer exists."""
        written = await self.kube.patch_status(ns, name, patch)
        if written is None:
            return False
        self.last_written = written
        return True

    async def observe_metrics(self, pods: list[Mapping[str, Any]]) -> float | None:
        """Scrape the ranks when due and fold the result into status; seconds until the next.

        Only a Running job is scraped. The window is dropped when the gang restarts or the
        spec changes, so rates never mix two attempts.
        """
        if self.scraper is None:
            return None
        job = self.freshest(self.body)
        status, spec = job.get("status") or {}, job.get("spec") or {}
        if status.get("phase") != c.PHASE_RUNNING or not (spec.get("monitoring") or {}).get(
            "enabled", True
        ):
            return None
        meta = job["metadata"]
        identity = (int(meta.get("generation") or 0), int(status.get("attempt") or 0))
        if self.monitor is None or self.monitored != identity:
            self.monitor = JobMonitor(spec, generation=identity[0])
            self.monitored = identity
        interval = float((spec.get("monitoring") or {}).get("scrapeIntervalSeconds") or 15)
        now = time.time()
        if now < self.next_scrape:
            return self.next_scrape - now
        self.next_scrape = now + interval
        targets = self.monitor.scrape_targets(spec, pods)
        results = await self.scraper.scrape_all(targets)
        for r in results:
            METRICS.observe_scrape(r.seconds, r.ok, None if r.error is None else str(r.error))
        update = self.monitor.observe(results, time.time())
        for ev in update.events:
            self.post_event(job, ev.type, ev.reason, ev.message)
        patch = update.status_patch(status)
        if patch:
            await self._write_status(meta["namespace"], meta["name"], patch)
            METRICS.update(meta["namespace"], meta["name"], self.freshest(self.body).get("status"))
        return interval

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
        meta = self.body.get("metadata", {})
        METRICS.forget(meta.get("namespace", ""), meta.get("name", ""))

    @property
    def key(self) -> str:
        meta = self.body.get("metadata", {})
        return f"{meta.get('namespace')}/{meta.get('name')}"

    async def _run(self) -> None:
        while True:
            try:
                plan = await self.reconcile(self.body, self._pods())
                resync = (
                    IDLE_RESYNC_SECONDS if plan.phase in ("Succeeded", "Failed") else RESYNC_SECONDS
                )
                timeout = min(plan.requeue_after or resync, resync)
            except asyncio.CancelledError:
                raise
            except Exception as e:
                log.exception("reconcile of %s failed; retrying in 5s", self.key)
                METRICS.observe_reconcile(0.0, type(e).__name__)
                timeout = 5.0
            try:
                due = await self.observe_metrics(self._pods())
                if due is not None:
                    timeout = min(timeout, due)
            except asyncio.CancelledError:
                raise
            except Exception:
                # A monitoring failure must never stop the lifecycle: log and go on.
                log.exception("metrics of %s failed", self.key)
            await self.sleep(max(timeout, 0.0))

    async def sleep(self, timeout: float) -> None:
        """Wait for a wake-up or the timeout, then coalesce a burst of events."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.wake.wait(), timeout)
        self.wake.clear()
        await asyncio.sleep(DEBOUNCE_SECONDS)
