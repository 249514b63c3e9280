"""The webhook serves the API server only: crafted reviews get no dry run, a flood from one
address leaves room for others, an oversized review is answered, and nothing is kept per
uid. The server is the operator's own handler on a real aiohttp socket (loopback)."""

from __future__ import annotations

import asyncio
import gc
import json
import os
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import aiohttp.web
from aiohttp.test_utils import TestServer

from gpujob_operator.lifecycle.apiserver import admissionreview
from gpujob_operator.runtime import webhook
from gpujob_operator.runtime.webhook import GuardedServer, Reviewer
from tests.support.fakekube import FakeKube

JOB: dict[str, Any] = {
    "apiVersion": "gpujob.dev/v1alpha1",
    "kind": "GPUTrainingJob",
    "metadata": {"name": "j", "namespace": "team-a", "uid": "u-1"},
    "spec": {"image": "img:1", "command": ["python", "-m", "t"], "nodes": 2},
}


def review(
    job: dict[str, Any] = JOB,
    namespace: str | None = "team-a",
    operation: str = "CREATE",
    old: dict[str, Any] | None = None,
    uid: str = "r-1",
) -> dict[str, Any]:
    req: dict[str, Any] = {
        "uid": uid,
        "kind": {"group": "gpujob.dev", "version": "v1alpha1", "kind": "GPUTrainingJob"},
        "resource": {"group": "gpujob.dev", "version": "v1alpha1", "resource": "gputrainingjobs"},
        "operation": operation,
        "userInfo": {"username": "someone"},
        "object": job,
    }
    if namespace is not None:
        req["namespace"] = namespace
    if old is not None:
        req["oldObject"] = old
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": req}


def in_namespace(ns: str) -> dict[str, Any]:
    return {**JOB, "metadata": {**JOB["metadata"], "namespace": ns}}


def test_only_what_the_api_server_could_send_is_dry_run() -> None:
    watched = ["team-a", "lab-*"]
    assert isinstance(admissionreview.screen(review(), watched), admissionreview.Request)
    lab = admissionreview.screen(review(in_namespace("lab-7"), "lab-7"), watched)
    assert isinstance(lab, admissionreview.Request)
    skipped = {
        "kube-system": review(in_namespace("kube-system"), "kube-system"),
        "mismatch": review(in_namespace("kube-system"), "team-a"),
        "no namespace": review(namespace=None),
        "delete": review(operation="DELETE"),
        "update without old": review(operation="UPDATE"),
        "a pod": {**review(), "request": {**review()["request"], "kind": {"kind": "Pod"}}},
        "garbage": {"request": "x"},
    }
    for what, r in skipped.items():
        out = admissionreview.screen(r, watched)
        assert isinstance(out, admissionreview.Skipped), what
        assert "kube-system" not in out.why  # a fixed phrase, never the input
    # Cluster mode (no namespaces): every namespace is watched, the match still required.
    assert isinstance(
        admissionreview.screen(review(in_namespace("x"), "x"), []), admissionreview.Request
    )
    assert isinstance(
        admissionreview.screen(review(in_namespace("x"), "y"), []), admissionreview.Skipped
    )


def test_the_uid_of_an_oversized_review_is_read_from_its_start() -> None:
    body = json.dumps(review(uid="abc-123")).encode()
    assert admissionreview.uid_of_prefix(body[: admissionreview.UID_SCAN_BYTES]) == "abc-123"
    assert admissionreview.uid_of_prefix(b"\x00" * 10) == ""


def serve(
    kube: FakeKube,
    watched: list[str],
    body: Callable[[TestServer], Awaitable[None]],
    guard: GuardedServer | None = None,
) -> None:
    """Run ``body`` against the guarded server's handler on a loopback port."""

    async def main() -> None:
        nonlocal guard
        guard = guard or GuardedServer(Reviewer(lambda: kube), watched)  # type: ignore[arg-type]
        app = aiohttp.web.Application()

        async def handle(request: aiohttp.web.Request) -> aiohttp.web.Response:
            assert guard is not None
            return await guard._serve(None, request)

        app.router.add_post("/validate-pods", handle)
        server = TestServer(app, host="127.0.0.1")
        await server.start_server()
        try:
            await body(server)
        finally:
            await server.close()

    asyncio.run(main())


async def post(
    session: aiohttp.ClientSession, server: TestServer, data: bytes | dict[str, Any]
) -> dict[str, Any]:
    raw = data if isinstance(data, bytes) else json.dumps(data).encode()
    async with session.post(server.make_url("/validate-pods"), data=raw) as resp:
        assert resp.status == 200, await resp.text()
        answer: dict[str, Any] = (await resp.json())["response"]
        return answer


def test_a_crafted_review_for_another_namespace_gets_no_dry_run() -> None:
    kube = FakeKube()

    async def body(server: TestServer) -> None:
        async with aiohttp.ClientSession() as s:
            out = await post(s, server, review(in_namespace("kube-system"), "kube-system"))
            assert out["allowed"] and out["uid"] == "r-1"
            assert out["warnings"] == [
                "gpujob did not check this request: a namespace this operator does not watch"
            ]
            assert not kube.dry_runs
            out = await post(s, server, review())
            assert out["allowed"] and "warnings" not in out
            assert [ns for ns, _, _ in kube.dry_runs] == ["team-a", "team-a"]

    serve(kube, ["team-a"], body)


def test_a_review_over_the_bound_is_denied_explicitly_not_dropped() -> None:
    kube = FakeKube()
    big = in_namespace("team-a")
    big["metadata"] = {
        **big["metadata"],
        "annotations": {"x": "a" * (admissionreview.MAX_REVIEW_BYTES + 10)},
    }

    async def body(server: TestServer) -> None:
        async with aiohttp.ClientSession() as s:
            out = await post(s, server, review(big, uid="big-1"))
            assert out["uid"] == "big-1" and not out["allowed"]
            assert out["status"]["code"] == 413
            assert "more than the 5 MiB the gpujob webhook reads" in out["status"]["message"]
            # Garbage is answered too (no uid to name), never with a traceback: not JSON,
            # nested past the parser's depth, nested just short of it.
            for junk in (b"{not json", b"[" * 100_000, b"[" * 900 + b"]" * 900):
                out = await post(s, server, junk)
                assert out["allowed"] and out["uid"] == ""
            deep: Any = {"spec": 1}
            for _ in range(900):
                deep = {"spec": deep}
            job = {**JOB, "spec": deep}
            out = await post(s, server, review(job, operation="UPDATE", old=job))
            assert out["allowed"]
            assert not kube.dry_runs

    serve(kube, ["team-a"], body)


def test_one_address_flooding_the_port_leaves_dry_run_slots_to_others() -> None:
    release = asyncio.Event()

    class Slow(FakeKube):
        async def dry_run_pod(self, namespace: str, body: dict[str, Any], *_: Any) -> None:
            self.dry_runs.append((namespace, body, 0.0))
            await release.wait()

    kube = Slow()
    one = {**JOB, "spec": {**JOB["spec"], "nodes": 1}}

    async def body(server: TestServer) -> None:
        flood = aiohttp.ClientSession()
        other = aiohttp.ClientSession(connector=aiohttp.TCPConnector(local_addr=("127.0.0.2", 0)))
        async with flood, other:
            held = [
                asyncio.create_task(post(flood, server, review(one, uid=f"h{i}")))
                for i in range(webhook.PER_SOURCE_DRY_RUNS + 2)
            ]
            # The flood holds its own slots only; its further reviews wait for them.
            await until(lambda: len(kube.dry_runs) == webhook.PER_SOURCE_DRY_RUNS)
            for _ in range(20):  # give the rest of the flood every chance to take a slot
                await asyncio.sleep(0.01)
            assert len(kube.dry_runs) == webhook.PER_SOURCE_DRY_RUNS
            theirs = asyncio.create_task(post(other, server, review(one, uid="api")))
            await until(lambda: len(kube.dry_runs) == webhook.PER_SOURCE_DRY_RUNS + 1)
            release.set()
            answers = await asyncio.gather(theirs, *held)
            for answer in answers:
                assert answer["allowed"] and "warnings" not in answer, answer
            assert len(kube.dry_runs) == len(answers)

    serve(kube, ["team-a"], body)


async def until(check: Callable[[], bool], timeout: float = 10.0) -> None:
    """Yield to the server until ``check`` holds; fail after ``timeout`` seconds."""
    async with asyncio.timeout(timeout):
        while not check():
            await asyncio.sleep(0.01)


def test_a_hundred_thousand_random_uid_updates_keep_no_memory() -> None:
    """kopf's admission engine kept one memory per object uid an UPDATE named, for ever."""

    class Quiet(FakeKube):
        async def dry_run_pod(self, *_: Any) -> None:
            return None

    reviewer = Reviewer(lambda: Quiet())  # type: ignore[arg-type, return-value]

    async def burst(n: int, changed: bool = False) -> None:
        for _ in range(n):
            job = {**JOB, "metadata": {**JOB["metadata"], "uid": uuid.uuid4().hex}}
            old = {**job, "spec": {**job["spec"], "nodes": 1}} if changed else job
            out = await webhook.answer(reviewer, review(job, operation="UPDATE", old=old), [])
            assert out["response"]["allowed"], out

    async def main() -> int:
        await burst(500, changed=True)  # warm caches, threads and interned strings
        gc.collect()
        before = rss()
        await burst(100_000)  # the spec unchanged: answered without a dry run
        await burst(2_000, changed=True)  # through the reviewer and its dry runs
        gc.collect()
        return rss() - before

    # One memory per uid (kopf keeps the object's body in it) would be well over 100 MiB.
    assert asyncio.run(main()) < 16 * 2**20


def rss() -> int:
    """This process's resident set, in bytes (Linux)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
