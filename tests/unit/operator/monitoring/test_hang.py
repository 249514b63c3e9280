"""The hang comparison on real ranks' evidence (tests/data/evidence: recorded from the example
under torchrun with gloo, two ranks, rank 1 hung four ways; rank 0 waits in all_reduce #11)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from gpujob_operator.api.display import format_hang
from gpujob_operator.api.status import stall_evidence
from gpujob_operator.monitoring.hang import hang, hangdump, hangtext
from gpujob_operator.monitoring.monitor import with_hang
from gpujob_operator.monitoring.scrape.result import ScrapeTarget
from gpujob_operator.runtime import hangcapture

DATA = Path(__file__).resolve().parents[3] / "data" / "evidence"


def dump(name: str) -> hangdump.RankDump:
    return hangdump.parse((DATA / f"{name}.json").read_bytes())


def answer(rank: int, name: str | None, error: str = "") -> hang.RankAnswer:
    return hang.RankAnswer(
        rank, f"j-node-{rank}", f"n{rank}", dump=dump(name) if name else None, error=error
    )


def target(rank: int | None, pod: str = "p") -> ScrapeTarget:
    return ScrapeTarget("http://127.0.0.1:1/metrics", pod, "n", 0, 0, rank)


def doc(name: str) -> dict[str, Any]:
    return dict(json.loads((DATA / f"{name}.json").read_text()))


def test_a_rank_asleep_outside_the_collective_is_named_with_its_place() -> None:
    r = hang.reduce([answer(0, "sleep-rank0"), answer(1, "sleep-rank1")])
    assert r.culprits == [1] and r.silent == []
    assert r.summary == (
        "rank 1 (pod j-node-1, node n1) is not in all_reduce #11 where rank 0 waits; "
        "it is in example.py:250 hang → threading.py:327 wait"
    )
    assert r.where[0].startswith("waits in all_reduce #11 at example.py:")


def test_a_rank_blocked_in_its_data_loader_is_said_to_be_there() -> None:
    r = hang.reduce([answer(0, "sleep-rank0"), answer(1, "loader-rank1")])
    assert r.culprits == [1]
    assert "it is in the data loader: example.py:238 __call__ → threading.py:327 wait" in (
        r.summary
    )


def test_a_rank_in_another_groups_collective_is_named_with_that_collective() -> None:
    r = hang.reduce([answer(0, "sleep-rank0"), answer(1, "collective-rank1")])
    assert r.culprits == [1]
    assert "is not in all_reduce #11 where rank 0 waits" in r.summary
    assert "it waits in all_reduce #1 of group 1 at example.py:247 hang" in r.summary


def test_a_rank_that_does_not_answer_is_named_as_silent() -> None:
    r = hang.reduce([answer(0, "sleep-rank0"), answer(1, None, "timeout: no response in 5s")])
    assert r.culprits == [1] and r.silent == [1]
    assert "rank 1 (pod j-node-1, node n1) did not answer (timeout: no response in 5s)" in (
        r.summary
    )
    assert r.summary.endswith("while rank 0 waits in all_reduce #11")


def test_the_majority_wins_and_runs_of_ranks_are_folded() -> None:
    ranks = [answer(i, "sleep-rank0") for i in (0, 1, 2, 3, 4, 6, 7)]
    r = hang.reduce([*ranks, answer(5, "sleep-rank1")])
    assert r.culprits == [5]
    assert "rank 5 (pod j-node-5, node n5) is not in all_reduce #11 where ranks 0-4,6-7 wait" in (
        r.summary
    )


def test_every_rank_in_the_same_collective_points_outside_the_processes() -> None:
    r = hang.reduce([answer(i, "sleep-rank0") for i in range(3)])
    assert r.culprits == []
    assert "every rank (0-2) waits in all_reduce #11" in r.summary


def test_a_different_op_at_the_same_sequence_number_is_a_mismatch() -> None:
    d = doc("sleep-rank0")
    d["collectives"]["entries"][-1]["op"] = "broadcast"
    other = hangdump.parse(json.dumps(d).encode())
    r = hang.reduce(
        [answer(0, "sleep-rank0"), answer(1, "sleep-rank0"), hang.RankAnswer(2, "p2", dump=other)]
    )
    assert r.culprits == [2]
    assert "rank 2 (pod p2) entered broadcast #11, not all_reduce #11 where ranks 0-1 wait" in (
        r.summary
    )


def test_without_a_recorder_the_stacks_decide() -> None:
    def bare(name: str) -> hang.RankDump:
        d = doc(name)
        d["collectives"] = {"available": False, "why": "no process group initialised"}
        return hangdump.parse(json.dumps(d).encode())

    r = hang.reduce(
        [hang.RankAnswer(i, f"p{i}", dump=bare("sleep-rank0")) for i in range(3)]
        + [hang.RankAnswer(3, "p3", dump=bare("loader-rank1"))]
    )
    assert r.culprits == [3]
    assert "rank 3 (pod p3) is in the data loader: example.py:238 __call__" in r.summary
    assert ", where ranks 0-2 are in backward: example.py:" in r.summary
    assert "(no collective trace: no process group initialised)" in r.summary


@pytest.mark.parametrize(
    ("body", "words"),
    [
        (b"\xff\xfe", "not JSON"),
        (b"[1, 2]", "expected an object"),
        (b'{"threads": "many"}', "expected a list"),
        (b'{"threads": [{"frames": [{"file": 1, "line": 2, "function": "f"}]}]}', "string"),
        (b'{"collectives": {"entries": [{"seq": "NaN"}]}}', "expected a number"),
        (b'{"collectives": {"entries": [{"seq": Infinity}]}}', "finite"),
        (b"[" * 100_000 + b"]" * 100_000, "bytes, over"),
        (b"[" * 50_000 + b"]" * 10, "not JSON"),
        (b'{"error": "RuntimeError(boom)"}', "could not take its evidence"),
    ],
)
def test_hostile_or_broken_evidence_is_refused_with_a_reason(body: bytes, words: str) -> None:
    with pytest.raises(hangdump.EvidenceError, match=words):
        hangdump.parse(body)


def test_caps_keep_a_huge_but_valid_document_small() -> None:
    frames = [{"file": "x" * 1_000, "line": 1, "function": "f"}] * 50
    d = {"rank": 0, "threads": [{"name": "t", "main": True, "frames": frames}]}
    r = hangdump.parse(json.dumps(d).encode())
    assert len(r.threads[0].frames) == 50
    assert all(len(f.file) <= hangdump.MAX_TEXT for t in r.threads for f in t.frames)


def test_answers_of_keeps_each_rank_apart_and_refuses_a_rank_that_claims_another() -> None:
    good = (DATA / "sleep-rank0.json").read_bytes()
    got = hang.answers_of(
        [target(0, "a"), target(1, "b"), target(2, "c"), target(3, "d")],
        [(good, None, ""), (good, None, ""), (None, "connection", "refused"),
         (None, "http_status", "HTTP 404 Not Found")],
    )  # fmt: skip
    assert got[0].dump is not None and got[0].answered
    assert got[1].dump is None and "it says rank 0, not 1" in got[1].error and got[1].answered
    assert got[2].dump is None and got[2].error == "connection: refused" and not got[2].answered
    assert got[3].answered, "a 404 is an answer: the process is alive"
    bare = hang.answers_of([target(None), target(None)], [(good, None, ""), (None, "timeout", "t")])
    assert [a.rank for a in bare] == [0, 1], "a bare URL takes its document's rank, else its place"


def test_a_named_rank_carries_its_gpu_when_its_metrics_named_one() -> None:
    fetched: list[hang.Fetched] = [
        ((DATA / "sleep-rank0.json").read_bytes(), None, ""),
        ((DATA / "sleep-rank1.json").read_bytes(), None, ""),
    ]
    answers, report = hang.compare([target(0, "a"), target(1, "b")], fetched, {1: "GPU-1234"})
    assert report.summary.startswith("rank 1 (pod b, node n, GPU GPU-1234) is not in all_reduce")
    assert [a.gpu for a in answers] == ["", "GPU-1234"]


def test_a_rank_that_answers_without_evidence_is_reported_and_blamed_for_nothing() -> None:
    unusable = hang.RankAnswer(1, "j-node-1", error="unusable evidence: not JSON", answered=True)
    r = hang.reduce([answer(0, "sleep-rank0"), answer(2, "sleep-rank0"), unusable])
    assert r.culprits == [] and r.silent == [] and r.unusable == [1]
    assert (
        "rank 1 (pod j-node-1) answered without usable evidence (unusable evidence: not JSON)"
        in (r.summary)
    )
    assert "GIL" not in r.summary


def test_silent_ranks_are_told_once_and_only_blamed_when_someone_answered() -> None:
    r = hang.reduce(
        [answer(0, "sleep-rank0"), answer(1, None, "timeout: t"), answer(2, None, "timeout: t")]
    )
    assert r.culprits == [1, 2] and r.summary.count("did not answer") == 1
    assert r.summary.startswith("ranks 1-2 (pods j-node-1, j-node-2) did not answer (timeout: t)")
    everyone = hang.reduce([answer(0, None, "timeout: t"), answer(1, None, "timeout: t")])
    assert everyone.culprits == [] and everyone.silent == [0, 1]


def test_a_tie_between_two_collectives_blames_no_one() -> None:
    d = doc("sleep-rank0")
    d["collectives"]["entries"][-1]["op"] = "broadcast"
    other = hangdump.parse(json.dumps(d).encode())
    for order in ((0, 1), (1, 0)):
        answers = [answer(0, "sleep-rank0"), hang.RankAnswer(1, "p1", dump=other)]
        r = hang.reduce([answers[i] for i in order])
        assert r.culprits == [], r.summary
        assert r.summary.startswith("the ranks disagree: rank ")


def test_a_send_and_its_receive_are_one_collective() -> None:
    def p2p(op: str) -> hangdump.RankDump:
        d = doc("sleep-rank0")
        d["collectives"]["entries"].append(
            {"seq": 0, "p2pSeq": 7, "op": op, "pg": "default_pg", "pgId": "0",
             "retired": False, "p2p": True}
        )  # fmt: skip
        for e in d["collectives"]["entries"][:-1]:
            e["retired"] = True
        return hangdump.parse(json.dumps(d).encode())

    r = hang.reduce(
        [hang.RankAnswer(0, "a", dump=p2p("send")), hang.RankAnswer(1, "b", dump=p2p("recv"))]
    )
    assert r.culprits == [] and "every rank (0-1) waits in" in r.summary, r.summary
    assert "(p2p #7)" in r.summary


def test_the_main_thread_survives_the_thread_cap() -> None:
    d = doc("sleep-rank1")
    d["threads"] += [{"name": f"w{i}", "main": False, "frames": []} for i in range(100)]
    got = hangdump.parse(json.dumps(d).encode())
    assert got.main is not None and got.main.name == "MainThread"


def test_the_configmap_holds_the_named_ranks_first_and_stays_under_its_byte_cap() -> None:
    answers = [answer(0, "sleep-rank0"), answer(1, "loader-rank1"), answer(2, None, "timeout")]
    report = hang.reduce(answers)
    data = hangtext.configmap_data(report, answers)
    assert set(data) == {"summary.txt", "rank-0.txt", "rank-1.txt", "rank-2.txt"}
    assert "PENDING" in data["rank-0.txt"] and "all_reduce #11" in data["rank-0.txt"]
    assert (
        "dataloader.py" in data["rank-1.txt"] and "did not answer (timeout)" in data["rank-2.txt"]
    )
    many = [answer(i, "sleep-rank0") for i in range(40)] + [answer(40, "sleep-rank1")]
    small = hangtext.configmap_data(hang.reduce(many), many, max_bytes=20_000)
    assert sum(len(v.encode()) for v in small.values()) <= 20_000 + 200
    assert "rank-40.txt" in small, "the rank that matters is never the one cut"
    assert "left out: the ConfigMap is full" in small["summary.txt"]
    wide = [hang.RankAnswer(0, "é" * 3000, dump=dump("sleep-rank0"))]
    text = hangtext.configmap_data(hang.reduce(wide), wide, max_bytes=5000)
    assert sum(len(v.encode()) for v in text.values()) <= 5000 + 200


def test_the_evidence_is_taken_once_per_stall() -> None:
    stalled = {"type": "Stalled", "status": "True", "lastTransitionTime": "2026-12-05T08:00:00Z"}
    status: dict[str, Any] = {"conditions": [stalled]}
    assert hangcapture.due(status) == "2026-12-05T08:00:00Z"
    status["hangEvidence"] = {"stalledSince": "2026-12-05T08:00:00Z", "summary": "s"}
    assert hangcapture.due(status) is None and stall_evidence(status)
    stalled["lastTransitionTime"] = "2026-12-05T09:00:00Z"  # a second stall, same attempt
    assert hangcapture.due(status) == "2026-12-05T09:00:00Z"
    assert stall_evidence(status) is None
    stalled["status"] = "False"
    assert hangcapture.due(status) is None


def test_the_answer_reaches_the_stalled_verdict_and_its_message() -> None:
    ev = {"summary": "rank 1 is elsewhere", "configMap": "j-hang-0", "culprits": [1]}
    ev |= {"pod": "j-node-1", "node": "n1", "gpu": "GPU-1"}
    assert format_hang(ev) == "; evidence: rank 1 is elsewhere (every rank: configmap/j-hang-0)"
    assert format_hang(None) == ""
    b = with_hang({"verdict": "Stalled", "evidence": {"step": 3}}, ev)
    assert b["evidence"] == {"step": 3, "hang": "rank 1 is elsewhere", "hangConfigMap": "j-hang-0"}
    assert (b["rank"], b["pod"], b["node"], b["gpuUUID"]) == (1, "j-node-1", "n1", "GPU-1")


@pytest.mark.parametrize(
    "others", ["collective-rank1", "loader-rank1", "sleep-rank1", "sleep-rank0"]
)
def test_a_digested_answer_compares_and_reads_as_the_whole_dump(others: str) -> None:
    """A capture keeps each rank's text and a cut dump as the answers arrive: the comparison,
    every rank's line and the ConfigMap are the same as from the whole dumps."""
    whole = [answer(0, "sleep-rank0"), answer(1, others), answer(2, None, "timeout: no answer")]
    kept = [hangtext.digested(a, len(whole)) for a in whole]
    for a in kept:
        if a.dump is not None:
            assert len(a.dump.threads) == 1 and len(a.dump.threads[0].frames) <= 3
            assert len(a.dump.collectives) <= 1
    full, cut = hang.reduce(whole), hang.reduce(kept)
    assert (cut.summary, cut.culprits, cut.silent, cut.where) == (
        full.summary,
        full.culprits,
        full.silent,
        full.where,
    )
    assert hangtext.configmap_data(cut, kept) == hangtext.configmap_data(full, whole)


def test_a_capture_keeps_a_digest_per_rank_not_its_evidence() -> None:
    """What `hangcapture.ask` holds once every rank answered: the digests, whatever the
    dumps' size; the bodies were dropped as they came."""
    body = (DATA / "loader-rank1.json").read_bytes()
    asked = [target(r, f"p-{r}") for r in range(64)]

    class Scraper:
        async def fetch_all(self, targets: Any, max_bytes: int, digest: Any = None) -> Any:
            assert digest is not None  # the capture always digests on arrival
            return [
                (digest(i, t, body.replace(b'"rank": 1', f'"rank": {t.rank}'.encode())), None, "")
                if t.rank != 7
                else (None, "timeout", "no answer within 5s")
                for i, t in enumerate(targets)
            ]

    answers = asyncio.run(hangcapture.ask(Scraper(), asked))  # type: ignore[arg-type]
    assert [a.rank for a in answers] == list(range(64))
    assert answers[7].dump is None and not answers[7].answered
    assert all(
        a.text and a.dump and len(a.dump.threads) == 1 for i, a in enumerate(answers) if i != 7
    )
