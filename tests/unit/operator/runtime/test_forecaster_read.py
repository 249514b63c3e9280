"""The forecast reads the cluster's pods page by page and keeps only their projection."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace
from typing import Any, cast

from gpujob_operator.runtime import forecaster, listing
from gpujob_operator.runtime.forecaster import Forecaster


class PagedCore:
    """list_* calls answered in pages of ``limit``, with continue tokens, as raw JSON."""

    def __init__(self, items: list[dict[str, Any]]) -> None:
        self.items = items
        self.calls: list[dict[str, Any]] = []

    def _page(self, **kw: Any) -> Any:
        self.calls.append(kw)
        start = int(kw.get("_continue") or 0)
        limit = kw["limit"]
        page = self.items[start : start + limit]
        rest = start + limit < len(self.items)
        body = {"metadata": {"continue": str(start + limit)} if rest else {}, "items": page}
        return SimpleNamespace(data=json.dumps(body).encode())

    list_node = _page
    list_pod_for_all_namespaces = _page


def a_pod(i: int) -> dict[str, Any]:
    return {
        "metadata": {"name": f"p{i}", "namespace": "ns", "managedFields": [{"x": "y" * 1000}]},
        "spec": {
            "nodeName": f"n{i % 3}",
            "containers": [{"name": "c", "env": [{"name": "PAD", "value": "x" * 5000}],
                            "resources": {"limits": {"nvidia.com/gpu": 1}}}],
        },
        "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]},
    }  # fmt: skip


def test_pods_are_read_in_pages_and_only_their_projection_is_kept() -> None:
    core = PagedCore([a_pod(i) for i in range(1234)])
    f = Forecaster(cast(Any, SimpleNamespace(core=core)), lambda: [], 30, "None", False)
    world = asyncio.run(f.read(native=True, kueue=False))
    assert len(world.pods) == 1234 and world.nodes_error is None
    pages = [c for c in core.calls if "field_selector" in c]
    # The first page is short (the items' size is unknown), the rest as long as allowed.
    assert [c["limit"] for c in pages] == [listing.FIRST_PAGE_ITEMS] + [listing.PAGE_ITEMS_MAX] * 3
    assert pages[0]["field_selector"] == forecaster.ACTIVE_POD_FIELDS
    kept = world.pods[7]
    assert "managedFields" not in kept["metadata"] and "env" not in kept["spec"]["containers"][0]
    assert kept["spec"]["containers"][0]["resources"] == {"limits": {"nvidia.com/gpu": 1}}
    assert kept["status"] == {"phase": "Running"}
