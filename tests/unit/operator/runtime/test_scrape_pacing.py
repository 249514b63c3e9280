"""One job's scrapes costing more operator CPU than its share: that job's rounds come less
often, MetricsAvailable and one Warning say so with the numbers, and a light job beside it
keeps its own interval."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from gpujob_operator.api import conditions as c
from gpujob_operator.api.children import LABEL_NODE_RANK
from gpujob_operator.monitoring.scrape.budget import ScrapeBudget
from gpujob_operator.monitoring.scrape.result import ScrapeResult, ScrapeTarget
from gpujob_operator.runtime.metricstask import MetricsTask
from tests.unit.operator.runtime.test_host_port_refusal import Loop


def job(uid: str, interval: float) -> dict[str, Any]:
    return {
        "metadata": {"name": uid, "namespace": "ns", "uid": uid, "generation": 1},
        "spec": {
            "image": "t:1",
            "command": ["python"],
            "nodes": 2,
            "monitoring": {"scrapeIntervalSeconds": interval},
        },
        "status": {"phase": "Running"},
    }


def pods(uid: str, n: int) -> list[dict[str, Any]]:
    return [
        {
            "metadata": {
                "name": f"{uid}-{i}",
                "labels": {LABEL_NODE_RANK: str(i)},
                "ownerReferences": [{"controller": True, "uid": uid}],
            },
            "status": {"phase": "Running", "podIP": f"127.0.0.{i + 1}"},
        }
        for i in range(n)
    ]


class Scraper:
    """The operator's scraper as the metrics task sees it: one budget, rounds whose parse
    cost is set per job (the real cost is measured in test_scrape.py)."""

    def __init__(self, cost: dict[str, float]) -> None:
        self.budget = ScrapeBudget(cores=1.0)
        self.cost = cost
        self.rounds: dict[str, int] = {}

    async def scrape_all(self, targets: list[ScrapeTarget]) -> list[ScrapeResult]:
        uid = targets[0].pod.rsplit("-", 1)[0]
        self.rounds[uid] = self.rounds.get(uid, 0) + 1
        each = self.cost[uid] / len(targets)
        return [ScrapeResult(t, time.time(), cpu=each) for t in targets]


def task_for(scraper: Scraper, body: dict[str, Any], events: list[Any]) -> MetricsTask:
    loop = Loop(
        scraper=scraper,
        body=body,
        lock=asyncio.Lock(),
        host_ports=(20000, 30000),
        writes=[],
        post_event=lambda _job, type_, reason, message: events.append((type_, reason, message)),
        token_key=None,
        pods=lambda: None,
        wake=asyncio.Event(),
    )
    return MetricsTask(loop)  # type: ignore[arg-type]


def metrics_condition(body: dict[str, Any]) -> dict[str, Any]:
    cond = c.find(body["status"].get("conditions"), c.METRICS_AVAILABLE)
    assert cond is not None
    return cond


def test_the_job_over_its_share_is_paced_and_told_and_the_light_one_is_not() -> None:
    scraper = Scraper({"heavy": 4.3, "light": 0.002})
    heavy_events: list[Any] = []
    light_events: list[Any] = []
    heavy, light = job("heavy", 1), job("light", 1)
    heavy_task = task_for(scraper, heavy, heavy_events)
    light_task = task_for(scraper, light, light_events)

    async def main() -> tuple[list[float | None], list[float | None]]:
        waits_h, waits_l = [], []
        for _ in range(2):
            heavy_task.next_scrape = light_task.next_scrape = 0.0  # due now, each round
            waits_l.append(await light_task.observe(pods("light", 2)))
            waits_h.append(await heavy_task.observe(pods("heavy", 2)))
        return waits_h, waits_l

    waits_h, waits_l = asyncio.run(main())
    # 4.3 s of CPU a round against ~0.998 core left by the light job: every 5 s, not 1
    assert heavy_task.next_scrape - time.time() > 3.5
    # the task wakes as often either way; the heavy one finds its scrape not due
    assert all(w == 1.0 for w in waits_h + waits_l)
    cond = metrics_condition(heavy)
    assert cond["status"] == c.TRUE and cond["reason"] == c.SCRAPE_INTERVAL_STRETCHED
    assert "stretched to 5s from 1s" in cond["message"] and "took 4.3 s" in cond["message"]
    assert "2 endpoint(s)" in cond["message"] and "GPUJOB_SCRAPE_CPU_CORES" in cond["message"]
    stretched = [e for e in heavy_events if e[1] == c.SCRAPE_INTERVAL_STRETCHED]
    assert [e[0] for e in stretched] == ["Warning"]  # once, not every round
    light_cond = metrics_condition(light)
    assert light_cond["reason"] == c.ALL_RANKS_SCRAPED and "stretched" not in light_cond["message"]
    assert light_task.next_scrape - time.time() <= 1.0
    assert not [e for e in light_events if e[1] == c.SCRAPE_INTERVAL_STRETCHED]

    # Another round a little dearer: the same words (no status write for noise), no Warning.
    scraper.cost["heavy"] = 4.34
    heavy_task.next_scrape = 0.0
    asyncio.run(heavy_task.observe(pods("heavy", 2)))
    assert metrics_condition(heavy)["message"] == cond["message"]
    assert len([e for e in heavy_events if e[1] == c.SCRAPE_INTERVAL_STRETCHED]) == 1

    # The heavy job ends: its share goes back to the others at once.
    heavy["status"]["phase"] = "Succeeded"
    asyncio.run(heavy_task.observe([]))
    assert scraper.budget.jobs == 1
