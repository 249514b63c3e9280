"""The pod index the operator's own watch feeds: projections only, exact across re-lists."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from gpujob_operator.api import children
from gpujob_operator.runtime import podwatch
from gpujob_operator.runtime.podwatch import PodIndex


def pod(
    uid: str, job: str | None = "bert", ns: str = "ml", phase: str = "Running"
) -> dict[str, Any]:
    labels = {children.LABEL_JOB_NAME: job} if job else {}
    return {
        "metadata": {"name": f"p-{uid}", "namespace": ns, "uid": uid, "labels": labels},
        "spec": {"containers": [{"name": "c", "env": [{"name": "PAD", "value": "x" * 1000}]}]},
        "status": {"phase": phase},
    }


def test_events_file_pods_under_their_job_and_report_which_jobs_changed() -> None:
    index = PodIndex()
    assert index.apply("ADDED", pod("1")) == {("ml", "bert")}
    assert index.apply("ADDED", pod("2", job="gpt")) == {("ml", "gpt")}
    assert index.apply("MODIFIED", pod("1")) == set()  # the same pod again wakes nobody
    assert index.apply("MODIFIED", pod("1", phase="Failed")) == {("ml", "bert")}
    assert [p["status"]["phase"] for p in index.pods(("ml", "bert"))] == ["Failed"]
    # A relabelled pod moves, and both jobs hear of it.
    assert index.apply("MODIFIED", pod("2", job="bert")) == {("ml", "gpt"), ("ml", "bert")}
    assert index.pods(("ml", "gpt")) == [] and len(index.pods(("ml", "bert"))) == 2
    assert index.apply("DELETED", pod("1")) == {("ml", "bert")}
    assert index.apply("DELETED", pod("1")) == set()
    assert len(index) == 1


def test_a_listing_replaces_its_namespace_only_and_leaves_no_ghost() -> None:
    index = PodIndex()
    for p in (pod("1"), pod("2"), pod("3", ns="other")):
        index.apply("ADDED", p)
    # Pod 2 was deleted while the watch was down; pod 4 was created.
    touched = index.replace("ml", [pod("1"), pod("4", job="gpt")])
    assert touched == {("ml", "bert"), ("ml", "gpt")}
    assert {p["metadata"]["uid"] for p in index.pods(("ml", "bert"))} == {"1"}
    assert len(index.pods(("other", "bert"))) == 1  # another namespace's listing is its own
    assert index.replace(None, []) == {("ml", "bert"), ("ml", "gpt"), ("other", "bert")}
    assert len(index) == 0


def test_a_watch_line_keeps_the_projection_and_errors_carry_their_code() -> None:
    line = json.dumps({"type": "ADDED", "object": pod("7") | {"metadata": pod("7")["metadata"]
                       | {"resourceVersion": "99", "managedFields": [{"f": "x" * 500}]}}})  # fmt: skip
    event = podwatch.decode_event(line.encode())
    assert event.kind == "ADDED" and event.resource_version == "99" and event.pod is not None
    assert "env" not in event.pod["spec"]["containers"][0]
    assert "managedFields" not in event.pod["metadata"]
    gone = podwatch.decode_event(
        b'{"type":"ERROR","object":{"kind":"Status","code":410,"message":"too old"}}'
    )
    assert (gone.kind, gone.code, gone.pod) == ("ERROR", 410, None)
    mark = podwatch.decode_event(
        b'{"type":"BOOKMARK","object":{"metadata":{"resourceVersion":"120"}}}'
    )
    assert (mark.kind, mark.resource_version, mark.pod) == ("BOOKMARK", "120", None)
    for bad in (b"[]", b'{"type":"ADDED"}', b'{"type":"EXPLODED","object":{}}', b"{"):
        with pytest.raises(ValueError):
            podwatch.decode_event(bad)


def test_lines_split_across_chunks_and_an_endless_line_is_refused() -> None:
    chunks = [b'{"a":', b'1}\n{"b"', b":2}\n\n", b'{"c":3}']
    assert [bytes(x) for x in podwatch.lines(iter(chunks))] == [b'{"a":1}', b'{"b":2}', b'{"c":3}']
    endless = (b"x" * 1000 for _ in range(100))
    with pytest.raises(ValueError, match="over 50000 bytes"):
        list(podwatch.lines(endless, limit=50_000))


class BrokenThenQuiet:
    """A core API whose first watch delivers two events and then breaks, and whose next
    watch records where it was asked to resume from."""

    def __init__(self) -> None:
        self.watched_from: list[str] = []
        self.watch: podwatch.PodWatch | None = None

    def list_namespaced_pod(self, namespace: str, **kw: Any) -> Any:
        if not kw.get("watch"):
            body = {"metadata": {"resourceVersion": "10"}, "items": []}
            return Resp([json.dumps(body).encode()])
        self.watched_from.append(kw["resource_version"])
        if len(self.watched_from) == 1:
            lines = [
                json.dumps({"type": "ADDED", "object": pod("1") | {"metadata": {
                    **pod("1")["metadata"], "resourceVersion": str(rv)}}}).encode() + b"\n"
                for rv in (11, 12)
            ]  # fmt: skip
            return Resp(lines, then=ConnectionResetError("reset by peer"))
        assert self.watch is not None
        self.watch.stop()
        return Resp([])


class Resp:
    def __init__(self, chunks: list[bytes], then: Exception | None = None) -> None:
        self.chunks, self.then = chunks, then
        self.data = b"".join(chunks)

    def stream(self, amt: int, decode_content: bool = True) -> Any:
        yield from self.chunks
        if self.then is not None:
            raise self.then

    def close(self) -> None:
        pass

    def shutdown(self) -> None:
        pass


def test_a_stream_broken_half_way_resumes_after_its_last_event() -> None:
    core = BrokenThenQuiet()

    async def scenario() -> PodIndex:
        index = PodIndex()
        watch = podwatch.PodWatch(core, ["ml"], index, lambda keys, p: None)
        core.watch = watch
        watch.start()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 30
        # The events were posted before the backoff that precedes the second watch, while
        # this loop polled: they are in the index once the second watch is asked for.
        while len(core.watched_from) < 2:
            assert loop.time() < deadline, core.watched_from
            await asyncio.sleep(0.01)
        return index

    index = asyncio.run(scenario())
    assert core.watched_from == ["10", "12"]  # not "10" again: no replay over newer states
    assert [p["metadata"]["uid"] for p in index.pods(("ml", "bert"))] == ["1"]
