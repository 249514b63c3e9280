"""A status written by the previous version (25 top-level fields) read in this one's shape.

Until v1alpha1's status was split into the user's contract and ``operatorState`` (see
:mod:`.status`), the operator kept its bookkeeping and some derived values beside what users
read. An operator of this version reads such a job once through :func:`upgrade`: every old
field moves to its new place (the new place wins when both are set) and is left behind as a
``None`` tombstone, so the first patch computed against the upgraded status deletes it.
Derived values (``summary``, ``restartsWithoutProgress``, ``secondsPerSample``) are dropped:
they are computed again where they are shown. The CRD keeps each old path as a deprecated
field (:data:`MOVES` feeds the generator), since the API server prunes what its schema lacks
on reads as well as writes; one release later both go.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any, Final

from gpujob_operator.api.jsoncopy import json_copy

Path = tuple[str, ...]

_LEDGER: Final = (
    "accountedUntil",
    "cause",
    "stage",
    "attempt",
    "attemptSince",
    "attemptStepped",
    "furthestStep",
    "verdict",
    "rank",
    "verdictSeconds",
    "rankSeconds",
    "samples",
    "tokens",
    "checkpointRatio",
    "evalRatio",
    "samplesPerSecond",
    "tokensPerSecond",
)

MOVES: Final[tuple[tuple[Path, Path | None], ...]] = (
    (("attempt",), ("gang", "attempt")),
    (("restarts",), ("gang", "restarts")),
    (("nextAttemptTime",), ("gang", "nextAttemptTime")),
    (("replicas",), ("gang", "replicas")),
    (("gpus",), ("gang", "gpus")),
    (("totalGPUs",), ("gang", "gpus", "requested")),
    (("queue",), ("gang", "startForecast")),
    (("createBackoff",), ("operatorState", "createBackoff")),
    (("admissionDenial",), ("operatorState", "admissionDenial")),
    (("attemptsWithoutProgress",), ("operatorState", "attemptsWithoutProgress")),
    (("furthestStepAtAttemptStart",), ("operatorState", "furthestStepAtAttemptStart")),
    (("restartsWithoutProgress",), None),
    (("summary",), None),
    (("progress", "rateSince"), ("operatorState", "rateSince")),
    (("progress", "secondsPerSample"), None),
    (("progress", "secondsPerToken"), None),
    *((("goodput", key), ("operatorState", "goodput", key)) for key in _LEDGER),
)
"""Each old path and where its value lives now (None: derived, dropped), in order: a later
move never overwrites an earlier one (``gpus`` before ``totalGPUs``)."""


def upgrade(status: Mapping[str, Any] | None) -> dict[str, Any]:
    """``status`` in this version's shape, old fields left as ``None`` tombstones (pure;
    a status already in this shape comes back equal)."""
    out: dict[str, Any] = json_copy(dict(status or {}))
    for old, new in MOVES:
        parent = _at(out, old[:-1])
        if not isinstance(parent, dict) or parent.get(old[-1]) is None:
            continue
        value = parent[old[-1]]
        parent[old[-1]] = None
        if new is not None and _at(out, new) is None:
            _put(out, new, value)
    return out


def is_legacy(status: Mapping[str, Any] | None) -> bool:
    """Whether ``status`` still holds a field of the previous shape."""
    return any(
        isinstance(p := _at(status or {}, old[:-1]), Mapping) and p.get(old[-1]) is not None
        for old, _ in MOVES
    )


def without_nulls(value: Any) -> Any:
    """``value`` with every ``None`` entry of a mapping removed, at every depth."""
    if isinstance(value, Mapping):
        return {k: without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [without_nulls(v) for v in value]
    return value


def _at(root: Mapping[str, Any], path: Path) -> Any:
    node: Any = root
    for key in path:
        if not isinstance(node, Mapping):
            return None
        node = node.get(key)
    return node


def _put(root: dict[str, Any], path: Path, value: Any) -> None:
    node = root
    for key in path[:-1]:
        child = node.get(key)
        if not isinstance(child, dict):
            child = node[key] = {}
        node = child
    node[path[-1]] = copy.deepcopy(value)
