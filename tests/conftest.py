"""Fixtures shared by every tier: one local cluster per run, a fresh namespace per test."""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpujob_localcluster.cluster import LocalCluster
from gpujob_localcluster.processes import ClusterError
from gpujob_localcluster.tools import ToolsUnavailable
from tests.support.kube import Kube
from tests.support.waiting import wait_until


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """A real control plane and node agent on loopback, shared by the whole run.

    A tool that cannot be built fails the tests with the build's message; nothing skips.
    """
    folder = Path(os.environ.get("GPUJOB_TEST_CLUSTER_DIR", tmp_path_factory.mktemp("cluster")))
    lc = LocalCluster(folder)
    try:
        lc.start()
    except (ToolsUnavailable, ClusterError) as e:
        pytest.fail(f"the local control plane is unavailable: {e}", pytrace=False)
    yield lc
    lc.stop()


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")[:40].strip("-")


@pytest.fixture
def kube(cluster: LocalCluster, request: pytest.FixtureRequest) -> Iterator[Kube]:
    """kubectl as admin in a fresh namespace named after the test; deleted afterwards."""
    ns = f"{_slug(request.node.name)}-{uuid.uuid4().hex[:5]}"
    k = Kube(cluster, ns, cluster.kubeconfig)
    k.run("create", "namespace", ns, ns=False, check=True)
    wait_until(lambda: k.get("serviceaccount", "default"), 30, f"default ServiceAccount in {ns}")
    yield k
    k.run("delete", "namespace", ns, "--wait=false", ns=False)


@pytest.fixture
def sa_kubeconfig(cluster: LocalCluster, tmp_path: Path):  # type: ignore[no-untyped-def]
    """Make a kubeconfig that authenticates as ``namespace/service_account`` with a bound token."""

    def make(namespace: str, service_account: str) -> Path:
        assert cluster.cp is not None
        return cluster.cp.token_kubeconfig(
            namespace, service_account, tmp_path / f"{service_account}.kubeconfig"
        )

    return make
