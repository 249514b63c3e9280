"""The refusal classifier: status code + metav1.Status in, reason and permanence out."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gpujob_operator.api import conditions as c
from gpujob_operator.lifecycle.apiserver import refusals


def status(code: int, reason: str, message: str, **details: Any) -> str:
    """A metav1.Status body as the API server sends it."""
    body: dict[str, Any] = {
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
    if details:
        body["details"] = details
    return json.dumps(body)


QUOTA = (
    'pods "j-node-1" is forbidden: exceeded quota: gpu, requested: requests.nvidia.com/gpu=2, '
    "used: requests.nvidia.com/gpu=2, limited: requests.nvidia.com/gpu=2"
)
PSA = (
    'pods "j-node-0" is forbidden: violates PodSecurity "restricted:latest": privileged '
    '(container "trainer" must not set securityContext.privileged=true)'
)


@pytest.mark.parametrize(
    ("code", "reason", "message", "expected", "permanent"),
    [
        (403, "Forbidden", QUOTA, c.QUOTA_EXCEEDED, False),
        (403, "Forbidden", 'pods "x" is forbidden: failed quota: q: must specify limits.cpu for: trainer', c.QUOTA_REQUIREMENTS_UNMET, True),
        (403, "Forbidden", 'pods "x" is forbidden: failed quota: compute: must specify limits.cpu,limits.memory,requests.cpu,requests.memory', c.QUOTA_REQUIREMENTS_UNMET, True),
        (403, "Forbidden", 'pods "x" is forbidden: status unknown for quota: compute, resources: requests.cpu', c.QUOTA_EXCEEDED, False),
        (403, "Forbidden", "pods is forbidden: insufficient quota to consume: requests.nvidia.com/gpu", c.QUOTA_EXCEEDED, False),
        (403, "Forbidden", 'pods is forbidden: User "system:serviceaccount:quota-team:gpujob" cannot create resource "pods" in API group "" in the namespace "quota-team"', c.OPERATOR_FORBIDDEN, False),
        (403, "Forbidden", 'workloads.kueue.x-k8s.io is forbidden: User "system:serviceaccount:gpujob:quota-exceeded-sa" cannot create resource "workloads" in API group "kueue.x-k8s.io" in the namespace "ml"', c.OPERATOR_FORBIDDEN, False),
        (403, "Forbidden", 'pods "quota-run-node-0" is forbidden: no PriorityClass with name urgent was found', c.CREATE_REFUSED, False),
        (403, "Forbidden", PSA, c.POD_SECURITY_VIOLATION, True),
        (403, "Forbidden", 'pods "x" is forbidden: the string value of PreemptionPolicy (Never) must not be provided in pod spec; priority admission controller computed PreemptLowerPriority from the given PriorityClass name', c.INVALID_POD_TEMPLATE, True),
        (403, "Forbidden", 'pods "x" is forbidden: maximum cpu usage per Container is 1, but limit is 2', c.LIMIT_RANGE_VIOLATION, True),
        (403, "Forbidden", 'pods "x" is forbidden: minimum memory usage per Pod is 1Gi, but request is 1Mi', c.LIMIT_RANGE_VIOLATION, True),
        (403, "Forbidden", 'pods "x" is forbidden: cpu max limit to request ratio per Container is 2, but provided ratio is 4.000000', c.LIMIT_RANGE_VIOLATION, True),
        (422, "Invalid", 'Pod "x" is invalid: metadata.annotations: Too long: may not be more than 262144 bytes', c.INVALID_POD_TEMPLATE, True),
        (400, "BadRequest", "the body of the request was in an unknown format", c.CREATE_REFUSED, True),
        (400, "BadRequest", 'Pod in version "v1" cannot be handled as a Pod: strict decoding error: unknown field "spec.containers[0].livenessProbe.initialDelaySecond"', c.INVALID_POD_TEMPLATE, True),
        (400, "BadRequest", "Pod in version \"v1\" cannot be handled as a Pod: quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'", c.INVALID_POD_TEMPLATE, True),
        (403, "Forbidden", 'admission webhook "deny.example.com" denied the request: no GPUs on Fridays', c.ADMISSION_WEBHOOK_DENIED, False),
        (400, "BadRequest", 'admission webhook "v.example.com" denied the request without explanation', c.ADMISSION_WEBHOOK_DENIED, False),
        (403, "Forbidden", 'admission webhook "budget.example.com" denied the request: team quota-team exceeded quota: GPU budget spent for today', c.ADMISSION_WEBHOOK_DENIED, False),
        (500, "InternalError", 'Internal error occurred: failed calling webhook "v.example.com": failed to call webhook: Post "https://svc:443/validate": dial tcp 10.0.0.1:443: connect: connection refused', c.ADMISSION_WEBHOOK_UNAVAILABLE, False),
        (422, "Invalid", "pods \"x\" is forbidden: ValidatingAdmissionPolicy 'gpu-limits' with binding 'b' denied request: too many GPUs", c.ADMISSION_POLICY_DENIED, True),
        (429, "TooManyRequests", "the server has received too many requests and has asked us to try again later", c.API_THROTTLED, False),
        (500, "InternalError", "Internal error occurred: etcdserver: request timed out", c.API_SERVER_ERROR, False),
        (503, "ServiceUnavailable", "the server is currently unable to handle the request", c.API_SERVER_ERROR, False),
        (504, "Timeout", "the server was unable to return a response in the time allotted", c.API_SERVER_ERROR, False),
        (409, "Conflict", "Operation cannot be fulfilled: the object has been modified", c.API_CONFLICT, False),
        (401, "Unauthorized", "Unauthorized", c.API_UNAUTHORIZED, False),
        (403, "Forbidden", 'pods is forbidden: User "system:serviceaccount:op:gpujob" cannot create resource "pods" in API group "" in the namespace "ml"', c.OPERATOR_FORBIDDEN, False),
        (403, "Forbidden", 'pods "x" is forbidden: no PriorityClass with name urgent was found', c.CREATE_REFUSED, False),
        (418, "", "I'm a teapot", c.API_ERROR, False),
    ],
)  # fmt: skip
def test_classifies_the_servers_refusals(
    code: int, reason: str, message: str, expected: str, permanent: bool
) -> None:
    r = refusals.classify(code, status(code, reason, message))
    assert (r.reason, r.permanent) == (expected, permanent)
    assert r.message == message and r.code == code
    assert expected in c.REFUSAL_REASONS


def test_only_a_webhooks_denial_is_retried_for_a_bounded_time() -> None:
    """Budget and capacity webhooks deny "for now": retried, but only for the job's window."""
    denied = 'admission webhook "budget.example.com" denied the request: GPU budget spent'
    r = refusals.classify(403, status(403, "Forbidden", denied))
    assert (r.reason, r.permanent, r.bounded) == (c.ADMISSION_WEBHOOK_DENIED, False, True)
    down = 'Internal error occurred: failed calling webhook "budget.example.com": timeout'
    assert not refusals.classify(500, status(500, "InternalError", down)).bounded
    assert not refusals.classify(403, status(403, "Forbidden", QUOTA)).bounded


def test_a_quota_requirement_names_the_quota_and_the_spec_fields_to_set() -> None:
    old = 'pods "j-node-0" is forbidden: failed quota: compute: must specify limits.cpu,requests.memory'
    new = (
        'pods "j-node-0" is forbidden: failed quota: compute: must specify limits.cpu for: '
        "trainer; requests.memory for: trainer"
    )
    for message in (old, new):
        r = refusals.classify(403, status(403, "Forbidden", message))
        assert r.reason == c.QUOTA_REQUIREMENTS_UNMET and r.permanent and not r.bounded
        assert r.advice is not None
        assert "ResourceQuota compute requires every container to set limits.cpu, " in r.advice
        assert "spec.resources.limits.cpu, spec.resources.requests.memory" in r.advice
    bare = 'pods "x" is forbidden: failed quota: q: must specify cpu'
    advice = refusals.classify(403, status(403, "Forbidden", bare)).advice
    assert advice is not None and "spec.resources.requests.cpu" in advice
    other = 'pods "x" is forbidden: failed quota: q: spec.containers[0].resources: Invalid value'
    r = refusals.classify(403, status(403, "Forbidden", other))
    assert r.reason == c.QUOTA_REQUIREMENTS_UNMET and r.advice and "ResourceQuota q" in r.advice


def test_quota_is_read_from_the_quota_plugins_phrases_not_the_word() -> None:
    """A name holding "quota" (namespace, ServiceAccount, pod) is no quota refusal."""
    for message in (
        'pods "quota-node-0" is forbidden: unable to validate against any security policy',
        'pods is forbidden: User "system:serviceaccount:quota:gpujob" cannot create resource '
        '"pods" in API group "" in the namespace "quota"',
    ):
        assert refusals.classify(403, status(403, "Forbidden", message)).reason not in (
            c.QUOTA_EXCEEDED,
            c.QUOTA_REQUIREMENTS_UNMET,
        )
    assert refusals.classify(403, status(403, "Forbidden", "forbidden: exceeded quota: q, "
                                         "requested: pods=1, used: pods=1, limited: pods=1")).reason == c.QUOTA_EXCEEDED  # fmt: skip


def test_invalid_objects_other_than_pods_are_the_operators() -> None:
    body = status(422, "Invalid", 'Service "x" is invalid: metadata.name: Invalid value')
    assert refusals.classify(422, body, kind="service").reason == c.INVALID_OBJECT


def test_retry_after_comes_from_the_header_or_the_status_details() -> None:
    body = status(429, "TooManyRequests", "slow down", retryAfterSeconds=7)
    assert refusals.classify(429, body).retry_after == 7.0
    assert refusals.classify(429, body, {"Retry-After": "3"}).retry_after == 3.0
    assert refusals.classify(500, status(500, "InternalError", "x")).retry_after is None


def test_a_body_that_is_not_a_status_still_gives_a_message() -> None:
    r = refusals.classify(502, "<html>Bad Gateway</html>")
    assert r.reason == c.API_SERVER_ERROR and r.message == "<html>Bad Gateway</html>"
    assert refusals.classify(503, None).message == "HTTP 503"


def test_long_messages_are_truncated() -> None:
    r = refusals.classify(422, status(422, "Invalid", "x" * 5000))
    assert len(r.message) == refusals.MESSAGE_MAX_CHARS and r.message.endswith("...")


class FakeApiException(Exception):
    """Shaped like kubernetes.client.rest.ApiException (status, reason, body, headers)."""

    def __init__(self, status_code: int, body: str, headers: dict[str, str] | None = None):
        super().__init__(f"({status_code})")
        self.status, self.body, self.headers, self.reason = status_code, body, headers, "x"


def test_classify_exception_reads_api_exceptions_and_network_errors() -> None:
    exc = FakeApiException(403, status(403, "Forbidden", QUOTA), {"Retry-After": "2"})
    r = refusals.classify_exception(exc)
    assert (r.reason, r.retry_after) == (c.QUOTA_EXCEEDED, 2.0)
    assert refusals.classify_exception(ConnectionRefusedError("refused")).reason == (
        c.API_UNREACHABLE
    )
    assert refusals.classify_exception(TimeoutError()).reason == c.API_UNREACHABLE
    bug = refusals.classify_exception(KeyError("metadata"))
    assert bug.reason == c.API_ERROR and not bug.expected


def test_classify_exception_reads_the_real_client_exception() -> None:
    from kubernetes.client.rest import ApiException

    exc = ApiException(status=422, reason="Unprocessable Entity")
    exc.body = status(422, "Invalid", 'Pod "x" is invalid: spec.volumes[0].name: Required value')
    r = refusals.classify_exception(exc)
    assert r.reason == c.INVALID_POD_TEMPLATE and "spec.volumes[0].name" in r.message


def test_an_invalid_endpoint_guard_is_the_operators_settings_retried_not_the_jobs_failure() -> None:
    from gpujob_operator.lifecycle.apiserver.refusals import ENDPOINT_GUARD, classify

    message = 'NetworkPolicy.networking.k8s.io "j-endpoints-1" is invalid: spec.ingress[1].from[1].ipBlock.cidr: Invalid value: "10.0.0/8"'
    r = classify(422, {"message": message, "reason": "Invalid"}, kind=ENDPOINT_GUARD)
    assert not r.permanent and r.advice is not None and "jobEndpoints" in r.advice
    assert classify(422, {"message": message, "reason": "Invalid"}, kind="service").permanent
