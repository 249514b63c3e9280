"""The collector tuning: freeze on a cadence, thaw and collect on a longer one."""

from __future__ import annotations

import asyncio
import gc
import logging

import pytest

from gpujob_operator.runtime import gctune


class FakeCollector:
    """Records what was asked of the ``gc`` module, in order."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.threshold = (700, 10, 10)
        self.frozen = 0

    def set_threshold(self, threshold0: int, threshold1: int = 10, threshold2: int = 10) -> None:
        self.threshold = (threshold0, threshold1, threshold2)
        self.calls.append(f"threshold {threshold0}")

    def get_threshold(self) -> tuple[int, int, int]:
        return self.threshold

    def freeze(self) -> None:
        self.frozen += 1000
        self.calls.append("freeze")

    def unfreeze(self) -> None:
        self.calls.append("unfreeze")

    def get_freeze_count(self) -> int:
        return self.frozen

    def collect(self, generation: int = 2) -> int:
        self.calls.append(f"collect {generation}")
        return 7


class Time:
    """A clock that the fake sleep advances; the tuner stops after ``rounds`` sleeps."""

    def __init__(self, rounds: int) -> None:
        self.now = 0.0
        self.rounds = rounds

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        if self.rounds == 0:
            raise asyncio.CancelledError
        self.rounds -= 1
        self.now += seconds


def run(freeze: float, thaw: float, rounds: int) -> FakeCollector:
    fake, t = FakeCollector(), Time(rounds)
    with pytest.raises(asyncio.CancelledError):
        asyncio.run(
            gctune.tune_collector(freeze, thaw, collector=fake, sleep=t.sleep, clock=t.clock)
        )
    return fake


def test_it_freezes_every_period_and_thaws_with_one_full_collection_on_the_longer_one(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, "gpujob.gc")
    fake = run(60, 180, rounds=4)
    young = ["collect 2", "freeze"]
    assert fake.calls == [
        f"threshold {gctune.GEN0_THRESHOLD}",
        *young,  # 60 s
        *young,  # 120 s
        "unfreeze", "collect 2", "freeze",  # 180 s: the thaw's one collection, then frozen
        *young,  # 240 s
    ]  # fmt: skip
    assert fake.threshold[1:] == (10, 10)  # only the young generation's threshold changes
    (thawed,) = [r.getMessage() for r in caplog.records]
    assert "thawed 2000 objects" in thawed and "found 7 unreachable" in thawed, thawed


def test_zero_leaves_the_collector_as_cpython_sets_it() -> None:
    fake, t = FakeCollector(), Time(rounds=3)
    asyncio.run(gctune.tune_collector(0, 180, collector=fake, sleep=t.sleep, clock=t.clock))
    assert fake.calls == []


def test_the_real_collector_freezes_and_thaws() -> None:
    """The calls the tuner makes do what it relies on (a splice each way)."""
    before = gc.get_threshold()
    gc.freeze()
    try:
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)
    assert gc.get_freeze_count() == 0
