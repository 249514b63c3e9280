"""The admission webhook: a job whose pods core/v1 refuses is refused at apply, naming the
user's field; with the webhook down the job is admitted (failurePolicy Ignore) and the same
mistake surfaces at run time as ``InvalidPodTemplate``.

Real control plane, the operator as a process serving the webhook on 127.0.0.1 with a CA of
its own and registering it for its namespace (host mode, ``OperatorProcess(webhook=True)``).
"""

from __future__ import annotations

import contextlib
import json
import re
import socket
import ssl
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from gpujob_operator.api import conditions as c
from tests.integration.conftest import job_status, wait_job_phase
from tests.support.jobs import python_job
from tests.support.kube import Kube
from tests.support.operator import OperatorProcess
from tests.support.waiting import wait_until

REPO = Path(__file__).resolve().parents[2]
BAD = sorted(
    p
    for p in (REPO / "tests" / "data" / "bad_manifests").glob("*.yaml")
    if re.search(r"^# by: webhook$", p.read_text(), re.MULTILINE)
)
PROBE = REPO / "tests" / "data" / "bad_manifests" / "webhook-pvc-volume-without-claim-name.yaml"
DENIED = "denied the request"


def expectation(path: Path) -> str:
    m = re.search(r"^# expect: (.+)$", path.read_text(), re.MULTILINE)
    assert m, f"{path.name} lacks an '# expect:' line"
    return m.group(1).strip()


def webhook_answers(kube: Kube) -> bool:
    """The API server calls the webhook now (its configuration informer has caught up)."""
    res = kube.run("create", "--dry-run=server", "-f", str(PROBE))
    return res.returncode != 0 and DENIED in res.stderr


@pytest.fixture
def webhook_operator(kube: Kube, crd: Path, tmp_path: Path) -> Iterator[OperatorProcess]:
    op = OperatorProcess(
        kube.kubeconfig, [kube.namespace], tmp_path / "operator.log", webhook=True
    ).start()
    try:
        wait_until(lambda: webhook_answers(kube), 60, f"the webhook answers (log: {op.log_path})")
        yield op
    finally:
        op.stop()
        kube.run(
            "delete", "validatingwebhookconfiguration", op.webhook_name, "--ignore-not-found",
            ns=False,
        )  # fmt: skip


def test_the_catalog_is_large_enough() -> None:
    assert len(BAD) >= 8


def test_each_pod_mistake_is_refused_at_apply_naming_the_users_field(
    kube: Kube, webhook_operator: OperatorProcess
) -> None:
    wrong: list[str] = []
    for manifest in BAD:
        res = kube.run("apply", "-f", str(manifest))
        if (
            res.returncode == 0
            or DENIED not in res.stderr
            or expectation(manifest) not in (res.stderr)
        ):
            wrong.append(f"{manifest.name}: rc={res.returncode} {res.stderr.strip()}")
    assert not wrong, "\n".join(wrong)
    assert not kube.list("gputrainingjobs")
    assert "Traceback" not in webhook_operator.log_path.read_text()


def test_a_good_job_passes_a_bad_spec_update_is_refused_and_unchecked_pods_warn(
    kube: Kube, webhook_operator: OperatorProcess
) -> None:
    body = python_job("good", "print('ok')", nodes=2, gpus=0)
    res = kube.run("apply", "-f", "-", input=yaml.safe_dump(body))
    assert res.returncode == 0, res.stderr
    assert "Warning" not in res.stderr, res.stderr

    bad_volume = {"name": "data", "persistentVolumeClaim": {"readOnly": True}}
    patch = json.dumps({"spec": {"template": {"volumes": [bad_volume]}}})
    res = kube.run("patch", "gputrainingjob", "good", "--type=merge", "-p", patch)
    assert res.returncode != 0 and DENIED in res.stderr, res.stderr
    assert "spec.template.volumes[0].persistentVolumeClaim.claimName: Required value" in (
        res.stderr
    )
    # An update that leaves the spec alone is not reviewed (matchConditions).
    assert kube.run("label", "gputrainingjob", "good", "team=a").returncode == 0

    # A ServiceAccount that does not exist (yet) is a state of the namespace, not a mistake
    # in the spec: admitted, with the server's reason as a warning.
    lonely = python_job("lonely", "print('ok')", nodes=1, gpus=0)
    lonely["spec"]["template"] = {"serviceAccountName": "not-yet"}
    res = kube.run("apply", "-f", "-", input=yaml.safe_dump(lonely))
    assert res.returncode == 0, res.stderr
    assert "Warning: the job's pods could not be checked" in res.stderr, res.stderr
    assert 'serviceaccount "not-yet" not found' in res.stderr, res.stderr


def test_a_job_whose_pods_would_not_fit_the_operator_is_refused_at_apply(
    kube: Kube, webhook_operator: OperatorProcess
) -> None:
    """400 KB of env values a pod x 200 nodes: 79 MiB of pods, over the operator's 64 MiB."""
    body = python_job("wide", "print('ok')", nodes=200, gpus=0)
    env = [{"name": f"V{i}", "value": "x" * 4000} for i in range(100)]
    body["spec"]["template"] = {
        "containers": [{"name": "sidecar", "image": "busybox:1", "env": env}]
    }
    res = kube.run("create", "--dry-run=server", "-f", "-", input=json.dumps(body))
    assert res.returncode != 0 and DENIED in res.stderr, res.stderr
    assert "PodsTooLarge: spec.template makes pods of" in res.stderr, res.stderr
    assert "x spec.nodes 200 = " in res.stderr and "GPUJOB_MAX_JOB_POD_BYTES" in res.stderr
    body["spec"]["nodes"] = 100  # 40 MiB: admitted
    res = kube.run("create", "--dry-run=server", "-f", "-", input=json.dumps(body))
    assert res.returncode == 0, res.stderr


def test_with_the_webhook_down_the_job_is_admitted_and_fails_at_run_time(
    kube: Kube, webhook_operator: OperatorProcess, tmp_path: Path
) -> None:
    """failurePolicy Ignore: the registration stays (a killed operator cleans nothing up),
    its server is gone, and the API server admits on the CRD's checks alone; the operator
    that runs next finds the same mistakes when it creates the pods (the backstop), with
    core/v1's message, also where the API client's own models would have refused first."""
    wrong = {
        "webhook-env-field-ref-label-key-invalid.yaml": "name part must consist of alphanumeric",
        "webhook-pvc-volume-without-claim-name.yaml": "persistentVolumeClaim.claimName: Required",
    }
    webhook_operator.kill()
    assert kube.get("validatingwebhookconfiguration", webhook_operator.webhook_name)
    names = {}
    for file, message in wrong.items():
        manifest = REPO / "tests/data/bad_manifests" / file
        res = kube.run("apply", "-f", str(manifest))
        assert res.returncode == 0, res.stderr
        names[yaml.safe_load(manifest.read_text())["metadata"]["name"]] = message

    plain = OperatorProcess(kube.kubeconfig, [kube.namespace], tmp_path / "plain.log").start()
    try:
        for name, message in names.items():
            status = wait_job_phase(kube, name, ("Failed",), timeout=90)
            cond = dict(c.find(job_status(kube, name).get("conditions"), c.FAILED) or {})
            assert cond.get("reason") == c.INVALID_POD_TEMPLATE, cond
            assert message in cond["message"], cond
            assert status["failure"]["reason"] == c.INVALID_POD_TEMPLATE
    finally:
        plain.stop()


def test_a_caller_without_the_api_servers_client_certificate_is_refused(
    kube: Kube, webhook_operator: OperatorProcess
) -> None:
    """The API server presents its AdmissionConfiguration's client certificate (the tests
    above pass through it); anyone else who reaches the port is refused in the handshake,
    before a byte of a review is read."""
    served_by = webhook_operator.log_path.parent / "webhook-pki" / "ca.crt"
    ctx = ssl.create_default_context(cafile=str(served_by))
    request = b"POST /validate-pods HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}"
    answer = b""
    with (
        contextlib.suppress(ssl.SSLError, ConnectionError),  # an alert, or a reset
        socket.create_connection(("127.0.0.1", webhook_operator.webhook_port), 10) as raw,
        ctx.wrap_socket(raw, server_hostname="127.0.0.1") as tls,
    ):
        tls.sendall(request)
        answer = tls.recv(1024)
    assert answer == b"", f"answered a caller without a client certificate: {answer!r}"
    # The same request with the API server's kind of certificate (the cluster's CA) is.
    cluster_pki = webhook_operator.cluster_ca().parent
    ctx.load_cert_chain(cluster_pki / "admin.crt", cluster_pki / "admin.key")
    with (
        socket.create_connection(("127.0.0.1", webhook_operator.webhook_port), 10) as raw,
        ctx.wrap_socket(raw, server_hostname="127.0.0.1") as tls,
    ):
        tls.sendall(request)
        assert tls.recv(1024).startswith(b"HTTP/1.1 200")
