"""JSON merge patches (RFC 7386) of status, in the two senses the operator needs (pure).

A merge patch replaces lists whole and deletes a key with null. The planner owns most of
the status and patches only what changed (:func:`minimal_patch`); the monitor owns whole
parts of it (progress, bottleneck, gpus) and rewrites each part it changed in full, so a
part never ends up half from one write and half from another (:func:`replacing_patch`).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any


def minimal_patch(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    """The smallest merge patch turning ``old`` into ``new`` (unchanged keys left out)."""
    patch: dict[str, Any] = {}
    for key in old:
        if key not in new:
            patch[key] = None
    for key, value in new.items():
        before = old.get(key)
        if isinstance(value, Mapping) and isinstance(before, Mapping):
            sub = minimal_patch(before, value)
            if sub:
                patch[key] = sub
        elif key not in old or before != value:
            patch[key] = copy.deepcopy(value)
    return patch


def replacing_patch(old: Any, new: Any) -> Any:
    """``new`` in full as a merge patch over ``old``: keys gone from a mapping become null."""
    if not isinstance(new, dict) or not isinstance(old, dict):
        return new
    out: dict[str, Any] = {k: replacing_patch(old.get(k), v) for k, v in new.items()}
    for k in old:
        if k not in new:
            out[k] = None
    return out
