"""Kubernetes lists read page by page as raw JSON, in the calling worker thread (I/O).

Every list the operator makes of objects that can be large (pods: a 400 KB template makes
400 KB pods) goes through :func:`list_pages`: no model round trip, each page decoded and
reduced (``project``) before the next is asked for, and the page's length chosen from the
size of the items so far, so that one page stays near :data:`PAGE_BYTES` whether the pods
are 5 KB or 1 MB. A list of thousands of big pods never sits whole in memory.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

PAGE_BYTES: Final = 8 * 1024 * 1024
"""About how many bytes of JSON one page may hold."""
PAGE_ITEMS_MAX: Final = 500
"""The most items a page asks for (small objects)."""
FIRST_PAGE_ITEMS: Final = 32
"""The first page's length, before the size of an item is known."""
READ_TIMEOUT: Final = (5.0, 30.0)
"""Connect and read timeouts of one page: a slow API server delays a list, never hangs it."""
METADATA_ONLY: Final = {
    "Accept": "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json"
}
"""The header that asks for the items' metadata alone (``kubectl get --show-kind`` does too)."""


@dataclass
class Listing:
    """What a list returned: the projected items and the list's resourceVersion (where a
    watch of the same objects may start without missing a change)."""

    items: list[Any] = field(default_factory=list)
    resource_version: str = ""
    pages: int = 0


def next_limit(bytes_so_far: int, items_so_far: int) -> int:
    """The next page's length: as many items as fit :data:`PAGE_BYTES` at the mean size so
    far, between 1 and :data:`PAGE_ITEMS_MAX`."""
    if items_so_far <= 0:
        return FIRST_PAGE_ITEMS
    mean = max(1, bytes_so_far // items_so_far)
    return max(1, min(PAGE_ITEMS_MAX, PAGE_BYTES // mean))


def list_pages(
    call: Callable[..., Any],
    project: Callable[[Any], Any] | None = None,
    timeout: tuple[float, float] = READ_TIMEOUT,
    **kw: Any,
) -> Listing:
    """Call a generated ``list_*`` method page by page (``_preload_content=False``) and
    return its items, each passed through ``project`` as its page is decoded. Blocking: run
    it in a worker thread. The API server keeps one snapshot across a list's continue
    tokens, so the pages together are one consistent listing."""
    out = Listing()
    token: str | None = None
    seen_bytes = seen_items = 0
    while True:
        more = {"_continue": token} if token else {}
        limit = next_limit(seen_bytes, seen_items)
        resp = call(_preload_content=False, _request_timeout=timeout, limit=limit, **more, **kw)
        data = resp.data
        page = json.loads(data)
        items = page.get("items") or []
        seen_bytes += len(data)
        seen_items += len(items)
        out.items.extend(items if project is None else (project(i) for i in items))
        meta = page.get("metadata") or {}
        out.resource_version = str(meta.get("resourceVersion") or out.resource_version)
        out.pages += 1
        token = meta.get("continue") or None
        del page, items, data, resp
        if not token:
            return out
