"""The node agent's pod-to-process contract: env, expansion, downward API, hosts files."""

from __future__ import annotations

import pytest

from gpujob_localcluster import containers, podenv

POD = {
    "metadata": {
        "name": "job-node-1",
        "namespace": "ml",
        "uid": "u-1",
        "labels": {"gpujob.dev/node-rank": "1"},
    },
    "spec": {
        "nodeName": "gpu-node-0",
        "hostname": "job-node-1",
        "subdomain": "job",
        "serviceAccountName": "sa",
    },
    "status": {"podIP": "127.1.0.2", "hostIP": "127.0.0.1", "podIPs": [{"ip": "127.1.0.2"}]},
}


def test_expand_follows_kubernetes_rules() -> None:
    env = {"A": "1", "B": "two"}
    assert podenv.expand("x$(A)-$(B)", env) == "x1-two"
    assert podenv.expand("$(MISSING)", env) == "$(MISSING)"
    assert podenv.expand("$$(A)", env) == "$(A)"


def test_env_resolves_values_fieldrefs_and_earlier_vars() -> None:
    container = {
        "env": [
            {
                "name": "RANK",
                "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['gpujob.dev/node-rank']"}},
            },
            {"name": "IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
            {"name": "ADDR", "value": "$(IP):9400"},
            {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
            {"name": "CPUS", "valueFrom": {"resourceFieldRef": {"resource": "limits.cpu"}}},
        ],
        "resources": {"limits": {"cpu": "1500m"}},
    }
    env = podenv.container_env(POD, container)
    assert env == {
        "RANK": "1",
        "IP": "127.1.0.2",
        "ADDR": "127.1.0.2:9400",
        "NODE": "gpu-node-0",
        "CPUS": "2",
    }


def test_missing_required_configmap_key_is_an_error() -> None:
    container = {
        "env": [{"name": "X", "valueFrom": {"configMapKeyRef": {"name": "cm", "key": "k"}}}]
    }
    with pytest.raises(ValueError, match="configMapKeyRef cm/k"):
        podenv.container_env(POD, container)
    ok = podenv.container_env(POD, container, lambda kind, name, key: "v")
    assert ok == {"X": "v"}


def test_hosts_file_maps_every_peer_name() -> None:
    peer = {
        "metadata": {"name": "job-node-0", "namespace": "ml"},
        "spec": {"hostname": "job-node-0", "subdomain": "job"},
    }
    text = podenv.hosts_file(POD, "127.1.0.2", [(POD, "127.1.0.2"), (peer, "127.1.0.1")])
    assert (
        "127.1.0.1\tjob-node-0.job.ml.svc.cluster.local job-node-0.job.ml.svc job-node-0.job.ml job-node-0.job"
        in text
    )
    assert text.count("127.1.0.2") == 1


def test_termination_tail_is_bounded() -> None:
    text = "\n".join(f"line {i}" for i in range(1000))
    tail = podenv.termination_tail(text)
    assert tail.endswith("line 999") and len(tail.encode()) <= 2048 and "line 900" not in tail


def test_kubernetes_service_env_names_the_api_server() -> None:
    env = podenv.kubernetes_service_env("127.0.0.1", 6443)
    assert env["KUBERNETES_SERVICE_HOST"] == "127.0.0.1"
    assert env["KUBERNETES_SERVICE_PORT"] == "6443"
    assert env["KUBERNETES_PORT"] == "tcp://127.0.0.1:6443"


def test_a_pod_never_inherits_the_callers_pythonpath(monkeypatch: pytest.MonkeyPatch) -> None:
    """What a pod imports depends on its spec and the venv, not on the shell that ran make."""
    monkeypatch.setenv("PYTHONPATH", "/somewhere/else")
    monkeypatch.setenv("HOME", "/home/me")
    env = containers.base_env("127.0.0.1", 6443)
    assert "PYTHONPATH" not in env
    assert env["HOME"] == "/home/me"
    assert env["KUBERNETES_SERVICE_HOST"] == "127.0.0.1"
