"""How fast the operator turns GPUTrainingJobs into pods, on the local control plane.

Prints: time from apply to all pods created for one job; for a burst of N jobs of
2 nodes each, the total time, pods/s, the operator's CPU seconds and peak RSS.
No asserts: figures only. Run: ``$(bash hack/venv.sh)/bin/python bench/reconcile.py``.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.integration.conftest import install_crd
from tests.support.kube import Kube
from tests.support.operator import OperatorProcess
from tests.support.waiting import wait_until

from gpujob_localcluster.cluster import LocalCluster, NodeConfig


def job(name: str, gpus: int = 0) -> dict:
    """A job whose pods sleep (its image is never pulled: the node agent runs the command)."""
    return {
        "apiVersion": "gpujob.dev/v1alpha1",
        "kind": "GPUTrainingJob",
        "metadata": {"name": name},
        "spec": {
            "image": "x",
            "nodes": 2,
            "gpusPerNode": gpus,
            "command": ["sleep", "600"],
            "training": {"launcher": "none"},
        },
    }


def bench_namespace(cluster: LocalCluster) -> Kube:
    """The CRD installed and an empty namespace `bench`, kubectl as admin in it."""
    install_crd(cluster)
    kube = Kube(cluster, "bench", cluster.kubeconfig)
    kube.run("create", "namespace", "bench", ns=False, check=True)
    wait_until(lambda: kube.get("serviceaccount", "default"), 30, "default SA")
    return kube


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def count_pods(kube: Kube) -> int:
    out = kube.run("get", "pods", "-l", "gpujob.dev/job-name", "-o", "name").stdout
    return len(out.split())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--jobs", type=int, default=200)
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="gpujob-bench-") as tmp:
        # Enough pod slots for the burst: 110 pods per node.
        nodes = max(2, -(-args.jobs * 2 // 100))
        cluster = LocalCluster(Path(tmp) / "cluster", NodeConfig(count=nodes, gpus=8)).start()
        try:
            kube = bench_namespace(cluster)
            op = OperatorProcess(cluster.kubeconfig, ["bench"], Path(tmp) / "operator.log").start()
            assert op.proc is not None
            pid = op.proc.pid
            try:
                singles = []
                for i in range(2):  # the first job after start-up, then one on a warm operator
                    t0 = time.monotonic()
                    kube.apply(job(f"single-{i}"))
                    n = 2 * (i + 1)
                    wait_until(lambda n=n: count_pods(kube) >= n, 60, "pods", interval=0.02)
                    singles.append(time.monotonic() - t0)

                cpu0 = cpu_seconds(pid)
                burst = "---\n".join(yaml.safe_dump(job(f"burst-{i}")) for i in range(args.jobs))
                t0 = time.monotonic()
                kube.run("apply", "-f", "-", input=burst, check=True, timeout=600)
                applied = time.monotonic() - t0
                want = 4 + 2 * args.jobs
                wait_until(lambda: count_pods(kube) >= want, 900, f"{want} pods", interval=0.5)
                total = time.monotonic() - t0
                cpu = cpu_seconds(pid) - cpu0
                rss = peak_rss_mb(pid)
            finally:
                op.stop()
        finally:
            cluster.stop()
    print(
        f"single job (2 nodes): apply -> all pods created: {singles[0]:.2f}s for the first job "
        f"after start-up, {singles[1]:.2f}s on a warm operator"
    )
    print(
        f"burst of {args.jobs} jobs x 2 nodes: kubectl apply {applied:.1f}s; all {2 * args.jobs} pods created "
        f"after {total:.1f}s -> {2 * args.jobs / total:.1f} pods/s"
    )
    print(
        f"operator: {cpu:.1f} CPU seconds for the burst ({cpu / args.jobs * 1000:.0f} ms per job), "
        f"peak RSS {rss:.0f} MB"
    )


if __name__ == "__main__":
    main()
