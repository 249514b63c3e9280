"""The node cache: one list per TTL for the whole operator, slimmed, and a failed list that
neither loses the last good one nor sticks (what cannot run here is only the API server:
the fake stands in for its list call)."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace
from typing import Any, cast

from kubernetes.client.rest import ApiException

from gpujob_operator.runtime import nodecache
from gpujob_operator.runtime.kube import Kube
from gpujob_operator.runtime.nodecache import NodeCache


class FakeCore:
    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []
        self.fail: Exception | None = None
        self.names = ["a", "b"]

    def list_node(self, **kw: Any) -> Any:
        self.calls.append(kw)
        if self.fail is not None:
            raise self.fail
        items = [
            {
                "metadata": {"name": n, "labels": {"zone": "z"}, "managedFields": ["x" * 100]},
                "spec": {"taints": [{"key": "k", "effect": "NoSchedule"}]},
                "status": {"allocatable": {"nvidia.com/gpu": "8"}, "images": ["big"] * 50},
            }
            for n in self.names
        ]
        return SimpleNamespace(data=json.dumps({"items": items}).encode())


def cache() -> tuple[NodeCache, FakeCore, list[float]]:
    core = FakeCore()
    clock = [0.0]
    nc = NodeCache(cast(Kube, SimpleNamespace(core=core)), clock=lambda: clock[0])
    return nc, core, clock


def test_concurrent_jobs_share_one_list_per_ttl_and_keep_only_what_placement_reads() -> None:
    nc, core, clock = cache()

    async def many() -> list[Any]:
        return await asyncio.gather(*(nc.get() for _ in range(20)))

    views = asyncio.run(many())
    assert len(core.calls) == 1 and core.calls[0]["resource_version"] == "0"
    assert all(v is views[0] for v in views)
    node = views[0].nodes[0]
    assert node == {
        "metadata": {"name": "a", "labels": {"zone": "z"}},
        "spec": {"unschedulable": False, "taints": [{"key": "k", "effect": "NoSchedule"}]},
        "status": {"allocatable": {"nvidia.com/gpu": "8"}, "declaredFeatures": []},
    }
    clock[0] = nodecache.TTL_SECONDS - 1
    asyncio.run(nc.get())
    assert len(core.calls) == 1
    clock[0] = nodecache.TTL_SECONDS
    asyncio.run(nc.get())
    assert len(core.calls) == 2


def test_a_failed_list_serves_the_last_good_one_for_a_while_then_says_why() -> None:
    nc, core, clock = cache()
    good = asyncio.run(nc.get())
    core.fail = ApiException(status=429, reason="Too Many Requests")
    clock[0] = nodecache.TTL_SECONDS
    assert asyncio.run(nc.get()) is good
    clock[0] = nodecache.STALE_OK_SECONDS + 1
    view = asyncio.run(nc.get())
    assert view.nodes == () and view.error is not None and "429" in view.error
    calls = len(core.calls)
    clock[0] += nodecache.ERROR_TTL_SECONDS - 1
    asyncio.run(nc.get())
    assert len(core.calls) == calls, "an error is cached briefly"
    core.fail = None
    clock[0] += 1
    assert asyncio.run(nc.get()).error is None, "and retried soon"


def test_a_cold_cache_that_cannot_list_says_why() -> None:
    nc, core, _ = cache()
    core.fail = ConnectionError("refused")
    view = asyncio.run(nc.get())
    assert view.error is not None and view.error.startswith("cannot list nodes:")
