"""The job loop's pure helpers (runtime/jobloop.py, once called the reconciler; its I/O is
covered by tests/integration)."""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime
from typing import Any, cast

import pytest

from gpujob_operator.lifecycle import backoff
from gpujob_operator.runtime import jobloop
from gpujob_operator.runtime.jobloop import JobLoop
from gpujob_operator.runtime.metricstask import next_tick
from tests.support.fakekube import FakeKube


def test_each_job_scrapes_on_its_own_phase_of_the_interval() -> None:
    for now in (1000.0, 1003.3, 1014.99, 1015.0):
        for uid in ("a", "b", "c"):
            t = next_tick(now, 15.0, uid)
            assert now < t <= now + 15.0
            assert abs(next_tick(t, 15.0, uid) - t - 15.0) < 1e-6  # a steady period afterwards
    phases = {round(next_tick(1000.0, 15.0, f"uid-{i}") % 15.0, 3) for i in range(100)}
    assert len(phases) > 50  # a hundred jobs started together spread over the interval


def test_an_api_outage_on_the_metrics_path_is_one_line_and_a_backoff(
    caplog: pytest.LogCaptureFixture,
) -> None:
    loop = JobLoop(kube=cast(Any, object()), post_event=lambda *a: None)
    loop.body = {"metadata": {"namespace": "ml", "name": "bert", "uid": "u1"}}
    down = ConnectionRefusedError(111, "Connection refused")
    with caplog.at_level(logging.WARNING, logger="gpujob.reconciler"):
        delays = [loop.side_failure("metrics", down, n) for n in (1, 2, 3, 4)]
    assert delays[-1] > delays[0]  # backs off instead of a fixed retry (doubling: below)
    assert all(r.exc_info is None for r in caplog.records), "an expected error got a traceback"
    assert any("call=metrics" in r.getMessage() for r in caplog.records)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="gpujob.reconciler"):
        loop.side_failure("metrics", KeyError("bug"), 1)
    assert any(r.exc_info is not None for r in caplog.records), "a bug must keep its traceback"


@pytest.mark.parametrize("rnd", [0.0, 0.5, 1.0])
def test_the_metrics_path_doubles_its_delay_up_to_the_cap(
    monkeypatch: pytest.MonkeyPatch, rnd: float
) -> None:
    """The metrics task's own loop counts failures in a row; each delay doubles the last
    (the same jitter throughout) until the cap, and a success starts again from the base."""
    monkeypatch.setattr(jobloop.random, "random", lambda: rnd)
    loop = JobLoop(kube=cast(Any, object()), post_event=lambda *a: None)
    loop.body = {"metadata": {"namespace": "ml", "name": "bert", "uid": "u1"}}
    loop.retry = backoff.Policy(1.0, 16.0, 0.5)
    task = loop.metrics
    delays: list[float] = []
    real = loop.side_failure

    def side_failure(call: str, e: Exception, failures: int) -> float:
        delays.append(real(call, e, failures))
        return 0.0  # the delay is what is asserted; the test does not wait for it

    outcomes = ["fail"] * 8 + ["ok"] + ["fail"] * 2

    async def observe(pods: Any) -> float | None:
        task.wake.set()  # wake the task at once instead of sleeping through its delay
        outcome = outcomes.pop(0)
        if not outcomes:
            loop.ended = True
        if outcome == "fail":
            raise ConnectionRefusedError(111, "Connection refused")
        return 0.0

    monkeypatch.setattr(loop, "side_failure", side_failure)
    monkeypatch.setattr(task, "observe", observe)
    asyncio.run(asyncio.wait_for(task.run(), 30))
    stretch = 1.0 + 0.5 * rnd
    doubling = [min(2.0**n, 16.0) * stretch for n in range(8)]  # 1, 2, 4, 8, 16, 16, 16, 16
    assert delays == pytest.approx(doubling + doubling[:2])


def test_a_fresh_loop_continues_the_tries_of_the_status(monkeypatch: pytest.MonkeyPatch) -> None:
    """After an operator restart the shell's next refusal is try 5, not try 1: its delay
    goes on doubling from where the status left it, and the run's start is kept."""
    from datetime import timedelta

    from gpujob_operator.lifecycle.apiserver import refusals
    from tests.support.fakekube import FakeKube, api_error
    from tests.unit.operator.lifecycle.test_planner import T0, Sim, make_job

    monkeypatch.setattr(jobloop.random, "random", lambda: 0.0)
    sim = Sim(make_job(nodes=2, gpusPerNode=8))
    quota = refusals.Refusal("QuotaExceeded", False, "exceeded quota: gpu", 403)
    sim.refused = refusals.Refused(quota, "pod bert-node-1", T0, T0 + timedelta(seconds=8), 4)
    sim.reconcile()
    sim.refused = None  # the restart
    sim.now = T0 + timedelta(seconds=8)
    plan = sim.plan()
    assert len(plan.create_pods) == 2
    full = api_error(403, "Forbidden", 'pods "x" is forbidden: exceeded quota: gpu')
    loop = JobLoop(
        kube=cast(Any, FakeKube(refuse={"create_pod": full})), post_event=lambda *a: None
    )
    loop.body = {"metadata": {"namespace": "ml", "name": "bert", "uid": "u1"}}
    assert asyncio.run(
        loop._create("ml", "bert", plan, plan.status["operatorState"]["createBackoff"])
    )
    assert loop.refused is not None and loop.refused.tries == 5 and loop.refused.since == T0
    delay = (loop.refused.retry_at - datetime.now(UTC)).total_seconds()
    assert delay > backoff.RETRY.delay(4)  # 16 s, not the first try's 1 s


def test_the_endpoint_guards_exist_before_any_pod_and_the_pods_read_the_token() -> None:
    """The NetworkPolicy and the token's Secret are created before the Service and the
    gang (a pod must never run with its endpoints open, nor wait for a missing Secret)."""
    from gpujob_operator.lifecycle import endpoints
    from tests.support.fakekube import FakeKube
    from tests.unit.operator.lifecycle.test_planner import Sim, make_job

    sim = Sim(make_job(nodes=2))
    plan = sim.plan()
    assert plan.create_service is not None and len(plan.create_pods) == 2
    kube = FakeKube()
    peer = {"podSelector": {"matchLabels": {"app": "op"}}}
    loop = JobLoop(
        kube=cast(Any, kube),
        post_event=lambda *a: None,
        network_policy=endpoints.PolicySettings(metrics_from=(peer,)),
        token_key=b"k" * 32,
    )
    loop.body = sim.job
    assert not asyncio.run(loop._create("ml", "bert", plan, None, sim.job))
    creates = [c for c in kube.calls if c.startswith("create")]
    policy_name = endpoints.network_policy_name(sim.job)
    secret_name = endpoints.token_secret_name(sim.job)
    uid8 = sim.job["metadata"]["uid"][:8]
    assert (policy_name, secret_name) == (f"bert-endpoints-{uid8}", f"bert-endpoint-token-{uid8}")
    assert creates[:3] == [
        f"create-networkpolicy {policy_name}",
        f"create-secret {secret_name}",
        "create-service bert",
    ]
    assert creates[3:] == ["create bert-node-0", "create bert-node-1"]
    secret = kube.created[("Secret", secret_name)]
    assert secret["stringData"]["token"] == endpoints.endpoint_token(b"k" * 32, sim.job)
    assert kube.created[("NetworkPolicy", policy_name)]["spec"]["ingress"][1]["from"] == [peer]
    for pod in kube.pods.values():
        env = {e["name"]: e for e in pod["spec"]["containers"][0]["env"]}
        ref = env["GPUJOB_ENDPOINT_TOKEN"]["valueFrom"]["secretKeyRef"]
        assert ref == {"name": secret_name, "key": "token"}

    # Neither configured: nothing more than before.
    kube = FakeKube()
    loop = JobLoop(kube=cast(Any, kube), post_event=lambda *a: None)
    loop.body = sim.job
    assert not asyncio.run(loop._create("ml", "bert", sim.plan(), None, sim.job))
    assert not kube.created
    assert all(
        e["name"] != "GPUJOB_ENDPOINT_TOKEN"
        for p in kube.pods.values()
        for e in p["spec"]["containers"][0]["env"]
    )


class Counting(FakeKube):
    """A fake API server that counts the pod creates in flight (and refuses one by name)."""

    def __init__(self, refuse_at: str = "") -> None:
        super().__init__(answer_after=0.001)
        self.flight = self.most = 0
        self.refuse_at = refuse_at

    async def create_pod(self, namespace: str, body: dict[str, Any], dry_run: bool = False) -> bool:
        from kubernetes.client.rest import ApiException

        self.flight += 1
        self.most = max(self.most, self.flight)
        try:
            await asyncio.sleep(0.001)
            if not dry_run and body["metadata"]["name"] == self.refuse_at:
                raise ApiException(status=403, reason="Forbidden")
            return await super().create_pod(namespace, body, dry_run)
        finally:
            self.flight -= 1


def test_a_batch_is_created_a_few_at_a_time_and_a_refusal_stops_the_rest() -> None:
    """The first pod alone, then CREATE_CONCURRENCY in flight at most; a refused pod is the
    one the refusal names, and the pods not yet sent stay unsent."""

    from tests.unit.operator.lifecycle.test_planner import Sim, make_job

    plan = Sim(make_job(nodes=40)).plan()
    kube = Counting()
    loop = JobLoop(kube=cast(Any, kube), post_event=lambda *a: None)
    loop.body = Sim(make_job(nodes=40)).job
    assert not asyncio.run(loop._create("ml", "bert", plan, None, loop.body))
    assert len(kube.pods) == 40 and kube.most == jobloop.CREATE_CONCURRENCY
    # The gang's probe, then the batch's first and last pods stand for all 40 in dry runs.
    assert [n for n in kube.names("dry-run") if "probe" not in n] == [
        "bert-node-0",
        "bert-node-39",
    ]
    assert kube.calls.index("dry-run bert-node-39") < kube.calls.index("create bert-node-0")
    assert kube.calls.index("create bert-node-0") < min(
        kube.calls.index(f"create bert-node-{i}") for i in range(1, 40)
    )

    refusing = Counting(refuse_at="bert-node-5")
    loop = JobLoop(kube=cast(Any, refusing), post_event=lambda *a: None)
    loop.body = Sim(make_job(nodes=40)).job
    assert asyncio.run(loop._create("ml", "bert", plan, None, loop.body))
    assert loop.refused is not None and "bert-node-5" in loop.refused.target
    assert len(refusing.pods) < 40 - jobloop.CREATE_CONCURRENCY


def test_a_gang_wider_than_a_batch_is_created_in_one_pass_a_few_bodies_at_a_time() -> None:
    """Beyond its first batch a wide gang is built pod by pod as each is sent: one pass
    creates it whole (no pass, status write or index wait per batch), never holding more
    than CREATE_CONCURRENCY bodies beyond the batch, each with the token and the shape of
    the batch whose first and last pods alone were dry-run."""
    import gc

    from gpujob_operator.lifecycle import endpoints
    from tests.unit.operator.lifecycle.test_planner import Sim, make_job

    sim = Sim(make_job(nodes=300))
    plan = sim.plan()
    batch = len(plan.create_pods)
    assert plan.more_pods == 300 - batch > 0 and plan.more_ranks[0] == batch
    kube = Counting()
    loop = JobLoop(kube=cast(Any, kube), post_event=lambda *a: None, token_key=b"k" * 32)
    loop.body = sim.job
    assert not asyncio.run(loop._create("ml", "bert", plan, None, sim.job))
    assert sorted(kube.pods) == sorted(f"bert-node-{r}" for r in range(300))
    assert kube.most <= jobloop.CREATE_CONCURRENCY
    # The batch's first pod and the gang's last stand for all 300 in dry runs.
    assert [n for n in kube.names("dry-run") if "probe" not in n] == [
        "bert-node-0",
        "bert-node-299",
    ]
    assert loop.created_more == list(range(batch, 300))
    first, last = kube.pods["bert-node-0"], kube.pods["bert-node-299"]
    assert first["spec"]["containers"][0]["image"] == last["spec"]["containers"][0]["image"]
    token = endpoints.token_secret_name(sim.job)
    for pod in (first, last):
        env = {e["name"]: e for e in pod["spec"]["containers"][0]["env"]}
        assert env["GPUJOB_ENDPOINT_TOKEN"]["valueFrom"]["secretKeyRef"]["name"] == token
    # The pods sent beyond the batch are not kept by the loop once created.
    del first, last, pod, env
    kube.pods.clear()
    kube.dry_runs.clear()
    gc.collect()
    kept = [
        o for o in gc.get_objects()
        if type(o) is dict and isinstance(meta := o.get("metadata"), dict)  # not subclasses
        and meta.get("name") == "bert-node-299"
    ]  # fmt: skip
    assert not kept, f"{len(kept)} bodies of a streamed pod are still held"


def test_a_pass_stops_creating_at_its_time_bound_or_at_a_pod_that_exists(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The stream beyond the batch ends at STREAM_SECONDS (the job's lock is held
    meanwhile) or at the first pod the server says exists (the index is behind, or the
    namespace is going): the next pass plans the rest from the index."""
    from tests.support.fakekube import FakeKube
    from tests.unit.operator.lifecycle.test_planner import Sim, make_job

    sim = Sim(make_job(nodes=300))
    plan = sim.plan()
    batch = len(plan.create_pods)

    class Taken(FakeKube):
        async def create_pod(
            self, namespace: str, body: dict[str, Any], dry_run: bool = False
        ) -> bool:
            if not dry_run and body["metadata"]["name"] == f"bert-node-{batch + 20}":
                return False  # 409: it exists
            return await super().create_pod(namespace, body, dry_run)

    kube = Taken()
    loop = JobLoop(kube=cast(Any, kube), post_event=lambda *a: None)
    loop.body = sim.job
    assert not asyncio.run(loop._create("ml", "bert", plan, None, sim.job))
    assert batch + 20 not in loop.created_more
    assert len(kube.pods) < batch + 20 + jobloop.CREATE_CONCURRENCY
    assert len(loop.created_more) == len(kube.pods) - batch

    # A clock that a second passes on each look: the bound, not the machine's load, ends it.
    ticks = iter(range(10**6))
    monkeypatch.setattr(jobloop, "stream_clock", lambda: float(next(ticks)))
    monkeypatch.setattr(jobloop, "STREAM_SECONDS", 30.0)
    timed = FakeKube()
    loop = JobLoop(kube=cast(Any, timed), post_event=lambda *a: None)
    loop.body = sim.job
    assert not asyncio.run(loop._create("ml", "bert", plan, None, sim.job))
    assert len(loop.created_more) == 30 < 300 - batch, loop.created_more
    assert len(timed.pods) == batch + 30


def test_the_between_creates_fault_fires_after_the_first_real_create(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The crash point a chaos test arms must leave exactly one new pod behind: it lies
    between real creates, never between the dry runs (which persist nothing)."""
    from gpujob_operator.runtime.faults import BETWEEN_POD_CREATES
    from tests.support.fakekube import FakeKube
    from tests.unit.operator.lifecycle.test_planner import Sim, make_job

    class Crashed(Exception):
        pass

    kube = FakeKube()

    def crash(armed: str | None, name: str) -> None:
        if armed == name:
            raise Crashed(name)

    monkeypatch.setattr(jobloop, "fault_point", crash)
    sim = Sim(make_job(nodes=2))
    loop = JobLoop(kube=cast(Any, kube), post_event=lambda *a: None, fault_at=BETWEEN_POD_CREATES)
    loop.body = sim.job
    with pytest.raises(Crashed):
        asyncio.run(loop._create("ml", "bert", sim.plan(), None, loop.body))
    assert sorted(kube.pods) == ["bert-node-0"], kube.calls


def test_a_gangs_pods_are_deleted_a_few_at_a_time_each_404_reported() -> None:
    from kubernetes.client.rest import ApiException

    class Deleting:
        def __init__(self, fail_at: str = "") -> None:
            self.flight = self.most = 0
            self.fail_at = fail_at
            self.deleted: list[str] = []

        async def delete_pod(self, namespace: str, name: str) -> bool:
            self.flight += 1
            self.most = max(self.most, self.flight)
            try:
                await asyncio.sleep(0.001)
                if name == self.fail_at:
                    raise ApiException(status=500, reason="boom")
                self.deleted.append(name)
                return name != "p-3"  # p-3 was already gone: a 404
            finally:
                self.flight -= 1

    kube = Deleting()
    loop = JobLoop(kube=cast(Any, kube), post_event=lambda *a: None)
    names = [f"p-{i}" for i in range(60)]
    got = dict(asyncio.run(loop._delete_pods("ml", names)))
    assert set(got) == set(names) and not got["p-3"] and sum(got.values()) == 59
    assert kube.most == jobloop.CREATE_CONCURRENCY
    failing = Deleting(fail_at="p-4")
    loop = JobLoop(kube=cast(Any, failing), post_event=lambda *a: None)
    with pytest.raises(ApiException):
        asyncio.run(loop._delete_pods("ml", names))
    assert len(failing.deleted) < 60 - jobloop.CREATE_CONCURRENCY


def test_a_gang_refused_half_way_keeps_backing_off_across_its_batches() -> None:
    """A wide gang's first batch is created and a later pod refused (the quota ran out half
    way), the gang released and tried again: each refusal continues the tries of the one
    before, never the shortest delay; a gang created whole starts afresh."""
    from kubernetes.client.rest import ApiException

    from tests.support.fakekube import FakeKube
    from tests.unit.operator.lifecycle.test_planner import Sim, make_job

    quota = ApiException(status=403, reason="Forbidden")
    quota.body = '{"reason":"Forbidden","message":"exceeded quota: q, requested: pods=1"}'

    class HalfQuota(FakeKube):
        room = 150

        async def create_pod(
            self, namespace: str, body: dict[str, Any], dry_run: bool = False
        ) -> bool:
            if not dry_run and len(self.pods) >= self.room:
                raise quota
            return await super().create_pod(namespace, body, dry_run)

    sim = Sim(make_job(nodes=200))
    plan = sim.plan()
    assert 0 < len(plan.create_pods) < HalfQuota.room and plan.more_pods > 0
    kube = HalfQuota()
    loop = JobLoop(kube=cast(Any, kube), post_event=lambda *a: None)
    loop.body = sim.job
    tries = []
    for _ in range(3):
        kube.pods.clear()  # the planner released the partial gang
        assert asyncio.run(loop._create("ml", "bert", plan, None, sim.job))
        assert loop.refused is not None and len(kube.pods) == HalfQuota.room
        tries.append(loop.refused.tries)
    assert tries == [1, 2, 3]
    kube.pods.clear()
    kube.room = 1000  # the quota was raised: the whole gang is created, the tries end
    assert not asyncio.run(loop._create("ml", "bert", plan, None, sim.job))
    assert len(kube.pods) == 200
    assert loop.refused is None and loop.batch_refused is None


def test_after_deleting_a_gang_the_loop_waits_for_the_index_to_show_the_deletes() -> None:
    """The next pass plans from the index: until it shows each deleted pod terminating (or
    gone), that pass would delete the same pods again, each a write of the whole pod."""

    def pod(uid: str, terminating: bool = False) -> dict[str, Any]:
        meta: dict[str, Any] = {"name": f"p-{uid}", "uid": uid}
        if terminating:
            meta["deletionTimestamp"] = "2026-12-07T00:00:00Z"
        return {"metadata": meta}

    index = [pod("a"), pod("b"), pod("c")]
    loop = JobLoop(kube=cast(Any, None), post_event=lambda *a: None)
    loop._pods = lambda: list(index)

    async def run() -> tuple[bool, bool, bool]:
        delivered = asyncio.Event()

        def watch_delivers() -> None:
            index[:] = [pod("a", True), pod("c")]  # a terminating, b gone, c never deleted
            delivered.set()

        asyncio.get_running_loop().call_later(0.2, watch_delivers)
        shown = await loop._until_deleting({"a", "b"}, timeout=30)
        was_delivered = delivered.is_set()
        never = await loop._until_deleting({"c"}, timeout=0.1)
        return shown, was_delivered, never

    shown, was_delivered, never = asyncio.run(run())
    assert shown and was_delivered, "returned before the index showed the deletes"
    assert not never, "a pod the index still shows alive is not waited for past the bound"


def test_the_status_read_is_the_newer_of_the_watch_and_the_last_write() -> None:
    loop = JobLoop(kube=cast(Any, object()), post_event=lambda *a: None)
    watched = {"phase": "Running", "progress": {"step": 10}}
    written = {"phase": "Running", "progress": {"step": 12}}
    loop.body = {"metadata": {"resourceVersion": "7"}, "status": watched}
    assert loop.peek_status() is watched  # nothing written yet
    loop.last_written = {"metadata": {"resourceVersion": "9"}, "status": written}
    assert loop.peek_status() is written  # the watch has not delivered our write yet
    assert loop.freshest(loop.body)["status"] == written
    assert loop.freshest(loop.body)["status"] is not written  # freshest copies, peek reads
    loop.body = {"metadata": {"resourceVersion": "11"}, "status": watched}
    assert loop.peek_status() is watched


def test_a_pass_that_patched_pods_waits_until_the_index_shows_the_patches() -> None:
    """The next pass plans from the index: a 512-pod move re-patched 314, 113 and 29 pods in
    three more passes while the watch trailed the writes."""
    from gpujob_operator.lifecycle.observations import project_pod, shows_patch

    move = {"metadata": {"labels": {"gpujob.dev/attempt": "1"}, "annotations": {
        "gpujob.dev/restarts-base": "1"}}}  # fmt: skip
    pods = [
        {"metadata": {"name": f"p{i}", "uid": f"u{i}", "labels": {"gpujob.dev/attempt": "0"}}}
        for i in range(3)
    ]
    index = [project_pod(p) for p in pods]
    loop = JobLoop(kube=cast(Any, object()), post_event=lambda *a: None)
    loop._pods = lambda: list(index)
    patched = [(f"p{i}", f"u{i}", move) for i in range(3)]
    assert not shows_patch(index[0], move)

    async def main() -> tuple[bool, bool]:
        late = await loop._until_patched(patched, 0.2)  # the watch has shown nothing yet
        loop.unshown = (patched, 0.1)  # what a pass leaves for the loop to wait on, unlocked
        await loop._patches_shown()
        assert loop.unshown is None

        async def watch_catches_up() -> None:
            for i, p in enumerate(pods):
                await asyncio.sleep(0.05)
                meta = p["metadata"]
                meta["labels"] = {"gpujob.dev/attempt": "1"}
                meta["annotations"] = {"gpujob.dev/restarts-base": "1", "other.io/x": "y"}
                index[i] = project_pod(p)
            index.pop()  # one deleted meanwhile: nothing to wait for

        feed = asyncio.create_task(watch_catches_up())
        shown = await loop._until_patched(patched, 10.0)
        await feed
        return late, shown

    late, shown = asyncio.run(main())
    assert not late and shown
    assert shows_patch(index[0], move) and shows_patch(index[0], {"metadata": {"annotations": {
        "unkept.io/note": "anything"}}})  # fmt: skip  # a key the projection drops: not waited on
