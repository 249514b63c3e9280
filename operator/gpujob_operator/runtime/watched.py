"""Namespaced objects as a watch last delivered them, read instead of a GET per pass.

Kueue jobs used to GET their Workload on every pass of their loop: a thousand Kueue jobs
woken by their pods asked the API server as often. kopf already watches the Workloads
(it wakes the job's loop on a change), so the watch feeds this cache and a pass reads the
Workload from memory. What it does not know it never claims:

- an object not in the cache is read from the API server (absence is never cached: a
  Workload the watch has not delivered yet is not "gone");
- an entry is trusted for :data:`TRUST_SECONDS` after the watch or a read last confirmed
  it, then read again: a watch paused by peering, or an event lost, is bounded in time;
- after the job's own write to an object its entry is dropped, so the next pass reads
  what it wrote (read-your-writes) rather than the version before it;
- a version older than what is known (by resourceVersion, when both are numbers, as
  etcd's are) is never kept: not an event older than the entry, nor, once the entry is
  dropped, one from before the operator's write or before the object's deletion (a late
  event, or a GET that raced the DELETED).

Lives on the event loop (the kopf handler that feeds it is a coroutine). Bounded: at most
:data:`MAX_ENTRIES` objects; past that, new ones are simply read each time.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from gpujob_operator.api.jsoncopy import json_copy

TRUST_SECONDS: Final = 60.0
MAX_ENTRIES: Final = 20_000

Key = tuple[str, str]


@dataclass
class _Entry:
    body: dict[str, Any]
    version: int | None
    confirmed: float


def _version(body: Mapping[str, Any]) -> int | None:
    text = str((body.get("metadata") or {}).get("resourceVersion") or "")
    return int(text) if text.isdigit() else None


def _key(body: Mapping[str, Any]) -> Key:
    meta = body.get("metadata") or {}
    return str(meta.get("namespace") or ""), str(meta.get("name") or "")


class WatchedObjects:
    """One kind of namespaced object (Kueue Workloads), by (namespace, name)."""

    def __init__(
        self, trust_seconds: float = TRUST_SECONDS, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.trust_seconds = trust_seconds
        self.clock = clock
        self._entries: dict[Key, _Entry] = {}
        self._floors: dict[Key, int] = {}
        """The newest version known of an object whose entry was dropped (written,
        deleted): nothing at or below it is kept again."""
        self.hits = self.misses = 0

    def __len__(self) -> int:
        return len(self._entries)

    def seen(self, event_type: str | None, body: Mapping[str, Any]) -> None:
        """A watch event (kopf's ``type``: None for the initial listing)."""
        key = _key(body)
        if event_type == "DELETED" or (body.get("metadata") or {}).get("deletionTimestamp"):
            self._drop(key, _version(body))
            return
        self._keep(key, body)

    def read(self, namespace: str, name: str, body: Mapping[str, Any] | None) -> None:
        """What a GET returned (None: not found, which is never cached)."""
        if body is None or (body.get("metadata") or {}).get("deletionTimestamp"):
            self._drop((namespace, name), None if body is None else _version(body))
        else:
            self._keep((namespace, name), body)

    def wrote(self, namespace: str, name: str) -> None:
        """The operator changed or deleted the object: read it afresh next time."""
        self._drop((namespace, name), None)

    def _drop(self, key: Key, version: int | None) -> None:
        entry = self._entries.pop(key, None)
        known = [v for v in (version, entry and entry.version, self._floors.get(key)) if v]
        if known:
            if key not in self._floors and len(self._floors) >= MAX_ENTRIES:
                self._floors.clear()  # forgetting floors only brings back the GET's race
            self._floors[key] = max(known)

    def get(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The object (a copy of its own), or None when the caller must read it."""
        entry = self._entries.get((namespace, name))
        if entry is None or self.clock() - entry.confirmed > self.trust_seconds:
            self.misses += 1
            return None
        self.hits += 1
        return json_copy(entry.body)

    def _keep(self, key: Key, body: Mapping[str, Any]) -> None:
        version = _version(body)
        old = self._entries.get(key)
        newest = old.version if old is not None else self._floors.get(key)
        # Older than what is kept; or, past a write or deletion, not newer than it.
        stale = (
            version is not None
            and newest is not None
            and (version < newest or (old is None and version == newest))
        )
        if stale:
            return
        if old is None and len(self._entries) >= MAX_ENTRIES:
            return
        self._floors.pop(key, None)
        self._entries[key] = _Entry(json_copy(dict(body)), version, self.clock())
