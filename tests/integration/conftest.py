"""Integration fixtures: the CRD installed once, an operator process per test namespace."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from gpujob_localcluster.cluster import LocalCluster
from tests.support.kube import Kube
from tests.support.operator import OperatorProcess
from tests.support.waiting import wait_until

REPO = Path(__file__).resolve().parents[2]
CRD = REPO / "crds" / "gputrainingjobs.gpujob.dev.yaml"


@pytest.fixture(scope="session")
def crd(cluster: LocalCluster) -> Path:
    """The generated CRD, applied and Established."""
    res = cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CRD))
    assert res.returncode == 0, res.stderr
    cluster.kubectl(
        "wait", "--for=condition=Established", "crd/gputrainingjobs.gpujob.dev", "--timeout=60s"
    )
    return CRD


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
