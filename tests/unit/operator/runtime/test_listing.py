"""Lists are read in pages sized by the bytes of their items, not a fixed count."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

from gpujob_operator.runtime import listing


class Pages:
    """A list call answered from ``items`` in pages of ``limit`` with continue tokens."""

    def __init__(self, items: list[dict[str, Any]], rv: str = "41") -> None:
        self.items, self.rv = items, rv
        self.limits: list[int] = []
        self.biggest = 0

    def __call__(self, **kw: Any) -> Any:
        assert kw["_preload_content"] is False and kw["_request_timeout"]
        start, limit = int(kw.get("_continue") or 0), kw["limit"]
        self.limits.append(limit)
        end = start + limit
        meta = {"resourceVersion": self.rv} | (
            {"continue": str(end)} if end < len(self.items) else {}
        )
        data = json.dumps({"metadata": meta, "items": self.items[start:end]}).encode()
        self.biggest = max(self.biggest, len(data))
        return SimpleNamespace(data=data)


def test_big_items_get_short_pages_so_a_page_stays_near_its_byte_budget() -> None:
    big = [{"metadata": {"uid": str(i)}, "pad": "x" * 400_000} for i in range(120)]
    call = Pages(big)
    got = listing.list_pages(call, lambda p: p["metadata"]["uid"], label_selector="a")
    assert got.items == [str(i) for i in range(120)] and got.resource_version == "41"
    assert call.limits[0] == listing.FIRST_PAGE_ITEMS
    assert all(limit == listing.PAGE_BYTES // 400_050 for limit in call.limits[1:-1]), call.limits
    # Only the first page (sized blind) may pass the budget; the rest stay within it.
    assert call.biggest <= listing.FIRST_PAGE_ITEMS * 400_100


def test_small_items_get_the_longest_pages_and_an_empty_list_one_page() -> None:
    assert listing.next_limit(0, 0) == listing.FIRST_PAGE_ITEMS
    assert listing.next_limit(32 * 100, 32) == listing.PAGE_ITEMS_MAX
    assert listing.next_limit(10 * 50_000_000, 10) == 1
    call = Pages([])
    got = listing.list_pages(call)
    assert got.items == [] and got.pages == 1
