"""Take a stalled job's hang evidence, once per stall, before anything restarts it.

The metrics task calls :func:`due` after each status write; when the job has just become
Stalled (a Stalled condition whose transition this job's ``status.hangEvidence`` does not
name yet), :func:`capture` asks every rank for its ``/debug/evidence`` through the scraper
(its slots, timeout and connection pool, with the evidence's own byte cap), parses and
compares the answers off the event loop (``monitoring/hang/hang.py``), writes them to a ConfigMap
owned by the job, and records the comparison in ``status.hangEvidence``, a Warning Event and
(through the monitor) the Stalled condition's message. ``runPolicy.restartOnStall`` waits for
that record (``lifecycle/restarts.py``), so the restart never destroys the evidence.

Every failure still ends in a record: ranks that do not answer are named as silent, a
ConfigMap the API server refuses, or one of that name that another owner holds (never
overwritten), leaves a ``note``; the record is what lets the restart go.
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
from gpujob_operator.api.display import EVIDENCE_MARK, format_hang
from gpujob_operator.api.status import attempt_of, stall_evidence, stalled_since
from gpujob_operator.monitoring.hang import hang, hangdump, hangtext
from gpujob_operator.monitoring.scrape.result import ScrapeTarget
from gpujob_operator.runtime.kube import Fenced, Kube, NameTaken

if TYPE_CHECKING:
    from gpujob_operator.monitoring.scrape.scraper import Scraper

log = logging.getLogger("gpujob.hang")


def due(status: Mapping[str, Any]) -> str | None:
    """The stall to capture, when this one has no evidence yet."""
    since = stalled_since(status)
    return since if since is not None and stall_evidence(status) is None else None


def compare_and_render(
    answers: Sequence[hang.RankAnswer],
) -> tuple[hang.HangReport, dict[str, str]]:
    """Compare and render in one call (on a worker thread: bounded, but not the loop's)."""
    report = hang.reduce(answers)
    return report, hangtext.configmap_data(report, answers)


async def ask(
    scraper: Scraper, asked: Sequence[ScrapeTarget], gpus: Mapping[int, str] | None = None
) -> list[hang.RankAnswer]:
    """Every rank's answer, each digested as it arrives (its text rendered, its dump cut to
    what the comparison reads, its body dropped): memory grows by a few KiB a rank, not by
    its whole evidence (up to 64 KiB of JSON, several times that parsed). The digest runs on
    the event loop, one body at a time (see :meth:`Scraper.fetch_all`)."""
    n = len(asked)

    def digest(i: int, target: ScrapeTarget, body: bytes) -> hang.RankAnswer:
        return hangtext.digested(hang.answer_of(i, target, (body, None, ""), gpus), n)

    fetched = await scraper.fetch_all(asked, hangdump.MAX_BYTES, digest=digest)
    return [
        kept if kept is not None else hang.answer_of(i, t, (None, kind, message), gpus)
        for i, (t, (kept, kind, message)) in enumerate(zip(asked, fetched, strict=True))
    ]


async def capture(
    kube: Kube,
    scraper: Scraper,
    job: Mapping[str, Any],
    targets: Sequence[ScrapeTarget],
    since: str,
    gpus: Mapping[int, str] | None = None,
    token: str = "",
) -> tuple[dict[str, Any], hang.HangReport]:
    """Ask, compare, keep: the ``status.hangEvidence`` record and the comparison
    (``kube``: where the ConfigMap goes; ``gpus``: each rank's CUDA device UUID, from its
    metrics, to name it by; ``token``: the job's endpoint token, "" where it has none)."""
    started = time.time()
    asked = hang.evidence_targets(targets, token)
    answers = await ask(scraper, asked, gpus)
    report, data = await asyncio.to_thread(compare_and_render, answers)
    first = next((a for a in answers if report.culprits and a.rank == report.culprits[0]), None)
    attempt = attempt_of(job.get("status") or {})
    name, namespace = str(job["metadata"]["name"]), str(job["metadata"]["namespace"])
    cm: str | None = hang_configmap_name(name, attempt)
    why = None
    try:
        await kube.put_configmap(namespace, hang_configmap(job, attempt, data))
    except NameTaken as e:  # someone else's ConfigMap under our name: never overwritten
        why, cm = f"the evidence was not stored: {str(e)[:800]}; delete or rename it", None
        log.warning("hang evidence of %s/%s not stored: %s", namespace, name, e)
    except ApiException as e:
        why, cm = f"the ConfigMap was not written: {e.status} {e.reason}", None
    except Fenced:
        raise  # this replica may not write now: the stall's evidence is taken again later
    except Exception as e:  # the API server unreachable: the record still lets a restart go
        why, cm = f"the ConfigMap was not written: {type(e).__name__}: {str(e)[:200]}", None
    kept = len(data) - 1
    if cm is not None and kept < len(answers):
        why = f"the ConfigMap holds {kept} of {len(answers)} ranks (size cap), the named first"
    record = {
        "attempt": attempt,
        "stalledSince": since,
        "capturedAt": c.format_time(datetime.fromtimestamp(started, UTC)),
        "summary": report.summary[:4096],
        "culprits": report.culprits[:64],
        "silent": report.silent[:64],
        "pod": first.pod if first else None,
        "node": (first.node or None) if first else None,
        "gpu": (first.gpu or None) if first else None,
        "configMap": cm,
        "note": why,
    }
    log.warning(
        "job %s/%s stalled: hang evidence from %d rank(s) (%d silent) in %.1fs: %s",
        namespace, name, len(answers), len(report.silent), time.time() - started, report.summary,
    )  # fmt: skip
    return record, report


def stalled_message(
    conditions: Sequence[Mapping[str, Any]], record: Mapping[str, Any]
) -> list[dict[str, Any]]:
    """The conditions with the answer joined to the Stalled message, only when that
    condition is still the stall the record is about (and does not carry it yet)."""
    out = []
    for cond in conditions:
        cond = dict(cond)
        message = str(cond.get("message", ""))
        if (
            cond.get("type") == c.STALLED
            and cond.get("status") == c.TRUE
            and cond.get("lastTransitionTime") == record.get("stalledSince")
            and EVIDENCE_MARK not in message
        ):
            cond["message"] = message + format_hang(record)
        out.append(cond)
    return out
