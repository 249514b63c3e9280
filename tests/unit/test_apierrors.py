"""The refusal classifier: status code + metav1.Status in, reason and permanence out."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gpujob_operator.api import conditions as c
from gpujob_operator.lifecycle import refusals


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
        (403, "Forbidden", 'pods "x" is forbidden: failed quota: q: must specify limits.cpu for: trainer', c.QUOTA_EXCEEDED, False),
        (403, "Forbidden", PSA, c.POD_SECURITY_VIOLATION, True),
        (403, "Forbidden", 'pods "x" is forbidden: maximum cpu usage per Container is 1, but limit is 2', c.LIMIT_RANGE_VIOLATION, True),
        (403, "Forbidden", 'pods "x" is forbidden: minimum memory usage per Pod is 1Gi, but request is 1Mi', c.LIMIT_RANGE_VIOLATION, True),
        (403, "Forbidden", 'pods "x" is forbidden: cpu max limit to request ratio per Container is 2, but provided ratio is 4.000000', c.LIMIT_RANGE_VIOLATION, True),
        (422, "Invalid", 'Pod "x" is invalid: metadata.annotations: Too long: may not be more than 262144 bytes', c.INVALID_POD_TEMPLATE, True),
        (400, "BadRequest", "the body of the request was in an unknown format", c.CREATE_REFUSED, True),
        (403, "Forbidden", 'admission webhook "deny.example.com" denied the request: no GPUs on Fridays', c.ADMISSION_WEBHOOK_DENIED, True),
        (400, "BadRequest", 'admission webhook "v.example.com" denied the request without explanation', c.ADMISSION_WEBHOOK_DENIED, True),
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
