"""The kubelet's probe rules: defaults, thresholds, initial verdicts, ports, one real check."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator

import pytest

from gpujob_localcluster import probes


def probe(kind: str = "readiness", **spec: object) -> probes.Probe:
    container = {f"{kind}Probe": {"httpGet": {"path": "/h", "port": 80}, **spec}}
    (p,) = probes.probes_of(container)
    return p


def test_defaults_are_the_kubelets() -> None:
    p = probe()
    assert (p.initial_delay, p.period, p.timeout) == (0, 10, 1)
    assert (p.success_threshold, p.failure_threshold) == (1, 3)
    assert p.action == "httpGet"


def test_startup_comes_first() -> None:
    container = {
        "readinessProbe": {"tcpSocket": {"port": 1}},
        "livenessProbe": {"tcpSocket": {"port": 1}},
        "startupProbe": {"exec": {"command": ["true"]}},
    }
    assert [p.kind for p in probes.probes_of(container)] == ["startup", "liveness", "readiness"]


def test_readiness_needs_success_threshold_consecutive_passes() -> None:
    state = probes.ProbeState(probe(successThreshold=2, failureThreshold=2))
    assert not state.passing and state.verdict is None
    assert state.record(True) is None
    assert state.record(False) is None  # the run of successes is broken
    assert state.record(True) is None
    assert state.record(True) == "passed" and state.passing
    assert state.record(False) is None
    assert state.record(False) == "failed" and not state.passing
    assert state.record(False) is None  # already failed: no second flip


def test_liveness_starts_healthy_and_fails_at_the_threshold() -> None:
    state = probes.ProbeState(probe("liveness", failureThreshold=3))
    assert state.passing
    assert [state.record(False) for _ in range(3)] == [None, None, "failed"]


def test_startup_that_never_passes_fails_at_the_threshold() -> None:
    state = probes.ProbeState(probe("startup", failureThreshold=2))
    assert not state.passing
    assert [state.record(False), state.record(False)] == [None, "failed"]


def test_named_and_numeric_ports() -> None:
    container = {"ports": [{"name": "health", "containerPort": 8080}]}
    assert probes.resolve_port("health", container) == 8080
    assert probes.resolve_port(81, container) == 81
    assert probes.resolve_port("82", container) == 82
    with pytest.raises(ValueError, match="not a named port"):
        probes.resolve_port("metrics", container)


def test_http_parts_default_to_the_pod_ip() -> None:
    handler = {"port": 8080, "path": "healthz", "httpHeaders": [{"name": "X", "value": "1"}]}
    assert probes.http_url_parts(handler, "127.9.0.1", {}) == (
        "http",
        "127.9.0.1",
        8080,
        "/healthz",
        [("X", "1")],
    )


@pytest.fixture
def server() -> Iterator[int]:
    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            self.send_response(200 if self.path == "/ok" else 503)
            self.end_headers()

    httpd = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield int(httpd.server_address[1])
    httpd.shutdown()


def test_http_and_tcp_checks_against_a_real_server(server: int) -> None:
    ok = probe(httpGet={"path": "/ok", "port": server})
    assert probes.check(ok, "127.0.0.1", {}) == (True, "")
    passed, message = probes.check(probe(httpGet={"path": "/no", "port": server}), "127.0.0.1", {})
    assert not passed and "statuscode: 503" in message
    tcp = probes.probes_of({"livenessProbe": {"tcpSocket": {"port": server}}})[0]
    assert probes.check(tcp, "127.0.0.1", {})[0]


def test_grpc_is_reported_unsupported_not_raised() -> None:
    (p,) = probes.probes_of({"readinessProbe": {"grpc": {"port": 1}}})
    passed, message = probes.check(p, "127.0.0.1", {})
    assert not passed and "not supported" in message
