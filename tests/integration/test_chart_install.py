"""`helm install` the chart into the local control plane: its Deployment runs the operator as
a pod, with the ServiceAccount token the node agent mounts, so the API server enforces exactly
the chart's RBAC on the operator's own requests.

Choices (documented here because they shape the test):
- ``--skip-crds``: the session's ``crd`` fixture already applied the same generated CRD (a unit
  test proves the chart's copy equals it), and Helm never upgrades or deletes ``crds/``
  anyway; installing it twice would only fight over ownership.
- The release is uninstalled and its pods waited away at teardown: a cluster-mode operator
  that outlived its test would reconcile the next tests' jobs.
"""

from __future__ import annotations

import base64
import json
import socket
import ssl
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.integration.conftest import wait_job_phase
from tests.support.chart import CHART
from tests.support.events import wait_event
from tests.support.incluster import ChartOperator
from tests.support.jobs import python_job
from tests.support.kube import Kube
from tests.support.waiting import wait_until

SA = "gj-gpujob"  # <release>-gpujob with release "gj"
REPO = Path(__file__).resolve().parents[2]
CHECKOUT_PATH = {
    "name": "PYTHONPATH",
    "value": ":".join(str(REPO / d) for d in ("operator", "trainer_image", "localcluster")),
}
BAD_PVC = REPO / "tests/data/bad_manifests/webhook-pvc-volume-without-claim-name.yaml"


def two_node_job(name: str) -> dict[str, Any]:
    return python_job(name, "print(1)")


class Release(ChartOperator):
    """A helm release of the chart in the test's namespace (``--skip-crds``)."""

    def install(self, values: dict[str, Any] | None = None, *extra: str) -> str:
        # The pod imports this checkout's operator, whatever checkout the shared venv's
        # editable install points at (a worktree's tests must test the worktree's code).
        values = dict(values or {})
        values["operator"] = {**values.get("operator", {}), "extraEnv": [CHECKOUT_PATH]}
        out = super().install(values, "--skip-crds", *extra)
        assert "kubectl get gputrainingjobs" in out  # NOTES.txt tells what to run next
        return out


@pytest.fixture
def release(kube: Kube, crd: Path, tmp_path: Path) -> Iterator[Release]:
    r = Release(kube.cluster, kube.namespace, tmp_path / "helm")
    yield r
    r.uninstall()


@pytest.fixture
def other_namespace(kube: Kube) -> Iterator[str]:
    """A second fresh namespace (a team's namespace the operator may or may not watch)."""
    ns = f"{kube.namespace[:50]}-x{uuid.uuid4().hex[:4]}"
    kube.run("create", "namespace", ns, ns=False, check=True)
    yield ns
    kube.run("delete", "namespace", ns, "--wait=false", ns=False)


def as_sa(kube: Kube, kubeconfig: Path, namespace: str) -> Kube:
    return Kube(kube.cluster, namespace, kubeconfig)


def forbidden(k: Kube, *args: str, input: str | None = None) -> str:
    res = k.run(*args, input=input)
    assert res.returncode != 0 and "Forbidden" in res.stderr, (
        f"kubectl {args} was allowed: {res.stdout}"
    )
    return res.stderr


def run_job_to_success(kube: Kube, jobs_ns: str, release: Release) -> None:
    """The chart's operator pod takes a job to Succeeded, with Events, and no 403 on the way."""
    admin = Kube(kube.cluster, jobs_ns, kube.cluster.kubeconfig)
    try:
        admin.apply(two_node_job("hello"))
        status = wait_job_phase(admin, "hello", ("Succeeded", "Failed"), timeout=120)
        assert status["phase"] == "Succeeded", status
        assert status["gang"]["replicas"]["succeeded"] == 2
        # Events need the chart's events permission.
        wait_event(admin, "hello", "AllRanksSucceeded")
    except BaseException:
        print(release.logs())
        raise
    assert not release.rbac_denials(), release.logs()


def operator_pod(release: Release) -> dict[str, Any]:
    """The single operator pod, checked for what the chart asks of it."""
    pods = release.pods()
    assert len(pods) == 1, pods
    pod = pods[0]
    (status,) = pod["status"]["containerStatuses"]
    assert status["ready"] and status["restartCount"] == 0, status
    # The admission plugin's kube-api-access volume, mounted where in-cluster clients look.
    mounts = {m["mountPath"] for m in pod["spec"]["containers"][0]["volumeMounts"]}
    assert "/var/run/secrets/kubernetes.io/serviceaccount" in mounts, mounts
    return pod


def review(
    pod_ip: str, ca: bytes, server_name: str, job: dict[str, Any], namespace: str | None = None
) -> dict[str, Any]:
    """POST an AdmissionReview of ``job`` to the operator pod's webhook port, as the API
    server would: TLS verified against the chart's CA for the Service's DNS name.

    The API server itself cannot reach it here: a Service-based webhook is dialled through
    the Service's endpoints (or its ClusterIP), and the local cluster has neither (its pods'
    addresses are loopback ones, which Endpoints refuse, and there is no kube-proxy).
    """
    meta = job["metadata"]
    request = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": str(uuid.uuid4()),
            "kind": {"group": "gpujob.dev", "version": "v1alpha1", "kind": "GPUTrainingJob"},
            "resource": {
                "group": "gpujob.dev",
                "version": "v1alpha1",
                "resource": "gputrainingjobs",
            },
            "operation": "CREATE",
            "namespace": namespace or meta["namespace"],
            "name": meta["name"],
            "userInfo": {"username": "test"},
            "object": job,
        },
    }
    body = json.dumps(request).encode()
    head = (
        f"POST /validate-pods HTTP/1.1\r\nHost: {server_name}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n"
    ).encode()
    ctx = ssl.create_default_context(cadata=ca.decode())
    with (
        socket.create_connection((pod_ip, 9443), timeout=30) as raw,
        ctx.wrap_socket(raw, server_hostname=server_name) as tls,
    ):
        tls.sendall(head + body)
        chunks = []
        while chunk := tls.recv(65536):
            chunks.append(chunk)
    status, _, rest = b"".join(chunks).partition(b"\r\n")
    assert b" 200 " in status, status
    return dict(json.loads(rest.partition(b"\r\n\r\n")[2])["response"])


def webhook_ca(kube: Kube) -> bytes:
    (config,) = [
        c
        for c in kube.list("validatingwebhookconfigurations")
        if c["metadata"]["name"] == f"{SA}-{kube.namespace}"
    ]
    return base64.b64decode(config["webhooks"][0]["clientConfig"]["caBundle"])


def check_reviews_outside_its_namespaces_get_no_dry_run(
    kube: Kube, pod: dict[str, Any], jobs_ns: str
) -> None:
    """Anyone who can reach the webhook port can send a review: the operator dry-runs only
    what the API server could have sent (the bad PVC would be denied by a dry run)."""
    job = yaml.safe_load(BAD_PVC.read_text())
    server = f"{SA}-webhook.{kube.namespace}.svc"
    for object_ns, request_ns, why in (
        ("kube-system", "kube-system", "a namespace this operator does not watch"),
        ("kube-system", jobs_ns, "the job's namespace is not the review's"),
    ):
        job["metadata"]["namespace"] = object_ns
        answer = review(pod["status"]["podIP"], webhook_ca(kube), server, job, request_ns)
        assert answer["allowed"] is True, answer
        assert answer["warnings"] == [f"gpujob did not check this request: {why}"], answer
    job["metadata"]["namespace"] = jobs_ns
    answer = review(pod["status"]["podIP"], webhook_ca(kube), server, job)
    assert answer["allowed"] is False, answer  # its own namespace: dry-run, refused


def check_the_charts_webhook(kube: Kube, release: Release, pod: dict[str, Any], ns: str) -> None:
    """The chart's operator pod serves the webhook with the chart's certificate: a job whose
    pods core/v1 refuses is denied with the user's field; an upgrade keeps the certificate."""
    (config,) = [
        c
        for c in kube.list("validatingwebhookconfigurations")
        if c["metadata"]["name"] == f"{SA}-{kube.namespace}"
    ]
    (hook,) = config["webhooks"]
    assert hook["failurePolicy"] == "Ignore"
    ca = base64.b64decode(hook["clientConfig"]["caBundle"])
    job = yaml.safe_load(BAD_PVC.read_text())
    job["metadata"]["namespace"] = ns
    answer = review(pod["status"]["podIP"], ca, f"{SA}-webhook.{kube.namespace}.svc", job)
    assert answer["allowed"] is False, answer
    assert (
        "spec.template.volumes[0].persistentVolumeClaim.claimName: Required value"
        in (answer["status"]["message"])
    )
    secret = kube.get("secret", f"{SA}-webhook-tls")
    assert secret is not None
    res = release.helm("upgrade", release.release, str(CHART), "-n", kube.namespace,
                       "--reuse-values", "--skip-crds")  # fmt: skip
    assert res.returncode == 0, res.stderr
    again = kube.get("secret", f"{SA}-webhook-tls")
    assert again is not None and again["data"] == secret["data"], "the upgrade rotated the cert"


def check_who_may_submit_a_job(kube: Kube, ns: str) -> None:
    """The chart's admission policy: a job is created only by someone who may create its
    pods; `edit` and `view` in a namespace cover jobs through the aggregated roles."""
    admin = Kube(kube.cluster, ns, kube.cluster.kubeconfig)
    jobs_only_role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": {"name": "jobs-only"},
        "rules": [
            {
                "apiGroups": ["gpujob.dev"],
                "resources": ["gputrainingjobs"],
                "verbs": ["create", "get", "list"],
            }
        ],
    }
    admin.apply(jobs_only_role)
    for user, kind, role in (
        ("jobs-only", "Role", "jobs-only"),
        ("editor", "ClusterRole", "edit"),
        ("viewer", "ClusterRole", "view"),
    ):
        admin.apply(
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "RoleBinding",
                "metadata": {"name": user},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": kind, "name": role},
                "subjects": [
                    {"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}
                ],
            }
        )

    def can(user: str, *what: str) -> bool:
        res = admin.run("auth", "can-i", *what, "--as", user)
        return res.stdout.strip() == "yes"

    # The aggregation controller adds the chart's rules to edit and view.
    wait_until(lambda: can("editor", "create", "gputrainingjobs.gpujob.dev"), 60, "edit aggregated")
    wait_until(lambda: can("viewer", "list", "gputrainingjobs.gpujob.dev"), 60, "view aggregated")
    assert not can("viewer", "create", "gputrainingjobs.gpujob.dev")
    assert not can("editor", "update", "gputrainingjobs.gpujob.dev", "--subresource=status")
    assert not can("jobs-only", "create", "pods")

    # A job that would hand its author a ServiceAccount, a Secret and the node's PID space.
    job = two_node_job("escalate")
    job["spec"]["template"] = {
        "containerSecurityContext": {"privileged": True},
        "serviceAccountName": "deployer",
        "hostPID": True,
        "volumes": [{"name": "creds", "secret": {"secretName": "deploy-token"}}],
        "volumeMounts": [{"name": "creds", "mountPath": "/creds"}],
    }
    text = yaml.safe_dump(job)

    def create_as(user: str) -> Any:
        return admin.run("create", "--dry-run=server", "-f", "-", "--as", user, input=text)

    def policy_denies() -> str | None:  # the API server loads the policy asynchronously
        res = create_as("jobs-only")
        return res.stderr if res.returncode != 0 and "may not create pods" in res.stderr else None

    refused = wait_until(policy_denies, 60, "the admission policy denies")
    assert f"jobs-only may not create pods in namespace {ns}" in refused, refused
    assert "missing permission: create pods" in refused, refused
    res = create_as("editor")
    assert res.returncode == 0, res.stderr


def test_cluster_mode_install_runs_a_job_with_the_charts_rbac(
    kube: Kube, release: Release, other_namespace: str, sa_kubeconfig: Any, tmp_path: Path
) -> None:
    release.install({"rbac": {"mode": "cluster"}})
    assert kube.get("serviceaccount", SA) is not None
    assert len(kube.list("configmaps", "grafana_dashboard=1")) == 3
    pod = operator_pod(release)
    assert pod["spec"]["serviceAccountName"] == SA
    # The whole cluster is watched: the job lives outside the release namespace.
    run_job_to_success(kube, other_namespace, release)
    check_the_charts_webhook(kube, release, pod, other_namespace)
    check_who_may_submit_a_job(kube, other_namespace)
    # /metrics where the Service and Prometheus find it: the pod IP (operator.bindAddress).
    with urllib.request.urlopen(f"http://{pod['status']['podIP']}:8081/metrics", timeout=10) as r:
        assert "gpujob_operator_" in r.read().decode()
    token = sa_kubeconfig(kube.namespace, SA)
    sa = as_sa(kube, token, other_namespace)
    assert "secrets is forbidden" in forbidden(sa, "get", "secrets")
    forbidden(sa, "get", "secrets", "-A")
    forbidden(sa, "get", "configmaps")
    forbidden(sa, "create", "namespace", "nope")
    # Node names and capacity are listable (the start-time forecast); nothing more of nodes.
    assert sa.run("get", "nodes").returncode == 0
    node = kube.list("nodes")[0]["metadata"]["name"]
    forbidden(sa, "get", "node", node)
    forbidden(sa, "label", "node", node, "x=y")
    assert sa.run("get", "gputrainingjobs", "-A").returncode == 0


def test_namespaced_mode_confines_the_operator_to_its_namespaces(
    kube: Kube, release: Release, other_namespace: str, sa_kubeconfig: Any, tmp_path: Path
) -> None:
    jobs_ns = other_namespace
    release.install(
        {
            "rbac": {"mode": "namespaced", "namespaces": [jobs_ns]},
            # Installs on a real API server (nothing enforces it here: no network plugin).
            "webhook": {
                "networkPolicy": {"enabled": True, "from": [{"ipBlock": {"cidr": "127.0.0.0/8"}}]}
            },
        }
    )
    assert kube.get("networkpolicy", f"{SA}-webhook") is not None
    check_reviews_outside_its_namespaces_get_no_dry_run(kube, operator_pod(release), jobs_ns)
    run_job_to_success(kube, jobs_ns, release)
    token = sa_kubeconfig(kube.namespace, SA)
    inside = as_sa(kube, token, jobs_ns)
    assert "secrets is forbidden" in forbidden(inside, "get", "secrets")
    assert inside.run("get", "pods").returncode == 0
    # Not given: the release's own namespace, and the cluster as a whole.
    outside = as_sa(kube, token, kube.namespace)
    for args in (("get", "pods"), ("get", "gputrainingjobs"), ("get", "services")):
        forbidden(outside, *args)
    forbidden(
        outside,
        "create",
        "-f",
        "-",
        input=json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": "sneaky"},
                "spec": {"containers": [{"name": "c", "image": "x"}]},
            }
        ),
    )
    forbidden(inside, "get", "pods", "-A")
    forbidden(inside, "get", "gputrainingjobs", "-A")
    # Namespace names are readable (rbac.clusterDiscovery, for kopf); namespaces are not writable.
    forbidden(inside, "create", "namespace", "nope")
    forbidden(inside, "delete", "namespace", kube.namespace)
    forbidden(inside, "label", "namespace", jobs_ns, "x=y")
