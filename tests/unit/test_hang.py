"""The hang comparison on real ranks' evidence (tests/data/evidence: recorded from the example
under torchrun with gloo, two ranks, rank 1 hung four ways; rank 0 waits in all_reduce #11)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gpujob_operator.monitoring import hang
from gpujob_operator.monitoring.monitor import hang_text, with_hang
from gpujob_operator.runtime import hangcapture

DATA = Path(__file__).resolve().parents[1] / "data" / "evidence"


def dump(name: str) -> hang.RankDump:
    return hang.parse((DATA / f"{name}.json").read_bytes())


def answer(rank: int, name: str | None, error: str = "") -> hang.RankAnswer:
    return hang.RankAnswer(
        rank, f"j-node-{rank}", f"n{rank}", dump=dump(name) if name else None, error=error
    )


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
    other = hang.parse(json.dumps(d).encode())
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
        return hang.parse(json.dumps(d).encode())

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
    with pytest.raises(hang.EvidenceError, match=words):
        hang.parse(body)


def test_caps_keep_a_huge_but_valid_document_small() -> None:
    frames = [{"file": "x" * 1_000, "line": 1, "function": "f"}] * 50
    d = {"rank": 0, "threads": [{"name": "t", "main": True, "frames": frames}]}
    r = hang.parse(json.dumps(d).encode())
    assert len(r.threads[0].frames) == 50
    assert all(len(f.file) <= hang.MAX_TEXT for t in r.threads for f in t.frames)


def test_answers_of_keeps_each_rank_apart_and_refuses_a_rank_that_claims_another() -> None:
    good = (DATA / "sleep-rank0.json").read_bytes()
    targets = [{"rank": 0, "pod": "a"}, {"rank": 1, "pod": "b"}, {"rank": 2, "pod": "c"}]
    out = hang.answers_of(targets, [(good, ""), (good, ""), (None, "connection: refused")])
    assert out[0].dump is not None
    assert out[1].dump is None and "it says rank 0, not 1" in out[1].error
    assert out[2].dump is None and out[2].error == "connection: refused"


def test_the_configmap_holds_every_rank_within_its_cap() -> None:
    answers = [answer(0, "sleep-rank0"), answer(1, "loader-rank1"), answer(2, None, "timeout")]
    data = hang.configmap_data("summary line", answers)
    assert set(data) == {"summary.txt", "rank-0.txt", "rank-1.txt", "rank-2.txt"}
    assert "PENDING" in data["rank-0.txt"] and "all_reduce #11" in data["rank-0.txt"]
    assert "dataloader.py" in data["rank-1.txt"] and "did not answer: timeout" in data["rank-2.txt"]
    small = hang.configmap_data("s", answers * 40, max_chars=20_000)
    assert sum(map(len, small.values())) <= 20_000 + 200
    assert "left out" in small["summary.txt"]


def test_the_evidence_is_taken_once_per_stall() -> None:
    stalled = {"type": "Stalled", "status": "True", "lastTransitionTime": "2026-12-05T08:00:00Z"}
    status: dict[str, Any] = {"conditions": [stalled]}
    assert hangcapture.due(status) == "2026-12-05T08:00:00Z"
    status["hangEvidence"] = {"stalledSince": "2026-12-05T08:00:00Z", "summary": "s"}
    assert hangcapture.due(status) is None and hangcapture.current(status)
    stalled["lastTransitionTime"] = "2026-12-05T09:00:00Z"  # a second stall, same attempt
    assert hangcapture.due(status) == "2026-12-05T09:00:00Z"
    assert hangcapture.current(status) is None
    stalled["status"] = "False"
    assert hangcapture.due(status) is None


def test_the_answer_reaches_the_stalled_verdict_and_its_message() -> None:
    ev = {"summary": "rank 1 is elsewhere", "configMap": "j-hang-0", "culprits": [1]}
    ev |= {"pod": "j-node-1", "node": "n1"}
    assert hang_text(ev) == "; evidence: rank 1 is elsewhere (every rank: configmap/j-hang-0)"
    assert hang_text(None) == ""
    b = with_hang({"verdict": "Stalled", "evidence": {"step": 3}}, ev)
    assert b["evidence"] == {"step": 3, "hang": "rank 1 is elsewhere", "hangConfigMap": "j-hang-0"}
    assert (b["rank"], b["pod"], b["node"]) == (1, "j-node-1", "n1")
