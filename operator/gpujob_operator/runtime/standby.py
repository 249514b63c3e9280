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
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from collections.abc import Callable, Sequence
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


async def guard(
    api: client.CustomObjectsApi,
    name: str,
    namespaces: Sequence[str],
    me: str,
    priority: int,
    stop_loops: Callable[[], int],
    demote: Callable[[], None],
    interval: float = INTERVAL_SECONDS,
) -> None:
    """Forever: while another replica is the active one, stop this replica's job loops;
    call ``demote`` when this replica goes from active to standby."""
    active = True
    while True:
        try:
            statuses = await asyncio.to_thread(read_statuses, api, name, namespaces)
            now = dt.datetime.now(dt.UTC)
            is_active = all(peers.is_active(s, me, priority, now) for s in statuses)
            if is_active != active:
                log.info(
                    "peering: this replica (%s) is now %s", me, "active" if is_active else "standby"
                )
                active = is_active
            if not is_active:
                stopped = stop_loops()
                if stopped:
                    log.info("standby: stopped %d job loops; the active replica owns them", stopped)
        except ApiException as e:
            log.warning("standby guard could not read the peering object: %s", e.reason)
        await asyncio.sleep(interval)
