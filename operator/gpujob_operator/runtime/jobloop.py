"""The I/O shell around the pure planner: observe, plan, apply, one job at a time.

One :class:`JobLoop` runs per job (two asyncio tasks). The lifecycle task wakes on any
event of the job or its pods and on the plan's own deadline, then applies the plan in the
order the planner demands: status, deletes, creates, Events. The last status this loop wrote
is remembered so that a reconcile that runs before the watch delivers our own write never
counts a gang restart twice.

The metrics task scrapes the ranks on its own clock, so a restart or a failure is never
handled late because scrapes (this job's or another's dead endpoints) are slow. Both tasks
write status; a per-job lock serialises their read-modify-write of it, never the network
wait of a scrape.

A loop ends when its job is gone: on the DELETED event, or, since watches can miss one,
when the API server answers 404 for the job (a status write, or the GET a quiet loop makes
every `RECHECK_SECONDS`).

Every API error is classified (:mod:`~gpujob_operator.lifecycle.apiserver.refusals`): a
refused create of the gang or its Service is remembered (:class:`refusals.Refused`) and
handed to the planner, which shows it in the status and decides when to retry; any other
failed call backs the whole pass off exponentially with jitter. Both log one line per error
(no traceback for an expected refusal) and count it in
``gpujob_operator_api_errors_total{call, reason}``.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sequence, Sized
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final, TypeVar

from gpujob_operator import api
from gpujob_operator.api import children, hostports, podbytes
from gpujob_operator.api import conditions as c
from gpujob_operator.api.children import job_uid, uid_of
from gpujob_operator.api.jsoncopy import json_copy
from gpujob_operator.api.patches import json_safe, minimal_patch
from gpujob_operator.api.status import attempt_of
from gpujob_operator.lifecycle import backoff, converge, endpoints, observations, planner
from gpujob_operator.lifecycle.apiserver import podreview, refusals
from gpujob_operator.lifecycle.gang import gangprobe
from gpujob_operator.monitoring.scrape.scraper import Scraper
from gpujob_operator.observability import opmetrics
from gpujob_operator.observability.opmetrics import METRICS
from gpujob_operator.runtime import gangstate
from gpujob_operator.runtime.faults import (
    AFTER_STATUS_WRITE,
    BETWEEN_POD_CREATES,
    BETWEEN_POD_DELETES,
    BETWEEN_POD_PATCHES,
    fault_point,
)
from gpujob_operator.runtime.jobhandle import EventPoster
from gpujob_operator.runtime.kube import Fenced, JobGone, Kube
from gpujob_operator.runtime.metricstask import MetricsTask
from gpujob_operator.runtime.nodecache import NodeCache
from gpujob_operator.runtime.watched import WatchedObjects

log = logging.getLogger("gpujob.reconciler")

RESYNC_SECONDS = 30.0
IDLE_RESYNC_SECONDS = 300.0
"""A finished job only changes through events (which wake its loop); resync it rarely."""
SERVICE_RECHECK_SECONDS = 300.0
"""How long a seen Service is trusted without a GET (a thousand jobs, one GET each per pass)."""
DEBOUNCE_SECONDS = 0.05
AUDIT_BLOCKED_SECONDS = 60.0
"""How long passes may wait on pods going away (old ones terminating, a name still taken)
before the pod index is compared with a fresh listing of the job's pods."""
WAITS_ON_PODS: Final = frozenset({c.WAITING_FOR_OLD_PODS, c.POD_NAME_TAKEN})
"""Running=False reasons that wait for indexed pods to vanish: what a ghost blocks. A gang
waiting for the scheduler waits on pods that exist; listing it would only load etcd."""
AUDIT_SECONDS = 600.0
"""How often the index of an active job is compared with a fresh listing anyway."""
AUDIT_MIN_GAP_SECONDS = 60.0
FENCED_RETRY_SECONDS = 2.0
"""How soon a pass held back by the peering fence tries again (the guard looks every 2 s)."""
INDEX_WAIT_SECONDS: Final = 5.0
"""How long a batch of creates (or deletes) waits for the index to show it before the next
pass is planned."""
PATCH_WAIT_MAX_SECONDS: Final = 30.0
"""The longest wait for the index to show a pass's pod patches (it waits as long as the
patches took, INDEX_WAIT_SECONDS at least)."""
INDEX_POLL_SECONDS: Final = 0.05
CREATE_CONCURRENCY: Final = 16
"""Pod creates, dry runs or deletes of one job in flight at once: a 2,048-pod gang is made
and restarted at the API server's pace, not one round trip at a time, while no job takes
every worker."""
STREAM_SECONDS: Final = 30.0
"""How long one pass goes on creating a wide gang's pods beyond its first batch: the job's
lock is held meanwhile (its status writes wait), and a change to the job (a suspend, an
eviction) is planned for by the next pass."""
stream_clock: Callable[[], float] = time.monotonic
"""The clock of a stream's time bound (a test's own, to bound it by sends, not by load)."""
RECHECK_SECONDS = 120.0
"""A loop that wrote nothing for this long GETs its job: a missed DELETED must end it."""


def kept_body(body: dict[str, Any]) -> dict[str, Any]:
    """The job's body as the loop keeps it: without ``metadata.managedFields``, which the
    operator never reads and which mirrors every field of the spec (a 400 KB template made
    it most of the body, copied on each read)."""
    meta = body.get("metadata")
    if not isinstance(meta, Mapping) or "managedFields" not in meta:
        return body
    return {**body, "metadata": {k: v for k, v in meta.items() if k != "managedFields"}}


def _rv(obj: Mapping[str, Any] | None) -> int:
    """The resourceVersion as an int for "which copy is newer" (etcd revisions are ints)."""
    try:
        return int((obj or {}).get("metadata", {}).get("resourceVersion", "0"))
    except ValueError:
        return 0


def _created_count(plan: planner.Plan, refused: bool, more: Sequence[int]) -> int:
    """Pods a pass created, for its log line: a refused batch counts none (where it
    stopped is the refusal's), a refusal beyond it the batch and what followed."""
    return len(more) + (0 if refused and not more else len(plan.create_pods))


GONE_MAX: Final = 1024
"""Disrupted pods a loop remembers at most (a gang has one per node; this only bounds it)."""


T = TypeVar("T")
R = TypeVar("R")


async def each_bounded(
    items: Iterable[T], call: Callable[[T], Awaitable[R]], limit: int = CREATE_CONCURRENCY
) -> tuple[list[tuple[T, R]], tuple[T, Exception] | None]:
    """``call`` on each item, at most ``limit`` in flight: (item, result) of each done, and
    the first failure with its item; a failure stops the items not yet started. ``items``
    may be a generator that ends early (it is read lazily, one item per free worker)."""
    todo = iter(items)
    done: list[tuple[T, R]] = []
    failed: list[tuple[T, Exception]] = []

    async def worker() -> None:
        for item in todo:
            if failed:
                return
            try:
                done.append((item, await call(item)))
            except asyncio.CancelledError:
                raise
            except Exception as e:
                failed.append((item, e))
                return

    workers = min(limit, len(items)) if isinstance(items, Sized) else limit
    await asyncio.gather(*(worker() for _ in range(workers)))
    return done, (failed[0] if failed else None)


@dataclass
class JobLoop:
    """Reconciles one GPUTrainingJob until its daemon is stopped."""

    kube: Kube
    post_event: EventPoster
    scraper: Scraper | None = None
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    service_seen_at: float = -1e9
    last_written: dict[str, Any] | None = None
    reconciles: int = 0
    refused: refusals.Refused | None = None
    """The latest refused create of this job's gang or Service (None after a success)."""
    batch_refused: refusals.Refused | None = None
    """The last refusal while a gang wider than one batch is being created: a later batch's
    refusal continues its tries (cleared once the whole gang was created)."""
    created_more: list[int] = field(default_factory=list, repr=False)
    """The ranks the last pass created beyond its first batch (:meth:`_create_more`)."""
    tried: bool = False
    """Whether this loop has tried a create: until then the planner resumes the backoff in
    ``operatorState.createBackoff`` (an operator restart), after it ``refused`` is the whole
    truth."""
    failures: int = 0
    """Passes in a row that failed with an API error (the loop's own backoff)."""
    call: str = ""
    """The API call in flight, for the error's log line and metric."""
    retry: backoff.Policy = backoff.RETRY
    restart_backoff: backoff.Policy = backoff.RESTART
    gang_grace_seconds: float = planner.GANG_GRACE_SECONDS
    max_pod_bytes: int = podbytes.DEFAULT_MAX_JOB_POD_BYTES
    """The most bytes of pods one job may ask for (``api/podbytes.py``)."""
    fault_at: str | None = None
    """The write boundary at which this process dies (tests: GPUJOB_FAULT_EXIT_AT)."""
    network_policy: endpoints.PolicySettings | None = None
    """Each job gets a NetworkPolicy guarding its metrics ports (None: none)."""
    token_key: bytes | None = None
    """Each job's pods get an endpoint token derived with this key (None: no token)."""
    host_ports: tuple[int, int] = hostports.RANGE
    """Node ports a host-network job may have scraped (GPUJOB_HOST_PORT_RANGE)."""
    body: dict[str, Any] = field(default_factory=dict)
    default_gang: str = api.GANG_NONE
    nodes: NodeCache | None = None
    """The operator's node cache: read when a new attempt's pods avoid blamed nodes."""
    workloads: WatchedObjects | None = None
    """The operator's Kueue Workloads as its watch delivered them (read instead of a GET)."""
    on_exit: Callable[[JobLoop], None] | None = None
    """Called once when the loop ends by itself (its job is gone): forget it."""
    lock: asyncio.Lock = field(default_factory=asyncio.Lock, repr=False)
    """Held while status is read, computed and written (lifecycle or metrics)."""
    checked_at: float = field(default_factory=time.monotonic)
    """When the API server last confirmed the job exists (a write or a GET)."""
    ended: bool = False
    unshown: tuple[list[tuple[str, str | None, dict[str, Any]]], float] | None = None
    """The last pass's pod patches, and how long the loop waits for the index to show them
    before its next pass."""
    gone: dict[str, observations.ObservedPod] = field(default_factory=dict, repr=False)
    """Pods seen marked for disruption (DisruptionTarget), by name, kept for the planner in
    case they vanish before a pass sees them; pruned once their attempt is over."""
    resync_seconds: float = RESYNC_SECONDS
    recheck_seconds: float = RECHECK_SECONDS
    vanished: set[str] = field(default_factory=set, repr=False)
    """Uids of pods the API server proved gone (a 404 on their delete, or absent from a
    fresh listing) that the index still holds: kopf drops nothing that vanished during a
    watch re-list, and a planner that waits on such a ghost waits for ever."""
    blocked_since: float | None = None
    """Since when (monotonic) passes have waited for indexed pods to go away
    (:data:`WAITS_ON_PODS`)."""
    audited_at: float = field(default_factory=time.monotonic)
    """When the index was last compared with a fresh listing of the job's pods."""
    _pods: Callable[[], list[Mapping[str, Any]]] = field(default=lambda: [], repr=False)
    _task: asyncio.Task[None] | None = field(default=None, repr=False)
    _scrape_task: asyncio.Task[None] | None = field(default=None, repr=False)
    metrics: MetricsTask = field(init=False, repr=False)
    """The second task: scrape and judge the ranks on its own clock (:mod:`.metricstask`).
    It holds this loop as a :class:`~.jobhandle.JobHandle`: the calls it may make, by their
    public names, so that it never imports this module back."""

    def __post_init__(self) -> None:
        self.metrics = MetricsTask(self)

    @property
    def uid(self) -> str:
        return job_uid(self.body)

    def saw_pod(self, pod: Mapping[str, Any]) -> None:
        """A pod event: remember a pod Kubernetes is taking away (see `gone`)."""
        conditions = (pod.get("status") or {}).get("conditions") or []
        if not any(cond.get("type") == observations.DISRUPTION_TARGET for cond in conditions):
            return  # the common case, without summarizing the whole pod
        observed = observations.observe_pod(pod)
        if observed.disruption and len(self.gone) < GONE_MAX:
            self.gone[observed.name] = observed

    def freshest(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """The live body, or our own last write when the watch has not delivered it yet.

        The caller's own copy, except the spec, which every reader only reads: a 400 KB
        template deep-copied on each call held the event loop half a second."""
        live = {k: v if k == "spec" else json_copy(v) for k, v in body.items()}
        if self.last_written is not None and _rv(self.last_written) > _rv(live):
            live["status"] = json_copy(self.last_written.get("status", {}))
        return live

    def peek_status(self) -> Mapping[str, Any]:
        """The status `freshest` would give, not copied: for a reader that only reads it
        now (bodies are replaced on each event or write, never changed in place)."""
        if self.last_written is not None and _rv(self.last_written) > _rv(self.body):
            return self.last_written.get("status") or {}
        return self.body.get("status") or {}

    async def reconcile(
        self,
        body: Mapping[str, Any],
        pods: Iterable[Mapping[str, Any]],
        now: datetime | None = None,
    ) -> planner.Plan:
        """Plan from what is observed and apply it; returns the plan for the caller's timing.

        Raises JobGone when the API server says the job no longer exists.
        """
        async with self.lock:
            return await self._reconcile(body, pods, now)

    async def _reconcile(
        self,
        body: Mapping[str, Any],
        pods: Iterable[Mapping[str, Any]],
        now: datetime | None,
    ) -> planner.Plan:
        took = Stopwatch(time.monotonic())
        job = self.freshest(body)
        meta = job["metadata"]
        ns, name = meta["namespace"], meta["name"]
        pods = list(pods)
        observed = [observations.observe_pod(p) for p in pods]
        attempt = attempt_of(job.get("status") or {})
        for seen in observed:
            if seen.disruption:
                self.gone[seen.name] = seen
        self.gone = {k: p for k, p in self.gone.items() if p.attempt >= attempt}
        started = time.monotonic()
        took.lap("observe")
        stale = time.monotonic() - self.service_seen_at > SERVICE_RECHECK_SECONDS
        self.call = "get_service"
        if stale and await self.kube.service_exists(ns, name):
            self.service_seen_at = time.monotonic()
        service = time.monotonic() - self.service_seen_at <= SERVICE_RECHECK_SECONDS
        self.call = "get_gang"
        gang_obs = await gangstate.observe(self.kube, job, self.default_gang, self.workloads)
        view = None
        when = now or datetime.now(UTC)
        if self.nodes is not None and planner.needs_nodes(job, observed, when):
            self.call = "list_nodes"
            view = await self.nodes.get()
        took.lap("read")  # the Service, the gang's objects, the nodes
        plan = planner.plan(
            job,
            observed,
            when,
            service_exists=service,
            refused=self.refused,
            restart_backoff=self.restart_backoff,
            gang_grace_seconds=self.gang_grace_seconds,
            gang_obs=gang_obs,
            gone=list(self.gone.values()),
            resume_backoff=not self.tried,
            nodes=view,
            max_pod_bytes=self.max_pod_bytes,
        )
        self.reconciles += 1
        took.lap("plan")
        if plan.phase in (c.PHASE_SUCCEEDED, c.PHASE_FAILED, c.PHASE_SUSPENDED):
            self.refused = self.batch_refused = None  # nothing is created any more
        old_status = {k: v for k, v in (job.get("status") or {}).items() if k != "kopf"}
        patch = minimal_patch(old_status, plan.status)
        self.call = "patch_status"
        if patch:
            await self.write_status(ns, name, patch)
            if plan.delete_pods or plan.create_pods or plan.patch_pods:
                fault_point(self.fault_at, AFTER_STATUS_WRITE)
        took.lap("status")
        self.call = "delete_pod"
        # The first alone (a crash between deletes leaves the rest), then a few at a time.
        deleted: set[str] = set()
        uids_of: dict[str, set[str]] = {}
        if plan.delete_pods:
            for p in pods:
                uids_of.setdefault(_name(p), set()).add(uid_of(p))
        for i, group in enumerate((plan.delete_pods[:1], plan.delete_pods[1:])):
            if i and group:
                fault_point(self.fault_at, BETWEEN_POD_DELETES)
            for pod, existed in await self._delete_pods(ns, group):
                uids = uids_of.get(pod, set())
                if existed:
                    deleted |= uids
                else:
                    self.vanish(uids, "delete_404")
        # The next pass is planned from the index: let it see these deletes first, or it
        # would delete the same pods again (a 512-pod restart sent ~500 deletes twice, each
        # a write of the whole pod).
        if len(deleted) > 1 and not await self._until_deleting(deleted, INDEX_WAIT_SECONDS):
            log.info(
                "%s: the index does not show %d deletes after %gs; planning on",
                self.key, len(deleted), INDEX_WAIT_SECONDS,
            )  # fmt: skip
        took.lap("delete")
        self.call = "patch_pod"
        # The first alone (a crash between patches leaves the rest), then a few at a time:
        # a 2,048-pod gang is moved, and released, at the API server's pace.
        patching = time.monotonic()
        applied: list[tuple[str, str | None, dict[str, Any]]] = []
        for i, moves in enumerate((plan.patch_pods[:1], plan.patch_pods[1:])):
            if i and moves:
                fault_point(self.fault_at, BETWEEN_POD_PATCHES)
            patched, failed = await each_bounded(
                moves, lambda p: self.kube.patch_pod(ns, p[0], p[1], p[2])
            )
            for move, done in patched:
                if done:
                    applied.append(move)
                else:
                    log.info("pod %s/%s is gone or replaced; not moved in place", ns, move[0])
                    self.wake.set()
            if failed is not None:
                raise failed[1]
        # As after deletes: the next pass plans from the index, and a 512-pod move patched
        # 314, 113 and 29 pods again in three more passes (each a write of the whole pod),
        # the watch trailing the writes by as long as they took. The loop waits for them
        # before its next pass, outside the job's lock (`_run`: the metrics task goes on).
        if len(applied) > 1:
            wait = time.monotonic() - patching
            self.unshown = (applied, min(PATCH_WAIT_MAX_SECONDS, max(INDEX_WAIT_SECONDS, wait)))
        self.call = "delete_gang_object"
        for ref in plan.delete_objects:
            self._wrote(ns, ref.name)
            await self.kube.delete_object(ns, ref)
        self.call = "patch_gang_status"
        for ref, obj_patch in plan.status_patches:
            self._wrote(ns, ref.name)
            if not await self.kube.patch_object_status(ns, ref, obj_patch):
                log.info("%s %s changed meanwhile; re-reading it", ref.plural, ref.name)
                self.wake.set()
        record = (plan.status.get("operatorState") or {}).get("createBackoff")
        took.lap("patch")
        refused = await self._create(ns, name, plan, record, job)
        took.lap("create")
        if refused:
            self.wake.set()  # plan again at once, so that the status shows the refusal
        elif plan.more_pods and plan.create_pods:
            # The next pass is planned from the index: let it hold these pods first, or it
            # would build and post them again (409s, each a full body).
            created = {str(p["metadata"]["name"]) for p in plan.create_pods}
            created |= {children.pod_name(name, r) for r in self.created_more}
            if not await self._until_indexed(created, INDEX_WAIT_SECONDS):
                log.info(
                    "%s: the index holds %d of the %d pods created after %gs; planning on",
                    self.key, len(created & {_name(p) for p in self.pods()}), len(created),
                    INDEX_WAIT_SECONDS,
                )  # fmt: skip
            took.lap("indexed")
        for ev in plan.events:
            if not (refused and ev.reason == c.PODS_CREATING):  # nothing was created
                self.post_event(job, ev.type, ev.reason, ev.message)
        if plan.delete_job:
            log.info("deleting finished job %s/%s (ttlSecondsAfterFinished)", ns, name)
            self.call = "delete_job"
            await self.kube.delete_job(ns, name)
        METRICS.observe_reconcile(time.monotonic() - started)
        METRICS.update(ns, name, plan.status)
        took.lap("events")
        await self._audit(ns, name, plan, pods)
        took.lap("audit")
        if plan.create_pods or plan.delete_pods or plan.events or plan.patch_pods:
            log.info(
                "reconciled %s/%s: phase=%s created=%s deleted=%s moved=%s events=%s took=%s",
                ns,
                name,
                plan.phase,
                _created_count(plan, refused, self.created_more),
                f"[{converge.names_listed(plan.delete_pods)}]",
                f"[{converge.names_listed([n for n, _, _ in plan.patch_pods])}]",
                [e.reason for e in plan.events],
                took,
            )
        return plan

    def pods(self) -> list[Mapping[str, Any]]:
        """The job's pods from the index, less those the API server proved gone."""
        pods = self._pods()
        if not self.vanished:
            return pods
        return [p for p in pods if uid_of(p) not in self.vanished]

    def _wrote(self, namespace: str, name: str) -> None:
        """This pass writes a gang object: the next reads it from the API server (before the
        write too: a write that fails half-way may still have landed)."""
        if self.workloads is not None:
            self.workloads.wrote(namespace, name)

    def vanish(self, uids: set[str], proof: str) -> None:
        """Plan without these indexed pods from now on: the API server proved them gone."""
        uids -= self.vanished
        if uids:
            log.warning(
                "%s: %d pod(s) in the index are gone from the API server (%s): planning without"
                " them",
                self.key,
                len(uids),
                proof,
            )
            METRICS.observe_ghost_pods(proof, len(uids))
            self.vanished |= uids
            self.wake.set()

    async def _audit(
        self, ns: str, name: str, plan: planner.Plan, pods: list[Mapping[str, Any]]
    ) -> None:
        """Compare the index with a fresh listing when passes have waited a while for pods
        to go away (they may be ghosts) and, less often, while the job is active (a ghost
        of the current attempt would hide a lost rank)."""
        now = time.monotonic()
        running = c.find(plan.status.get("conditions"), c.RUNNING) or {}
        if running.get("reason") not in WAITS_ON_PODS or plan.create_pods:
            self.blocked_since = None
        elif self.blocked_since is None:
            self.blocked_since = now
        finished = plan.phase in (c.PHASE_SUCCEEDED, c.PHASE_FAILED)
        blocked = (
            self.blocked_since is not None and now - self.blocked_since > AUDIT_BLOCKED_SECONDS
        )
        due = not finished and now - self.audited_at > AUDIT_SECONDS
        if not pods or not (blocked or due) or now - self.audited_at < AUDIT_MIN_GAP_SECONDS:
            return
        self.audited_at = now
        self.call = "list_pods"
        listed = await self.kube.pod_uids(ns, f"{children.LABEL_JOB_NAME}={name}")
        self.vanish({uid_of(p) for p in pods} - listed, "listing")
        self.vanished &= {uid_of(p) for p in self._pods()}  # bounded by what the index holds

    async def _create(
        self,
        ns: str,
        name: str,
        plan: planner.Plan,
        record: Mapping[str, Any] | None = None,
        job: Mapping[str, Any] | None = None,
    ) -> bool:
        """Create the job's endpoint guards, its Service and its gang, all or nothing; True
        when the server refused.

        The batch's first and last pods (:func:`podreview.representatives`: ranks differ
        only in rank-derived values) are first created with ``dryRun=All``: admission
        (quota, PodSecurity, LimitRange, webhooks) and validation run without persisting
        anything, so a gang that cannot be admitted creates no pod at all, for two requests
        rather than one per pod. The gang's pods beyond the batch follow in the same pass,
        each built as it is sent (:meth:`_create_more`). Dry runs do not add up against a quota, so
        the gang's total is dry-run too, as one probe pod (:mod:`gangprobe`). Should a later
        pod still be refused (the quota was taken meanwhile), the planner deletes the ones
        already created after its grace. ``record`` is the status's backoff, which a refusal
        continues when this loop has not tried yet (an operator restart).
        """
        if not self.tried and self.refused is None:
            self.refused = refusals.resume(record)
        if plan.create_service is not None or plan.ensure_objects or plan.create_pods:
            self.tried = True
        pods = plan.create_pods
        body = job if job is not None else self.body
        pods = self._with_token(pods, body)
        self.created_more = []
        target = f"service {name}"
        kind = "service"
        try:
            # The endpoints' guards before any pod: a pod must never run with its endpoints
            # open, nor wait for its token's Secret. Again before each gang (409: kept), so a
            # job from before they were turned on gets them too.
            kind = refusals.ENDPOINT_GUARD
            if self.network_policy is not None and (plan.create_service is not None or pods):
                self.call = "create_network_policy"
                target = f"networkpolicy {endpoints.network_policy_name(body)}"
                policy = endpoints.build_network_policy(body, self.network_policy)
                await self.kube.create_network_policy(ns, policy)
            if self.token_key is not None and (plan.create_service is not None or pods):
                self.call = "create_secret"
                target = f"secret {endpoints.token_secret_name(body)}"
                token = endpoints.endpoint_token(self.token_key, body)
                await self.kube.create_secret(ns, endpoints.build_token_secret(body, token))
            target = f"service {name}"
            kind = "service"
            if plan.create_service is not None:
                self.call = "create_service"
                await self.kube.create_service(ns, plan.create_service)
                self.service_seen_at = time.monotonic()
            kind = "gang object"
            self.call = "create_gang_object"
            for obj in plan.ensure_objects:
                # The gang's admission object first: pods that bypassed it would defeat it.
                target = f"{obj['kind']} {obj['apiVersion']} {obj['metadata']['name']}"
                self._wrote(ns, obj["metadata"]["name"])
                await self.kube.create_object(ns, obj)
            kind = "pod"
            if await self._probe_gang(ns, pods, len(pods) + plan.more_pods):
                return True
            gang_last: list[dict[str, Any]] = []
            if plan.build_more is not None and plan.more_ranks:
                # The gang's last rank, not the batch's: ranks differ in rank-derived values.
                gang_last = self._with_token([plan.build_more(plan.more_ranks[-1])], body)
            sample = podreview.representatives([*pods, *gang_last])
            for call, dry_run in (("dry_run_pod", True), ("create_pod", False)):
                self.call = call
                batch = sample if dry_run else pods
                # The first pod alone, then the rest CREATE_CONCURRENCY at a time: a crash
                # between creates leaves the first, and a refusal stops the rest (the first's
                # refusal is the one reported, whatever answers first).
                for i, group in enumerate((batch[:1], batch[1:])):
                    if i and group and not dry_run:
                        # Between real creates only: a dry run persists nothing.
                        fault_point(self.fault_at, BETWEEN_POD_CREATES)
                    failed = await self._post_pods(ns, group, dry_run)
                    if failed is not None:
                        target = f"pod {failed[0]}"
                        raise failed[1]
            self.created_more, more = await self._create_more(ns, plan, body)
            if more is not None:
                target = f"pod {children.pod_name(name, more[0])}"
                raise more[1]
        except asyncio.CancelledError:
            raise
        except Exception as e:
            refusal = refusals.classify_exception(e, kind=kind)
            if not refusal.expected:
                raise
            self._refuse(target, refusal)
            return True
        if plan.create_pods or plan.ensure_objects:
            # A batch of a wider gang went through: planning goes on, but a later batch's
            # refusal continues the backoff of the one before (a gang refused half way
            # must not retry at the shortest delay for ever).
            left = plan.more_pods - len(self.created_more)
            self.batch_refused = (self.refused or self.batch_refused) if left else None
            self.refused = None
        return False

    def _with_token(
        self, pods: list[dict[str, Any]], body: Mapping[str, Any]
    ) -> list[dict[str, Any]]:
        """``pods`` reading the job's endpoint token, when the endpoints require one."""
        if not pods or self.token_key is None:
            return pods
        return endpoints.with_token_env(pods, body)

    async def _create_more(
        self, ns: str, plan: planner.Plan, body: Mapping[str, Any]
    ) -> tuple[list[int], tuple[int, Exception] | None]:
        """Create the gang's pods beyond the pass's first batch, each built as a worker
        takes it (at most CREATE_CONCURRENCY bodies exist at once), for STREAM_SECONDS at
        most: the ranks created, and the first failure with its rank (which stops the
        rest). A pod that exists already or a namespace being deleted (``create_pod``
        False) stops them too: the next pass plans from the index."""
        build = plan.build_more
        if build is None or not plan.more_ranks:
            return [], None
        deadline = stream_clock() + STREAM_SECONDS
        stop = False

        def ranks() -> Iterator[int]:
            for rank in plan.more_ranks:
                if stop or stream_clock() > deadline:
                    return
                yield rank

        async def create(rank: int) -> bool:
            nonlocal stop
            made = await self.kube.create_pod(ns, self._with_token([build(rank)], body)[0])
            stop = stop or not made
            return made

        done, failed = await each_bounded(ranks(), create)
        return [rank for rank, made in done if made], failed

    async def _delete_pods(self, ns: str, names: list[str]) -> list[tuple[str, bool]]:
        """Delete ``names``, at most CREATE_CONCURRENCY at once: (name, whether it existed)
        for each; the first failure is raised once the deletes in flight are done."""
        done, failed = await each_bounded(names, lambda n: self.kube.delete_pod(ns, n))
        if failed is not None:
            raise failed[1]
        return done

    async def _until_deleting(self, uids: set[str], timeout: float) -> bool:
        """Wait (at most ``timeout`` seconds) until no pod of ``uids`` in the index lacks
        its deletionTimestamp (each is terminating or gone)."""
        return await self._until(
            lambda: (
                not any(
                    uid_of(p) in uids and not (p.get("metadata") or {}).get("deletionTimestamp")
                    for p in self.pods()
                )
            ),
            timeout,
        )

    async def _patches_shown(self) -> None:
        """Wait until the index shows the last pass's pod patches (`unshown`), bounded."""
        if self.unshown is None:
            return
        shown, wait = self.unshown
        self.unshown = None
        if not await self._until_patched(shown, wait):
            log.info(
                "%s: the index does not show %d pod patches after %.0fs; planning on",
                self.key, len(shown), wait,
            )  # fmt: skip

    async def _until_patched(
        self, patched: list[tuple[str, str | None, dict[str, Any]]], timeout: float
    ) -> bool:
        """Wait (at most ``timeout`` seconds) until every pod the index still holds of
        ``patched`` (name, uid, metadata patch) shows its patch."""

        def done() -> bool:
            by_uid = {uid_of(p): p for p in self.pods()}
            return all(
                uid not in by_uid or observations.shows_patch(by_uid[uid], patch)
                for _, uid, patch in patched
            )

        return await self._until(done, timeout)

    async def _until_indexed(self, names: set[str], timeout: float) -> bool:
        """Wait (at most ``timeout`` seconds) until the pod index holds pods of ``names``."""
        return await self._until(lambda: names <= {_name(p) for p in self.pods()}, timeout)

    @staticmethod
    async def _until(done: Callable[[], bool], timeout: float) -> bool:
        """Poll ``done`` every INDEX_POLL_SECONDS for at most ``timeout`` seconds: whether
        it came true."""
        deadline = time.monotonic() + timeout
        while not done():
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(INDEX_POLL_SECONDS)
        return True

    async def _post_pods(
        self, ns: str, pods: list[dict[str, Any]], dry_run: bool
    ) -> tuple[str, Exception] | None:
        """Create (or dry-run) ``pods``, at most CREATE_CONCURRENCY at once; the first
        failure stops the rest and is returned with its pod's name."""
        _, failed = await each_bounded(
            pods, lambda pod: self.kube.create_pod(ns, pod, dry_run=dry_run)
        )
        return None if failed is None else (str(failed[0]["metadata"]["name"]), failed[1])

    async def _probe_gang(self, ns: str, pods: list[dict[str, Any]], total: int = 0) -> bool:
        """Dry-run the gang's summed resources as one pod; True when that was refused.

        A permanent refusal of the probe (a LimitRange's per-pod maximum, say) or a webhook's
        denial (of a pod asking for the whole gang) says nothing about the real pods, whose
        own dry runs follow: it is ignored.
        """
        probe = gangprobe.probe_pod(pods, total)
        if probe is None:
            return False
        self.call = "dry_run_gang"
        try:
            await self.kube.create_pod(ns, probe, dry_run=True)
        except asyncio.CancelledError:
            raise
        except Exception as e:
            refusal = refusals.classify_exception(e)
            if not refusal.expected:
                raise
            if refusal.permanent or refusal.bounded:
                log.debug("gang probe of %s refused (%s), ignored", self.key, refusal.message)
                return False
            self._refuse(f"the gang's {max(total, len(pods))} pods", refusal)
            return True
        return False

    def _refuse(self, target: str, refusal: refusals.Refusal) -> None:
        """Remember a refused create for the planner, with the retry time of its backoff."""
        now = datetime.now(UTC)
        prev = self.refused or self.batch_refused
        tries = (prev.tries if prev is not None else 0) + 1
        delay = self.retry.delay(tries, random.random(), refusal.retry_after)
        self.refused = refusals.next_refused(prev, target, refusal, now, delay)
        self._log_refusal(self.call, refusal, delay, target)

    def _log_refusal(
        self, call: str, refusal: refusals.Refusal, delay: float, target: str = ""
    ) -> None:
        """One line per API error (no traceback for an expected one) and one count."""
        METRICS.observe_api_error(call, refusal.reason)
        what = "fails the job" if refusal.permanent else f"retry in {delay:.1f}s"
        log.warning(
            "API error: job=%s call=%s%s reason=%s code=%s %s: %s",
            self.key,
            call,
            f" object={target!r}" if target else "",
            refusal.reason,
            refusal.code,
            what,
            refusal.message,
        )

    async def write_status(self, ns: str, name: str, patch: dict[str, Any]) -> None:
        """Patch status (never with NaN or an infinity); JobGone when the job is gone."""
        written = await self.kube.patch_status(ns, name, json_safe(patch))
        if written is None:
            raise JobGone(f"job {ns}/{name} is gone (404 on its status)")
        if job_uid(written) != self.uid:
            raise JobGone(f"job {ns}/{name} is now another object (uid {job_uid(written)})")
        self.last_written = written
        self.checked_at = time.monotonic()

    async def check_exists(self) -> None:
        """GET the job when nothing confirmed it for a while; JobGone when it is gone."""
        if time.monotonic() - self.checked_at < self.recheck_seconds:
            return
        meta = self.body.get("metadata", {})
        ns, name = meta.get("namespace", ""), meta.get("name", "")
        live = await self.kube.get_job(ns, name)
        if live is None:
            raise JobGone(f"job {ns}/{name} is gone (404)")
        if job_uid(live) != self.uid:
            raise JobGone(f"job {ns}/{name} is now another object (uid {job_uid(live)})")
        self.checked_at = time.monotonic()
        if _rv(live) > _rv(self.body):
            self.body = kept_body(live)  # the watch missed a change too: take the fresher copy

    # -- the tasks that run the loop -------------------------------------------------------
    def start(self, body: dict[str, Any], pods: Callable[[], list[Mapping[str, Any]]]) -> None:
        """Run the loop's tasks; ``pods`` returns the job's pods from the operator's index."""
        self.body = kept_body(body)
        self._pods = pods
        loop = asyncio.get_running_loop()
        self._task = loop.create_task(self._run(), name=f"job {self.key}")
        self._scrape_task = loop.create_task(self.metrics.run(), name=f"metrics {self.key}")

    def update(self, body: dict[str, Any]) -> None:
        """A newer copy of the job arrived from the watch: keep it and reconcile soon."""
        self.body = kept_body(body)
        self.checked_at = time.monotonic()
        self.wake.set()

    def stop(self) -> None:
        """Stop both tasks and drop the job's series (its DELETED event, or shutdown)."""
        self.ended = True
        current = asyncio.current_task() if _in_loop() else None
        for task in (self._task, self._scrape_task):
            if task is not None and task is not current:
                task.cancel()
        meta = self.body.get("metadata", {})
        METRICS.forget(meta.get("namespace", ""), meta.get("name", ""))

    def job_gone(self, why: JobGone) -> None:
        """The job is gone (either task found out): stop both tasks, once, and forget it."""
        if self.ended:
            return
        log.info("stopping the loop of %s: %s", self.key, why)
        self.stop()
        if self.on_exit is not None:
            self.on_exit(self)

    @property
    def key(self) -> str:
        meta = self.body.get("metadata", {})
        return f"{meta.get('namespace')}/{meta.get('name')}"

    async def _run(self) -> None:
        while not self.ended:
            try:
                plan = await self.reconcile(self.body, self.pods())
                idle = plan.phase in ("Succeeded", "Failed")
                resync = max(self.resync_seconds, IDLE_RESYNC_SECONDS if idle else 0.0)
                timeout = min(plan.requeue_after or resync, resync)
                self.metrics.wake.set()
                self.failures = 0
            except asyncio.CancelledError:
                raise
            except JobGone as gone:
                self.job_gone(gone)
                return
            except Exception as e:
                # Wake-ups (pod events, job updates) must not cut an API backoff short.
                await asyncio.sleep(self._failed(e))
                continue
            await self._patches_shown()
            woken = await self.sleep(max(timeout, 0.0))
            if not woken:
                try:
                    await self.check_exists()
                except asyncio.CancelledError:
                    raise
                except JobGone as gone:
                    self.job_gone(gone)
                    return
                except Exception as e:
                    self.side_failure("get_job", e, 1)

    def side_failure(self, call: str, e: Exception, failures: int) -> float:
        """A failure off the lifecycle path (scrape-and-status, the existence check): an
        expected API error is one line and a count, a bug a traceback; the delay backs off."""
        if isinstance(e, Fenced):
            return self._held_back(call, e)
        refusal = refusals.classify_exception(e)
        delay = self.retry.delay(failures, random.random(), refusal.retry_after)
        if refusal.expected:
            self._log_refusal(call, refusal, delay)
        else:
            METRICS.observe_api_error(call, refusal.reason)
            log.exception("%s of %s failed; retry in %.1fs", call, self.key, delay)
        return delay

    def _held_back(self, call: str, e: Fenced) -> float:
        """Not a failure: the standby guard has not confirmed this replica yet; try soon."""
        log.info("%s of %s held back: %s", call, self.key, e)
        return FENCED_RETRY_SECONDS

    def _failed(self, e: Exception) -> float:
        """A pass failed: classify, log, count, and back off (exponential, jittered, capped)."""
        if isinstance(e, Fenced):
            return self._held_back("reconcile", e)
        self.failures += 1
        refusal = refusals.classify_exception(e)
        delay = self.retry.delay(self.failures, random.random(), refusal.retry_after)
        METRICS.observe_reconcile(0.0, opmetrics.error_reason(e))
        if refusal.expected:
            self._log_refusal(self.call or "reconcile", refusal, delay)
        else:
            METRICS.observe_api_error(self.call or "reconcile", refusal.reason)
            log.exception(
                "reconcile of %s failed (call=%s); retry in %.1fs", self.key, self.call, delay
            )
        return delay

    async def sleep(self, timeout: float) -> bool:
        """Wait for a wake-up or the timeout, then coalesce a burst of events; True if woken."""
        woken = True
        try:
            await asyncio.wait_for(self.wake.wait(), timeout)
        except TimeoutError:
            woken = False
        self.wake.clear()
        await asyncio.sleep(DEBOUNCE_SECONDS)
        return woken


class Stopwatch:
    """Where a pass's time went, for its log line: ``plan 0.31s, create 2.10s`` (laps under
    10 ms left out)."""

    def __init__(self, start: float) -> None:
        self.last = start
        self.laps: list[tuple[str, float]] = []

    def lap(self, what: str) -> None:
        now = time.monotonic()
        if now - self.last >= 0.01:
            self.laps.append((what, now - self.last))
        self.last = now

    def __str__(self) -> str:
        return ", ".join(f"{what} {seconds:.2f}s" for what, seconds in self.laps) or "-"


def _name(pod: Mapping[str, Any]) -> str:
    return str((pod.get("metadata") or {}).get("name") or "")


def _in_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True
