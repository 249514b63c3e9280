"""kopf wiring: settings, the pod index, one reconcile daemon per job, wake-ups.

Level-based (kopf's "reconciliation" pattern): handlers never carry state machines;
each job's daemon observes the job and the index of its pods, asks the pure planner
what the world should look like, and applies the difference. Events on the job or
its pods only wake that daemon early.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any

import kopf

from gpujob_operator import api, builders
from gpujob_operator.kube import Kube
from gpujob_operator.reconciler import JobLoop
from gpujob_operator.scrape import Scraper

log = logging.getLogger("gpujob.handlers")

PREFIX = "gpujob.dev"
LOOPS: dict[tuple[str, str], JobLoop] = {}
_KUBE: Kube | None = None
_SCRAPER: Scraper | None = None


def scraper() -> Scraper:
    """One scraper for every job: one HTTP session and one global bound on concurrency."""
    global _SCRAPER
    if _SCRAPER is None:
        _SCRAPER = Scraper(
            concurrency=int(os.environ.get("GPUJOB_SCRAPE_CONCURRENCY", "64")),
            timeout=float(os.environ.get("GPUJOB_SCRAPE_TIMEOUT", "5")),
        )
    return _SCRAPER


def kube() -> Kube:
    """One API client for the whole operator (created after kopf has logged in)."""
    global _KUBE
    if _KUBE is None:
        _KUBE = Kube()
    return _KUBE


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    """Every kopf setting the operator depends on, explicit and in one place."""
    settings.persistence.finalizer = f"{PREFIX}/finalizer"
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=PREFIX)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=PREFIX, key="last-handled-configuration"
    )
    settings.posting.enabled = True
    settings.posting.level = logging.WARNING  # our own Events are posted explicitly
    settings.watching.server_timeout = int(os.environ.get("GPUJOB_WATCH_SERVER_TIMEOUT", "300"))
    settings.watching.client_timeout = settings.watching.server_timeout + 30
    settings.watching.connect_timeout = 30
    settings.networking.request_timeout = 60
    settings.batching.worker_limit = int(os.environ.get("GPUJOB_WORKER_LIMIT", "200"))
    settings.peering.standalone = os.environ.get("GPUJOB_PEERING", "") == ""
    if not settings.peering.standalone:
        settings.peering.name = os.environ["GPUJOB_PEERING"]
        settings.peering.mandatory = True
        settings.peering.clusterwide = os.environ.get("GPUJOB_PEERING_CLUSTERWIDE", "") == "1"


@kopf.index("pods", labels={builders.LABEL_JOB_NAME: kopf.PRESENT})  # type: ignore[arg-type]
def job_pods(
    namespace: str, labels: Mapping[str, str], body: kopf.Body, **_: Any
) -> dict[Any, Any]:
    """Pods by (namespace, job name): the observed children the planner reads."""
    return {(namespace, labels[builders.LABEL_JOB_NAME]): dict(body)}


@kopf.on.event("pods", labels={builders.LABEL_JOB_NAME: kopf.PRESENT})  # type: ignore[arg-type]
def pod_changed(namespace: str, labels: Mapping[str, str], **_: Any) -> None:
    """Wake the job's loop; it re-reads the index."""
    loop = LOOPS.get((namespace, labels[builders.LABEL_JOB_NAME]))
    if loop is not None:
        loop.wake.set()


@kopf.on.event(api.GROUP, api.VERSION, api.PLURAL)  # type: ignore[arg-type]
async def job_event(
    event: kopf.RawEvent,
    body: kopf.Body,
    namespace: str,
    name: str,
    job_pods: kopf.Index[Any, Any],
    **_: Any,
) -> None:
    """Start, wake or stop the job's loop.

    A plain asyncio task per job instead of a kopf daemon: daemons make kopf put a
    finalizer on every job, and then deleting a job hangs whenever the operator is down.
    Owner references already clean the children up, so no finalizer is needed.
    """
    key = (namespace, name)
    loop = LOOPS.get(key)
    if event.get("type") == "DELETED" or body.get("metadata", {}).get("deletionTimestamp"):
        if loop is not None:
            loop.stop()
            del LOOPS[key]
        return
    if loop is None:
        loop = LOOPS[key] = JobLoop(kube(), _post_event, scraper())
        loop.start(dict(body), lambda: list(job_pods.get(key, [])))
    else:
        loop.update(dict(body))


def _post_event(job: Mapping[str, Any], type_: str, reason: str, message: str) -> None:
    kopf.event(dict(job), type=type_, reason=reason, message=message)  # type: ignore[arg-type]


@kopf.on.cleanup()
async def stop_loops(**_: Any) -> None:
    """Let every job loop finish its current pass before the operator exits."""
    for loop in list(LOOPS.values()):
        loop.stop()
    LOOPS.clear()
    if _SCRAPER is not None:
        await _SCRAPER.close()
