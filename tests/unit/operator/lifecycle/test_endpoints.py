"""Who can reach a job's endpoints: its NetworkPolicy judged rule by rule, and its token.

The policy is checked with a small evaluator of NetworkPolicy's ingress semantics (a rule
admits a source when one of its peers matches, or it has none; and a port when one of its
entries matches, or it has none), since the local cluster runs no network plugin that could
enforce it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pytest

from gpujob_operator import api
from gpujob_operator.api.hostports import rank_ports
from gpujob_operator.lifecycle import builders, endpoints
from gpujob_operator.lifecycle.endpoints import PolicySettings
from gpujob_trainer.contract import ENV_ENDPOINT_TOKEN

OPERATOR_LABELS = {"app.kubernetes.io/name": "gpujob", "app.kubernetes.io/component": "operator"}
OPERATOR = {
    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "gpujob-system"}},
    "podSelector": {"matchLabels": OPERATOR_LABELS},
}
PROMETHEUS = {
    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
    "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}},
}


@dataclass(frozen=True)
class Source:
    namespace: str
    labels: Mapping[str, str]


OPERATOR_POD = Source("gpujob-system", OPERATOR_LABELS)
PROMETHEUS_POD = Source("monitoring", {"app.kubernetes.io/name": "prometheus"})
SAME_JOB = Source("ml", {"gpujob.dev/job-name": "bert", "gpujob.dev/node-rank": "1"})
OTHER_JOB = Source("ml", {"gpujob.dev/job-name": "gpt"})
TENANT = Source("team-b", {"app": "notebook"})
# Operator's labels, wrong namespace: a tenant's pod dressed as the operator.
IMPOSTOR = Source("team-b", OPERATOR_LABELS)


def _selects(selector: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    assert set(selector) <= {"matchLabels"}, "the evaluator knows matchLabels only"
    return all(labels.get(k) == v for k, v in (selector.get("matchLabels") or {}).items())


def _peer_matches(peer: Mapping[str, Any], src: Source, policy_ns: str) -> bool:
    assert set(peer) <= {"podSelector", "namespaceSelector"}, peer
    if "namespaceSelector" in peer:
        ns_ok = _selects(peer["namespaceSelector"], {"kubernetes.io/metadata.name": src.namespace})
    else:
        ns_ok = src.namespace == policy_ns
    return ns_ok and _selects(peer.get("podSelector") or {}, src.labels)


def _port_matches(entry: Mapping[str, Any], port: int, protocol: str) -> bool:
    if entry.get("protocol", "TCP") != protocol:
        return False
    if "port" not in entry:
        return True
    return int(entry["port"]) <= port <= int(entry.get("endPort", entry["port"]))


def admits(policy: Mapping[str, Any], src: Source, port: int, protocol: str = "TCP") -> bool:
    ns = policy["metadata"]["namespace"]
    for rule in policy["spec"]["ingress"]:
        peers, ports = rule.get("from"), rule.get("ports")
        if peers is not None and not peers:
            pytest.fail(f"a rule with an empty from list admits every source: {rule}")
        if peers and not any(_peer_matches(p, src, ns) for p in peers):
            continue
        if ports and not any(_port_matches(e, port, protocol) for e in ports):
            continue
        return True
    return False


def job(procs: int = 1, **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"image": "trainer:1", "command": ["python", "-m", "train"]}
    body.update(spec)
    body["training"] = {"procsPerNode": procs, **body.get("training", {})}
    return {
        "apiVersion": api.API_VERSION,
        "kind": api.KIND,
        "metadata": {"name": "bert", "namespace": "ml", "uid": "u1"},
        "spec": body,
    }


SETTINGS = PolicySettings(metrics_from=(OPERATOR, PROMETHEUS), other_ports_open=True)


def test_the_metrics_ports_admit_only_the_operator_prometheus_and_the_job_itself() -> None:
    j = job(procs=4)
    policy = endpoints.build_network_policy(j, SETTINGS)
    assert policy["spec"]["podSelector"] == {"matchLabels": {"gpujob.dev/job-name": "bert"}}
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    assert policy["metadata"]["ownerReferences"][0]["uid"] == "u1"
    for port in range(9400, 9404):  # metrics-0 .. metrics-3: /metrics and /debug/evidence
        for src in (OPERATOR_POD, PROMETHEUS_POD, SAME_JOB):
            assert admits(policy, src, port), (src, port)
        for src in (OTHER_JOB, TENANT, IMPOSTOR):
            assert not admits(policy, src, port), (src, port)


def test_every_other_port_stays_open_to_everyone_and_the_job_talks_to_itself_freely() -> None:
    j = job(procs=4)
    policy = endpoints.build_network_policy(j, SETTINGS)
    metrics = set(range(9400, 9404))
    closed = [p for p in range(1, 65536) if not admits(policy, TENANT, p)]
    assert set(closed) == metrics  # the rendezvous (29500), NCCL's, a user's own: all open
    for protocol in ("UDP", "SCTP"):
        assert all(admits(policy, TENANT, p, protocol) for p in (1, 9400, 29500, 65535))
    # NCCL and gloo pick ports of their own: the gang's pods reach each other on any of them
    assert all(admits(policy, SAME_JOB, p) for p in range(1, 65536, 97))


def test_the_block_at_the_edges_of_the_port_range_leaves_no_empty_range() -> None:
    for first, procs in ((1024, 2), (65535, 1), (65532, 4)):
        j = job(procs=procs, training={"metricsPort": first, "masterPort": 2000})
        policy = endpoints.build_network_policy(j, SETTINGS)
        for rule in policy["spec"]["ingress"]:
            for entry in rule.get("ports") or ():
                assert entry.get("port", 1) <= entry.get("endPort", entry.get("port", 1))
        assert not admits(policy, TENANT, first) and admits(policy, OPERATOR_POD, first)


def test_a_host_network_job_guards_the_block_of_ports_it_was_given() -> None:
    j = job(procs=2, template={"hostNetwork": True})
    ports = rank_ports(api.parse_spec(j["spec"]), "u1")
    assert ports.metrics != 9400
    policy = endpoints.build_network_policy(j, SETTINGS)
    for port in (ports.metrics, ports.metrics + 1):
        assert not admits(policy, TENANT, port) and admits(policy, OPERATOR_POD, port)
    assert admits(policy, TENANT, 9400)


def test_closed_other_ports_keep_a_default_deny_namespace_closed() -> None:
    policy = endpoints.build_network_policy(
        job(), PolicySettings(metrics_from=(OPERATOR,), other_ports_open=False)
    )
    assert not any(admits(policy, TENANT, p) for p in (22, 9400, 29500))
    assert not admits(policy, PROMETHEUS_POD, 9400)
    assert admits(policy, OPERATOR_POD, 9400) and admits(policy, SAME_JOB, 29500)


def test_no_metrics_peer_writes_no_rule_that_would_admit_everyone() -> None:
    policy = endpoints.build_network_policy(
        job(), PolicySettings(metrics_from=(), other_ports_open=True)
    )
    assert not admits(policy, OPERATOR_POD, 9400) and not admits(policy, TENANT, 9400)
    assert admits(policy, TENANT, 29500)


def test_the_token_is_the_jobs_own_and_reaches_the_trainer_from_the_secret() -> None:
    key = b"k" * 32
    j = job(nodes=2)
    token = endpoints.endpoint_token(key, j)
    assert token == endpoints.endpoint_token(key, j)  # recomputed, never read back
    other = {**j, "metadata": {**j["metadata"], "uid": "u2"}}  # same name, a new job
    assert endpoints.endpoint_token(key, other) != token
    assert endpoints.endpoint_token(b"x" * 32, j) != token
    secret = endpoints.build_token_secret(j, token)
    assert secret["metadata"]["name"] == "bert-endpoint-token-u1"  # the job's UID: its own
    assert secret["metadata"]["ownerReferences"][0]["uid"] == "u1"
    assert secret["stringData"] == {"token": token}

    pods = [builders.build_pod(j, rank, 0) for rank in (0, 1)]
    guarded = endpoints.with_token_env(pods, j)
    for pod in guarded:
        env = [e for e in pod["spec"]["containers"][0]["env"] if e["name"] == ENV_ENDPOINT_TOKEN]
        assert env == [
            {
                "name": ENV_ENDPOINT_TOKEN,
                "valueFrom": {"secretKeyRef": {"name": "bert-endpoint-token-u1", "key": "token"}},
            }
        ]
    assert all(e["name"] != ENV_ENDPOINT_TOKEN for e in pods[0]["spec"]["containers"][0]["env"]), (
        "the builder's pods were changed in place"
    )


def test_a_user_cannot_set_the_token_variable() -> None:
    with pytest.raises(ValueError, match=ENV_ENDPOINT_TOKEN):
        api.parse_spec(job(env=[{"name": ENV_ENDPOINT_TOKEN, "value": "guess"}])["spec"])
