"""How many bytes of pods a job asks the operator to create and watch, and the bound on it.

Each pod is about its template's size as JSON, and the operator sees every pod of a job
several times while the gang starts (its create, then each status change, decoded by the
watch) and holds the events of pods that change faster than they are handled. A core/v1-valid
template of 400 KB times 512 nodes took the operator to 828 MiB at its peak, past the chart's
512 MiB limit: OOM-killed, restarted, the same again, and no job managed meanwhile. So a job
whose pods add up to more than ``GPUJOB_MAX_JOB_POD_BYTES`` (64 MiB by default: about 3.5
times that at the peak, inside the limit beside everything else) is refused, at apply by the
webhook and, if it got past (the webhook down), by the operator before any pod exists.

Pure: the spec as stored (camelCase) in, the bytes or the refusal's words out.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Final

DEFAULT_MAX_JOB_POD_BYTES: Final = 64 * 2**20
POD_OVERHEAD_BYTES: Final = 4096
"""What the operator adds to each pod beyond the template (labels, env, probes, volumes)."""


def pod_bytes(raw_spec: Mapping[str, Any]) -> tuple[int, int]:
    """(bytes of one pod, pods): the template as compact JSON plus the operator's own part,
    and ``spec.nodes``."""
    template = raw_spec.get("template") or {}
    size = len(json.dumps(template, separators=(",", ":"), ensure_ascii=False).encode())
    nodes = raw_spec.get("nodes")
    return size + POD_OVERHEAD_BYTES, nodes if isinstance(nodes, int) and nodes > 0 else 1


def refusal(raw_spec: Mapping[str, Any], bound: int) -> str | None:
    """Why the job's pods are too many bytes for the operator (None: they fit, or no bound)."""
    if bound <= 0:
        return None
    each, nodes = pod_bytes(raw_spec)
    total = each * nodes
    if total <= bound:
        return None
    return (
        f"spec.template makes pods of {each / 1024:.0f} KiB each, x spec.nodes {nodes} = "
        f"{total / 2**20:.0f} MiB of pods, over the operator's bound of "
        f"{bound / 2**20:.0f} MiB (GPUJOB_MAX_JOB_POD_BYTES): it watches every pod of a job "
        "while the gang starts. Move large values out of the template (a ConfigMap or a "
        "volume) and create the job again, or raise the bound together with the operator's "
        "memory limit"
    )
