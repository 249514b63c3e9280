"""What the API server refuses at run time becomes status, an Event and a backoff.

Real control plane, real admission (ResourceQuota, PodSecurity, validation), the operator
as a process. The jobs run short Python snippets without torch (launcher none).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import re
import urllib.request
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpujob_operator.api import conditions as c
from tests.integration.conftest import apply_quota, job_status, wait_job_phase
from tests.integration.test_operator_lifecycle import job_pods
from tests.support.faultproxy import Fault, FaultProxy, pod_creates
from tests.support.jobs import python_job as job
from tests.support.kube import Kube
from tests.support.operator import OperatorProcess
from tests.support.waiting import wait_until

FAST_RETRIES = {
    "GPUJOB_RETRY_BASE_SECONDS": "0.5",
    "GPUJOB_RETRY_MAX_SECONDS": "4",
    "GPUJOB_GANG_GRACE_SECONDS": "3",
}
"""Short backoffs so a test sees several retries in seconds (production: 1 s .. 300 s)."""


@pytest.fixture
def fast_operator(kube: Kube, crd: Path, tmp_path: Path) -> Iterator[OperatorProcess]:
    op = OperatorProcess(
        kube.kubeconfig, [kube.namespace], tmp_path / "operator.log", extra_env=FAST_RETRIES
    ).start()
    yield op
    op.stop()


def warnings(kube: Kube, name: str) -> list[dict[str, Any]]:
    return [
        e
        for e in kube.list("events")
        if e["involvedObject"].get("name") == name
        and e["involvedObject"].get("kind") == "GPUTrainingJob"
        and e.get("type") == "Warning"
    ]


def condition(kube: Kube, name: str, type_: str) -> dict[str, Any]:
    return dict(c.find(job_status(kube, name).get("conditions"), type_) or {})


def wait_reason(kube: Kube, name: str, type_: str, reason: str, timeout: float = 60) -> dict:
    return wait_until(
        lambda: (cond := condition(kube, name, type_)).get("reason") == reason and cond,
        timeout,
        f"{type_} condition of {name} with reason {reason}",
    )


def no_tracebacks(op: OperatorProcess) -> None:
    log = op.log_path.read_text(errors="replace")
    assert "Traceback" not in log, op.log_tail(80)


def test_quota_too_small_for_the_gang_holds_nothing_and_runs_once_raised(
    kube: Kube, fast_operator: OperatorProcess
) -> None:
    apply_quota(kube, "gpus", {"requests.nvidia.com/gpu": "2"})
    kube.apply(job("tight", "print('ran')", nodes=2, gpus=2))

    cond = wait_reason(kube, "tight", c.CREATED, c.QUOTA_EXCEEDED)
    # The server's own message, with the gang's total (the probe asked for all 4 GPUs).
    assert "exceeded quota: gpus" in cond["message"], cond
    assert "requested: requests.nvidia.com/gpu=4" in cond["message"], cond
    assert condition(kube, "tight", c.RUNNING)["reason"] == c.QUOTA_EXCEEDED
    status = job_status(kube, "tight")
    assert status["phase"] == "Pending" and status.get("gang", {}).get("nextAttemptTime")
    events = wait_until(
        lambda: [e for e in warnings(kube, "tight") if e["reason"] == c.QUOTA_EXCEEDED],
        30,
        "a QuotaExceeded Warning Event",
    )
    assert "exceeded quota: gpus" in events[0]["message"]
    describe = kube.run("describe", "gputrainingjob", "tight", check=True).stdout
    assert "QuotaExceeded" in describe and "exceeded quota: gpus" in describe
    # All or nothing: no pod of the gang holds a GPU while the job waits.
    wait_until(lambda: not job_pods(kube, "tight"), 30, "no pod of the refused gang")
    used = (kube.get("resourcequota", "gpus") or {})["status"].get("used", {})
    assert used.get("requests.nvidia.com/gpu") in ("0", None), used

    kube.run(
        "patch", "resourcequota", "gpus", "--type=merge",
        "-p", json.dumps({"spec": {"hard": {"requests.nvidia.com/gpu": "4"}}}), check=True,
    )  # fmt: skip
    status = wait_job_phase(kube, "tight", ("Succeeded", "Failed"), timeout=120)
    assert status["phase"] == "Succeeded", status
    assert condition(kube, "tight", c.CREATED)["reason"] == c.PODS_CREATED
    assert "nextAttemptTime" not in status["gang"]
    assert fast_operator.proc is not None and fast_operator.proc.poll() is None
    no_tracebacks(fast_operator)


CYCLE_RETRIES = {**FAST_RETRIES, "GPUJOB_RETRY_MAX_SECONDS": "8"}
"""Room for the delays to double a few times (0.5, 1, 2, 4, 8 s) before the cap."""


def event_time(event: dict[str, Any]) -> datetime:
    """When an Event was posted: never before the decision that posted it."""
    when = c.parse_time(
        event.get("eventTime")
        or event.get("firstTimestamp")
        or event["metadata"]["creationTimestamp"]
    )
    assert when is not None, event
    return when


def test_a_partial_gang_is_deleted_after_the_grace(kube: Kube, crd: Path, tmp_path: Path) -> None:
    """The quota admits the gang's first pod only once the gang check has passed: another
    job took the quota between the dry runs and the creates (simulated by a quota on the
    pod count, which the one-pod probe cannot see). The partial gang is released no sooner
    than the grace, the retries back off (each try's delay doubles), and the gang runs once
    the quota frees."""
    op = OperatorProcess(
        kube.kubeconfig, [kube.namespace], tmp_path / "operator.log", extra_env=CYCLE_RETRIES
    ).start()
    try:
        apply_quota(kube, "pods", {"pods": "1"})
        kube.apply(job("half", "import time; time.sleep(60)", nodes=2, gpus=1))
        wait_reason(kube, "half", c.CREATED, c.QUOTA_EXCEEDED)
        # Every try's record, by its number: watched until the delay reached the cap.
        records: dict[int, dict[str, Any]] = {}

        def releases() -> list[dict[str, Any]]:
            events = [e for e in warnings(kube, "half") if e["reason"] == c.GANG_RELEASED]
            return sorted(events, key=event_time)

        def cycled() -> bool:
            record = job_status(kube, "half").get("operatorState", {}).get("createBackoff")
            if record:
                records.setdefault(record["tries"], record)
            # Created and released again, not only once; and tries up to the cap.
            return max(records, default=0) >= 5 and len(releases()) >= 2

        wait_until(cycled, 120, "five refused tries and two GangReleased Events")
        released = releases()
        assert all("half-node-0" in e["message"] for e in released)
        # The grace counts from the run's first refusal (status, whole seconds, rounded down).
        since = {r["since"] for r in records.values()}
        assert len(since) == 1, records  # one run of QuotaExceeded: its start never moves
        first = c.parse_time(since.pop())
        assert first is not None
        grace = float(CYCLE_RETRIES["GPUJOB_GANG_GRACE_SECONDS"])
        assert event_time(released[0]) >= first + timedelta(seconds=grace), (released, first)
        # A try is never made before the previous one's retryAt, and its own delay doubles:
        # try t+1's retryAt comes at least base * 2**t (capped) after try t's. Whole seconds,
        # rounded down: 1 s less.
        base = float(CYCLE_RETRIES["GPUJOB_RETRY_BASE_SECONDS"])
        cap = float(CYCLE_RETRIES["GPUJOB_RETRY_MAX_SECONDS"])
        pairs = [(t, t + 1) for t in sorted(records) if t + 1 in records]
        assert any(t >= 4 for t, _ in pairs), sorted(records)  # the doubling to the cap seen
        for t, u in pairs:
            a, b = (c.parse_time(records[x]["retryAt"]) for x in (t, u))
            assert a is not None and b is not None
            least = min(base * 2.0**t, cap) - 1.0
            assert (b - a).total_seconds() >= least, (t, records[t], records[u])
        # The quota frees: the whole gang is created and runs, and the record ends.
        apply_quota(kube, "pods", {"pods": "2"})
        wait_until(
            lambda: (
                (kube.get("resourcequota", "pods") or {})
                .get("status", {})
                .get("hard", {})
                .get("pods")
                == "2"
            ),
            30,
            "the quota raised to 2 pods",
        )
        status = wait_job_phase(kube, "half", ("Running",), timeout=90)
        assert status["gang"]["replicas"]["running"] == 2, status
        wait_until(
            lambda: "createBackoff" not in job_status(kube, "half").get("operatorState", {}),
            30,
            "status.operatorState.createBackoff cleared",
        )
        assert cond_reason(kube, "half", c.CREATED) == c.PODS_CREATED
        no_tracebacks(op)
    finally:
        op.stop()


def cond_reason(kube: Kube, name: str, type_: str) -> str:
    return str(condition(kube, name, type_).get("reason"))


def test_pod_security_violation_fails_the_job_naming_the_field(
    kube: Kube, fast_operator: OperatorProcess
) -> None:
    kube.run(
        "label", "namespace", kube.namespace, "pod-security.kubernetes.io/enforce=restricted",
        ns=False, check=True,
    )  # fmt: skip
    body = job("priv", "print('never')", nodes=2, gpus=1)
    body["spec"]["template"] = {"containerSecurityContext": {"privileged": True}}
    kube.apply(body)
    status = wait_job_phase(kube, "priv", ("Failed",), timeout=60)
    cond = condition(kube, "priv", c.FAILED)
    assert cond["reason"] == c.POD_SECURITY_VIOLATION, cond
    assert 'violates PodSecurity "restricted' in cond["message"], cond
    assert "securityContext.privileged=true" in cond["message"], cond
    assert status["failure"]["reason"] == c.POD_SECURITY_VIOLATION
    assert not job_pods(kube, "priv")
    events = wait_until(
        lambda: [e for e in warnings(kube, "priv") if e["reason"] == c.POD_SECURITY_VIOLATION],
        30,
        "a PodSecurityViolation Warning Event",
    )
    assert "privileged" in events[0]["message"]
    no_tracebacks(fast_operator)


def test_an_invalid_pod_that_slipped_past_admission_fails_with_the_message(
    kube: Kube, fast_operator: OperatorProcess
) -> None:
    # Volume sources are copied verbatim (their contents change every release and would not
    # fit the CRD's CEL budget), so only the pod's own validation sees a bad defaultMode.
    body = job("fat", "print('never')", nodes=2, gpus=0)
    body["spec"]["template"] = {
        "volumes": [{"name": "cfg", "configMap": {"name": "cfg", "defaultMode": 4096}}]
    }
    kube.run("create", "-f", "-", input=yaml.safe_dump(body), check=True)
    status = wait_job_phase(kube, "fat", ("Failed",), timeout=60)
    cond = condition(kube, "fat", c.FAILED)
    assert cond["reason"] == c.INVALID_POD_TEMPLATE, cond
    assert "configMap.defaultMode" in cond["message"], cond
    assert status["failure"]["reason"] == c.INVALID_POD_TEMPLATE
    assert "configMap.defaultMode" in status["failure"]["message"]
    assert not job_pods(kube, "fat")
    wait_until(
        lambda: any(e["reason"] == c.INVALID_POD_TEMPLATE for e in warnings(kube, "fat")),
        30,
        "the InvalidPodTemplate Warning",
    )
    no_tracebacks(fast_operator)


def metric(op: OperatorProcess, name: str, **labels: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{op.metrics_port}/metrics", timeout=5) as r:
        text = r.read().decode()
    for line in text.splitlines():
        if line.startswith(f"{name}{{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


@contextlib.contextmanager
def operator_behind(kube: Kube, tmp_path: Path, fault: Fault) -> Iterator[OperatorProcess]:
    """An operator whose API traffic passes the fault proxy, with fast, capped retries."""
    proxy = FaultProxy(kube.kubeconfig, [fault]).start()
    op = OperatorProcess(
        proxy.kubeconfig(tmp_path / "proxy.kubeconfig"),
        [kube.namespace],
        tmp_path / "operator.log",
        extra_env={**FAST_RETRIES, "GPUJOB_RETRY_MAX_SECONDS": "30"},
    )
    try:
        op.start()
        yield op
    finally:
        op.stop()
        proxy.stop()


def backoff_gaps(times: list[float]) -> list[float]:
    """The gaps between retried requests, each checked to be no sooner than the backoff."""
    gaps = [b - a for a, b in itertools.pairwise(times)]
    base = float(FAST_RETRIES["GPUJOB_RETRY_BASE_SECONDS"])
    for i, gap in enumerate(gaps):
        assert gap >= base * 2**i * 0.95, (i, gaps)  # never sooner than the backoff
    return gaps


def test_throttled_and_failing_pod_creates_are_retried_with_growing_delays(
    kube: Kube, crd: Path, tmp_path: Path
) -> None:
    codes = [429, 500, 429, 503]
    fault = pod_creates(kube.namespace, codes)
    with operator_behind(kube, tmp_path, fault) as op:
        kube.apply(job("flaky", "print('ok')", nodes=2, gpus=1))
        status = wait_job_phase(kube, "flaky", ("Succeeded", "Failed"), timeout=120)
        assert status["phase"] == "Succeeded", status
        # Every faulted attempt stopped at its first dry run: one request per attempt.
        faulted = [t for t, code in fault.seen if code]
        assert [code for _, code in fault.seen if code] == codes
        first_ok = next(t for t, code in fault.seen if not code)
        gaps = backoff_gaps([*faulted, first_ok])
        assert gaps[-1] > 2 * gaps[0] and gaps[-1] > gaps[-2], gaps  # and growing
        assert metric(op, "gpujob_operator_api_errors_total", call="dry_run_gang",
                      reason=c.API_THROTTLED) == 2  # fmt: skip
        assert metric(op, "gpujob_operator_api_errors_total", call="dry_run_gang",
                      reason=c.API_SERVER_ERROR) == 2  # fmt: skip
        seen = {e["reason"] for e in warnings(kube, "flaky")}
        assert {c.API_THROTTLED, c.API_SERVER_ERROR} <= seen, seen
        log = op.log_path.read_text(errors="replace")
        assert "call=dry_run_gang" in log and "reason=APIThrottled" in log
        assert "Traceback" not in log, op.log_tail(80)


def test_gang_restarts_back_off_and_status_says_when(
    kube: Kube, fast_operator: OperatorProcess, tmp_path: Path
) -> None:
    marker = tmp_path / "failed-once"
    script = f"""
        import os, pathlib, sys
        m = pathlib.Path({str(marker)!r})
        if os.environ["RANK"] == "1" and not m.exists():
            m.write_text("x"); sys.exit(3)
    """
    # Recreate: the operator's restart backoff (an in-place restart has the kubelet's).
    kube.apply(job("blip", script, runPolicy={"backoffLimit": 2, "restartStrategy": "Recreate"}))
    waiting = wait_until(
        lambda: (
            (s := job_status(kube, "blip")).get("gang", {}).get("restarts") == 1
            and s.get("gang", {}).get("nextAttemptTime")
            and s
        ),
        60,
        "the restart with a nextAttemptTime",
    )
    restarting = c.find(waiting["conditions"], c.RESTARTING) or {}
    restarted_at = c.parse_time(restarting.get("lastTransitionTime"))
    next_at = c.parse_time(waiting["gang"]["nextAttemptTime"])
    assert restarted_at is not None and next_at is not None
    assert (next_at - restarted_at).total_seconds() >= 10, waiting  # the first backoff: 10 s
    assert waiting["gang"]["nextAttemptTime"] in restarting["message"]
    status = wait_job_phase(kube, "blip", ("Succeeded", "Failed"), timeout=120)
    assert status["phase"] == "Succeeded" and status["gang"]["restarts"] == 1, status
    assert "nextAttemptTime" not in status["gang"]
    created = [
        c.parse_time(p["metadata"]["creationTimestamp"])
        for p in job_pods(kube, "blip")
        if p["metadata"]["labels"]["gpujob.dev/attempt"] == "1"
    ]
    assert created and all(t is not None and t >= next_at for t in created), (created, next_at)
    no_tracebacks(fast_operator)


def test_failing_status_writes_back_the_whole_loop_off(
    kube: Kube, crd: Path, tmp_path: Path
) -> None:
    codes = [500, 500, 500, 500]
    fault = Fault(
        "PATCH",
        re.compile(
            rf"/apis/gpujob.dev/v1alpha1/namespaces/{kube.namespace}/gputrainingjobs/slow/status"
        ),
        codes,
    )
    with operator_behind(kube, tmp_path, fault) as op:
        kube.apply(job("slow", "print('ok')", nodes=2, gpus=0))
        status = wait_job_phase(kube, "slow", ("Succeeded", "Failed"), timeout=120)
        assert status["phase"] == "Succeeded", status
        gaps = backoff_gaps([t for t, _ in fault.seen[: len(codes) + 1]])
        assert gaps[-1] > 2 * gaps[0], gaps
        assert metric(op, "gpujob_operator_api_errors_total", call="patch_status",
                      reason=c.API_SERVER_ERROR) == len(codes)  # fmt: skip
        log = op.log_path.read_text(errors="replace")
        assert "call=patch_status reason=APIServerError" in log
        assert "Traceback" not in log, op.log_tail(80)


def test_limit_range_violation_fails_the_job(kube: Kube, fast_operator: OperatorProcess) -> None:
    kube.apply(
        {
            "apiVersion": "v1",
            "kind": "LimitRange",
            "metadata": {"name": "cpu"},
            "spec": {"limits": [{"type": "Container", "max": {"cpu": "1"}}]},
        }
    )
    body = job("big", "print('never')", nodes=2, gpus=0)
    body["spec"]["resources"] = {"requests": {"cpu": "2"}, "limits": {"cpu": "2"}}
    kube.apply(body)
    wait_job_phase(kube, "big", ("Failed",), timeout=60)
    cond = condition(kube, "big", c.FAILED)
    assert cond["reason"] == c.LIMIT_RANGE_VIOLATION, cond
    assert "maximum cpu usage per Container is 1, but limit is 2" in cond["message"], cond
    assert not job_pods(kube, "big")
    no_tracebacks(fast_operator)


def cluster_object(kube: Kube, manifest: dict[str, Any]) -> None:
    kube.run("apply", "-f", "-", input=yaml.safe_dump(manifest), ns=False, check=True)


def test_a_webhook_that_is_down_is_retried_until_it_is_gone(
    kube: Kube, fast_operator: OperatorProcess
) -> None:
    name = f"down-{kube.namespace}"[:63]
    webhook = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": name},
        "webhooks": [
            {
                "name": "down.gpujob.test",
                # Port 1 on loopback: nothing listens, the call fails at once.
                "clientConfig": {"url": "https://127.0.0.1:1/validate"},
                "rules": [
                    {
                        "apiGroups": [""],
                        "apiVersions": ["v1"],
                        "operations": ["CREATE"],
                        "resources": ["pods"],
                    }
                ],
                "namespaceSelector": {
                    "matchLabels": {"kubernetes.io/metadata.name": kube.namespace}
                },
                "failurePolicy": "Fail",
                "sideEffects": "None",
                "admissionReviewVersions": ["v1"],
                "timeoutSeconds": 2,
            }
        ],
    }
    cluster_object(kube, webhook)
    try:
        kube.apply(job("hooked", "print('ran')", nodes=2, gpus=0))
        cond = wait_reason(kube, "hooked", c.CREATED, c.ADMISSION_WEBHOOK_UNAVAILABLE)
        assert 'failed calling webhook "down.gpujob.test"' in cond["message"], cond
        assert job_status(kube, "hooked")["phase"] == "Pending"
    finally:
        kube.run("delete", "validatingwebhookconfiguration", name, ns=False)
    status = wait_job_phase(kube, "hooked", ("Succeeded", "Failed"), timeout=90)
    assert status["phase"] == "Succeeded", status
    assert condition(kube, "hooked", c.CREATED)["reason"] == c.PODS_CREATED
    no_tracebacks(fast_operator)


def test_an_admission_policy_denial_fails_the_job_with_its_message(
    kube: Kube, fast_operator: OperatorProcess
) -> None:
    name = f"no-gpu-{kube.namespace}"[:63]
    policy = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": name},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {
                "resourceRules": [
                    {
                        "apiGroups": [""],
                        "apiVersions": ["v1"],
                        "operations": ["CREATE"],
                        "resources": ["pods"],
                    }
                ]
            },
            "validations": [
                {
                    "expression": "object.spec.containers.all(c, !has(c.resources.limits) || "
                    "!('nvidia.com/gpu' in c.resources.limits))",
                    "message": "GPUs are not for this namespace",
                }
            ],
        },
    }
    binding = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": name},
        "spec": {
            "policyName": name,
            "validationActions": ["Deny"],
            "matchResources": {
                "namespaceSelector": {
                    "matchLabels": {"kubernetes.io/metadata.name": kube.namespace}
                }
            },
        },
    }
    cluster_object(kube, policy)
    cluster_object(kube, binding)
    try:
        # The policy is enforced once the API server has loaded it: a plain pod says when.
        def denied() -> bool:
            probe = {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": "probe"},
                "spec": {
                    "containers": [
                        {
                            "name": "c",
                            "image": "x",
                            "resources": {"limits": {"nvidia.com/gpu": "1"}},
                        }
                    ]
                },
            }
            res = kube.run("create", "--dry-run=server", "-f", "-", input=yaml.safe_dump(probe))
            return res.returncode != 0 and "GPUs are not for this namespace" in res.stderr

        wait_until(denied, 30, "the admission policy in force")
        kube.apply(job("denied", "print('never')", nodes=2, gpus=1))
        status = wait_job_phase(kube, "denied", ("Failed",), timeout=60)
        cond = condition(kube, "denied", c.FAILED)
        assert cond["reason"] == c.ADMISSION_POLICY_DENIED, cond
        assert "GPUs are not for this namespace" in cond["message"], cond
        assert status["failure"]["reason"] == c.ADMISSION_POLICY_DENIED
        assert not job_pods(kube, "denied")
        no_tracebacks(fast_operator)
    finally:
        kube.run("delete", "validatingadmissionpolicybinding", name, ns=False)
        kube.run("delete", "validatingadmissionpolicy", name, ns=False)
