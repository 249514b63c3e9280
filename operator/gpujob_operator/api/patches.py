"""JSON merge patches (RFC 7386) of status, in the two senses the operator needs (pure).

A merge patch replaces lists whole and deletes a key with null. The planner owns most of
the status and patches only what changed (:func:`minimal_patch`); the monitor owns whole
parts of it (progress, bottleneck, gpus) and rewrites each part it changed in full, so a
part never ends up half from one write and half from another (:func:`replacing_patch`).
Either passes through :func:`json_safe` on its way out: the API server refuses NaN.
"""

from __future__ import annotations

import copy
import math
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


def json_safe(value: Any) -> Any:
    """`value` with every NaN or infinity replaced by None (in a merge patch: "unknown now").

    The API server refuses them in a status patch; nothing upstream should produce one,
    and this is the last guard that makes sure.
    """
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    return value
