"""Container probes as the kubelet runs them: the spec, the result state machine, one check.

The state machine (:class:`ProbeState`) is pure: a result flips only after
``successThreshold`` consecutive successes or ``failureThreshold`` consecutive failures,
readiness and startup start out failed, liveness starts out passing. :func:`check` runs
one httpGet or tcpSocket probe (exec goes through a runner the agent hands in).
"""

from __future__ import annotations

import http.client
import socket
import ssl
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

KINDS = ("startup", "liveness", "readiness")
ACTIONS = ("httpGet", "tcpSocket", "exec", "grpc")


@dataclass(frozen=True)
class Probe:
    """One probe of one container, with the kubelet's defaults filled in."""

    kind: str
    action: str
    handler: Mapping[str, Any]
    initial_delay: float = 0.0
    period: float = 10.0
    timeout: float = 1.0
    success_threshold: int = 1
    failure_threshold: int = 3
    termination_grace: float | None = None

    @property
    def initially_passing(self) -> bool:
        """Liveness is assumed healthy until proven otherwise; readiness/startup are not."""
        return self.kind == "liveness"


def probes_of(container: Mapping[str, Any]) -> list[Probe]:
    """The container's probes, startup first (it gates the other two)."""
    out = []
    for kind in KINDS:
        spec = container.get(f"{kind}Probe")
        if not spec:
            continue
        action = next((a for a in ACTIONS if a in spec), "")
        grace = spec.get("terminationGracePeriodSeconds")
        out.append(
            Probe(
                kind=kind,
                action=action,
                handler=spec.get(action) or {},
                initial_delay=float(spec.get("initialDelaySeconds") or 0),
                period=float(spec.get("periodSeconds") or 10),
                timeout=float(spec.get("timeoutSeconds") or 1),
                # Liveness and startup must use 1 (the API server enforces it).
                success_threshold=int(spec.get("successThreshold") or 1),
                failure_threshold=int(spec.get("failureThreshold") or 3),
                termination_grace=None if grace is None else float(grace),
            )
        )
    return out


@dataclass
class ProbeState:
    """Consecutive results of one probe and the verdict they add up to.

    ``verdict`` is None until the first threshold is reached, except for liveness, which
    is assumed healthy from the start.
    """

    probe: Probe
    verdict: bool | None = field(init=False)
    successes: int = 0
    failures: int = 0
    last_message: str = ""

    def __post_init__(self) -> None:
        self.verdict = True if self.probe.initially_passing else None

    @property
    def passing(self) -> bool:
        return self.verdict is True

    def record(self, ok: bool, message: str = "") -> str | None:
        """Add one result; ``"passed"`` or ``"failed"`` when the verdict changes, else None."""
        self.last_message = message
        if ok:
            self.successes, self.failures = self.successes + 1, 0
            if self.verdict is not True and self.successes >= self.probe.success_threshold:
                self.verdict = True
                return "passed"
        else:
            self.failures, self.successes = self.failures + 1, 0
            if self.verdict is not False and self.failures >= self.probe.failure_threshold:
                self.verdict = False
                return "failed"
        return None


def resolve_port(port: Any, container: Mapping[str, Any]) -> int:
    """A probe's ``port``: a number, or the name of one of the container's ports."""
    if isinstance(port, int):
        return port
    text = str(port)
    if text.isdigit():
        return int(text)
    for p in container.get("ports") or []:
        if p.get("name") == text:
            return int(p["containerPort"])
    raise ValueError(f"port {text!r} is not a named port of the container")


def http_url_parts(
    handler: Mapping[str, Any], pod_ip: str, container: Mapping[str, Any]
) -> tuple[str, str, int, str, list[tuple[str, str]]]:
    """(scheme, host, port, path, headers) of an httpGet probe; the host defaults to the pod IP."""
    scheme = str(handler.get("scheme") or "HTTP").lower()
    host = str(handler.get("host") or pod_ip)
    port = resolve_port(handler.get("port"), container)
    path = str(handler.get("path") or "/")
    if not path.startswith("/"):
        path = "/" + path
    headers = [(str(h["name"]), str(h.get("value", ""))) for h in handler.get("httpHeaders") or []]
    return scheme, host, port, path, headers


ExecRunner = Callable[[Sequence[str], float], tuple[int, str]]


def check(
    probe: Probe,
    pod_ip: str,
    container: Mapping[str, Any],
    exec_runner: ExecRunner | None = None,
) -> tuple[bool, str]:
    """Run the probe once: (passed, message). Never raises: an error is a failure."""
    try:
        if probe.action == "httpGet":
            return _http(probe, pod_ip, container)
        if probe.action == "tcpSocket":
            host = str(probe.handler.get("host") or pod_ip)
            port = resolve_port(probe.handler.get("port"), container)
            with socket.create_connection((host, port), timeout=probe.timeout):
                return True, ""
        if probe.action == "exec" and exec_runner is not None:
            code, output = exec_runner(list(probe.handler.get("command") or []), probe.timeout)
            return code == 0, output[-1024:]
        return False, f"{probe.action or 'an empty'} probe is not supported by the local node agent"
    except (OSError, ValueError, http.client.HTTPException) as e:
        return False, f"{type(e).__name__}: {e}"


def _http(probe: Probe, pod_ip: str, container: Mapping[str, Any]) -> tuple[bool, str]:
    scheme, host, port, path, headers = http_url_parts(probe.handler, pod_ip, container)
    conn: http.client.HTTPConnection
    if scheme == "https":  # the kubelet does not verify a probe's certificate either
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        conn = http.client.HTTPSConnection(host, port, timeout=probe.timeout, context=ctx)
    else:
        conn = http.client.HTTPConnection(host, port, timeout=probe.timeout)
    try:
        sent = {"User-Agent": "kube-probe/1.37", "Accept": "*/*"}
        sent.update(dict(headers))
        conn.request("GET", path, headers=sent)
        resp = conn.getresponse()
        body = resp.read(10 * 1024)
    finally:
        conn.close()
    if 200 <= resp.status < 400:
        return True, ""
    return False, f"HTTP probe failed with statuscode: {resp.status} {body[:200]!r}"
