"""kopf wiring: kopf's settings, one job loop per job, the pod watch, wake-ups.

Level-based (kopf's "reconciliation" pattern): handlers never carry state machines;
each job's loop (:mod:`.jobloop`) observes the job and the index of its pods, asks the pure planner
what the world should look like, and applies the difference. Events on the job or
its pods only wake that daemon early. kopf watches the jobs (and Kueue's Workloads); the
pods are watched by the operator's own :mod:`.podwatch`, which keeps each as its
projection and never decodes one on the event loop.

What the process keeps between handler calls (the settings, the job loops, the one API
client and scraper, the guard and forecaster tasks) is one :class:`OperatorState` in kopf's
``memo``, not module globals: :func:`install` builds it and ``main`` hands that memo to
``kopf.operator``. kopf gives each object's handlers a shallow copy of that memo, so the
state must be one object under one key (:data:`MEMO_KEY`): every copy then holds the same
object, and what one handler sets there (a new loop, the scraper made on first use) every
other handler sees.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import kopf
from kubernetes import client

from gpujob_operator import api
from gpujob_operator.api import children
from gpujob_operator.lifecycle.gang import gang
from gpujob_operator.monitoring.scrape.scraper import Scraper
from gpujob_operator.observability.gcpause import GC_PAUSES
from gpujob_operator.observability.looplag import (
    COUNTED_LAG,
    CpuTimes,
    cpu_times,
    lag_cause,
    spent,
)
from gpujob_operator.observability.opmetrics import METRICS
from gpujob_operator.runtime import gctune, peers, standby, webhook
from gpujob_operator.runtime.forecaster import Forecaster
from gpujob_operator.runtime.jobloop import JobLoop
from gpujob_operator.runtime.kube import Kube, load_client
from gpujob_operator.runtime.nodecache import NodeCache
from gpujob_operator.runtime.podwatch import JobKey, PodIndex, PodWatch
from gpujob_operator.runtime.settings import Settings
from gpujob_operator.runtime.stallwatch import StallWatch
from gpujob_operator.runtime.watched import WatchedObjects

log = logging.getLogger("gpujob.handlers")

PREFIX = "gpujob.dev"
MEMO_KEY: Final = "gpujob"
"""The key of the :class:`OperatorState` in kopf's memo."""


@dataclass
class OperatorState:
    """This process's operator: what every handler shares, through kopf's memo."""

    settings: Settings = field(default_factory=Settings)
    """The process's settings, read once before kopf starts."""
    identity: str = ""
    """This replica's kopf peering identity (``main`` hands it to kopf too)."""
    namespaces: list[str] = field(default_factory=list)
    """The watched namespaces (empty: the whole cluster)."""
    loops: dict[tuple[str, str], JobLoop] = field(default_factory=dict)
    """The job loops, by (namespace, name)."""
    served: bool = False
    """Whether kopf has handed this replica any job (its job loops were fed)."""
    pods: PodIndex = field(default_factory=PodIndex)
    """The projected pods of every job, fed by :attr:`pod_watch`."""
    pod_watch: PodWatch | None = None
    workloads: WatchedObjects = field(default_factory=WatchedObjects)
    """Kueue Workloads as kopf's watch of them delivered them (see :mod:`.watched`)."""
    guard: asyncio.Task[None] | None = None
    forecaster: Forecaster | None = None
    forecast_task: asyncio.Task[None] | None = None
    lag_probe: asyncio.Task[None] | None = None
    gc_tuner: asyncio.Task[None] | None = None
    stall_watch: StallWatch | None = None
    _kube: Kube | None = None
    _scraper: Scraper | None = None
    _nodes: NodeCache | None = None

    def scraper(self) -> Scraper:
        """One scraper for every job: one HTTP session and one global bound on concurrency."""
        if self._scraper is None:
            self._scraper = Scraper(
                concurrency=self.settings.scrape_concurrency,
                timeout=self.settings.scrape_timeout,
                cpu_cores=self.settings.scrape_cpu_cores,
            )
        return self._scraper

    def kube(self) -> Kube:
        """One API client for the whole operator (created after kopf has logged in)."""
        if self._kube is None:
            fence = None if self.settings.standalone else standby.FENCE.open
            self._kube = Kube(timeout=self.settings.api_timeout, may_write=fence)
        return self._kube

    def node_cache(self) -> NodeCache:
        """One node cache for every job loop: one list of the nodes per TTL at most."""
        if self._nodes is None:
            self._nodes = NodeCache(self.kube())
        return self._nodes

    async def close(self) -> None:
        """The operator's exit: cancel the guard and the forecaster, stop every loop, close
        the scraper's connections."""
        if self.guard is not None:
            self.guard.cancel()
        for stoppable in (self.pod_watch, self.stall_watch):
            if stoppable is not None:
                stoppable.stop()
        for task in (self.forecast_task, self.lag_probe, self.gc_tuner):
            if task is not None:
                task.cancel()
        self.stop_all_loops()
        if self._scraper is not None:
            await self._scraper.close()

    def start_pod_watch(self) -> None:
        """List and watch the pods of every job, projected, in threads of their own, with
        an API client of its own (a watch holds its connection for minutes)."""
        if self.pod_watch is not None:
            return
        self.pod_watch = PodWatch(
            client.CoreV1Api(load_client(self.settings.api_timeout)),
            self.namespaces,
            self.pods,
            self.pods_changed,
            server_timeout=self.settings.watch_server_timeout,
        )
        self.pod_watch.start()

    def pods_changed(self, keys: set[JobKey], pod: Mapping[str, Any] | None) -> None:
        """Wake the loops of the jobs whose pods changed; each re-reads the index. A pod
        marked for disruption is noted first: it may be gone from the index before the
        loop's next pass."""
        for key in keys:
            loop = self.loops.get(key)
            if loop is not None:
                if pod is not None:
                    loop.saw_pod(pod)
                loop.wake.set()

    def job_pods(self, key: JobKey) -> Callable[[], list[Mapping[str, Any]]]:
        """What a job's loop reads of its pods: the index's projections, now."""
        return functools.partial(self.pods.pods, key)

    def forget(self, loop: JobLoop) -> None:
        """A loop found its job gone by itself (a missed DELETED): drop it from the loops."""
        meta = loop.body.get("metadata", {})
        key = (meta.get("namespace", ""), meta.get("name", ""))
        if self.loops.get(key) is loop:
            del self.loops[key]

    def stop_all_loops(self) -> int:
        """Stop every job loop (standby, shutdown); returns how many ran."""
        count = len(self.loops)
        for loop in list(self.loops.values()):
            loop.stop()
        self.loops.clear()
        return count

    def demote(self) -> None:
        """Paused after serving: exit cleanly so the pod restarts this replica as a fresh
        standby (nothing a paused replica's loops or kopf's job watch kept should outlive
        the pause)."""
        if not self.served:
            return
        log.warning("peering: this replica stands by now; restarting to drop its caches")
        os.kill(os.getpid(), signal.SIGTERM)

    def guard_ended(self, task: asyncio.Task[None]) -> None:
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
        self.stop_all_loops()
        os.kill(os.getpid(), signal.SIGTERM)

    def start_forecaster(self) -> None:
        """Forecast the start of waiting jobs over the jobs this replica serves, every
        ``GPUJOB_FORECAST_INTERVAL`` seconds (0: off). Started from the first job event, not
        at start-up: a task inherits its context, and kopf's Event posting lives in the
        handlers'."""
        if self.forecast_task is not None or self.settings.forecast_interval <= 0:
            return
        self.forecaster = Forecaster(
            self.kube(),
            lambda: [loop.freshest(loop.body) for loop in list(self.loops.values())],
            self.settings.forecast_interval,
            self.settings.default_gang,
            self.settings.kueue,
            _post_event,
        )
        self.forecast_task = asyncio.get_running_loop().create_task(
            self.forecaster.run(), name="start-time forecast"
        )


def state(memo: kopf.Memo) -> OperatorState:
    """The operator's state in a handler's memo (any object's copy: they share it)."""
    found = memo.get(MEMO_KEY)
    if not isinstance(found, OperatorState):
        raise RuntimeError(f"kopf's memo holds no {MEMO_KEY!r}: start the operator with main")
    return found


def _startup_state(memo: kopf.Memo) -> OperatorState:
    """The state in the operator's own memo at start-up (before kopf copies it for any
    object): the one ``install`` made, else the defaults, as for a ``kopf run`` of this
    module."""
    found = memo.setdefault(MEMO_KEY, OperatorState())
    assert isinstance(found, OperatorState)
    return found


def install(settings: Settings, namespaces: list[str], identity: str) -> kopf.Memo:
    """Configure the handlers for this process, before kopf starts; returns the memo to
    hand ``kopf.operator``, which holds the process's :class:`OperatorState`.

    Decorated handlers register when this module is imported (kopf's way); the one that
    depends on a setting, the Kueue Workload watch, registers here, only where Kueue is
    installed (chart: kueue.enabled): watching an API that is not served, or without RBAC
    for it, would only fill the log with errors. The admission webhook's handlers register
    only with a webhook port and certificate: kopf will not start admission handlers
    without a server.
    """
    own = OperatorState(settings=settings, identity=identity, namespaces=list(namespaces))
    if settings.kueue:
        kopf.on.event(
            gang.KUEUE_GROUP,
            gang.KUEUE_VERSION,
            "workloads",
            labels={children.LABEL_JOB_NAME: kopf.PRESENT},
        )(kueue_workload_changed)  # type: ignore[arg-type]
    if settings.webhook:
        webhook.install(settings, namespaces, own.kube)
    return kopf.Memo({MEMO_KEY: own})


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    """Every kopf setting the operator depends on, explicit and in one place."""
    ours = _startup_state(memo).settings
    settings.persistence.finalizer = f"{PREFIX}/finalizer"
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=PREFIX)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=PREFIX, key="last-handled-configuration"
    )
    settings.posting.enabled = True
    settings.posting.level = logging.WARNING  # our own Events are posted explicitly
    settings.watching.server_timeout = ours.watch_server_timeout
    settings.watching.client_timeout = settings.watching.server_timeout + 30
    settings.watching.connect_timeout = 30
    settings.networking.request_timeout = 60
    settings.batching.worker_limit = ours.worker_limit
    settings.peering.standalone = ours.standalone
    if not settings.peering.standalone:
        settings.peering.name = ours.peering
        settings.peering.mandatory = True
        settings.peering.clusterwide = ours.peering_clusterwide
        settings.peering.priority = peers.priority(time.time())
        settings.peering.lifetime = ours.peering_lifetime


@kopf.on.event(api.GROUP, api.VERSION, api.PLURAL)  # type: ignore[arg-type]
async def job_event(
    event: kopf.RawEvent,
    body: kopf.Body,
    namespace: str,
    name: str,
    memo: kopf.Memo,
    **_: Any,
) -> None:
    """Start, wake or stop the job's loop.

    A plain asyncio task per job instead of a kopf daemon: daemons make kopf put a
    finalizer on every job, and then deleting a job hangs whenever the operator is down.
    Owner references already clean the children up, so no finalizer is needed.
    """
    own = state(memo)
    own.served = True
    key = (namespace, name)
    loop = own.loops.get(key)
    uid = body.get("metadata", {}).get("uid")
    other = loop is not None and bool(uid) and loop.uid != uid
    if event.get("type") == "DELETED" or body.get("metadata", {}).get("deletionTimestamp"):
        if loop is not None and not other:  # a late event of an older object ends nothing
            loop.stop()
            del own.loops[key]
        return
    if loop is not None and (loop.ended or other):
        # Another object under the same name (deleted and re-created, DELETED missed or
        # batched away): its loop starts afresh, with none of the old one's memory.
        loop.stop()
        del own.loops[key]
        loop = None
    if loop is None:
        if own.pod_watch is not None:
            await _pods_listed(own.pod_watch, namespace, name)
        pods = own.job_pods(key)
        ghosts = await _index_caught_up(own.kube(), namespace, name, pods)
        loop = own.loops[key] = JobLoop(
            own.kube(),
            _post_event,
            own.scraper(),
            default_gang=own.settings.default_gang,
            nodes=own.node_cache(),
            workloads=own.workloads if own.settings.kueue else None,
            retry=own.settings.retry,
            restart_backoff=own.settings.restart_backoff,
            gang_grace_seconds=own.settings.gang_grace_seconds,
            max_pod_bytes=own.settings.max_job_pod_bytes,
            fault_at=own.settings.fault_exit_at,
            network_policy=own.settings.job_network_policy,
            token_key=own.settings.endpoint_token_key,
            host_ports=own.settings.host_port_range,
            on_exit=own.forget,
        )
        loop.start(dict(body), pods)
        if ghosts:  # before the loop's first pass: its tasks have not run yet
            loop.vanish(ghosts, "listing")
        own.start_forecaster()
        if own.forecaster is not None:
            own.forecaster.wake.set()  # a new job may be waiting: forecast it soon
    else:
        loop.update(dict(body))


async def kueue_workload_changed(
    namespace: str,
    labels: Mapping[str, str],
    body: kopf.Body,
    type: str | None,
    memo: kopf.Memo,
    **_: Any,
) -> None:
    """Kueue admitted, evicted or requeued a job's Workload: keep it for the job's passes
    (on the loop: a coroutine, not a thread) and wake the job's loop."""
    own = state(memo)
    own.workloads.seen(type, body)
    loop = own.loops.get((namespace, labels[children.LABEL_JOB_NAME]))
    if loop is not None:
        loop.wake.set()


INDEX_SYNC_SECONDS = 15.0
LISTING_WARN_SECONDS = 30.0


async def _pods_listed(watch: PodWatch, namespace: str, name: str) -> None:
    """Wait for the pod watch's first listing of every namespace to be in the index: a loop
    that planned from an index never filled would take the running gang's pods for lost
    and restart it. As long as it takes (kopf waited for its index the same way), warning
    every :data:`LISTING_WARN_SECONDS`."""
    while True:
        try:
            await asyncio.wait_for(watch.synced.wait(), LISTING_WARN_SECONDS)
            return
        except TimeoutError:
            log.warning(
                "job %s/%s waits for the pod watch's first listing (see the pod watch's errors)",
                namespace,
                name,
            )


async def _index_caught_up(
    kube: Kube, namespace: str, name: str, indexed: Callable[[], list[Mapping[str, Any]]]
) -> set[str]:
    """Wait until the pod index holds what the API server holds for this job; returns the
    uids of indexed pods the API server does not hold (ghosts: a DELETED lost in a re-list).

    A loop that starts when the operator starts, or when kopf resumes this replica (peering
    handed it the work), can see the job's fresh status before the pod watch's listing has
    reached the index; the planner would
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
            want = await kube.pod_uids(namespace, selector)
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


LOOP_LAG_INTERVAL: Final = 0.1


async def probe_loop_lag(
    interval: float = LOOP_LAG_INTERVAL, on_tick: Callable[[CpuTimes], None] | None = None
) -> None:
    """For ever: how late the loop wakes a timer, into the loop-lag metric. Every job's
    handling waits behind whatever holds the loop, so this is the operator's own latency.
    ``on_tick`` (the stall watch) hears of every wake-up, with the loop thread's CPU
    readings of that moment (one reading serves both)."""
    loop = asyncio.get_running_loop()
    cpu = cpu_times()
    while True:
        before = loop.time()
        await asyncio.sleep(interval)
        wall = loop.time() - before
        lag = wall - interval
        woke = cpu_times()
        cause = None
        if lag > COUNTED_LAG:  # what held it: this (the loop's) thread, the others, the CPU
            cause = lag_cause(wall, *spent(cpu, woke))
        METRICS.observe_loop_lag(lag, cause)
        cpu = woke
        if on_tick is not None:
            on_tick(woke)


@kopf.on.startup()
async def start_pod_watch(memo: kopf.Memo, **_: Any) -> None:
    """Watch the jobs' pods before kopf hands over any job (a new job loop still checks
    that the index holds its pods: ``_index_caught_up``)."""
    _startup_state(memo).start_pod_watch()


@kopf.on.startup()
async def start_loop_lag_probe(memo: kopf.Memo, **_: Any) -> None:
    """The loop-lag probe, the stall watch that logs where a stalled loop is, and the
    collector tuning that keeps full collections from stalling it (``gctune``)."""
    own = _startup_state(memo)
    own.stall_watch = StallWatch(threading.get_ident(), gc_pauses=GC_PAUSES.install())
    own.stall_watch.start()
    own.lag_probe = asyncio.get_running_loop().create_task(
        probe_loop_lag(on_tick=own.stall_watch.tick), name="loop lag"
    )
    s = own.settings
    own.gc_tuner = asyncio.get_running_loop().create_task(
        gctune.tune_collector(s.gc_freeze_seconds, s.gc_thaw_seconds), name="gc tuner"
    )


@kopf.on.startup()
async def start_standby_guard(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    """With peering, stop this replica's job loops whenever another replica is active."""
    own = _startup_state(memo)
    if settings.peering.standalone:
        return
    standby.FENCE.until = 0.0  # shut until the guard's first read finds this replica active
    own.guard = asyncio.get_running_loop().create_task(
        standby.guard(
            own.kube().custom,
            settings.peering.name,
            [] if settings.peering.clusterwide else own.namespaces,
            own.identity,
            settings.peering.priority,
            own.stop_all_loops,
            own.demote,
            lifetime=settings.peering.lifetime,
        ),
        name="standby guard",
    )
    own.guard.add_done_callback(own.guard_ended)


@kopf.on.cleanup()
async def stop_loops(memo: kopf.Memo, **_: Any) -> None:
    """Let every job loop finish its current pass before the operator exits."""
    await state(memo).close()
