"""The operator's own pod watch against a real API server: listed, followed, resumed."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kubernetes import client, config

from gpujob_operator.api import children
from gpujob_operator.observability.opmetrics import METRICS
from gpujob_operator.runtime.podwatch import JobKey, PodIndex, PodWatch
from tests.support.faultproxy import Fault, FaultProxy
from tests.support.kube import Kube


def unscheduled_pod(name: str, job: str | None) -> dict[str, Any]:
    """A pod no scheduler takes (it stays Pending: nothing runs), with a 200 KB env."""
    labels = {children.LABEL_JOB_NAME: job} if job else {"other": "x"}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "schedulerName": "nobody",
            "containers": [
                {"name": "c", "image": "none", "env": [{"name": "PAD", "value": "x" * 200_000}]}
            ],
        },
    }


async def until(what: Callable[[], bool], timeout: float, why: str) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not what():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out waiting for {why}")
        await asyncio.sleep(0.05)


def test_the_watch_lists_follows_and_resumes_keeping_projections_only(
    kube: Kube,
) -> None:
    for name in ("a-0", "a-1"):
        kube.apply(unscheduled_pod(name, "alpha"))
    kube.apply(unscheduled_pod("stranger", None))
    job = (kube.namespace, "alpha")
    woken: list[set[JobKey]] = []

    async def scenario() -> None:
        index = PodIndex()
        watch = PodWatch(
            client.CoreV1Api(config.new_client_from_config(str(kube.kubeconfig))),
            [kube.namespace],
            index,
            lambda keys, pod: woken.append(keys),
            server_timeout=2,
        )
        watch.start()
        try:
            await asyncio.wait_for(watch.synced.wait(), 30)
            names = lambda: sorted(p["metadata"]["name"] for p in index.pods(job))  # noqa: E731
            assert names() == ["a-0", "a-1"] and len(index) == 2  # the stranger is not listed
            kept = index.pods(job)[0]
            assert "env" not in kept["spec"]["containers"][0]  # a projection, not the body
            await asyncio.to_thread(kube.apply, unscheduled_pod("a-2", "alpha"))
            await until(lambda: names() == ["a-0", "a-1", "a-2"], 30, "the new pod")
            await asyncio.to_thread(kube.run, "delete", "pod", "a-0", "--wait=false")
            await until(lambda: names() == ["a-1", "a-2"], 30, "the deleted pod gone")
            # Relabelled to another job: it leaves alpha and joins beta.
            await asyncio.to_thread(
                kube.run, "label", "pod", "a-1", f"{children.LABEL_JOB_NAME}=beta", "--overwrite"
            )
            await until(lambda: names() == ["a-2"], 30, "the relabelled pod moved")
            assert [p["metadata"]["name"] for p in index.pods((kube.namespace, "beta"))] == ["a-1"]
            # The server ends each watch after 2 s; the watch resumes where it was, no re-list.
            await until(lambda: watch.watches >= 3, 30, "the watch resumed twice")
            await asyncio.to_thread(kube.run, "delete", "pod", "a-2", "--wait=false")
            await until(lambda: names() == [], 30, "the last pod gone after resuming")
            assert watch.listings == 1
            assert job in set().union(*woken)
        finally:
            watch.stop()

    asyncio.run(scenario())


def test_a_cut_stream_and_a_refused_watch_are_resumed_without_listing_again(
    kube: Kube, tmp_path: Path
) -> None:
    """A failover resets the watch's connection, and the next watch request is answered
    500: the watch resumes from the last event it saw (no listing of every pod again) and
    misses nothing created meanwhile."""
    kube.apply(unscheduled_pod("b-0", "bravo"))
    pods_path = re.compile(rf"/api/v1/namespaces/{kube.namespace}/pods")
    refuse = Fault("GET", pods_path, [])
    proxy = FaultProxy(kube.kubeconfig, [refuse]).start()
    job = (kube.namespace, "bravo")
    errors_before = watch_errors()

    async def scenario() -> None:
        index = PodIndex()
        api = config.new_client_from_config(str(proxy.kubeconfig(tmp_path / "proxy.kubeconfig")))
        watch = PodWatch(
            client.CoreV1Api(api), [kube.namespace], index, lambda k, p: None, server_timeout=60
        )
        watch.start()
        try:
            await asyncio.wait_for(watch.synced.wait(), 30)
            refuse.codes = [500]  # the next watch request is refused once
            assert proxy._loop is not None
            deadline = asyncio.get_running_loop().time() + 30
            while not await asyncio.wrap_future(  # once its response is streaming
                asyncio.run_coroutine_threadsafe(_cut(proxy, pods_path), proxy._loop)
            ):
                assert asyncio.get_running_loop().time() < deadline, "no watch to cut"
                await asyncio.sleep(0.05)
            await asyncio.to_thread(kube.apply, unscheduled_pod("b-1", "bravo"))
            names = lambda: sorted(p["metadata"]["name"] for p in index.pods(job))  # noqa: E731
            await until(lambda: names() == ["b-0", "b-1"], 60, "the pod made after the cut")
            assert watch.listings == 1, "the watch listed everything again instead of resuming"
            assert watch.watches >= 3  # the first, the refused one, the resumed one
        finally:
            watch.stop()

    try:
        asyncio.run(scenario())
    finally:
        proxy.stop()
    assert [code for _, code in refuse.seen if code] == [500]
    assert watch_errors() >= errors_before + 2  # the cut and the refusal, each counted


def watch_errors() -> float:
    return sum(v for (call, _), v in METRICS._api_errors.items() if call == "watch_pods")


async def _cut(proxy: FaultProxy, path: re.Pattern[str]) -> int:
    return proxy.cut_now(path)
