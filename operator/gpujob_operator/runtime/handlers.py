"""kopf wiring: kopf's settings, the pod index, one job loop per job, wake-ups.

Level-based (kopf's "reconciliation" pattern): handlers never carry state machines;
each job's loop (:mod:`.jobloop`) observes the job and the index of its pods, asks the pure planner
what the world should look like, and applies the difference. Events on the job or
its pods only wake that daemon early.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time
from collections.abc import Callable, Mapping
from typing import Any

import kopf

from gpujob_operator import api
from gpujob_operator.api import children
from gpujob_operator.lifecycle import gang
from gpujob_operator.monitoring.scrape import Scraper
from gpujob_operator.runtime import peers, standby, webhook
from gpujob_operator.runtime.forecaster import Forecaster
from gpujob_operator.runtime.jobloop import JobLoop
from gpujob_operator.runtime.kube import Kube
from gpujob_operator.runtime.settings import Settings

log = logging.getLogger("gpujob.handlers")

PREFIX = "gpujob.dev"
LOOPS: dict[tuple[str, str], JobLoop] = {}
SETTINGS = Settings()
"""The process's settings; ``install`` sets them before kopf starts."""
IDENTITY = ""
"""This replica's kopf peering identity (``install`` sets it; ``main`` hands it to kopf)."""
NAMESPACES: list[str] = []
"""The watched namespaces (empty: the whole cluster)."""
_GUARD: asyncio.Task[None] | None = None
SERVED = False
"""Whether kopf has handed this replica any pod or job (its indexes hold something)."""
_KUBE: Kube | None = None
_SCRAPER: Scraper | None = None
_FORECASTER: Forecaster | None = None
_FORECAST_TASK: asyncio.Task[None] | None = None


def install(settings: Settings, namespaces: list[str], identity: str) -> None:
    """Configure the handlers for this process, before kopf starts.

    Decorated handlers register when this module is imported (kopf's way); the one that
    depends on a setting, the Kueue Workload watch, registers here, only where Kueue is
    installed (chart: kueue.enabled): watching an API that is not served, or without RBAC
    for it, would only fill the log with errors. The admission webhook's handlers register
    only with a webhook port and certificate: kopf will not start admission handlers
    without a server.
    """
    global SETTINGS, IDENTITY
    SETTINGS = settings
    IDENTITY = identity
    NAMESPACES[:] = namespaces
    if settings.kueue:
        kopf.on.event(
            gang.KUEUE_GROUP,
            gang.KUEUE_VERSION,
            "workloads",
            labels={children.LABEL_JOB_NAME: kopf.PRESENT},
        )(kueue_workload_changed)  # type: ignore[arg-type]
    if settings.webhook:
        webhook.install(settings, namespaces, kube)


def scraper() -> Scraper:
    """One scraper for every job: one HTTP session and one global bound on concurrency."""
    global _SCRAPER
    if _SCRAPER is None:
        _SCRAPER = Scraper(concurrency=SETTINGS.scrape_concurrency, timeout=SETTINGS.scrape_timeout)
    return _SCRAPER


def kube() -> Kube:
    """One API client for the whole operator (created after kopf has logged in)."""
    global _KUBE
    if _KUBE is None:
        fence = None if SETTINGS.standalone else standby.FENCE.open
        _KUBE = Kube(timeout=SETTINGS.api_timeout, may_write=fence)
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
    settings.watching.server_timeout = SETTINGS.watch_server_timeout
    settings.watching.client_timeout = settings.watching.server_timeout + 30
    settings.watching.connect_timeout = 30
    settings.networking.request_timeout = 60
    settings.batching.worker_limit = SETTINGS.worker_limit
    settings.peering.standalone = SETTINGS.standalone
    if not settings.peering.standalone:
        settings.peering.name = SETTINGS.peering
        settings.peering.mandatory = True
        settings.peering.clusterwide = SETTINGS.peering_clusterwide
        settings.peering.priority = peers.priority(time.time())
        settings.peering.lifetime = SETTINGS.peering_lifetime


@kopf.index("pods", labels={children.LABEL_JOB_NAME: kopf.PRESENT})  # type: ignore[arg-type]
def job_pods(
    namespace: str, labels: Mapping[str, str], body: kopf.Body, **_: Any
) -> dict[Any, Any]:
    """Pods by (namespace, job name label): every pod that claims the name. Which of them are
    the job's is decided by their controller ownerReference (api/children.py), in the planner
    (which also waits for foreign pods holding its pod names) and the monitor."""
    global SERVED
    SERVED = True
    return {(namespace, labels[children.LABEL_JOB_NAME]): dict(body)}


@kopf.on.event("pods", labels={children.LABEL_JOB_NAME: kopf.PRESENT})  # type: ignore[arg-type]
def pod_changed(namespace: str, labels: Mapping[str, str], body: kopf.Body, **_: Any) -> None:
    """Wake the job's loop; it re-reads the index. A pod marked for disruption is noted
    first: it may be gone from the index before the loop's next pass."""
    loop = LOOPS.get((namespace, labels[children.LABEL_JOB_NAME]))
    if loop is not None:
        loop.saw_pod(body)
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
    global SERVED
    SERVED = True
    key = (namespace, name)
    loop = LOOPS.get(key)
    uid = body.get("metadata", {}).get("uid")
    other = loop is not None and bool(uid) and loop.uid != uid
    if event.get("type") == "DELETED" or body.get("metadata", {}).get("deletionTimestamp"):
        if loop is not None and not other:  # a late event of an older object ends nothing
            loop.stop()
            del LOOPS[key]
        return
    if loop is not None and (loop.ended or other):
        # Another object under the same name (deleted and re-created, DELETED missed or
        # batched away): its loop starts afresh, with none of the old one's memory.
        loop.stop()
        del LOOPS[key]
        loop = None
    if loop is None:
        ghosts = await _index_caught_up(namespace, name, lambda: list(job_pods.get(key, [])))
        loop = LOOPS[key] = JobLoop(
            kube(),
            _post_event,
            scraper(),
            default_gang=SETTINGS.default_gang,
            retry=SETTINGS.retry,
            restart_backoff=SETTINGS.restart_backoff,
            gang_grace_seconds=SETTINGS.gang_grace_seconds,
            fault_at=SETTINGS.fault_exit_at,
            on_exit=_forget,
        )
        loop.start(dict(body), lambda: list(job_pods.get(key, [])))
        if ghosts:  # before the loop's first pass: its tasks have not run yet
            loop.vanish(ghosts, "listing")
        _start_forecaster()
        if _FORECASTER is not None:
            _FORECASTER.wake.set()  # a new job may be waiting: forecast it soon
    else:
        loop.update(dict(body))


def kueue_workload_changed(namespace: str, labels: Mapping[str, str], **_: Any) -> None:
    """Kueue admitted, evicted or requeued a job's Workload: wake the job's loop."""
    loop = LOOPS.get((namespace, labels[children.LABEL_JOB_NAME]))
    if loop is not None:
        loop.wake.set()


def _forget(loop: JobLoop) -> None:
    """A loop found its job gone by itself (a missed DELETED): drop it from LOOPS."""
    meta = loop.body.get("metadata", {})
    key = (meta.get("namespace", ""), meta.get("name", ""))
    if LOOPS.get(key) is loop:
        del LOOPS[key]


INDEX_SYNC_SECONDS = 15.0


async def _index_caught_up(
    namespace: str, name: str, indexed: Callable[[], list[Mapping[str, Any]]]
) -> set[str]:
    """Wait until the pod index holds what the API server holds for this job; returns the
    uids of indexed pods the API server does not hold (ghosts: a DELETED lost in a re-list).

    A loop that starts when kopf resumes this replica (peering handed it the work) can see
    the job's fresh status before the pods' re-list has reached the index; the planner would
    then take the gang's pods for lost and restart it a second time. Compared by pod uid; a
    new job (no pods) passes at once. Pods only the index holds do not hold the start up:
    the listing proves them gone, and the new loop plans without them. After the deadline,
    or when the API cannot be listed, the loop starts anyway (logged): its own audit of the
    index covers what this could not.
    """
    selector = f"{children.LABEL_JOB_NAME}={name}"
    deadline = asyncio.get_running_loop().time() + INDEX_SYNC_SECONDS
    while True:
        have = {children.uid_of(p) for p in indexed()}
        try:
            want = await kube().pod_uids(namespace, selector)
        except Exception as e:  # a timeout or a refusal: start, the loop's audit follows
            log.warning(
                "job %s/%s: the pods could not be listed (%s); starting", namespace, name, e
            )
            return set()
        if want <= have:
            return {uid for uid in have - want if uid}
        if asyncio.get_running_loop().time() > deadline:
            log.warning(
                "job %s/%s: the pod index still lacks pods of the API after %.0fs; starting anyway",
                namespace,
                name,
                INDEX_SYNC_SECONDS,
            )
            return {uid for uid in have - want if uid}
        await asyncio.sleep(0.2)


def _post_event(job: Mapping[str, Any], type_: str, reason: str, message: str) -> None:
    kopf.event(dict(job), type=type_, reason=reason, message=message)  # type: ignore[arg-type]


@kopf.on.startup()
async def start_standby_guard(settings: kopf.OperatorSettings, **_: Any) -> None:
    """With peering, stop this replica's job loops whenever another replica is active."""
    global _GUARD
    if settings.peering.standalone:
        return
    standby.FENCE.until = 0.0  # shut until the guard's first read finds this replica active
    _GUARD = asyncio.get_running_loop().create_task(
        standby.guard(
            kube().custom,
            settings.peering.name,
            [] if settings.peering.clusterwide else NAMESPACES,
            IDENTITY,
            settings.peering.priority,
            _stop_all_loops,
            _demote,
            lifetime=settings.peering.lifetime,
        ),
        name="standby guard",
    )
    _GUARD.add_done_callback(_guard_ended)


def _guard_ended(task: asyncio.Task[None]) -> None:
    """The guard never returns: should it end other than by the operator's own shutdown,
    this replica could work beside another unguarded, so the process exits (its pod
    restarts it as a fresh standby)."""
    if task.cancelled():
        return
    standby.FENCE.until = 0.0
    log.critical(
        "the standby guard ended (%r); exiting so that this replica restarts fresh",
        task.exception(),
    )
    _stop_all_loops()
    os.kill(os.getpid(), signal.SIGTERM)


def _start_forecaster() -> None:
    """Forecast the start of waiting jobs over the jobs this replica serves, every
    ``GPUJOB_FORECAST_INTERVAL`` seconds (0: off). Started from the first job event, not at
    start-up: a task inherits its context, and kopf's Event posting lives in the handlers'."""
    global _FORECASTER, _FORECAST_TASK
    if _FORECAST_TASK is not None or SETTINGS.forecast_interval <= 0:
        return
    _FORECASTER = Forecaster(
        kube(),
        lambda: [loop.freshest(loop.body) for loop in list(LOOPS.values())],
        SETTINGS.forecast_interval,
        SETTINGS.default_gang,
        SETTINGS.kueue,
        _post_event,
    )
    _FORECAST_TASK = asyncio.get_running_loop().create_task(
        _FORECASTER.run(), name="start-time forecast"
    )


def _demote() -> None:
    """Paused after serving: exit cleanly so the pod restarts this replica as a fresh standby
    (kopf's indexes would keep ghosts of pods deleted during the pause)."""
    if not SERVED:
        return
    log.warning("peering: this replica stands by now; restarting to drop its caches")
    os.kill(os.getpid(), signal.SIGTERM)


def _stop_all_loops() -> int:
    count = len(LOOPS)
    for loop in list(LOOPS.values()):
        loop.stop()
    LOOPS.clear()
    return count


@kopf.on.cleanup()
async def stop_loops(**_: Any) -> None:
    """Let every job loop finish its current pass before the operator exits."""
    if _GUARD is not None:
        _GUARD.cancel()
    if _FORECAST_TASK is not None:
        _FORECAST_TASK.cancel()
    _stop_all_loops()
    if _SCRAPER is not None:
        await _SCRAPER.close()
