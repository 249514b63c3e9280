"""`helm install` the chart into the local control plane, then run the operator with the chart's
ServiceAccount token, so the API server enforces exactly the chart's RBAC.

Choices (documented here because they shape the test):
- ``--skip-crds``: the session's ``crd`` fixture already applied the same generated CRD (a unit
  test proves the chart's copy equals it), and Helm never upgrades or deletes ``crds/``
  anyway; installing it twice would only fight over ownership.
- ``replicaCount: 0``: the local node agent runs a pod's command on the host and ignores the
  image, so the chart's own Deployment would start a second, credential-less operator. The
  operator runs as :class:`OperatorProcess` instead, with the SA's bound token.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpujob_localcluster.cluster import LocalCluster
from tests.integration.conftest import wait_job_phase
from tests.support.chart import CHART, helm, values_file
from tests.support.kube import Kube
from tests.support.operator import OperatorProcess
from tests.support.waiting import wait_until

SA = "gj-gpujob"  # <release>-gpujob with release "gj"


def two_node_job(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "gpujob.dev/v1alpha1",
        "kind": "GPUTrainingJob",
        "metadata": {"name": name},
        "spec": {
            "image": "python:3.11-slim",
            "nodes": 2,
            "gpusPerNode": 1,
            "command": ["python", "-c", "print(1)"],
            "training": {"launcher": "none"},
        },
    }


class Release:
    """A helm release of the chart in one namespace; uninstalled at teardown."""

    def __init__(self, cluster: LocalCluster, namespace: str, folder: Path) -> None:
        self.cluster, self.namespace, self.folder = cluster, namespace, folder

    def helm(self, *args: str) -> Any:
        return helm(*args, kubeconfig=self.cluster.kubeconfig, home=self.folder)

    def install(self, values: dict[str, Any]) -> None:
        f = values_file({"replicaCount": 0, **values}, self.folder)
        res = self.helm(
            "install", "gj", str(CHART), "-n", self.namespace, "--skip-crds", "-f", str(f)
        )
        assert res.returncode == 0, res.stderr
        assert "kubectl get gputrainingjobs" in res.stdout  # NOTES.txt tells what to run next

    def uninstall(self) -> None:
        self.helm("uninstall", "gj", "-n", self.namespace, "--wait=false")


@pytest.fixture
def release(kube: Kube, crd: Path, tmp_path: Path) -> Iterator[Release]:
    r = Release(kube.cluster, kube.namespace, tmp_path)
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


def run_job_to_success(
    kube: Kube, jobs_ns: str, kubeconfig: Path, namespaces: list[str], tmp_path: Path
) -> OperatorProcess:
    admin = Kube(kube.cluster, jobs_ns, kube.cluster.kubeconfig)
    op = OperatorProcess(kubeconfig, namespaces, tmp_path / "operator.log").start()
    try:
        admin.apply(two_node_job("hello"))
        status = wait_job_phase(admin, "hello", ("Succeeded", "Failed"), timeout=120)
        assert status["phase"] == "Succeeded", status
        assert status["replicas"]["succeeded"] == 2
        events = wait_until(
            lambda: [
                e["reason"]
                for e in admin.list("events")
                if e["involvedObject"].get("name") == "hello"
            ],
            30,
            "job events",
        )
        assert "AllRanksSucceeded" in events  # Events need the chart's events permission
    except BaseException:
        print(op.log_tail(80))
        raise
    finally:
        op.stop()
    assert not op.rbac_denials(), op.log_tail(80)
    return op


def test_cluster_mode_install_runs_a_job_with_the_charts_rbac(
    kube: Kube, release: Release, other_namespace: str, sa_kubeconfig: Any, tmp_path: Path
) -> None:
    release.install({"rbac": {"mode": "cluster"}})
    assert kube.get("serviceaccount", SA) is not None
    assert len(kube.list("configmaps", "grafana_dashboard=1")) == 3
    token = sa_kubeconfig(kube.namespace, SA)
    # The whole cluster is watched: the job lives outside the release namespace.
    run_job_to_success(kube, other_namespace, token, [], tmp_path)
    sa = as_sa(kube, token, other_namespace)
    assert "secrets is forbidden" in forbidden(sa, "get", "secrets")
    forbidden(sa, "get", "secrets", "-A")
    forbidden(sa, "get", "configmaps")
    forbidden(sa, "create", "namespace", "nope")
    forbidden(sa, "get", "nodes")
    assert sa.run("get", "gputrainingjobs", "-A").returncode == 0


def test_namespaced_mode_confines_the_operator_to_its_namespaces(
    kube: Kube, release: Release, other_namespace: str, sa_kubeconfig: Any, tmp_path: Path
) -> None:
    jobs_ns = other_namespace
    release.install({"rbac": {"mode": "namespaced", "namespaces": [jobs_ns]}})
    token = sa_kubeconfig(kube.namespace, SA)
    run_job_to_success(kube, jobs_ns, token, [jobs_ns], tmp_path)
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
