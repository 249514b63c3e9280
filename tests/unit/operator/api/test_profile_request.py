"""The profile request annotation and what the operator does with it each pass."""

from __future__ import annotations

from typing import Any

import pytest

from gpujob_operator.api import profile as P
from gpujob_operator.api.names import PROFILE_ANNOTATION

NOW = "2026-01-01T00:00:00Z"


def job(
    value: str | None = None,
    *,
    status: dict[str, Any] | None = None,
    nodes: int = 2,
    procs: int = 2,
    **monitoring: Any,
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "j", "namespace": "ns", "uid": "u-1"}
    if value is not None:
        meta["annotations"] = {PROFILE_ANNOTATION: value}
    return {
        "metadata": meta,
        "spec": {
            "image": "img:1",
            "command": ["python", "-m", "train"],
            "nodes": nodes,
            "training": {"procsPerNode": procs},
            "monitoring": monitoring,
        },
        "status": {"phase": "Running", "gang": {"attempt": 2}, **(status or {})},
    }


@pytest.mark.parametrize(
    ("value", "steps", "ranks", "id_"),
    [
        ("", 5, "slowest", ""),
        ("steps=7", 7, "slowest", ""),
        ("steps=50;ranks=all;id=abc", 50, "all", "abc"),
        (" ranks = 13,0 ; steps=1 ;", 1, (0, 13), ""),
        ("id=A.b_c-9", 5, "slowest", "A.b_c-9"),
    ],
)
def test_good_requests_parse(value: str, steps: int, ranks: Any, id_: str) -> None:
    req = P.parse_request(value)
    assert isinstance(req, P.Request)
    assert (req.steps, req.ranks, req.id) == (steps, ranks, id_)


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ("steps=0", "steps must be an integer from 1 to 50"),
        ("steps=51", "from 1 to 50"),
        ("steps=-1", "from 1 to 50"),
        ("steps=2.5", "from 1 to 50"),
        ("steps=99999999999999999999", "from 1 to 50"),
        ("steps=5;steps=6", "steps is given twice"),
        ("depth=3", "unknown key 'depth'"),
        ("garbage", "is not key=value"),
        ("ranks=", "ranks must be all, slowest or a comma list"),
        ("ranks=0,,1", "comma list"),
        ("ranks=-1", "comma list"),
        ("ranks=1,1", "names a rank twice"),
        ("ranks=fastest", "comma list"),
        ("id=has space", "id must be 1 to 64"),
        ("id=" + "x" * 65, "id must be 1 to 64"),
        ("id=a/b", "id must be"),
        ("steps=5;" + "x" * 300, "at most 256"),
    ],
)
def test_bad_requests_are_refused_with_a_reason(value: str, words: str) -> None:
    why = P.parse_request(value)
    assert isinstance(why, str) and words in why, why


def test_format_request_parses_back() -> None:
    req = P.parse_request(P.format_request(9, "0,3", "deadbeef"))
    assert isinstance(req, P.Request) and (req.steps, req.ranks, req.id) == (9, (0, 3), "deadbeef")


def test_no_annotation_no_profile_nothing_to_do() -> None:
    assert isinstance(P.decide(job(), NOW), P.Nothing)


def test_a_new_request_starts_a_capture() -> None:
    d = P.decide(job("steps=3;ranks=0,3;id=r1"), NOW)
    assert isinstance(d, P.Start) and not d.resume
    assert (d.id, d.steps, d.ranks) == ("r1", 3, [0, 3])
    rec = d.record
    assert rec["state"] == "Requested" and rec["request"] == "steps=3;ranks=0,3;id=r1"
    assert rec["attempt"] == 2 and rec["path"] == "/var/run/gpujob/profiles"
    assert rec["auto"] is False and rec["requestedAt"] == NOW
    assert P.apply({}, d) == rec


def test_the_record_passes_the_status_model() -> None:
    from gpujob_operator.api.status import parse_status

    d = P.decide(job("id=r1;ranks=all"), NOW)
    assert isinstance(d, P.Start)
    got = parse_status({"profile": d.record}).profile
    assert got is not None and got.ranks == [0, 1, 2, 3] and got.state == "Requested"


def test_an_acknowledged_request_is_not_new() -> None:
    value = "steps=3;id=r1"
    done = {"profile": {"request": value, "id": "r1", "state": "Captured"}}
    assert isinstance(P.decide(job(value, status=done), NOW), P.Nothing)


def test_the_id_is_made_when_not_given_and_differs_with_time() -> None:
    a = P.decide(job("ranks=all"), NOW)
    b = P.decide(job("ranks=all"), "2026-01-01T00:00:01Z")
    assert isinstance(a, P.Start) and isinstance(b, P.Start)
    assert P.ID_PATTERN.fullmatch(a.id) and a.id != b.id


def test_ranks_beyond_the_world_are_refused() -> None:
    d = P.decide(job("ranks=0,13;id=r"), NOW)
    assert isinstance(d, P.Refuse) and not d.keep
    assert "rank 13 does not exist: the job has 4 ranks (0..3)" in d.reason
    assert d.record["state"] == "Refused" and d.record["id"] == "r"
    assert P.apply({}, d)["reason"] == d.reason


def test_a_bad_value_is_refused_in_the_status() -> None:
    d = P.decide(job("steps=0;id=r"), NOW)
    assert isinstance(d, P.Refuse) and "from 1 to 50" in d.record["reason"]


def test_a_finished_job_is_refused() -> None:
    d = P.decide(job("id=r", status={"phase": "Succeeded"}), NOW)
    assert isinstance(d, P.Refuse) and "finished (Succeeded)" in d.reason


def test_a_pending_job_is_refused() -> None:
    d = P.decide(job("id=r", status={"phase": "Pending"}), NOW)
    assert isinstance(d, P.Refuse) and "not running" in d.reason


def test_monitoring_off_is_refused() -> None:
    d = P.decide(job("id=r", enabled=False), NOW)
    assert isinstance(d, P.Refuse) and "spec.monitoring.enabled is false" in d.reason


def test_a_request_during_a_capture_is_refused_and_the_capture_kept() -> None:
    running = {"request": "id=r1", "id": "r1", "state": "Capturing", "steps": 5, "ranks": [0, 1]}
    d = P.decide(job("id=r2", status={"profile": running}), NOW, in_flight="r1")
    assert isinstance(d, P.Refuse) and d.keep and "id r1" in d.reason
    written = P.apply(running, d)
    assert written is not None
    assert written["id"] == "r1" and written["state"] == "Capturing"
    assert written["refused"]["id"] == "r2" and written["refused"]["request"] == "id=r2"
    # acknowledged: the next pass does nothing more with it
    after = job("id=r2", status={"profile": written})
    assert isinstance(P.decide(after, NOW, in_flight="r1"), P.Nothing)


def test_a_capture_the_status_holds_but_no_runtime_runs_is_resumed() -> None:
    running = {"request": "id=r1", "id": "r1", "state": "Capturing", "steps": 7, "ranks": [1]}
    d = P.decide(job("id=r1", status={"profile": running}), NOW)
    assert isinstance(d, P.Start) and d.resume
    assert (d.id, d.steps, d.ranks) == ("r1", 7, [1])
    # the runtime that runs it is left alone
    assert isinstance(P.decide(job("id=r1", status={"profile": running}), NOW, "r1"), P.Nothing)


def test_a_capture_under_way_on_a_finished_job_fails() -> None:
    running = {"request": "id=r1", "id": "r1", "state": "Requested"}
    d = P.decide(job("id=r1", status={"profile": running, "phase": "Failed"}), NOW)
    assert isinstance(d, P.Refuse) and d.record["state"] == "Failed"


BREAKDOWN = {
    "severity": "Warning",
    "verdict": "Straggler",
    "rank": 3,
    "breakdown": [
        {"rank": 3, "role": "slowest"},
        {"rank": 1, "role": "median"},
        {"rank": 0, "role": "fastest"},
    ],
}


def test_slowest_asks_the_slowest_and_the_median() -> None:
    d = P.decide(job("id=r", status={"bottleneck": BREAKDOWN}), NOW)
    assert isinstance(d, P.Start) and d.ranks == [1, 3]


def test_slowest_without_a_verdict_asks_every_rank() -> None:
    d = P.decide(job("id=r"), NOW)
    assert isinstance(d, P.Start) and d.ranks == [0, 1, 2, 3]


def test_all_on_a_huge_job_is_refused() -> None:
    d = P.decide(job("ranks=all;id=r", nodes=100, procs=8), NOW)
    assert isinstance(d, P.Refuse) and "at most 256" in d.reason


def test_auto_profiles_once_per_attempt_on_a_warning() -> None:
    j = job(status={"bottleneck": BREAKDOWN}, profileOnVerdict=True)
    d = P.decide(j, NOW)
    assert isinstance(d, P.Start) and d.record["auto"] is True and d.ranks == [1, 3]
    assert d.id.startswith("auto-2-") and P.ID_PATTERN.fullmatch(d.id)
    done = {**d.record, "state": "Captured"}
    again = job(status={"bottleneck": BREAKDOWN, "profile": done}, profileOnVerdict=True)
    assert isinstance(P.decide(again, NOW), P.Nothing)
    next_attempt = job(
        status={"bottleneck": BREAKDOWN, "profile": done, "gang": {"attempt": 3}},
        profileOnVerdict=True,
    )
    assert isinstance(P.decide(next_attempt, NOW), P.Start)


@pytest.mark.parametrize(
    "status",
    [
        {"bottleneck": {**BREAKDOWN, "severity": "Info"}},
        {"bottleneck": BREAKDOWN, "phase": "Succeeded"},
        {},
    ],
)
def test_no_auto_profile_without_a_warning_on_a_running_job(status: dict[str, Any]) -> None:
    assert P.auto_request(job(status=status, profileOnVerdict=True), NOW) is None


def test_no_auto_profile_unless_asked() -> None:
    assert P.auto_request(job(status={"bottleneck": BREAKDOWN}), NOW) is None


def test_a_manual_request_wins_over_the_auto_one() -> None:
    j = job("id=mine;ranks=0", status={"bottleneck": BREAKDOWN}, profileOnVerdict=True)
    d = P.decide(j, NOW)
    assert isinstance(d, P.Start) and d.id == "mine" and d.record["auto"] is False
