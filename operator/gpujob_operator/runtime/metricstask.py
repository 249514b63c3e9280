"""The job loop's metrics task: scrape a Running job's ranks and fold them into status.

It runs beside the lifecycle task on its own clock, so a restart or a failure is never
handled late because scrapes (this job's or another's dead endpoints) are slow. The scrape
itself runs without the job's lock; folding the result into status takes it, and a round
that straddles a gang restart or a spec change is discarded. Each job scrapes at its own
phase within the interval (:func:`next_tick`), so a thousand jobs do not scrape in lockstep.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final

from gpujob_operator.api import conditions as c
from gpujob_operator.api.children import job_uid
from gpujob_operator.api.hostports import host_port_refusal
from gpujob_operator.api.profile import wanted, with_profile
from gpujob_operator.api.spec import parse_spec
from gpujob_operator.api.status import attempt_of, stall_evidence
from gpujob_operator.api.statusupgrade import upgrade
from gpujob_operator.lifecycle import endpoints
from gpujob_operator.monitoring.monitor import JobMonitor, exited_ranks, with_hang
from gpujob_operator.monitoring.scrape.result import ErrorKind, ScrapeTarget
from gpujob_operator.monitoring.verdicts.verdict import STALLED
from gpujob_operator.observability.opmetrics import METRICS
from gpujob_operator.runtime import hangcapture
from gpujob_operator.runtime.faults import BEFORE_EVIDENCE_RECORD, fault_point
from gpujob_operator.runtime.jobhandle import JobHandle
from gpujob_operator.runtime.kube import Fenced, JobGone
from gpujob_operator.runtime.profilecapture import ProfileCapture

log = logging.getLogger("gpujob.hang")

OBSERVE_INLINE_RANKS: Final = 64
"""A round of more ranks than this is analysed in a worker thread, not on the event loop."""


@dataclass
class MetricsTask:
    """One job's scrape state: its monitor (window, hysteresis) and its scrape clock."""

    loop: JobHandle
    """The job loop that owns this task, seen through the calls the task may make."""
    monitor: JobMonitor | None = None
    monitored: tuple[int, int] | None = None
    """(generation, attempt) the monitor's window belongs to."""
    next_scrape: float = 0.0
    failures: int = 0
    """Failed scrape-and-status passes in a row (their backoff)."""
    wake: asyncio.Event = field(default_factory=asyncio.Event, repr=False)
    captured: str | None = None
    """The stall (its Stalled transition time) whose evidence this task last took."""
    unwritten: dict[str, Any] | None = None
    """That stall's ``status.hangEvidence`` until a status write took it."""
    profiles: ProfileCapture = field(default_factory=ProfileCapture)
    """The job's profile request under way, if any (``status.profile``)."""

    async def observe(self, pods: list[Mapping[str, Any]]) -> float | None:
        """Scrape the ranks when due and fold the result into status; seconds until the next.

        Only a Running job is scraped. The window is dropped when the gang restarts or the
        spec changes, so rates never mix two attempts; a round that straddles such a change
        is discarded. The scrape itself runs without the lock: the lifecycle never waits
        for an endpoint.
        """
        loop = self.loop
        if loop.scraper is None:
            return None
        job = loop.freshest(loop.body)
        status, spec = job.get("status") or {}, job.get("spec") or {}
        if status.get("phase") != c.PHASE_RUNNING or not (spec.get("monitoring") or {}).get(
            "enabled", True
        ):
            loop.scraper.budget.forget(job_uid(job))  # its share of the scrape CPU goes back
            if self.profiles.in_flight or wanted(job):
                await self.profile(job, None)  # a request now is refused (or a capture ends)
            return None
        meta = job["metadata"]
        identity = (int(meta.get("generation") or 0), attempt_of(status))
        if self.monitor is None or self.monitored != identity:
            self.monitor = JobMonitor(spec, generation=identity[0])
            known = upgrade(status)  # a status of the previous shape reads the same
            rate = (known.get("operatorState") or {}).get("rateSince")
            self.monitor.carry(known.get("progress"), identity[1], rate)
            self.monitored = identity
        monitor = self.monitor
        interval = float((spec.get("monitoring") or {}).get("scrapeIntervalSeconds") or 15)
        if self.profiles.in_flight or wanted(job):  # else nothing to parse on this wake-up
            ports = loop.host_ports
            barred = host_port_refusal(parse_spec(spec), ports) is not None
            targets = None if barred else monitor.scrape_targets(spec, pods, job_uid(job), ports)
            await self.profile(job, targets)
        now = time.time()
        if now < self.next_scrape:
            return self.next_scrape - now
        self.next_scrape = next_tick(now, interval, job_uid(job))
        refusal = host_port_refusal(parse_spec(spec), loop.host_ports)
        if refusal is not None:
            await self.refuse_ports(refusal)
            return interval
        targets = monitor.scrape_targets(spec, pods, job_uid(job), loop.host_ports)
        results = await loop.scraper.scrape_all(targets)
        # Charged to the job's share of the operator's scrape CPU: over it, the next round
        # waits longer (this job's scraping slows, no other's), and MetricsAvailable says so.
        cpu = sum(r.cpu for r in results)
        paced, stretch = loop.scraper.budget.pace(
            job_uid(job), interval, cpu, len(results), time.time()
        )
        if stretch is not None:  # said once in a Warning Event, and in MetricsAvailable
            self.next_scrape = max(self.next_scrape, now + paced)
        for r in results:
            METRICS.observe_scrape(r.seconds, r.ok, None if r.error is None else str(r.error))
            refused = r.error in (ErrorKind.TOO_LARGE, ErrorKind.TOO_MANY_CHUNKS)
            dropped_bytes = r.size if refused else 0
            METRICS.observe_dropped(r.dropped_series, r.dropped_values, dropped_bytes)
        async with loop.lock:
            job = loop.freshest(loop.body)
            status = job.get("status") or {}
            meta = job["metadata"]
            now_identity = (int(meta.get("generation") or 0), attempt_of(status))
            if monitor is not self.monitor or now_identity != identity:
                return interval  # the gang restarted (or the spec changed) meanwhile
            if status.get("phase") != c.PHASE_RUNNING:
                return None
            monitor.hang = stall_evidence(status)
            # The pods as they are now: ranks may have exited during the scrape.
            exited = exited_ranks(loop.pods() or pods, job_uid(job))
            observe = functools.partial(
                monitor.observe, results, time.time(), exited=exited, stretch=stretch
            )
            # A wide job's round is analysed in a worker thread (4,096 ranks held the event
            # loop 1-2 s); the monitor is this task's alone, and the job's lock is held.
            wide = len(results) > OBSERVE_INLINE_RANKS
            update = await asyncio.to_thread(observe) if wide else observe()
            capped = update.dropped_series - sum(r.dropped_series for r in results)
            if capped > 0:  # refused by the job's own series cap (not counted per result)
                METRICS.observe_dropped(capped, 0, 0)
            for ev in update.events:
                loop.post_event(job, ev.type, ev.reason, ev.message)
            patch = update.status_patch(status)
            if patch and patch.get("bottleneck"):  # its advice names this attempt's profile
                patch["bottleneck"] = with_profile(
                    patch["bottleneck"], status.get("profile"), identity[1]
                )
            if patch:
                await loop.write_status(meta["namespace"], meta["name"], patch)
                METRICS.update(meta["namespace"], meta["name"], loop.peek_status())
                loop.wake.set()  # the lifecycle acts on what was observed (restartOnStall)
            since = hangcapture.due(loop.peek_status())
            if since is not None and since != self.captured:
                job = loop.freshest(loop.body)  # the evidence's copy of the job
        if since is not None and since != self.captured:
            self.captured = since  # once per stall: a failed capture is recorded, not retried
            try:
                self.unwritten = await self.take_evidence(job, targets, since)
            except Fenced:
                self.captured = None  # not a failure: taken again once this replica may write
                raise
        if self.unwritten is not None:
            await self.record_evidence(identity)
        return interval

    async def profile(self, job: Mapping[str, Any], targets: list[ScrapeTarget] | None) -> None:
        """Advance the job's profile request (``runtime/profilecapture.py``). A failure there
        is logged and left for the next pass: it never holds up the scrape."""
        loop = self.loop
        key = loop.token_key
        token = endpoints.endpoint_token(key, job) if key is not None else ""
        try:
            await self.profiles.advance(loop, job, targets, token)
        except (Fenced, JobGone, asyncio.CancelledError):
            raise
        except Exception:
            log.exception("profile request of %s failed this pass", job["metadata"].get("name"))

    async def refuse_ports(self, message: str) -> None:
        """The job's metrics ports are node ports the operator may not scrape: say so in
        MetricsAvailable (reason HostPortsNotAllowed) and a Warning Event, once."""
        loop = self.loop
        async with loop.lock:
            job = loop.freshest(loop.body)
            status, meta = job.get("status") or {}, job["metadata"]
            old = c.find(status.get("conditions"), c.METRICS_AVAILABLE) or {}
            if old.get("reason") == c.HOST_PORTS_NOT_ALLOWED and old.get("message") == message:
                return
            conditions = c.set_condition(
                status.get("conditions"), c.METRICS_AVAILABLE, c.FALSE,
                c.HOST_PORTS_NOT_ALLOWED, message, datetime.now(UTC),
                int(meta.get("generation") or 0),
            )  # fmt: skip
            await loop.write_status(meta["namespace"], meta["name"], {"conditions": conditions})
            loop.post_event(job, "Warning", c.HOST_PORTS_NOT_ALLOWED, message)

    async def take_evidence(
        self, job: Mapping[str, Any], targets: list[ScrapeTarget], since: str
    ) -> dict[str, Any]:
        """Capture the stall's evidence without the lock: its record, whatever happens."""
        loop = self.loop
        assert loop.scraper is not None
        try:
            gpus = self.monitor.rank_gpus() if self.monitor is not None else {}
            key = loop.token_key
            token = endpoints.endpoint_token(key, job) if key is not None else ""
            record, report = await hangcapture.capture(
                loop.kube, loop.scraper, job, targets, since, gpus, token
            )
        except Fenced:
            raise
        except Exception as e:  # a bug or a dead worker thread: say so, let the restart go
            log.exception("hang evidence of %s failed", job["metadata"].get("name"))
            summary = f"the evidence could not be taken: {type(e).__name__}: {str(e)[:300]}"
            record = {"stalledSince": since, "summary": summary, "note": summary}
            record["attempt"] = attempt_of(job.get("status") or {})
            METRICS.observe_hang_capture("unrecorded")
            loop.post_event(job, "Warning", c.HANG_EVIDENCE, summary)
            return record
        fault_point(loop.fault_at, BEFORE_EVIDENCE_RECORD)
        outcome = "partial" if report.silent or report.unusable else "complete"
        METRICS.observe_hang_capture(outcome if record["configMap"] else "unrecorded")
        cm = record.get("configMap")
        where = f"every rank's stacks: kubectl get configmap {cm} -o yaml" if cm else record["note"]
        loop.post_event(job, "Warning", c.HANG_EVIDENCE, f"{report.summary}; {where}")
        return record

    async def record_evidence(self, identity: tuple[int, int]) -> None:
        """Write the record (and the answer into the Stalled condition and verdict) while
        the job is still in that stall; a failed write is tried again next round."""
        loop, record = self.loop, self.unwritten
        assert record is not None
        async with loop.lock:
            job = loop.freshest(loop.body)
            status, meta = job.get("status") or {}, job["metadata"]
            now_identity = (int(meta.get("generation") or 0), attempt_of(status))
            if now_identity != identity or hangcapture.due(status) != record["stalledSince"]:
                self.unwritten = None  # restarted, recovered or already recorded meanwhile
                return
            patch: dict[str, Any] = {
                "hangEvidence": record,
                "conditions": hangcapture.stalled_message(status.get("conditions") or [], record),
            }
            bottleneck = status.get("bottleneck") or {}
            if bottleneck.get("verdict") == STALLED:
                patch["bottleneck"] = with_hang(bottleneck, record)
            try:
                await loop.write_status(meta["namespace"], meta["name"], patch)
            except JobGone:
                raise
            except Exception as e:
                log.warning("hang evidence of %s not recorded yet: %s", meta["name"], e)
                return
            self.unwritten = None
            if self.monitor is not None:
                self.monitor.hang = record
            loop.wake.set()  # restartOnStall waits for this record

    async def run(self) -> None:
        """Until the loop ends: observe when due, back off on failure, sleep until woken."""
        loop = self.loop
        try:
            await self._run()
        finally:
            if loop.scraper is not None and self.monitored is not None:
                loop.scraper.budget.forget(job_uid(loop.body))

    async def _run(self) -> None:
        loop = self.loop
        while not loop.ended:
            try:
                due = await self.observe(loop.pods())
            except asyncio.CancelledError:
                raise
            except JobGone as gone:
                loop.job_gone(gone)
                return
            except Exception as e:
                # A monitoring failure must never stop the lifecycle: classify, back off, go on.
                # A write held back by the peering fence is no failure: it counts nothing.
                self.failures += not isinstance(e, Fenced)
                due = loop.side_failure("metrics", e, self.failures)
            else:
                self.failures = 0
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(
                    self.wake.wait(), loop.resync_seconds if due is None else max(due, 0.0)
                )
            self.wake.clear()


def next_tick(now: float, interval: float, uid: str) -> float:
    """The job's next scrape time: its own phase within the interval (from its UID), so a
    thousand jobs started together do not scrape in lockstep and queue for the slots."""
    offset = (zlib.crc32(uid.encode()) % 997) / 997 * interval
    wait = interval - ((now - offset) % interval)
    return now + (wait if wait > 1e-3 else wait + interval)  # never twice in a row
