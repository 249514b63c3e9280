"""Kueue's cluster-scoped objects are read once per interval for every job, not per pass."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import pytest

from gpujob_operator.lifecycle.gang import gang
from gpujob_operator.runtime import gangstate


class Counting:
    def __init__(self, objects: dict[str, dict[str, Any]]) -> None:
        self.objects = objects
        self.gets: list[str] = []

    async def get_cluster_object(self, ref: gang.ObjectRef) -> dict[str, Any] | None:
        self.gets.append(ref.name)
        return self.objects.get(ref.name)


def flavor(name: str) -> gang.ObjectRef:
    return gang.ObjectRef(gang.KUEUE_GROUP, gang.KUEUE_VERSION, "resourceflavors", name)


def test_a_flavor_is_read_once_per_interval_and_a_missing_one_every_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(gangstate, "_CLUSTER_OBJECTS", {})
    clock = [1000.0]
    monkeypatch.setattr(gangstate.time, "monotonic", lambda: clock[0])
    kube = Counting({"a100": {"metadata": {"name": "a100"}, "spec": {"nodeLabels": {"x": "y"}}}})

    async def passes() -> list[Any]:
        k = cast(Any, kube)
        return [await gangstate.cluster_object(k, flavor(n)) for n in ("a100", "a100", "gone")]

    first = asyncio.run(passes())
    assert first[0] == first[1] and first[2] is None
    assert kube.gets == ["a100", "gone"]
    kube.objects["gone"] = {"metadata": {"name": "gone"}}  # created meanwhile: seen at once
    assert asyncio.run(passes())[2] is not None
    assert kube.gets == ["a100", "gone", "gone"]
    clock[0] += gangstate.CLUSTER_OBJECT_SECONDS + 1  # the interval passed: read again
    asyncio.run(passes())
    assert kube.gets.count("a100") == 2
