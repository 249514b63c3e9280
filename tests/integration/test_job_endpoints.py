"""Who can reach a job's endpoints, on a real API server: the operator creates the job's
NetworkPolicy and token Secret before its pods, and the ranks read the token.

The local cluster runs no network plugin, so nothing here enforces the policy: that the API
server accepts it (its port ranges included) is what this test can prove; its rules are
judged in tests/unit/operator/lifecycle/test_endpoints.py.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpujob_operator.lifecycle import endpoints
from tests.integration.conftest import wait_job_phase
from tests.support.jobs import python_job
from tests.support.kube import Kube
from tests.support.operator import OperatorProcess

KEY = b"integration-test-endpoint-key-0123456789"
OPERATOR_PEER = {
    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "gpujob-system"}},
    "podSelector": {"matchLabels": {"app.kubernetes.io/component": "operator"}},
}


@pytest.fixture
def guarded_operator(kube: Kube, crd: Path, tmp_path: Path) -> Iterator[OperatorProcess]:
    key = tmp_path / "token-key"
    key.write_bytes(KEY)
    policy = {"metricsFrom": [OPERATOR_PEER], "otherPortsOpen": True}
    op = OperatorProcess(
        kube.kubeconfig,
        [kube.namespace],
        tmp_path / "operator.log",
        extra_env={
            "GPUJOB_JOB_NETWORK_POLICY": json.dumps(policy),
            "GPUJOB_ENDPOINT_TOKEN_KEY_FILE": str(key),
        },
    ).start()
    yield op
    op.stop()


def test_the_operator_guards_a_jobs_endpoints_before_its_ranks_run(
    kube: Kube, guarded_operator: OperatorProcess
) -> None:
    # Each rank exits 0 only when it was given a token of the derived length.
    script = """
        import os, sys
        sys.exit(0 if len(os.environ.get("GPUJOB_ENDPOINT_TOKEN", "")) == 64 else 3)
    """
    kube.apply(python_job("guarded", script, nodes=2, gpus=2, training={"procsPerNode": 2}))
    status = wait_job_phase(kube, "guarded", ("Succeeded", "Failed"))
    assert status["phase"] == "Succeeded", status
    job = kube.get("gputrainingjob", "guarded")
    assert job is not None
    uid = job["metadata"]["uid"]

    policy = kube.get("networkpolicy", endpoints.network_policy_name(job))
    assert policy is not None, "no NetworkPolicy for the job"
    assert [r["uid"] for r in policy["metadata"]["ownerReferences"]] == [uid]
    # As built, accepted as is by the API server (the metrics block is a port range).
    built = endpoints.build_network_policy(
        job, endpoints.PolicySettings(metrics_from=(OPERATOR_PEER,), other_ports_open=True)
    )
    assert policy["spec"] == built["spec"]
    assert {"protocol": "TCP", "port": 9400, "endPort": 9401} in policy["spec"]["ingress"][1][
        "ports"
    ]

    secret = kube.get("secret", endpoints.token_secret_name(job))
    assert secret is not None, "no token Secret for the job"
    assert [r["uid"] for r in secret["metadata"]["ownerReferences"]] == [uid]
    token = base64.b64decode(secret["data"]["token"]).decode()
    assert token == endpoints.endpoint_token(KEY, job)  # what the operator will present
