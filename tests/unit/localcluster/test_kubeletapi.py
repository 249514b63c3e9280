"""The kubelet container-logs endpoint: paths, query parameters, tails; and over real TLS."""

from __future__ import annotations

import ssl
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from gpujob_localcluster import kubeletapi
from gpujob_localcluster.pki import Pki


def test_paths_and_query_parameters() -> None:
    req = kubeletapi.parse_request(
        "/containerLogs/ns/pod-0/main?follow=true&previous=false&tailLines=5&limitBytes=100"
    )
    assert req == kubeletapi.LogRequest("ns", "pod-0", "main", True, False, 5, 100)
    assert kubeletapi.parse_request("/containerLogs/a/b/c").tail_lines is None
    with pytest.raises(kubeletapi.BadRequest) as e:
        kubeletapi.parse_request("/exec/a/b/c")
    assert e.value.status == 404
    with pytest.raises(kubeletapi.BadRequest, match="tailLines must be an integer"):
        kubeletapi.parse_request("/containerLogs/a/b/c?tailLines=x")


def test_tail() -> None:
    data = b"a\nb\nc"
    assert kubeletapi.tail(data, 2) == b"b\nc"
    assert kubeletapi.tail(data, 0) == b""
    assert kubeletapi.tail(data, 9) == data
    assert kubeletapi.tail(data, None) == data


def test_serves_logs_over_tls_only_to_clients_the_ca_signed(tmp_path: Path) -> None:
    pki = Pki(tmp_path / "pki")
    serving = pki.issue("kubelet", "node", sans=("IP:127.0.0.1",))
    client = pki.issue("client", "kube-apiserver-kubelet-client")
    log = tmp_path / "main.log"
    log.write_text("one\ntwo\nthree\n")

    def resolve(req: kubeletapi.LogRequest) -> kubeletapi.LogSource:
        if req.container != "main":
            raise kubeletapi.BadRequest(404, "no such container")
        return kubeletapi.LogSource(log, lambda: False)

    server = kubeletapi.KubeletServer(resolve, serving.cert, serving.key, pki.ca_cert).start()
    try:
        ctx = ssl.create_default_context(cafile=str(pki.ca_cert))
        ctx.load_cert_chain(str(client.cert), str(client.key))
        base = f"https://127.0.0.1:{server.port}/containerLogs/ns/p"
        with urllib.request.urlopen(f"{base}/main?tailLines=2", context=ctx) as r:
            assert r.read() == b"two\nthree\n"
        with urllib.request.urlopen(f"{base}/main?follow=true", context=ctx) as r:
            assert r.read() == b"one\ntwo\nthree\n"  # not growing: the stream ends
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(f"{base}/other", context=ctx)
        assert e.value.code == 404
        anonymous = ssl.create_default_context(cafile=str(pki.ca_cert))
        with pytest.raises((ssl.SSLError, urllib.error.URLError, ConnectionError)):
            urllib.request.urlopen(f"{base}/main", context=anonymous).read()
    finally:
        server.stop()
