"""The operator's own pod watch against a real API server: listed, followed, resumed."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from kubernetes import client, config

from gpujob_operator.api import children
from gpujob_operator.runtime.podwatch import JobKey, PodIndex, PodWatch
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
