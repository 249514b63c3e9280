"""The webhook's reviewer: the dry run's outcomes turned into verdicts, never a denial of its own."""

from __future__ import annotations

import asyncio
from typing import Any

from kubernetes.client.rest import ApiException

from gpujob_operator.runtime.webhook import Reviewer
from tests.support.fakekube import FakeKube, api_error

JOB: dict[str, Any] = {
    "metadata": {"name": "j", "namespace": "ns"},
    "spec": {"image": "img:1", "command": ["python", "-m", "t"], "nodes": 2},
}


def review(kube: FakeKube, job: dict[str, Any] = JOB, timeout: float = 5.0) -> Any:
    return asyncio.run(Reviewer(lambda: kube, timeout).review(job))  # type: ignore[arg-type, return-value]


def invalid(field: str, message: str) -> ApiException:
    causes = [{"field": field, "message": message}]
    return api_error(422, "Invalid", f'Pod "x" is invalid: {field}: {message}', causes)


def test_both_ranks_are_dry_run_in_the_jobs_namespace_within_the_bound() -> None:
    kube = FakeKube()
    assert review(kube).allowed
    assert [ns for ns, _, _ in kube.dry_runs] == ["ns", "ns"]
    assert all(4.0 < t <= 5.0 for _, _, t in kube.dry_runs), "what is left of the 5 s budget"
    assert [b["metadata"]["name"] for _, b, _ in kube.dry_runs] == [
        "j-node-0-admission",
        "j-node-1-admission",
    ]


def test_an_invalid_pod_is_denied_once_with_the_users_field() -> None:
    v = review(
        FakeKube(refuse={"dry_run_pod": invalid("spec.containers[0].image", "Required value")})
    )
    assert not v.allowed and v.code == 422
    assert v.message.split("\n")[1:] == ["spec.image: Required value"]  # both ranks, one line


def test_a_slow_or_unreachable_api_server_admits_with_a_warning() -> None:
    slow = review(FakeKube(refuse={"dry_run_pod": TimeoutError()}), timeout=0.05)
    assert slow.allowed and "no answer to the dry run in 0.05s" in slow.warnings[0]
    down = review(FakeKube(refuse={"dry_run_pod": ConnectionRefusedError("refused")}))
    assert down.allowed and "APIUnreachable" in down.warnings[0]


def test_a_spec_the_model_refuses_is_left_to_the_crd() -> None:
    kube = FakeKube()
    assert review(kube, {**JOB, "spec": {"image": ""}}).allowed
    assert not kube.dry_runs


def test_an_update_that_leaves_the_pods_as_they_were_is_not_judged_again() -> None:
    """A suspend or a TTL edit of a job whose pods a tightened policy would now refuse."""
    kube = FakeKube(refuse={"dry_run_pod": invalid("spec.containers[0].image", "Invalid value")})
    old = {**JOB, "spec": {**JOB["spec"], "runPolicy": {"ttlSecondsAfterFinished": 60}}}
    new = {**JOB, "spec": {**JOB["spec"], "runPolicy": {"ttlSecondsAfterFinished": 600}}}
    verdict = asyncio.run(Reviewer(lambda: kube, 5.0).review(new, old))  # type: ignore[arg-type]
    assert verdict.allowed and kube.dry_runs == []
    changed = {**JOB, "spec": {**JOB["spec"], "image": "img:2"}}
    verdict = asyncio.run(Reviewer(lambda: kube, 5.0).review(changed, old))  # type: ignore[arg-type]
    assert not verdict.allowed and len(kube.dry_runs) == 2


def test_reviews_past_the_concurrency_bound_are_admitted_with_a_warning() -> None:
    kube = FakeKube(answer_after=0.5)

    async def burst() -> list[Any]:
        reviewer = Reviewer(lambda: kube, 0.2)  # type: ignore[arg-type]
        return await asyncio.gather(*(reviewer.review(JOB, source=f"s{i % 2}") for i in range(4)))

    verdicts = asyncio.run(burst())
    assert all(v.allowed for v in verdicts)
    assert len(kube.dry_runs) == 4, "4 slots, 2 per address: the other dry runs never started"
    assert any("too many reviews in flight" in " ".join(v.warnings) for v in verdicts)


def wide(nodes: int, env_kb: int) -> dict[str, Any]:
    """A job of `nodes` pods whose template carries `env_kb` KB of env values."""
    env = [{"name": f"V{i}", "value": "x" * 4000} for i in range(env_kb // 4)]
    template = {"containers": [{"name": "sidecar", "image": "busybox:1", "env": env}]}
    return {**JOB, "spec": {**JOB["spec"], "nodes": nodes, "template": template}}


def test_a_job_whose_pods_would_not_fit_the_operator_is_denied_with_the_numbers() -> None:
    kube = FakeKube()
    job = wide(512, 400)
    verdict = asyncio.run(Reviewer(lambda: kube, 5.0, max_pod_bytes=64 * 2**20).review(job))  # type: ignore[arg-type]
    assert not verdict.allowed and kube.dry_runs == []  # no pod built, none dry-run
    assert verdict.message.startswith("PodsTooLarge: spec.template makes pods of 397 KiB")
    assert "x spec.nodes 512 = 199 MiB" in verdict.message and "bound of 64 MiB" in verdict.message
    assert "GPUJOB_MAX_JOB_POD_BYTES" in verdict.message
    # the same template on fewer nodes fits, and no bound admits anything
    assert asyncio.run(Reviewer(lambda: kube, 5.0).review(wide(128, 400))).allowed  # type: ignore[arg-type]
    unbounded = Reviewer(lambda: kube, 5.0, max_pod_bytes=0)  # type: ignore[arg-type]
    assert asyncio.run(unbounded.review(job)).allowed
    # an update that leaves the template and the width alone is not judged again
    edited = {**job, "spec": {**job["spec"], "runPolicy": {"suspend": True}}}
    assert asyncio.run(Reviewer(lambda: kube, 5.0).review(edited, job)).allowed  # type: ignore[arg-type]
