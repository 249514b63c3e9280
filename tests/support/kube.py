"""Test-side handles on the local cluster: kubectl runs and a fresh namespace per test."""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from gpujob_localcluster.cluster import LocalCluster
from tests.support import rest
from tests.support.waiting import wait_until

GET_COLUMNS: tuple[str, ...] = (
    "NAME", "STATUS", "NODES", "GPUS", "PROGRESS", "ETA", "THROUGHPUT", "BOTTLENECK", "MFU",
    "AGE",
)  # fmt: skip
"""The columns of `kubectl get gputrainingjobs` (the CRD's printer columns without -o wide)."""


@dataclass
class Kube:
    """kubectl bound to one cluster, one namespace and one kubeconfig."""

    cluster: LocalCluster
    namespace: str
    kubeconfig: Path

    def run(
        self,
        *args: str,
        input: str | None = None,
        ns: bool = True,
        check: bool = False,
        timeout: float = 60,
    ) -> subprocess.CompletedProcess[str]:
        assert self.cluster.cp is not None
        extra = ["-n", self.namespace] if ns else []
        res = self.cluster.cp.kubectl(
            *extra, *args, input=input, kubeconfig_path=self.kubeconfig, timeout=timeout
        )
        if check and res.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed: {res.stderr}")
        return res

    def apply(self, manifest: dict[str, Any] | str) -> subprocess.CompletedProcess[str]:
        text = manifest if isinstance(manifest, str) else yaml.safe_dump(manifest)
        return self.run("apply", "-f", "-", input=text, check=True)

    def get(self, kind: str, name: str) -> dict[str, Any] | None:
        if how := rest.reader(self.kubeconfig, kind):
            return rest.get(how, self.namespace, name)
        res = self.run("get", kind, name, "-o", "json")
        return json.loads(res.stdout) if res.returncode == 0 else None

    def list(self, kind: str, selector: str | None = None) -> list[dict[str, Any]]:
        if how := rest.reader(self.kubeconfig, kind):
            return rest.list_items(how, self.namespace, selector)
        args = ["get", kind, "-o", "json"] + (["-l", selector] if selector else [])
        return list(json.loads(self.run(*args, check=True).stdout)["items"])

    def wait_phase(self, pod: str, phases: tuple[str, ...], timeout: float = 60) -> dict[str, Any]:
        def check() -> dict[str, Any] | None:
            obj = self.get("pod", pod)
            return obj if obj and obj.get("status", {}).get("phase") in phases else None

        return wait_until(check, timeout, f"pod {pod} in {phases}")

    def wait_gone(self, kind: str, name: str, timeout: float = 60) -> None:
        wait_until(lambda: self.get(kind, name) is None, timeout, f"{kind} {name} gone")


def simple_pod(name: str, script: str, gpus: int = 0, **spec: Any) -> dict[str, Any]:
    """A one-container pod that runs a Python snippet (the agent ignores the image)."""
    container: dict[str, Any] = {
        "name": "main",
        "image": "python:3.11-slim",
        "command": ["python", "-c", script],
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "env": [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}],
    }
    if gpus:
        container["resources"] = {"limits": {"nvidia.com/gpu": str(gpus)}}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 5,
            "containers": [container],
            **spec,
        },
    }
