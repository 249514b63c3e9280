"""A host-network job whose metrics ports are node ports the operator may not scrape: it is
not scraped, and MetricsAvailable and a Warning say why, naming the field."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from gpujob_operator.api import conditions as c
from gpujob_operator.runtime.metricstask import MetricsTask


class Scraped(Exception):
    """The scraper was asked: the test fails."""


class Loop(SimpleNamespace):
    """The JobHandle calls the metrics task makes, recorded."""

    def freshest(self, body: dict[str, Any]) -> dict[str, Any]:
        return body

    def peek_status(self) -> dict[str, Any]:
        return dict(self.body.get("status") or {})

    async def write_status(self, ns: str, name: str, patch: dict[str, Any]) -> None:
        self.writes.append(patch)
        self.body["status"].update(patch)


def test_a_spec_mode_job_on_a_node_daemons_port_is_not_scraped_and_says_why() -> None:
    async def scrape_all(targets: Any) -> Any:
        raise Scraped(targets)

    spec = {
        "image": "t:1",
        "command": ["python"],
        "template": {"hostNetwork": True},
        "training": {"hostNetworkPorts": "Spec", "metricsPort": 9100},
    }
    job = {
        "metadata": {"name": "j", "namespace": "ns", "uid": "u", "generation": 1},
        "spec": spec,
        "status": {"phase": "Running"},
    }
    events: list[tuple[str, str, str]] = []
    loop = Loop(
        scraper=SimpleNamespace(scrape_all=scrape_all),
        body=job,
        lock=asyncio.Lock(),
        host_ports=(20000, 30000),
        writes=[],
        post_event=lambda _job, type_, reason, message: events.append((type_, reason, message)),
    )
    task = MetricsTask(loop)  # type: ignore[arg-type]
    assert asyncio.run(task.observe([])) == 15.0
    task.next_scrape = 0.0
    asyncio.run(task.observe([]))  # the same refusal again: no second write or event
    (patch,) = loop.writes
    cond = c.find(patch["conditions"], c.METRICS_AVAILABLE)
    assert cond is not None and cond["status"] == "False"
    assert cond["reason"] == c.HOST_PORTS_NOT_ALLOWED
    assert cond["message"].startswith("spec.training.metricsPort") and "9100" in cond["message"]
    assert [(t, r) for t, r, _ in events] == [("Warning", c.HOST_PORTS_NOT_ALLOWED)]
