"""Take a stalled job's hang evidence, once per stall, before anything restarts it.

The metrics task calls :func:`due` after each status write; when the job has just become
Stalled (a Stalled condition whose transition this job's ``status.hangEvidence`` does not
name yet), :func:`capture` asks every rank for its ``/debug/evidence`` through the scraper
(its slots, timeout and connection pool, with the evidence's own byte cap), parses and
compares the answers off the event loop (``monitoring/hang.py``), writes them to a ConfigMap
owned by the job, and records the comparison in ``status.hangEvidence``, a Warning Event and
(through the monitor) the Stalled condition's message. ``runPolicy.restartOnStall`` waits for
that record (``lifecycle/restarts.py``), so the restart never destroys the evidence.

Every failure still ends in a record: ranks that do not answer are named as silent, a
ConfigMap the API server refuses leaves a ``note``; the record is what lets the restart go.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from kubernetes.client.exceptions import ApiException

from gpujob_operator.api import conditions as c
from gpujob_operator.api.children import hang_configmap, hang_configmap_name
from gpujob_operator.monitoring import hang
from gpujob_operator.monitoring.scrape_result import ScrapeTarget

if TYPE_CHECKING:
    from gpujob_operator.monitoring.scrape import Scraper
    from gpujob_operator.runtime.jobloop import JobLoop

log = logging.getLogger("gpujob.hang")


def stalled_since(status: Mapping[str, Any]) -> str | None:
    """The current stall's identity: the Stalled condition's transition time, while True."""
    cond = c.find(status.get("conditions"), c.STALLED) or {}
    if cond.get("status") != c.TRUE:
        return None
    since = cond.get("lastTransitionTime")
    return str(since) if since else None


def current(status: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """``status.hangEvidence`` when it is about the current stall (else None)."""
    since = stalled_since(status)
    ev = status.get("hangEvidence") or {}
    return ev if since is not None and ev.get("stalledSince") == since else None


def due(status: Mapping[str, Any]) -> str | None:
    """The stall to capture, when this one has no evidence yet."""
    since = stalled_since(status)
    if since is None or (status.get("hangEvidence") or {}).get("stalledSince") == since:
        return None
    return since


async def capture(
    loop: JobLoop,
    scraper: Scraper,
    job: Mapping[str, Any],
    targets: Sequence[ScrapeTarget],
    since: str,
) -> tuple[dict[str, Any], hang.HangReport]:
    """Ask, compare, keep: the ``status.hangEvidence`` patch and the comparison."""
    started = time.time()
    asked = hang.evidence_targets(targets)
    bodies = await scraper.fetch_all(asked, hang.MAX_BYTES)
    meta = [{"rank": t.rank, "pod": t.pod, "node": t.node} for t in asked]
    answers = await asyncio.to_thread(hang.answers_of, meta, bodies)
    report = hang.reduce(answers)
    first = next((a for a in answers if report.culprits and a.rank == report.culprits[0]), None)
    status = job.get("status") or {}
    attempt = int(status.get("attempt") or 0)
    name, namespace = str(job["metadata"]["name"]), str(job["metadata"]["namespace"])
    data = await asyncio.to_thread(hang.configmap_data, report.summary, answers)
    cm: str | None = hang_configmap_name(name, attempt)
    why = None
    try:
        await loop.kube.put_configmap(namespace, hang_configmap(job, attempt, data))
    except ApiException as e:
        why = f"the ConfigMap was not written: {e.status} {e.reason}"
        cm = None
    except Exception as e:  # the API server unreachable: the record still lets a restart go
        why = f"the ConfigMap was not written: {type(e).__name__}: {str(e)[:200]}"
        cm = None
    if why is None and len(data) - 1 < len(answers):
        why = f"the ConfigMap holds {len(data) - 1} of {len(answers)} ranks (size cap)"
    record = {
        "attempt": attempt,
        "stalledSince": since,
        "capturedAt": c.format_time(datetime.fromtimestamp(started, UTC)),
        "summary": report.summary[:4096],
        "culprits": report.culprits[:64],
        "silent": report.silent[:64],
        "pod": first.pod if first else None,
        "node": (first.node or None) if first else None,
        "configMap": cm,
        "note": why,
    }
    log.warning(
        "job %s/%s stalled: hang evidence from %d rank(s) in %.1fs: %s",
        namespace, name, len(answers), time.time() - started, report.summary,
    )  # fmt: skip
    return record, report
