"""Profiles on demand: a job's request (its ``gpujob.dev/profile`` annotation, or a held
Warning verdict with ``spec.monitoring.profileOnVerdict``) carried to its ranks and back.

The metrics task calls :meth:`ProfileCapture.advance` on every pass. The capture's state
lives in the job's ``status.profile``, so an operator that restarts in the middle of one goes
on from it: a rank's ``/debug/profile?id=…&steps=…`` is idempotent on the id, so asking again
is how a capture is both started and polled. The ranks are asked at most once a second,
through the scraper (its slots, timeout and pool, with the answer's own byte cap); the
comparison and the ConfigMap's text are computed off the event loop. What is decided
(accept, refuse, compare) is pure (:mod:`gpujob_operator.api.profile`,
:mod:`gpujob_operator.monitoring.profile`); this module only asks, writes and posts.

Every request ends in a status the user can read: Refused with the reason, Failed with the
reason (the gang restarted, the job ended, no rank gave a summary), or Captured with the
one-line answer, a ConfigMap with every rank's summary and an Event.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from kubernetes.client.exceptions import ApiException

from gpujob_operator.api import conditions as c
from gpujob_operator.api import profile as req
from gpujob_operator.api.children import profile_configmap
from gpujob_operator.api.status import attempt_of
from gpujob_operator.monitoring.profile import profilecompare as pc
from gpujob_operator.monitoring.profile import profiledoc
from gpujob_operator.monitoring.scrape.result import ScrapeTarget
from gpujob_operator.runtime.jobhandle import JobHandle
from gpujob_operator.runtime.kube import Fenced, NameTaken

log = logging.getLogger("gpujob.profile")

POLL_SECONDS = 1.0
"""Least time between two rounds of asking the ranks (a pass can come on every wake-up)."""

Event = tuple[str, str, str]
"""(type, reason, message) of an Event about the job."""


def stamp(now: float) -> str:
    """An RFC 3339 time for status."""
    return c.format_time(datetime.fromtimestamp(now, UTC))


def _deadline(record: Mapping[str, Any], status: Mapping[str, Any]) -> float | None:
    """When the capture gives up on ranks still working (Unix time; None: unknown start)."""
    started = c.parse_time(record.get("requestedAt"))
    if started is None:
        return None
    steps = int(record.get("steps") or 1)
    return started.timestamp() + req.wait_seconds(steps, req.step_seconds(status))


def _ended(
    record: Mapping[str, Any], status: Mapping[str, Any], askable: bool, now: float
) -> str | None:
    """Why a capture under way can no longer finish (None: it can). ``askable``: whether
    the ranks can be asked at all (not while their ports are barred; then not forever)."""
    phase = status.get("phase")
    if phase != c.PHASE_RUNNING:
        return f"the job left Running ({phase or 'unknown'}) during the capture"
    attempt = attempt_of(status)
    if record.get("attempt") is not None and record.get("attempt") != attempt:
        return f"the gang restarted (attempt {attempt}) during the capture: its ranks are new"
    deadline = None if askable else _deadline(record, status)
    if deadline is not None and now >= deadline:
        return "no rank could be asked before the deadline (see MetricsAvailable)"
    return None


def compare_and_render(
    answers: Sequence[pc.RankProfile],
) -> tuple[pc.ProfileReport, dict[str, str]]:
    """Compare and render in one call (on a worker thread: bounded, but not the loop's)."""
    report = pc.compare(answers)
    return report, pc.configmap_data(report)


def finished_event(record: Mapping[str, Any]) -> Event:
    """The Event of a finished capture: the answer and where every rank's summary is."""
    cm = record.get("configMap")
    where = f"; every rank: kubectl get configmap {cm} -o yaml" if cm else ""
    if record.get("state") == "Captured":
        return ("Normal", c.PROFILE_CAPTURED, f"{record.get('answer')}{where}")
    return ("Warning", c.PROFILE_FAILED, f"{record.get('reason')}{where}")


class ProfileCapture:
    """One job's profile requests: the capture this runtime runs, when its ranks were asked."""

    def __init__(self) -> None:
        self.in_flight: str | None = None
        """The id of the capture this runtime is running (None: none, or not yet resumed)."""
        self.asked_at = 0.0

    async def advance(
        self,
        loop: JobHandle,
        job: Mapping[str, Any],
        targets: Sequence[ScrapeTarget] | None,
        token: str,
    ) -> None:
        """Accept or refuse a new request; ask the ranks of the capture under way; record it.

        ``targets``: the job's rank endpoints when it is Running and scraped, else None.
        """
        now = time.time()
        status = job.get("status") or {}
        decision = req.decide(job, stamp(now), self.in_flight)
        if not isinstance(decision, req.Nothing):
            meta = job["metadata"]
            log.info(
                "profile request of %s/%s: %s (in flight here: %s; status: %s %s)",
                meta.get("namespace"), meta.get("name"), decision, self.in_flight,
                (status.get("profile") or {}).get("id"), (status.get("profile") or {}).get("state"),
            )  # fmt: skip
        if isinstance(decision, req.Refuse):
            new = req.apply(status.get("profile"), decision)
            if new is not None:
                reason = c.PROFILE_FAILED if new.get("state") == "Failed" else c.PROFILE_REFUSED
                event = ("Warning", reason, decision.reason)
                await self._write(loop, job, new, event, req.bookkeeping(decision))
            return
        if isinstance(decision, req.Start):
            if not decision.resume:
                ranks = ",".join(map(str, decision.ranks[:16]))
                more = "…" if len(decision.ranks) > 16 else ""
                what = "automatic " if decision.record.get("auto") else ""
                words = (
                    f"{what}profile {decision.id}: the next {decision.steps} steps on rank(s) "
                    f"{ranks}{more}"
                )
                event = ("Normal", c.PROFILE_REQUESTED, words)
                kept = req.bookkeeping(decision)
                if not await self._write(loop, job, dict(decision.record), event, kept):
                    return
            self.in_flight, self.asked_at = decision.id, 0.0
            job = loop.freshest(loop.body)
            status = job.get("status") or {}
        record = status.get("profile") or {}
        if record.get("state") not in req.IN_FLIGHT or record.get("id") != self.in_flight:
            self.in_flight = None
            return
        why = _ended(record, status, targets is not None, now)
        if why is not None:
            final = req.failed_record(record, why, stamp(now))
            self.in_flight = None
            await self._write(loop, job, final, ("Warning", c.PROFILE_FAILED, why))
            return
        if targets is None or now - self.asked_at < POLL_SECONDS:
            return
        self.asked_at = now
        await self._ask(loop, job, record, targets, token, _deadline(record, status))

    async def _ask(
        self,
        loop: JobHandle,
        job: Mapping[str, Any],
        record: Mapping[str, Any],
        targets: Sequence[ScrapeTarget],
        token: str,
        deadline: float | None,
    ) -> None:
        assert loop.scraper is not None
        capture_id, steps = str(record["id"]), int(record.get("steps") or 1)
        chosen = {int(r) for r in record.get("ranks") or ()}
        mine = [t for t in targets if t.rank in chosen]
        asked = pc.profile_targets(mine, capture_id, steps, token)
        fetched = await loop.scraper.fetch_all(asked, profiledoc.MAX_BYTES)
        answers = pc.answers_of(asked, fetched, capture_id)
        seen = {a.rank for a in answers}
        answers += [
            pc.RankProfile(r, error="no endpoint: the rank's pod is not running")
            for r in sorted(chosen - seen)
        ]
        now = time.time()
        late = deadline is not None and now >= deadline
        if not (pc.settled(answers) or late):
            if record.get("state") == "Requested" and pc.capturing(answers):
                await self._write(loop, job, {**record, "state": "Capturing"}, None)
            return
        answers = pc.at_deadline(answers)
        report, data = await asyncio.to_thread(compare_and_render, answers)
        attempt = attempt_of(job.get("status") or {})
        cm, note = await self._keep(loop, job, attempt, capture_id, data)
        final = pc.record(record, report, stamp(now), cm, note)
        self.in_flight = None
        await self._write(loop, job, final, finished_event(final))
        meta = job["metadata"]
        log.info(
            "profile %s of %s/%s: %s", capture_id, meta["namespace"], meta["name"],
            final.get("answer") if final.get("state") == "Captured" else final.get("reason"),
        )  # fmt: skip

    async def _keep(
        self,
        loop: JobHandle,
        job: Mapping[str, Any],
        attempt: int,
        capture_id: str,
        data: Mapping[str, str],
    ) -> tuple[str | None, str | None]:
        """Write the ConfigMap; its name, or None and why not (the record still goes)."""
        body = profile_configmap(job, attempt, data)
        try:
            await loop.kube.put_configmap(str(job["metadata"]["namespace"]), body)
        except NameTaken as e:
            return None, f"the summaries were not stored: {str(e)[:400]}; delete or rename it"
        except ApiException as e:
            return None, f"the ConfigMap was not written: {e.status} {e.reason}"
        except Fenced:
            raise
        except Exception as e:  # the API server unreachable: the status still says what it can
            return None, f"the ConfigMap was not written: {type(e).__name__}: {str(e)[:200]}"
        return str(body["metadata"]["name"]), None

    async def _write(
        self,
        loop: JobHandle,
        job: Mapping[str, Any],
        record: Mapping[str, Any],
        event: Event | None,
        state: Mapping[str, Any] | None = None,
    ) -> bool:
        """Write ``status.profile`` while the job is still in the attempt the record was
        decided in; False when it moved on meanwhile (the next pass decides again)."""
        async with loop.lock:
            fresh = loop.freshest(loop.body)
            meta = fresh["metadata"]
            if attempt_of(fresh.get("status") or {}) != attempt_of(job.get("status") or {}):
                return False
            patch: dict[str, Any] = {"profile": dict(record)}
            if state:  # merged into operatorState: its other fields stay
                patch["operatorState"] = dict(state)
            status = fresh.get("status") or {}
            if record.get("state") == "Captured" and status.get("bottleneck"):
                patch["bottleneck"] = req.with_profile(
                    status["bottleneck"], record, attempt_of(status)
                )
            await loop.write_status(meta["namespace"], meta["name"], patch)
        if event is not None:
            loop.post_event(fresh, *event)
        return True
