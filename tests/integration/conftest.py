"""Integration fixtures: the CRD installed once, an operator process per test namespace."""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpujob_localcluster.cluster import LocalCluster
from gpujob_localcluster.processes import ClusterError
from gpujob_localcluster.tools import ToolsUnavailable
from tests.support.kube import Kube
from tests.support.operator import OperatorProcess
from tests.support.waiting import wait_until

REPO = Path(__file__).resolve().parents[2]
CRD = REPO / "crds" / "gputrainingjobs.gpujob.dev.yaml"
# kopf's peering CRDs, which the chart ships beside ours (chart tests install with --skip-crds).
FULL_TEMPLATE = REPO / "tests" / "data" / "full-template.yaml"
KOPF_CRDS = REPO / "charts" / "gpujob" / "crds" / "kopf.dev-peerings.yaml"


def install_crd(cluster: LocalCluster) -> Path:
    """Apply the generated CRD (and kopf's peering CRDs) and wait until they are Established."""
    for path in (CRD, KOPF_CRDS):
        res = cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(path))
        assert res.returncode == 0, res.stderr
    for name in (
        "gputrainingjobs.gpujob.dev",
        "clusterkopfpeerings.kopf.dev",
        "kopfpeerings.kopf.dev",
    ):
        cluster.kubectl("wait", "--for=condition=Established", f"crd/{name}", "--timeout=60s")
    return CRD


@pytest.fixture(scope="session")
def crd(cluster: LocalCluster) -> Path:
    """The generated CRD, applied and Established."""
    return install_crd(cluster)


@contextlib.contextmanager
def own_cluster(folder: Path, what: str, **options: Any) -> Iterator[LocalCluster]:
    """A control plane of a test module's own (e.g. gang scheduling, Kueue) with the CRD;
    a tool that cannot be built fails the test with its message, nothing skips."""
    lc = LocalCluster(folder, **options)
    try:
        lc.start()
    except (ToolsUnavailable, ClusterError) as e:
        pytest.fail(f"the local control plane {what} is unavailable: {e}", pytrace=False)
    try:
        install_crd(lc)
        yield lc
    finally:
        lc.stop()


@contextlib.contextmanager
def fresh_namespace(cluster: LocalCluster, prefix: str) -> Iterator[Kube]:
    """kubectl as admin in a new namespace; afterwards its jobs and pods are deleted and
    waited for (the next test needs every GPU back), then the namespace."""
    ns = f"{prefix}-{uuid.uuid4().hex[:6]}"
    k = Kube(cluster, ns, cluster.kubeconfig)
    k.run("create", "namespace", ns, ns=False, check=True)
    wait_until(lambda: k.get("serviceaccount", "default"), 30, f"default ServiceAccount in {ns}")
    try:
        yield k
    finally:
        k.run("delete", "gputrainingjobs", "--all", "--wait=false")
        k.run("delete", "pods", "--all", "--wait=false")
        wait_until(lambda: not k.list("pods"), 60, f"pods of {ns} gone")
        k.run("delete", "namespace", ns, "--wait=false", ns=False)


def apply_quota(kube: Kube, name: str, hard: dict[str, str]) -> None:
    """A ResourceQuota in the test's namespace, waited for until the server enforces it."""
    kube.apply(
        {
            "apiVersion": "v1",
            "kind": "ResourceQuota",
            "metadata": {"name": name},
            "spec": {"hard": hard},
        }
    )
    wait_until(
        lambda: (kube.get("resourcequota", name) or {}).get("status", {}).get("hard"),
        30,
        f"the status of quota {name}",
    )


@pytest.fixture
def operator(kube: Kube, crd: Path, tmp_path: Path) -> Iterator[OperatorProcess]:
    """A fresh operator process (admin credentials) watching only this test's namespace."""
    op = OperatorProcess(kube.kubeconfig, [kube.namespace], tmp_path / "operator.log").start()
    yield op
    op.stop()


def job_status(kube: Kube, name: str) -> dict:
    obj = kube.get("gputrainingjob", name)
    return (obj or {}).get("status", {})


def wait_job_phase(kube: Kube, name: str, phases: tuple[str, ...], timeout: float = 120) -> dict:
    """Wait for the job's display phase; returns the status."""
    return wait_until(
        lambda: (s := job_status(kube, name)).get("phase") in phases and s,
        timeout,
        f"job {name} in {phases}",
    )


def delete_job(kube: Kube, name: str) -> None:
    """Delete the job and wait for its pods to go (their processes hold ports and cores): a
    test that has seen what it asserts need not pay for the rest of the run."""
    kube.run("delete", "gputrainingjob", name, "--wait=false", check=True)
    wait_until(
        lambda: not [p for p in kube.list("pods") if p["metadata"]["name"].startswith(name)],
        120,
        f"{name}'s pods gone",
        interval=1.0,
    )


def full_template_prerequisites(kube: Kube, tpl: dict[str, Any]) -> None:
    """What a real cluster would hold: the ServiceAccount, PriorityClass and RuntimeClass."""
    kube.run("create", "serviceaccount", tpl["serviceAccountName"], check=True)
    pc = tpl["priorityClassName"]
    if kube.run("get", "priorityclass", pc, ns=False).returncode != 0:
        kube.run("create", "priorityclass", pc, "--value=1000", ns=False, check=True)
    runtime = {
        "apiVersion": "node.k8s.io/v1",
        "kind": "RuntimeClass",
        "metadata": {"name": tpl["runtimeClassName"]},
        "handler": tpl["runtimeClassName"],
    }
    kube.run("apply", "-f", "-", input=json.dumps(runtime), ns=False, check=True)
