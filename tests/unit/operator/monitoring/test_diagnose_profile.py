"""``gpujob diagnose --profile STEPS`` against ranks served on 127.0.0.1 (canned state
documents): it asks, polls until every rank is done or failed, compares and prints."""

from __future__ import annotations

import argparse
import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
from aiohttp import web

from gpujob_operator.monitoring import diagnose
from tests.support.loopback import served
from tests.unit.operator.monitoring.test_profile_compare import doc, summary


@asynccontextmanager
async def ranks(asked: list[dict[str, str]], *, hostile: bool = False) -> AsyncIterator[str]:
    calls: dict[int, int] = {}

    async def handler(request: web.Request) -> web.Response:
        rank = int(request.match_info["rank"])
        asked.append(dict(request.query))
        calls[rank] = calls.get(rank, 0) + 1
        capture_id = request.query.get("id", "")
        if not 1 <= int(request.query.get("steps", "0")) <= 50:
            return web.json_response({"error": "steps"}, status=400)
        if rank == 2 and hostile:
            return web.Response(body=b'{"version": 1, "state": "done", "rank": 2, "summary": "x"}')
        if calls[rank] == 1 and rank == 0:  # the first poll finds rank 0 still capturing
            return web.json_response(doc(0, state="capturing", capture_id=capture_id))
        mm = 0.4 if rank == 1 else 0.2
        body = doc(
            rank,
            capture_id=capture_id,
            summary=summary(rank, mm + 0.1, top=[("aten::mm", mm), ("aten::add", 0.1)]),
        )
        return web.json_response(body)

    app = web.Application()
    app.router.add_get("/r{rank}/debug/profile", handler)
    async with served(app) as base:
        yield base


def test_profile_polls_compares_and_names_the_slow_rank() -> None:
    asked: list[dict[str, str]] = []

    async def go() -> Any:
        async with ranks(asked) as base:
            urls = [f"{base}/r{i}/metrics" for i in range(3)]
            targets = diagnose.targets_from_urls(urls)
            return await diagnose.profile_ranks(targets, 7, capture_id="abc", poll=0.01)

    report = asyncio.run(go())
    assert report.slowest_rank == 1 and report.median_rank == 0
    assert report.answer == "rank 1: aten::mm 74% vs 59% on the median rank (rank 0)"
    assert {a["id"] for a in asked} == {"abc"} and {a["steps"] for a in asked} == {"7"}
    assert len(asked) >= 4  # rank 0 was asked again while it captured


def test_a_hostile_rank_is_reported_and_the_rest_compared() -> None:
    async def go() -> Any:
        async with ranks([], hostile=True) as base:
            targets = diagnose.targets_from_urls([f"{base}/r{i}/metrics" for i in range(3)])
            return await diagnose.profile_ranks(targets, 5, capture_id="abc", poll=0.01)

    report = asyncio.run(go())
    assert [r for r, _ in report.failed] == [2]
    assert "summary is not an object" in report.failed[0][1]
    assert report.slowest_rank == 1


def test_a_silent_rank_is_named_and_the_deadline_holds() -> None:
    async def go() -> Any:
        async with ranks([]) as base:
            targets = diagnose.targets_from_urls(
                [f"{base}/r0/metrics", "http://127.0.0.1:9/metrics"]
            )
            return await diagnose.profile_ranks(
                targets, 5, capture_id="abc", poll=0.01, timeout=1.0, deadline=2.0
            )

    report = asyncio.run(go())
    assert [r for r, _ in report.failed] == [1]
    assert report.slowest_rank == 0 and "nothing to compare" in report.answer


def _args(urls: list[str], **kw: Any) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    diagnose.add_arguments(p)
    extra = [f"--{k.replace('_', '-')}={v}" for k, v in kw.items() if v is not True]
    extra += [f"--{k}" for k, v in kw.items() if v is True]
    return p.parse_args([*urls, *extra])


def test_run_prints_the_report_and_json(capsys: pytest.CaptureFixture[str]) -> None:
    async def serve_and_run(json_mode: bool) -> int:
        async with ranks([]) as base:
            urls = [f"{base}/r{i}/metrics" for i in range(2)]
            args = _args(urls, profile=3, **({"json": True} if json_mode else {}))
            return await asyncio.to_thread(diagnose.run, args)

    assert asyncio.run(serve_and_run(False)) == 0
    out = capsys.readouterr().out
    assert out.startswith("rank 1: aten::mm") and "slowest" in out and "[" in out
    assert asyncio.run(serve_and_run(True)) == 0
    doc_ = json.loads(capsys.readouterr().out)
    assert doc_["slowestRank"] == 1 and set(doc_["ranks"]) == {"0", "1"}


@pytest.mark.parametrize("steps", [0, 51, -3])
def test_bad_steps_are_a_usage_error(steps: int, capsys: pytest.CaptureFixture[str]) -> None:
    assert diagnose.run(_args(["127.0.0.1:9"], profile=steps)) == 64
    assert "--profile must be 1..50" in capsys.readouterr().err
