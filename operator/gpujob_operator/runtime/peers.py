"""Which replica is active under kopf peering: the oldest live one.

kopf pauses every replica when two live peers share a priority, and pauses a replica as soon
as a higher-priority peer appears. Job loops are plain asyncio tasks that kopf's pause does
not stop, so a running replica must never be pre-empted by a newcomer: the priority falls
with the start time (older wins), and a random tie-break keeps two replicas started in the
same millisecond apart. A new replica (a second one, or a rolling ``helm upgrade``) stands
by until the active one leaves: at once when it exits cleanly (kopf withdraws it), or once
its keep-alive lapses (``peering.lifetime``) when it is killed.

kopf's pause stops its own watches and daemons, not our job loops: :func:`is_active`
tells the operator's standby guard (``standby.py``) when to stop them, by kopf's rule.
"""

from __future__ import annotations

import datetime as dt
import random
from collections.abc import Mapping
from typing import Any

DEFAULT_LIFETIME = 60
ENV_LIFETIME = "GPUJOB_PEERING_LIFETIME"


def priority(started_at: float, tiebreak: int | None = None) -> int:
    """kopf peering priority of a replica started at ``started_at`` (seconds since the epoch)."""
    if tiebreak is None:
        tiebreak = random.randrange(1000)
    return -(int(started_at * 1000) * 1000 + tiebreak % 1000)


def lastseen(info: Mapping[str, Any]) -> dt.datetime | None:
    """A peer's last keep-alive, or None when its entry cannot be read."""
    try:
        seen = dt.datetime.fromisoformat(str(info["lastseen"]))
    except (KeyError, ValueError, TypeError):
        return None
    return seen if seen.tzinfo else seen.replace(tzinfo=dt.UTC)


def deadline(info: Mapping[str, Any]) -> dt.datetime | None:
    """When a peer's keep-alive lapses (``lastseen + lifetime``), or None if unreadable."""
    seen = lastseen(info)
    try:
        return (
            None
            if seen is None
            else seen + dt.timedelta(seconds=int(info.get("lifetime", DEFAULT_LIFETIME)))
        )
    except (ValueError, TypeError):
        return None


def live(info: Mapping[str, Any], now: dt.datetime) -> bool:
    """Whether a peer's keep-alive has not yet lapsed; an entry that cannot be read counts
    as live (kopf's own entries always can)."""
    until = deadline(info)
    return until is None or until > now


def is_active(
    status: Mapping[str, Mapping[str, Any]], me: str, my_priority: int, now: dt.datetime
) -> bool:
    """Whether kopf lets replica ``me`` work, judged from one peering object's ``status``.

    The same rule as kopf: a live other peer (``lastseen + lifetime`` not yet passed) with a
    higher priority pauses us, and so does one with the same priority (kopf pauses both).
    """
    for ident, info in status.items():
        if ident == me or not isinstance(info, Mapping):
            continue
        until = deadline(info)
        try:
            theirs = int(info.get("priority", 0))
        except (ValueError, TypeError):
            continue
        if until is not None and until > now and theirs >= my_priority:
            return False
    return True


def identity(pod_name: str | None, host: str, pid: int) -> str:
    """This replica's peering identity: the pod name in a cluster, else host and pid."""
    return pod_name or f"{host}/{pid}"
