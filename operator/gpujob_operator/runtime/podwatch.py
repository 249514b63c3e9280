"""The operator's own watch of its pods, and the index it feeds (I/O at the edge).

kopf's watch decoded every pod event on the event loop and queued each body per object
until a worker took it: a 2,048-pod job of 400 KB pods made each burst of pod events
(created, scheduled, started, ready) most of a gigabyte of JSON on the loop, and the
queues held the bodies. Here one thread per watched scope (a namespace, or the cluster)
lists and watches the pods that carry the job label, decodes each event in that thread,
keeps only its projection (:func:`~gpujob_operator.lifecycle.observations.project_pod`)
and hands that to the loop, in order. No pod body reaches the loop or outlives its line.

The index is exact across re-lists: a fresh listing replaces what the index held in its
scope, so a pod deleted while the watch was down leaves no ghost (kopf's re-list could).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Final

from kubernetes.client.rest import ApiException

from gpujob_operator.api import children
from gpujob_operator.lifecycle.observations import project_pod
from gpujob_operator.observability.opmetrics import METRICS, error_reason
from gpujob_operator.runtime import listing

log = logging.getLogger("gpujob.podwatch")

SELECTOR: Final = children.LABEL_JOB_NAME
"""Every pod that names a job (which of them are a job's is decided by its controller
reference, in the planner and the monitor)."""
MAX_EVENT_BYTES: Final = 8 * 1024 * 1024
"""A watch line longer than this is not a pod (etcd refuses objects over 1.5 MiB by
default): the watch is dropped and the scope listed afresh."""
CHUNK_BYTES: Final = 256 * 1024
BACKOFF_FIRST: Final = 0.5
BACKOFF_MAX: Final = 10.0
RESUME_TRIES: Final = 5
"""Failed watch requests in a row before the scope is listed afresh."""
HEALTHY_SECONDS: Final = 60.0
"""A watch followed this long before it had to be listed again resets the backoff."""
QUICK_END_SECONDS: Final = 1.0
"""A watch the server ends this soon with nothing in it is reopened after a pause."""

JobKey = tuple[str, str]
Projection = dict[str, Any]


def job_key(pod: Mapping[str, Any]) -> JobKey | None:
    """(namespace, job label) of a pod, None if it names no job."""
    meta = pod.get("metadata") or {}
    name = (meta.get("labels") or {}).get(children.LABEL_JOB_NAME)
    return (str(meta.get("namespace") or ""), str(name)) if name else None


class PodIndex:
    """Projected pods by (namespace, job label), each job's by uid. Lives on the loop."""

    def __init__(self) -> None:
        self._jobs: dict[JobKey, dict[str, Projection]] = {}
        self._where: dict[str, JobKey] = {}

    def pods(self, key: JobKey) -> list[Mapping[str, Any]]:
        """The job's indexed pods (the projections themselves: read, never change them)."""
        return list(self._jobs.get(key, {}).values())

    def __len__(self) -> int:
        return len(self._where)

    def apply(self, kind: str, pod: Projection) -> set[JobKey]:
        """One watch event (ADDED, MODIFIED, DELETED); returns the jobs whose pods changed
        (two when a pod's job label changed)."""
        uid = children.uid_of(pod)
        if not uid:
            return set()
        key = job_key(pod)
        old = self._where.get(uid)
        if kind != "DELETED" and old is not None and old == key and self._jobs[old][uid] == pod:
            return set()  # nothing new (a re-list, a status write that changed nothing kept)
        touched: set[JobKey] = set()
        old = self._where.pop(uid, None)
        if old is not None:
            self._drop(old, uid)
            touched.add(old)
        if kind != "DELETED" and key is not None:
            self._jobs.setdefault(key, {})[uid] = pod
            self._where[uid] = key
            touched.add(key)
        return touched

    def replace(self, namespace: str | None, pods: list[Projection]) -> set[JobKey]:
        """A fresh listing of one scope (a namespace; None: the cluster) replaces what the
        index held there; returns the jobs whose pods were added, changed or dropped."""
        fresh: dict[str, Projection] = {}
        for pod in pods:
            uid = children.uid_of(pod)
            if uid and job_key(pod) is not None:
                fresh[uid] = pod
        touched: set[JobKey] = set()
        for uid, key in list(self._where.items()):
            if (namespace is None or key[0] == namespace) and uid not in fresh:
                del self._where[uid]
                self._drop(key, uid)
                touched.add(key)
        for pod in fresh.values():
            touched |= self.apply("ADDED", pod)
        return touched

    def _drop(self, key: JobKey, uid: str) -> None:
        job = self._jobs.get(key)
        if job is not None:
            job.pop(uid, None)
            if not job:
                del self._jobs[key]


@dataclass(frozen=True)
class WatchEvent:
    """One decoded line of a watch: its type, the resourceVersion to resume from, and the
    pod's projection (None for a BOOKMARK or an ERROR, whose ``code`` is then set)."""

    kind: str
    resource_version: str = ""
    pod: Projection | None = None
    code: int = 0
    message: str = ""


def decode_event(line: bytes | bytearray) -> WatchEvent:
    """Decode one watch line and keep only what the index keeps. Raises ValueError on a
    line that is not a watch event."""
    event = json.loads(line)
    if not isinstance(event, dict) or not isinstance(event.get("object"), dict):
        raise ValueError("a watch line without an object")
    kind, obj = str(event.get("type") or ""), event["object"]
    if kind == "ERROR":
        return WatchEvent(kind, code=int(obj.get("code") or 0), message=str(obj.get("message")))
    rv = str((obj.get("metadata") or {}).get("resourceVersion") or "")
    if kind == "BOOKMARK":
        return WatchEvent(kind, rv)
    if kind not in ("ADDED", "MODIFIED", "DELETED"):
        raise ValueError(f"a watch event of type {kind!r}")
    return WatchEvent(kind, rv, project_pod(obj))


def lines(chunks: Iterator[bytes], limit: int = MAX_EVENT_BYTES) -> Iterator[bytearray]:
    """The newline-separated lines of a stream of chunks. Raises ValueError when a line
    grows past ``limit`` bytes (only what is kept of a line counts, never the stream)."""
    buf = bytearray()
    for chunk in chunks:
        buf += chunk
        start = 0
        while (end := buf.find(b"\n", start)) != -1:
            if end > start:
                yield buf[start:end]
            start = end + 1
        del buf[:start]
        if len(buf) > limit:
            raise ValueError(f"a watch event over {limit} bytes")
    if buf.strip():
        yield buf


class Gone(Exception):
    """The watch's resourceVersion is too old (410): the scope must be listed again."""


class PodWatch:
    """List and watch the job-labelled pods of each scope, each scope in a thread of its
    own, and apply what they see to the index on the loop, in order.

    ``on_change(keys, pods)`` runs on the loop after each event or listing, with the jobs
    whose pods changed and, for an event, the projection it carried. ``synced`` is set once
    every scope's first listing is in the index.
    """

    def __init__(
        self,
        core: Any,
        namespaces: list[str],
        index: PodIndex,
        on_change: Callable[[set[JobKey], Projection | None], None],
        server_timeout: int = 300,
    ) -> None:
        self.core = core
        self.scopes: list[str | None] = list(namespaces) or [None]
        self.index = index
        self.on_change = on_change
        self.server_timeout = server_timeout
        self.synced = asyncio.Event()
        self._unsynced = set(self.scopes)
        self._stop = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock = threading.Lock()
        self._open: set[Any] = set()
        self._resume: dict[str | None, str] = {}
        """Per scope, the resourceVersion its watch resumes from (its thread's alone)."""
        self.listings = 0
        """Listings made (the first, and one after each expired or unusable watch)."""
        self.watches = 0
        """Watch requests opened (a watch ends every ``server_timeout`` and is resumed)."""

    def start(self) -> None:
        """Start one daemon thread per scope (call on the loop)."""
        self._loop = asyncio.get_running_loop()
        for scope in self.scopes:
            threading.Thread(
                target=self._run, args=(scope,), name=f"pod watch {scope or '*'}", daemon=True
            ).start()

    def stop(self) -> None:
        """End the threads: each open watch is shut, which ends its blocked read (they are
        daemons too, so the process never waits for them)."""
        self._stop.set()
        with self._lock:
            responses = list(self._open)
        for resp in responses:
            with contextlib.suppress(Exception):
                resp.shutdown()

    # -- on the loop ------------------------------------------------------------------

    def _listed(self, scope: str | None, pods: list[Projection]) -> None:
        touched = self.index.replace(scope, pods)
        self._unsynced.discard(scope)
        if not self._unsynced:
            self.synced.set()
        if touched:
            self.on_change(touched, None)

    def _event(self, kind: str, pod: Projection) -> None:
        touched = self.index.apply(kind, pod)
        if touched:
            self.on_change(touched, pod)

    def _post(self, fn: Callable[..., None], *args: Any) -> None:
        loop = self._loop
        if self._stop.is_set() or loop is None or loop.is_closed():
            self._stop.set()
            return
        try:
            loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:  # the loop closed between the check and the call
            self._stop.set()

    # -- in the scope's thread --------------------------------------------------------

    def _list_call(self, scope: str | None) -> Callable[..., Any]:
        if scope is None:
            return self.core.list_pod_for_all_namespaces
        return lambda **kw: self.core.list_namespaced_pod(scope, **kw)

    def _count(self, what: str) -> None:
        with self._lock:
            setattr(self, what, getattr(self, what) + 1)

    def _pause(self, delay: float) -> bool:
        """Wait about ``delay`` seconds (jittered); True when stopped meanwhile."""
        return self._stop.wait(delay * random.uniform(0.8, 1.2))

    def _run(self, scope: str | None) -> None:
        """List, then follow; list again only when the watch cannot resume (410, a line
        that is not an event, repeated failures)."""
        name, delay = scope or "*", BACKOFF_FIRST
        while not self._stop.is_set():
            followed = float("inf")
            try:
                got = listing.list_pages(
                    self._list_call(scope), project_pod, label_selector=SELECTOR
                )
                rv = got.resource_version
                self._count("listings")
                self._post(self._listed, scope, got.items)
                del got
                followed = time.monotonic()
                self._follow(scope, rv)
                return  # stopped
            except Exception as e:
                if self._stop.is_set():
                    return
                if time.monotonic() - followed > HEALTHY_SECONDS:
                    delay = BACKOFF_FIRST  # it watched well for a while: not a failing streak
                if _expired(e):
                    log.info("pod watch %s: its resourceVersion expired; listing again", name)
                else:
                    METRICS.observe_api_error("watch_pods", error_reason(e))
                    log.warning("pod watch %s: %s; listing again in %.1fs", name, _why(e), delay)
            if self._pause(delay):
                return
            delay = min(BACKOFF_MAX, delay * 2)

    def _follow(self, scope: str | None, rv: str) -> None:
        """Watch from ``rv`` until stopped, resuming from the last event seen after a
        transport error, a server error or a watch the server ended; raises to be listed
        again (410; a line that is not an event; :data:`RESUME_TRIES` failures in a row)."""
        name, delay, failures = scope or "*", BACKOFF_FIRST, 0
        self._resume[scope] = rv
        while not self._stop.is_set():
            opened = time.monotonic()
            try:
                events = self._watch(scope)
            except (Gone, ValueError):
                raise
            except Exception as e:
                if self._stop.is_set():
                    return  # stop() shut the stream
                if _expired(e):
                    raise
                failures += 1
                if failures >= RESUME_TRIES:
                    raise  # counted where it is listed again
                METRICS.observe_api_error("watch_pods", error_reason(e))
                log.warning("pod watch %s: %s; resuming in %.1fs", name, _why(e), delay)
                if self._pause(delay):
                    return
                delay = min(BACKOFF_MAX, delay * 2)
                continue
            failures, delay = 0, BACKOFF_FIRST
            # A watch ended at once with nothing in it: do not spin on a server that does that.
            quick = not events and time.monotonic() - opened < QUICK_END_SECONDS
            if quick and self._pause(BACKOFF_FIRST):
                return

    def _watch(self, scope: str | None) -> int:
        """One watch request from where the scope's last one stopped, read to its end;
        returns how many events it carried. The resourceVersion to resume from advances
        with each event, so a stream broken half way resumes after its last event (never
        replaying older states over newer ones)."""
        self._count("watches")
        rv = self._resume[scope]
        resp = self._list_call(scope)(
            label_selector=SELECTOR,
            watch=True,
            allow_watch_bookmarks=True,
            resource_version=rv,
            timeout_seconds=self.server_timeout,
            _preload_content=False,
            _request_timeout=(listing.READ_TIMEOUT[0], self.server_timeout + 30.0),
        )
        events = 0
        with self._lock:
            self._open.add(resp)
        try:
            for line in lines(resp.stream(CHUNK_BYTES, decode_content=True)):
                event = decode_event(line)
                del line
                if event.kind == "ERROR":
                    if event.code == 410:
                        raise Gone(event.message)
                    raise RuntimeError(f"watch error {event.code}: {event.message}")
                rv = event.resource_version or rv
                self._resume[scope] = rv
                events += 1
                if event.pod is not None:
                    self._post(self._event, event.kind, event.pod)
                if self._stop.is_set():
                    break
        finally:
            with self._lock:
                self._open.discard(resp)
            resp.close()  # never pool a connection with a stream left unread on it
        return events


def _expired(e: Exception) -> bool:
    """The watch's resourceVersion is too old, said in the stream or by the status."""
    return isinstance(e, Gone) or (isinstance(e, ApiException) and e.status == 410)


def _why(e: Exception) -> str:
    if isinstance(e, ApiException):
        return f"{e.status} {e.reason}"
    return f"{type(e).__name__}: {e}"
