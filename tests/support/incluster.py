"""The operator as the chart deploys it: a helm release whose Deployment's pods run it.

The node agent runs the Deployment's pods like a kubelet (the service-account token
mounted, probes, restarts), so what runs here is what runs on a cluster: the chart's
args, env, probes and RBAC, enforced on the pod's own token. Tests and ``bench/takeover.py``
share this handle.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from gpujob_localcluster.cluster import LocalCluster
from gpujob_localcluster.tools import bin_dir
from gpujob_operator.runtime import peers
from tests.support.jobs import python_job
from tests.support.waiting import wait_until

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "gpujob"

FORBIDDEN_NOISE = (
    # Namespaces of earlier tests still terminating refuse new content with a Forbidden.
    "being terminated",
    "NamespaceTerminating",
)


def rbac_denials(log: str) -> list[str]:
    """Log lines where the API server refused the operator for lack of permission.

    A 403 shows as "Forbidden" in the client's and kopf's errors. kopf's namespace scan may
    be refused in namespaced mode without rbac.clusterDiscovery; neither that nor a
    terminating namespace is a missing permission of the operator's own work.
    """
    log = log.replace("Not enough permissions to list namespaces", "")
    return [
        line
        for line in log.splitlines()
        if "Forbidden" in line and not any(n in line for n in FORBIDDEN_NOISE)
    ]


@dataclass
class ChartOperator:
    """``helm install <release> charts/gpujob`` into ``namespace``; the operator is its pods."""

    cluster: LocalCluster
    namespace: str
    home: Path
    release: str = "gj"

    @property
    def deployment(self) -> str:
        return self.release if "gpujob" in self.release else f"{self.release}-gpujob"

    def kubectl(self, *args: str, check: bool = True, timeout: float = 60) -> str:
        res = self.cluster.kubectl("-n", self.namespace, *args, timeout=timeout)
        if check and res.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)}: {res.stderr}")
        return res.stdout

    def helm(self, *args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
        env = {
            var: str(self.home / var.lower())
            for var in ("HELM_CACHE_HOME", "HELM_CONFIG_HOME", "HELM_DATA_HOME")
        }
        return subprocess.run(
            [str(bin_dir() / "helm"), "--kubeconfig", str(self.cluster.kubeconfig), *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            env={**os.environ, **env},
        )

    def _values(self, values: dict[str, Any]) -> Path:
        self.home.mkdir(parents=True, exist_ok=True)
        path = self.home / f"values-{len(list(self.home.glob('values-*.yaml')))}.yaml"
        path.write_text(yaml.safe_dump(values))
        return path

    def install(self, values: dict[str, Any] | None = None, *extra: str) -> str:
        """Install the chart and wait until its Deployment is Available; returns helm's output."""
        res = self.helm(
            "install",
            self.release,
            str(CHART),
            "-n",
            self.namespace,
            "-f",
            str(self._values(values or {})),
            *extra,
        )
        if res.returncode != 0:
            # A failed install keeps its release and cluster-scoped objects (the ClusterRole),
            # which would refuse every later test's release: remove them before failing.
            with contextlib.suppress(AssertionError):
                self.uninstall()
            raise AssertionError(f"helm install failed: {res.stderr}")
        self.wait_available()
        return res.stdout

    def upgrade(self, values: dict[str, Any], *extra: str) -> None:
        res = self.helm(
            "upgrade",
            self.release,
            str(CHART),
            "-n",
            self.namespace,
            "-f",
            str(self._values(values)),
            *extra,
        )
        assert res.returncode == 0, res.stderr

    def deployment_status(self) -> dict[str, Any]:
        out = self.kubectl("get", "deployment", self.deployment, "-o", "json", check=False)
        return dict(json.loads(out).get("status", {})) if out else {}

    def available(self) -> bool:
        status = self.deployment_status()
        conds = {c["type"]: c["status"] for c in status.get("conditions", [])}
        want = int(status.get("replicas", 0))
        return (
            conds.get("Available") == "True"
            and want > 0
            and status.get("updatedReplicas") == want
            and status.get("readyReplicas") == want
            and status.get("availableReplicas") == want
        )

    def wait_available(self, timeout: float = 180) -> None:
        try:
            wait_until(self.available, timeout, f"deployment {self.deployment} Available")
        except AssertionError:
            print(self.kubectl("get", "pods", "-o", "wide", check=False))
            print(self.logs())
            raise

    def pods(self) -> list[dict[str, Any]]:
        """The operator's pods that are not being deleted."""
        out = self.kubectl(
            "get", "pods", "-l", f"app.kubernetes.io/instance={self.release}", "-o", "json"
        )
        return [p for p in json.loads(out)["items"] if not p["metadata"].get("deletionTimestamp")]

    def logs(self, previous: bool = False) -> str:
        """Every operator pod's log, through ``kubectl logs`` (the node agent's kubelet API)."""
        out = []
        for pod in self.pods():
            name = pod["metadata"]["name"]
            args = ["logs", name] + (["--previous"] if previous else [])
            res = self.cluster.kubectl("-n", self.namespace, *args)
            out.append(f"----- {name}{' (previous)' if previous else ''}\n{res.stdout}{res.stderr}")
        return "\n".join(out)

    def rbac_denials(self) -> list[str]:
        return rbac_denials(self.logs())

    def peering(self, name: str = "gpujob") -> dict[str, Any]:
        res = self.cluster.kubectl("get", "clusterkopfpeering", name, "-o", "json")
        return dict(json.loads(res.stdout).get("status") or {}) if res.returncode == 0 else {}

    def active_pod(self) -> str | None:
        """The replica kopf peering lets work (by kopf's rule), or None while none is."""
        status = self.peering()
        now = dt.datetime.now(dt.UTC)
        live = [p["metadata"]["name"] for p in self.pods()]
        for ident in live:
            info = status.get(ident)
            if info is not None and peers.is_active(status, ident, int(info["priority"]), now):
                return ident
        return None

    def main_pid(self, pod: str) -> int:
        """The operator process of a pod: the child of the container's ``unshare``."""
        obj = json.loads(self.kubectl("get", "pod", pod, "-o", "json"))
        cid = obj["status"]["containerStatuses"][0]["containerID"]
        root = int(cid.removeprefix("local://"))
        kids = [
            int(k)
            for task in Path(f"/proc/{root}/task").iterdir()
            for k in (task / "children").read_text().split()
        ]
        assert kids, f"pod {pod}'s container process {root} has no child"
        return kids[0]

    def uninstall(self, timeout: float = 90) -> None:
        """Uninstall and wait until its pods are gone (no operator outlives its test)."""
        self.helm("uninstall", self.release, "-n", self.namespace, "--wait=false")
        wait_until(
            lambda: (
                not self.cluster.kubectl(
                    "-n",
                    self.namespace,
                    "get",
                    "pods",
                    "-l",
                    f"app.kubernetes.io/instance={self.release}",
                    "-o",
                    "name",
                ).stdout.strip()
            ),
            timeout,
            f"release {self.release}'s pods gone",
        )


def sleeper_job(name: str, seconds: float, nodes: int = 2) -> dict[str, Any]:
    """A job whose ranks sleep (no torch): long enough to disturb the operator mid-job."""
    script = f"import time; time.sleep({seconds})"
    # Recreate: the census proves a restart by the gang's new pods (their UIDs).
    return python_job(
        name, script, nodes, runPolicy={"backoffLimit": 3, "restartStrategy": "Recreate"}
    )


class PodCensus:
    """Counts a job's live pods every few hundred ms in the background: the most seen at once,
    and every pod uid, so a duplicate reconciler (two pods of one rank) cannot go unseen."""

    def __init__(self, cluster: LocalCluster, namespace: str, job: str) -> None:
        import threading

        self.cluster, self.namespace, self.job = cluster, namespace, job
        self.max_live = 0
        self.per_rank_max = 0
        self.uids: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.3):
            res = self.cluster.kubectl(
                "-n",
                self.namespace,
                "get",
                "pods",
                "-l",
                f"gpujob.dev/job-name={self.job}",
                "-o",
                "json",
            )
            if res.returncode != 0:
                continue
            live = [
                p
                for p in json.loads(res.stdout)["items"]
                if not p["metadata"].get("deletionTimestamp")
                and p.get("status", {}).get("phase") not in ("Succeeded", "Failed")
            ]
            self.uids.update(p["metadata"]["uid"] for p in live)
            self.max_live = max(self.max_live, len(live))
            ranks: dict[str, int] = {}
            for p in live:
                rank = p["metadata"]["labels"].get("gpujob.dev/node-rank", p["metadata"]["name"])
                ranks[rank] = ranks.get(rank, 0) + 1
            self.per_rank_max = max([self.per_rank_max, *ranks.values()])

    def stop(self) -> PodCensus:
        self._stop.set()
        self._thread.join(10)
        return self
