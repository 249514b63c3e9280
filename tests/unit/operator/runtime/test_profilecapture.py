"""The runtime side of a profile request: the status is its only state, so a request goes
Requested -> Capturing -> Captured with a ConfigMap and Events, a successor operator resumes
a capture with the same id, and a gang restart ends one as Failed with the reason."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace
from typing import Any

from gpujob_operator.api import conditions as c
from gpujob_operator.monitoring.scrape.result import ScrapeTarget
from gpujob_operator.runtime.profilecapture import ProfileCapture
from tests.unit.operator.runtime.test_host_port_refusal import Loop


def summary(rank: int, mm: float) -> dict[str, Any]:
    step = 0.1 + mm
    return {
        "version": 1,
        "rank": rank,
        "steps": 2,
        "device": "cpu",
        "stepSeconds": step,
        "stepsSeconds": [step, step],
        "parts": {"compute": mm + 0.05, "communication": 0.05, "copy": 0.0, "idle": 0.0},
        "communicationSeconds": 0.05,
        "overlap": 0.0,
        "top": [
            {"name": "aten::mm", "kind": "compute", "seconds": mm, "share": mm / step},
            {"name": "aten::relu", "kind": "compute", "seconds": 0.05, "share": 0.05 / step},
        ],
    }


def state(rank: int, capture_id: str, st: str, mm: float = 0.0) -> bytes:
    doc = {
        "version": 1,
        "rank": rank,
        "id": capture_id,
        "state": st,
        "steps": 2,
        "stepsDone": 2 if st == "done" else 0,
        "summary": summary(rank, mm) if st == "done" else None,
    }
    return json.dumps(doc).encode()


def make(annotation: str | None, answers: list[list[bytes]]) -> Loop:
    meta: dict[str, Any] = {"name": "j", "namespace": "ns", "uid": "u-1", "generation": 1}
    if annotation is not None:
        meta["annotations"] = {"gpujob.dev/profile": annotation}
    job = {
        "metadata": meta,
        "spec": {"image": "t:1", "command": ["python"], "nodes": 2},
        "status": {"phase": "Running", "gang": {"attempt": 0}},
    }
    asked: list[list[str]] = []

    async def fetch_all(targets: list[ScrapeTarget], max_bytes: int) -> list[Any]:
        asked.append([t.url for t in targets])
        bodies = answers.pop(0)
        return [(b, None, "") for b in bodies]

    kube = SimpleNamespace(configmaps=[])

    async def put_configmap(namespace: str, body: dict[str, Any]) -> None:
        kube.configmaps.append(body)

    kube.put_configmap = put_configmap
    return Loop(
        scraper=SimpleNamespace(fetch_all=fetch_all),
        kube=kube,
        body=job,
        lock=asyncio.Lock(),
        writes=[],
        events=[],
        asked=asked,
        post_event=lambda _job, *ev: loop_events(_job, ev),
    )


def loop_events(_job: Any, ev: tuple[str, str, str]) -> None:
    EVENTS.append(ev)


EVENTS: list[tuple[str, str, str]] = []

TARGETS = [
    ScrapeTarget("http://127.0.0.1:1/metrics", "j-node-0", rank=0),
    ScrapeTarget("http://127.0.0.1:2/metrics", "j-node-1", rank=1),
]


def test_a_request_is_acknowledged_asked_of_its_ranks_and_compared_with_a_configmap() -> None:
    EVENTS.clear()
    loop = make(
        "steps=2;ranks=all;id=abc",
        [
            [state(0, "abc", "pending"), state(1, "abc", "capturing")],
            [state(0, "abc", "done", 0.1), state(1, "abc", "done", 0.4)],
        ],
    )
    cap = ProfileCapture()
    asyncio.run(cap.advance(loop, loop.body, TARGETS, ""))  # type: ignore[arg-type]
    states = [w["profile"]["state"] for w in loop.writes]
    assert states == ["Requested", "Capturing"], loop.writes
    assert "/debug/profile?id=abc&steps=2" in loop.asked[0][0]
    assert EVENTS[0][1] == c.PROFILE_REQUESTED
    cap.asked_at = 0.0  # the next pass comes a second later
    asyncio.run(cap.advance(loop, loop.body, TARGETS, ""))  # type: ignore[arg-type]
    final = loop.body["status"]["profile"]
    assert final["state"] == "Captured", final
    assert final["slowestRank"] == 1 and final["operation"] == "aten::mm", final
    assert final["answer"].startswith("rank 1: aten::mm"), final
    (cm,) = loop.kube.configmaps
    assert final["configMap"] == cm["metadata"]["name"]
    assert {"rank-0.json", "rank-1.json", "summary"} <= set(cm["data"])
    assert (
        EVENTS[-1][:2] == ("Normal", c.PROFILE_CAPTURED) and cm["metadata"]["name"] in EVENTS[-1][2]
    )
    assert cap.in_flight is None
    asyncio.run(cap.advance(loop, loop.body, TARGETS, ""))  # nothing more to do
    assert len(loop.asked) == 2


def test_a_successor_resumes_the_capture_with_the_same_id() -> None:
    EVENTS.clear()
    loop = make("steps=2;ranks=all;id=abc", [[state(0, "abc", "pending")] * 2])
    asyncio.run(ProfileCapture().advance(loop, loop.body, TARGETS, ""))  # type: ignore[arg-type]
    loop.asked.clear()
    loop.writes.clear()
    # a new operator: no memory of the capture but the status
    answers = [[state(0, "abc", "done", 0.1), state(1, "abc", "done", 0.3)]]
    loop.scraper.fetch_all = make("x", answers).scraper.fetch_all
    successor = ProfileCapture()
    asyncio.run(successor.advance(loop, loop.body, TARGETS, ""))  # type: ignore[arg-type]
    assert [w["profile"]["state"] for w in loop.writes] == ["Captured"], loop.writes
    assert loop.body["status"]["profile"]["id"] == "abc"


def test_a_gang_restart_during_a_capture_fails_it_with_the_reason() -> None:
    EVENTS.clear()
    loop = make("steps=2;ranks=all;id=abc", [[state(0, "abc", "pending")] * 2])
    cap = ProfileCapture()
    asyncio.run(cap.advance(loop, loop.body, TARGETS, ""))  # type: ignore[arg-type]
    loop.body["status"]["gang"] = {"attempt": 1}
    asyncio.run(cap.advance(loop, loop.body, TARGETS, ""))  # type: ignore[arg-type]
    final = loop.body["status"]["profile"]
    assert final["state"] == "Failed" and "gang restarted" in final["reason"], final
    assert EVENTS[-1][:2] == ("Warning", c.PROFILE_FAILED)


def test_a_request_on_a_finished_job_is_refused_in_the_status() -> None:
    EVENTS.clear()
    loop = make("steps=2", [])
    loop.body["status"]["phase"] = "Succeeded"
    asyncio.run(ProfileCapture().advance(loop, loop.body, None, ""))  # type: ignore[arg-type]
    final = loop.body["status"]["profile"]
    assert final["state"] == "Refused" and "finished" in final["reason"], final
    assert EVENTS[-1][:2] == ("Warning", c.PROFILE_REFUSED)
    assert not loop.asked


def test_an_acted_on_request_stays_old_and_the_automatic_capture_comes_once_per_attempt() -> None:
    """A later record in status.profile (the automatic capture's) neither makes the user's
    old annotation new again nor lets profileOnVerdict profile the attempt twice."""
    EVENTS.clear()
    loop = make(
        "steps=2;ranks=all;id=abc",
        [[state(0, "abc", "done", 0.1), state(1, "abc", "done", 0.4)]],
    )
    loop.body["spec"]["monitoring"] = {"profileOnVerdict": True}
    cap = ProfileCapture()
    asyncio.run(cap.advance(loop, loop.body, TARGETS, ""))  # type: ignore[arg-type]
    assert loop.body["status"]["profile"]["state"] == "Captured"
    assert loop.body["status"]["operatorState"] == {"profileRequest": "steps=2;ranks=all;id=abc"}
    # a Warning verdict now holds: the automatic capture replaces the record
    loop.body["status"]["bottleneck"] = {"verdict": "Straggler", "severity": "Warning", "rank": 1}
    loop.body["status"]["operatorState"] = {"profileRequest": "steps=2;ranks=all;id=abc"}
    auto_answers = [[state(0, "x", "pending"), state(1, "x", "pending")]]
    loop.scraper.fetch_all = make("x", auto_answers).scraper.fetch_all
    loop.writes.clear()
    asyncio.run(cap.advance(loop, loop.body, None, ""))  # type: ignore[arg-type]
    (write,) = loop.writes
    assert write["profile"]["auto"] and write["profile"]["state"] == "Requested", write
    assert write["operatorState"] == {"profileAutoAttempt": 0}, write
    # it ends; the user's annotation (unchanged) is not asked again, nor is another automatic
    loop.body["status"]["profile"] = {**write["profile"], "state": "Captured"}
    loop.body["status"]["operatorState"] = {
        "profileRequest": "steps=2;ranks=all;id=abc",
        "profileAutoAttempt": 0,
    }
    cap.in_flight = None
    loop.writes.clear()
    asyncio.run(cap.advance(loop, loop.body, None, ""))  # type: ignore[arg-type]
    assert loop.writes == []
