"""Reads of the local cluster over HTTPS from the test process, instead of a kubectl each.

Tests poll: a ``wait_until`` on a job's status reads it ten times a second, and a kubectl
process costs about 70 ms of CPU a call (start-up, discovery cache, decoding), so a single
wait took close to half a core from the two that the cluster, the operator and the trainers
under test share. One GET here costs a few milliseconds. Only plain reads of the kinds
tests poll come this way, and only with the admin kubeconfig (client certificate files);
anything else still goes through kubectl, whose behaviour is the reference: a failed read
is ``None`` (kubectl's non-zero exit), a failed list raises, a hung server raises, and 429s
are waited out.
"""

from __future__ import annotations

import http.client
import json
import ssl
import threading
import time
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from gpujob_operator.api.job import GROUP, KIND, PLURAL, VERSION


@dataclass(frozen=True)
class Resource:
    """Where a kind lives in the API: its path prefix, its plural, its scope and its kind."""

    prefix: str
    plural: str
    namespaced: bool
    kind: str

    @property
    def api_version(self) -> str:
        return self.prefix.removeprefix("/api/").removeprefix("/apis/")


def _core(plural: str, kind: str, namespaced: bool = True) -> Resource:
    return Resource("/api/v1", plural, namespaced, kind)


_RESOURCES = [
    _core("pods", "Pod"),
    _core("events", "Event"),
    _core("serviceaccounts", "ServiceAccount"),
    _core("resourcequotas", "ResourceQuota"),
    _core("secrets", "Secret"),
    _core("configmaps", "ConfigMap"),
    _core("services", "Service"),
    _core("nodes", "Node", namespaced=False),
    Resource(f"/apis/{GROUP}/{VERSION}", PLURAL, True, KIND),
]
RESOURCES: dict[str, Resource] = {}
"""The names kubectl accepts for each kind tests poll: singular, plural, the plural's
group-qualified form."""
for _r in _RESOURCES:
    for _name in (_r.kind.lower(), _r.plural, f"{_r.plural}.{GROUP}" if _r.kind == KIND else ""):
        if _name:
            RESOURCES[_name] = _r


class ReadFailed(Exception):
    """The API server could not be reached or did not answer 200."""


@dataclass(frozen=True)
class _Target:
    host: str
    port: int
    context: ssl.SSLContext


_targets: dict[tuple[str, int], _Target | None] = {}
_targets_lock = threading.Lock()
_local = threading.local()


def _target(kubeconfig: Path) -> _Target | None:
    """The server and TLS context of a client-certificate kubeconfig (cached while the file
    is unchanged: a cluster started again in its folder writes a new one); ``None`` when it
    authenticates any other way."""
    try:
        key = (str(kubeconfig), kubeconfig.stat().st_mtime_ns)
    except OSError:
        return None
    with _targets_lock:
        if key in _targets:
            return _targets[key]
    try:
        target = _parse_kubeconfig(kubeconfig)
    except Exception:  # half written, another shape, unreadable: kubectl says why
        target = None
    with _targets_lock:
        _targets[key] = target
    return target


def _parse_kubeconfig(kubeconfig: Path) -> _Target | None:
    cfg = yaml.safe_load(kubeconfig.read_text())
    current = next(c["context"] for c in cfg["contexts"] if c["name"] == cfg["current-context"])
    cluster = next(c["cluster"] for c in cfg["clusters"] if c["name"] == current["cluster"])
    user = next(u["user"] for u in cfg["users"] if u["name"] == current["user"])
    if not (
        {"client-certificate", "client-key"} <= user.keys() and "certificate-authority" in cluster
    ):
        return None
    url = urllib.parse.urlsplit(cluster["server"])
    if url.scheme != "https" or not url.hostname or not url.port:
        return None
    here = kubeconfig.parent  # kubectl reads relative paths from the kubeconfig's folder
    ctx = ssl.create_default_context(cafile=here / cluster["certificate-authority"])
    ctx.load_cert_chain(here / user["client-certificate"], here / user["client-key"])
    return _Target(url.hostname, url.port, ctx)


def _connection(target: _Target) -> http.client.HTTPSConnection:
    """This thread's kept-alive connection to ``target`` (tests that poll from threads each
    get their own)."""
    conns: dict[_Target, http.client.HTTPSConnection] = _local.__dict__.setdefault("conns", {})
    conn = conns.get(target)
    if conn is None:
        conn = http.client.HTTPSConnection(
            target.host, target.port, context=target.context, timeout=30
        )
        conns[target] = conn
    return conn


THROTTLE_TRIES = 5
"""Answers of 429 (the API server's priority and fairness) waited out, as kubectl does."""


def _get(target: _Target, path: str) -> dict[str, Any]:
    throttled = 0
    fresh = False
    while True:
        conn = _connection(target)
        try:
            conn.request("GET", path, headers={"Accept": "application/json"})
            resp = conn.getresponse()
            body = resp.read()
        except TimeoutError:
            conn.close()
            raise  # a hung server is an error, as kubectl's timeout was; never "not found"
        except (OSError, http.client.HTTPException) as e:
            conn.close()
            if fresh:
                raise ReadFailed(f"GET {path}: {e}") from e
            fresh = True  # a kept-alive connection the server closed: once more, afresh
            continue
        if resp.status == 429 and throttled < THROTTLE_TRIES:
            throttled += 1
            time.sleep(min(float(resp.headers.get("Retry-After") or 1), 5.0))
            continue
        if resp.status != 200:
            raise ReadFailed(f"GET {path}: {resp.status} {body[:300]!r}")
        result: dict[str, Any] = json.loads(body)
        return result


def _as_kubectl_prints(obj: dict[str, Any]) -> dict[str, Any]:
    """kubectl leaves out managedFields unless asked for them."""
    (obj.get("metadata") or {}).pop("managedFields", None)
    return obj


def _path(res: Resource, namespace: str, name: str = "") -> str:
    scope = f"/namespaces/{namespace}" if res.namespaced else ""
    return f"{res.prefix}{scope}/{res.plural}" + (f"/{urllib.parse.quote(name)}" if name else "")


def reader(kubeconfig: Path, kind: str) -> tuple[_Target, Resource] | None:
    """How to read ``kind`` without kubectl, or ``None`` when kubectl must."""
    res = RESOURCES.get(kind.lower())
    target = _target(kubeconfig) if res else None
    return (target, res) if target and res else None


def get(how: tuple[_Target, Resource], namespace: str, name: str) -> dict[str, Any] | None:
    """One object as ``kubectl get -o json`` prints it (``how``: `reader`'s answer);
    ``None`` when it cannot be read."""
    target, res = how
    if not name:  # kubectl needs a name here; an empty one would read the whole list
        return None
    try:
        return _as_kubectl_prints(_get(target, _path(res, namespace, name)))
    except ReadFailed:
        return None


def list_items(
    how: tuple[_Target, Resource], namespace: str, selector: str | None
) -> list[dict[str, Any]]:
    """The items as ``kubectl get -o json`` lists them (each with its kind and apiVersion,
    which the API server leaves out of a list's items; ``how``: `reader`'s answer)."""
    target, res = how
    path = _path(res, namespace)
    if selector:
        path += "?" + urllib.parse.urlencode({"labelSelector": selector})
    try:
        items = _get(target, path).get("items") or []
    except ReadFailed as e:
        raise AssertionError(f"kubectl get {res.plural} failed: {e}") from e
    for item in items:
        _as_kubectl_prints(item)
        item.setdefault("apiVersion", res.api_version)
        item.setdefault("kind", res.kind)
    return list(items)
