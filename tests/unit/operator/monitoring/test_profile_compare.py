"""A profile's rank documents parsed (hostile ones included), compared and written down."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from gpujob_operator.monitoring.profile import profilecompare as C
from gpujob_operator.monitoring.profile import profiledoc as D
from gpujob_operator.monitoring.scrape.result import ScrapeTarget


def summary(
    rank: int, compute: float, *, top: list[tuple[str, float]], comm: float = 0.01
) -> dict[str, Any]:
    parts = {"compute": compute, "communication": comm, "copy": 0.01, "idle": 0.02}
    step = sum(parts.values())
    return {
        "version": 1,
        "rank": rank,
        "steps": 5,
        "device": "cpu",
        "stepSeconds": step,
        "stepsSeconds": [step] * 5,
        "parts": parts,
        "communicationSeconds": comm * 2,
        "overlap": 0.5,
        "top": [{"name": n, "kind": "compute", "seconds": s, "share": s / step} for n, s in top],
    }


def doc(rank: int, state: str = "done", capture_id: str = "c1", **extra: Any) -> dict[str, Any]:
    d: dict[str, Any] = {
        "version": 1,
        "rank": rank,
        "id": capture_id,
        "state": state,
        "steps": 5,
        "stepsDone": 5 if state == "done" else 2,
        "requestedAt": 1.0,
        "startedAt": 2.0,
        "finishedAt": 3.0 if state == "done" else None,
        "trace": f"/var/run/gpujob/profiles/j-rank{rank}-{capture_id}.pt.trace.json",
        "traceBytes": 1000,
        "error": None,
        "summary": None,
    }
    d.update(extra)
    return d


def body(d: Any) -> bytes:
    return json.dumps(d).encode()


def targets(n: int) -> list[ScrapeTarget]:
    return [
        ScrapeTarget(url=f"http://10.0.0.{i}:9400/metrics", pod=f"p{i}", rank=i) for i in range(n)
    ]


def balanced(n: int = 4, slow: int = 3) -> list[bytes]:
    out = []
    for r in range(n):
        mm = 0.4 if r == slow else 0.2
        out.append(
            body(doc(r, summary=summary(r, mm + 0.1, top=[("aten::mm", mm), ("aten::add", 0.1)])))
        )
    return out


def fetched(bodies: list[bytes | None]) -> list[C.Fetched]:
    return [(b, None, "") if b is not None else (None, "timeout", "no answer") for b in bodies]


def test_the_slowest_rank_is_named_with_the_operation_that_differs() -> None:
    answers = C.answers_of(targets(4), fetched(balanced()), "c1")
    assert C.settled(answers)
    rep = C.compare(answers)
    assert (rep.slowest_rank, rep.median_rank, rep.operation) == (3, 1, "aten::mm")
    assert rep.answer == "rank 3: aten::mm 74% vs 59% on the median rank (rank 1)"
    assert rep.failed == []


def test_lower_median_of_two_is_the_faster() -> None:
    rep = C.compare(C.answers_of(targets(2), fetched(balanced(2, slow=1)), "c1"))
    assert (rep.slowest_rank, rep.median_rank) == (1, 0)


def test_an_operation_only_the_slow_rank_runs_is_found() -> None:
    bodies = balanced(3, slow=99)
    bodies[2] = body(doc(2, summary=summary(2, 0.6, top=[("aten::mm", 0.2), ("my::extra", 0.3)])))
    rep = C.compare(C.answers_of(targets(3), fetched(bodies), "c1"))
    assert rep.slowest_rank == 2 and rep.operation == "my::extra"
    assert "my::extra" in rep.answer and "not in the top 10 on the median rank" in rep.answer


def test_one_rank_has_nothing_to_compare() -> None:
    rep = C.compare(C.answers_of(targets(1), fetched(balanced(1, slow=0)), "c1"))
    assert "nothing to compare" in rep.answer and rep.slowest_rank == 0


def test_silent_and_failed_ranks_are_listed_and_the_rest_compared() -> None:
    bodies: list[bytes | None] = list(balanced())
    bodies[0] = None
    bodies[1] = body(doc(1, state="failed", error="training ended mid-capture"))
    rep = C.compare(C.answers_of(targets(4), fetched(bodies), "c1"))
    assert rep.failed == [(0, "timeout: no answer"), (1, "failed: training ended mid-capture")]
    assert rep.slowest_rank == 3 and rep.median_rank == 2


def test_no_usable_rank_fails_with_the_first_reason() -> None:
    rep = C.compare(C.answers_of(targets(2), fetched([None, None]), "c1"))
    assert rep.answer.startswith("no rank gave a profile (rank 0: timeout")
    rec = C.record({"id": "c1", "state": "Capturing"}, rep, "T", None)
    assert rec["state"] == "Failed" and rec["reason"].startswith("no rank gave")


def test_working_ranks_are_not_settled_and_capturing_shows() -> None:
    bodies = [body(doc(0, state="capturing")), body(doc(1, state="pending"))]
    answers = C.answers_of(targets(2), fetched(bodies), "c1")
    assert not C.settled(answers) and C.capturing(answers)


def test_a_busy_rank_or_another_capture_is_not_this_one() -> None:
    bodies = [
        body(doc(0, state="busy", capture_id="c1", busyWith="other")),
        body(doc(1, capture_id="old", summary=summary(1, 0.3, top=[]))),
    ]
    answers = C.answers_of(targets(2), fetched(bodies), "c1")
    assert "busy with another capture (other)" in answers[0].why
    assert "answered about capture 'old'" in answers[1].why
    assert C.settled(answers)


def test_a_rank_answering_as_another_is_unusable() -> None:
    bodies = [body(doc(5, summary=summary(5, 0.3, top=[])))]
    answers = C.answers_of(targets(1), fetched(bodies), "c1")
    assert answers[0].summary is None and "answered as rank 5" in answers[0].why


def test_bare_urls_take_the_rank_the_document_names() -> None:
    t = [ScrapeTarget(url="http://h:1/metrics", pod="h:1")]
    answers = C.answers_of(t, fetched([balanced(8)[7]]), "c1")
    assert answers[0].rank == 7 and answers[0].summary is not None


HOSTILE = [
    (b"x" * (D.MAX_BYTES + 1), "at most"),
    (b"\xff\xfe", "not JSON"),
    (b"[1,2]", "not a JSON object"),
    (b"[" * 60000, "not JSON"),
    (body({"version": 2, "state": "done"}), "version"),
    (body(doc(0, state="exploded")), "state 'exploded' is unknown"),
    (body(doc(0, summary=None)), "done without a summary"),
    (body(doc(0, summary="yes")), "summary is not an object"),
    (body({**doc(0, state="failed"), "rank": -1}), "rank is not an integer"),
    (body({**doc(0, state="failed"), "rank": True}), "rank is not an integer"),
    (body(doc(0, state="failed", stepsDone="5")), "stepsDone is not an integer"),
]


@pytest.mark.parametrize(("raw", "words"), HOSTILE)
def test_hostile_documents_are_unusable_with_a_reason(raw: bytes, words: str) -> None:
    with pytest.raises(D.ProfileDocError, match=words):
        D.parse(raw)


def _with(**changes: Any) -> bytes:
    s = summary(0, 0.3, top=[("aten::mm", 0.2)])
    for k, v in changes.items():
        if k.startswith("parts."):
            s["parts"][k[6:]] = v
        elif k.startswith("top0."):
            s["top"][0][k[5:]] = v
        else:
            s[k] = v
    return json.dumps(doc(0, summary=s), allow_nan=True).encode()


@pytest.mark.parametrize(
    ("changes", "words"),
    [
        ({"stepSeconds": math.nan}, "out of range"),
        ({"stepSeconds": math.inf}, "out of range"),
        ({"stepSeconds": 0}, "not positive"),
        ({"stepSeconds": "1"}, "not a number"),
        ({"parts.idle": -1.0}, "out of range"),
        ({"parts.compute": None}, "not a number"),
        ({"parts": [1, 2]}, "parts is not an object"),
        ({"stepSeconds": 10.0}, "inconsistent"),
        ({"overlap": 2.0}, "overlap is out of range"),
        ({"top": {"a": 1}}, "top is not a list"),
        ({"top0.kind": "magic"}, "unknown"),
        ({"top0.name": 5}, "with a name"),
        ({"top0.seconds": math.inf}, "out of range"),
        ({"steps": 0}, "summary steps"),
        ({"steps": 51}, "summary steps"),
        ({"version": None}, "summary version"),
    ],
)
def test_hostile_summaries_are_unusable(changes: dict[str, Any], words: str) -> None:
    with pytest.raises(D.ProfileDocError, match=words):
        D.parse(_with(**changes))


def test_long_names_and_long_lists_are_cut() -> None:
    s = summary(0, 0.3, top=[("x" * 1000, 0.01)] * 30)
    s["stepsSeconds"] = [0.34] * 1000
    state = D.parse(body(doc(0, summary=s, error="e" * 10000)))
    assert state.summary is not None
    assert len(state.summary.top) == D.MAX_TOP and len(state.summary.top[0].name) == D.MAX_NAME
    assert len(state.summary.steps_seconds) == 50 and len(state.error or "") == D.MAX_TEXT


def test_configmap_data_holds_the_summary_and_each_rank() -> None:
    rep = C.compare(C.answers_of(targets(4), fetched(balanced()), "c1"))
    data = C.configmap_data(rep)
    assert list(data) == ["summary", "rank-0.json", "rank-1.json", "rank-2.json", "rank-3.json"]
    text = data["summary"]
    assert text.startswith(rep.answer) and "slowest" in text and "median" in text
    assert "[" in text and "#" in text
    assert json.loads(data["rank-3.json"])["parts"]["compute"] == pytest.approx(0.5)


def test_configmap_data_is_capped_and_says_how_many_ranks_it_kept() -> None:
    n = 300
    bodies = [
        body(
            doc(
                r,
                summary=summary(
                    r, 0.3 + r / 1e4, top=[(f"op{i}" + "y" * 180, 0.01) for i in range(10)]
                ),
            )
        )
        for r in range(n)
    ]
    rep = C.compare(C.answers_of(targets(n), fetched(bodies), "c1"))
    data = C.configmap_data(rep)
    size = sum(len(k) + len(v.encode()) for k, v in data.items())
    assert size < 900 * 1024
    kept = len(data) - 1
    assert kept < n
    assert f"{kept} of {n} ranks' summaries kept" in data["summary"]
    assert f"rank-{rep.slowest_rank}.json" in data and f"rank-{rep.median_rank}.json" in data


def test_the_record_carries_the_answer() -> None:
    rep = C.compare(C.answers_of(targets(4), fetched(balanced()), "c1"))
    started = {"request": "id=c1", "id": "c1", "state": "Capturing", "steps": 5}
    rec = C.record(started, rep, "2026-01-01T00:00:00Z", "j-profile-0-c1")
    from gpujob_operator.api.status import parse_status

    got = parse_status({"profile": rec}).profile
    assert got is not None and got.state == "Captured" and got.slowest_rank == 3
    assert got.config_map == "j-profile-0-c1" and got.answer == rep.answer
    assert rec["failedRanks"] is None and rec["request"] == "id=c1"


def test_bar_is_fixed_width() -> None:
    b = C.bar({"compute": 0.5, "communication": 0.25, "copy": 0.0, "idle": 0.25})
    assert b == "[" + "#" * 10 + "=" * 5 + "." * 5 + "]"
    assert len(C.bar({"compute": 0.333, "communication": 0.333, "copy": 0.333, "idle": 0})) == 22


def test_profile_targets_ask_the_debug_path_with_the_token() -> None:
    t = C.profile_targets(targets(1), "c1", 5, token="tok")
    assert t[0].url == "http://10.0.0.0:9400/debug/profile?id=c1&steps=5" and t[0].token == "tok"


def test_the_deadline_grows_with_steps() -> None:
    assert C.capture_deadline(50) > C.capture_deadline(5) >= 60
    assert C.capture_deadline(50, 1e6) == 3600


def test_a_rank_that_did_not_answer_this_time_is_asked_again_until_the_deadline() -> None:
    """A timeout is not an answer: a rank busy stopping its profiler answers late. Only at
    the deadline is it reported, as not finished, with what went wrong."""
    asked = [ScrapeTarget("http://127.0.0.1:1/debug/profile", "p-0", rank=0)]
    (silent,) = C.answers_of(asked, [(None, "timeout", "5s")], "abc")
    assert not silent.settled and not C.settled([silent])
    (late,) = C.at_deadline([silent])
    assert late.settled and late.why == "not finished at the deadline: timeout: 5s"
