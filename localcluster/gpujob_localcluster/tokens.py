"""Service-account tokens for projected volumes: the TokenRequest call and when to refresh.

The kubelet asks the TokenRequest API for a token bound to the pod (it dies with the pod)
and rewrites the file once 80% of the requested lifetime has passed, or after 24 hours,
whichever comes first; clients (client-go, the ``kubernetes`` package, kopf on a 401)
re-read the file. The timing is pure; :func:`request_token` is the one API call.
"""

from __future__ import annotations

from typing import Any, cast

from kubernetes import client

from gpujob_localcluster.volumes import TokenSource

MAX_REFRESH_AFTER = 24 * 3600.0
REFRESH_FRACTION = 0.8


def refresh_after(expiration_seconds: float) -> float:
    """Seconds after issue at which the kubelet replaces a token of that requested lifetime."""
    return min(REFRESH_FRACTION * expiration_seconds, MAX_REFRESH_AFTER)


def refresh_due(issued_at: float, expiration_seconds: float, now: float) -> bool:
    """Whether a token issued at ``issued_at`` must be replaced at ``now``."""
    return now >= issued_at + refresh_after(expiration_seconds)


def token_request(source: TokenSource, pod_name: str, pod_uid: str) -> dict[str, Any]:
    """The TokenRequest body: the volume's audience and lifetime, bound to the pod."""
    spec: dict[str, Any] = {
        "expirationSeconds": source.expiration_seconds,
        "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": pod_name, "uid": pod_uid},
    }
    # No audience: the API server's own (--api-audiences), as the kubelet leaves it.
    if source.audience:
        spec["audiences"] = [source.audience]
    return {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec}


def request_token(
    core: client.CoreV1Api, namespace: str, service_account: str, body: dict[str, Any]
) -> str:
    """Ask the API server for a token of ``namespace/service_account``."""
    resp: Any = core.create_namespaced_service_account_token(
        service_account, namespace, cast(Any, body)
    )
    return str(resp.status.token)
