"""The standby guard: a replica that kopf peering pauses stops its job loops, and restarts.

kopf pauses a replica's watches when a peer outranks it, but a job loop is a plain task
that keeps reconciling. Two replicas can briefly both work (both start while the peering
object has no status yet, or the active one's keep-alive came late); the guard reads the
peering objects every few seconds and, while this replica is not the active one, stops
every job loop it has.

A replica that has served and is then paused also restarts (``demote``): kopf keeps its
indexes across a pause and never learns of the pods deleted meanwhile, so a resumed replica
would plan with ghosts of deleted pods. A fresh process starts paused with empty indexes
and fills them from a full listing when it becomes active.

The guard fails closed: a replica that cannot read the peering state for longer than a
keep-alive's lifetime, or whose own keep-alive has lapsed, may already have been replaced,
so it stops its loops and restarts rather than come back working beside its successor.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

from gpujob_operator.runtime import peers

log = logging.getLogger("gpujob.standby")

GROUP, VERSION = "kopf.dev", "v1"
INTERVAL_SECONDS = 2.0


def read_statuses(
    api: client.CustomObjectsApi, name: str, namespaces: Sequence[str]
) -> list[dict[str, Any]]:
    """The ``status`` of every peering object this replica takes part in."""
    objs: list[Any] = []
    try:
        if not namespaces:
            objs.append(api.get_cluster_custom_object(GROUP, VERSION, "clusterkopfpeerings", name))
        else:
            objs += [
                api.get_namespaced_custom_object(GROUP, VERSION, ns, "kopfpeerings", name)
                for ns in namespaces
            ]
    except ApiException as e:
        if e.status != 404:
            raise
    return [dict(o.get("status") or {}) for o in objs]


class Fence:
    """Until when this replica's writes are allowed (monotonic seconds; None: no peering).

    The guard opens it after each read that finds this replica active, for half a
    keep-alive's lifetime: no successor can start before this replica's keep-alive lapses,
    a full lifetime after its last touch. A process frozen (SIGSTOP, a stalled VM) or cut off
    finds it shut when it comes back, so no job loop writes before the guard has looked.
    """

    def __init__(self) -> None:
        self.until: float | None = None

    def open(self) -> bool:
        return self.until is None or time.monotonic() < self.until


FENCE = Fence()


def judge(
    statuses: Sequence[Mapping[str, Any]] | None,
    me: str,
    priority: int,
    now: dt.datetime,
    away_for: float,
    lifetime: float,
    active: bool,
) -> tuple[bool, str]:
    """Whether this replica may work now, and why (pure: the guard's whole decision).

    ``statuses`` is None when the peering objects could not be read; ``away_for`` is how
    long since the last read that could (or since the guard started). Fail closed: a
    replica that could not look for longer than a keep-alive's lifetime (the API
    unreadable, or the process frozen) may have been replaced, so it stops, even if this
    read now succeeds. A replica whose own keep-alive has lapsed (kopf could not write it)
    while another peer is live stops too: that peer already counts it as gone and works.
    """
    if away_for > lifetime:
        return False, f"this replica could not see its peers for {away_for:.0f}s"
    if statuses is None:
        return active, "the peering state could not be read; keeping the last judgement"
    for s in statuses:
        mine = s.get(me)
        others = [
            v for k, v in s.items() if k != me and isinstance(v, Mapping) and peers.live(v, now)
        ]
        if isinstance(mine, Mapping) and not peers.live(mine, now) and others:
            return False, "this replica's keep-alive has lapsed and a live peer may have taken over"
    if all(peers.is_active(s, me, priority, now) for s in statuses):
        return True, "no live peer outranks this replica"
    return False, "another replica is active"


async def guard(
    api: client.CustomObjectsApi,
    name: str,
    namespaces: Sequence[str],
    me: str,
    priority: int,
    stop_loops: Callable[[], int],
    demote: Callable[[], None],
    lifetime: float = peers.DEFAULT_LIFETIME,
    interval: float = INTERVAL_SECONDS,
    fence: Fence = FENCE,
) -> None:
    """Forever: while another replica is the active one (or this one could not look for
    longer than a keep-alive lives), shut the write fence and stop this replica's job
    loops; call ``demote`` when this replica, once seen active, is no longer.

    Survives every error of a read (a refused connection, a reset, a timeout, not only an
    ``ApiException``); the task that runs it is supervised by the caller, which ends the
    process should the guard ever end.
    """
    active, confirmed = True, False
    last_read = time.monotonic()
    while True:
        started = time.monotonic()
        statuses: list[dict[str, Any]] | None
        try:
            statuses = await asyncio.to_thread(read_statuses, api, name, namespaces)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # any failure of a read is "unread", never the end of the guard
            log.warning("standby guard could not read the peering object: %s", _why(e))
            statuses = None
        now = dt.datetime.now(dt.UTC)
        is_active, why = judge(statuses, me, priority, now, started - last_read, lifetime, active)
        if statuses is not None:
            last_read = started  # a fail-closed judgement is taken once, then judged afresh
        if is_active != active:
            log.warning(
                "peering: this replica (%s) is now %s: %s",
                me,
                "active" if is_active else "standby",
                why,
            )
        if not is_active:
            fence.until = 0.0
            stopped = stop_loops()
            if stopped:
                log.info("standby: stopped %d job loops (%s)", stopped, why)
            if confirmed:
                demote()
                confirmed = False  # once: the process is on its way out
        elif statuses is not None:
            fence.until = started + lifetime / 2
            confirmed = True
        active = is_active
        await asyncio.sleep(interval)


def _why(e: BaseException) -> str:
    return e.reason if isinstance(e, ApiException) else f"{type(e).__name__}: {str(e)[:200]}"
