"""How many requests N jobs send while the API server refuses every pod create with 429.

The operator talks to the real API server through the tests' fault proxy, which answers 429
to every pod create (dry runs included) and records the time of each. Prints the rate of
refused creates and of all requests per window, against what a fixed 5 s retry would send
(N / 5 per second). No asserts: figures only. Run:
``$(bash hack/venv.sh)/bin/python bench/throttled.py --jobs 200 --seconds 120``.
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.support.faultproxy import Fault, FaultProxy
from tests.support.operator import OperatorProcess

from gpujob_localcluster.cluster import LocalCluster
from reconcile import bench_namespace, job  # bench/ is the script's own folder on sys.path


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--jobs", type=int, default=200)
    p.add_argument("--seconds", type=float, default=120.0)
    p.add_argument("--window", type=float, default=20.0)
    args = p.parse_args()
    creates = Fault("POST", re.compile(r"/api/v1/namespaces/bench/pods"), [429], forever=True)
    with tempfile.TemporaryDirectory(prefix="gpujob-bench-") as tmp:
        cluster = LocalCluster(Path(tmp) / "cluster").start()
        proxy = FaultProxy(cluster.kubeconfig, [creates]).start()
        try:
            kube = bench_namespace(cluster)
            op = OperatorProcess(
                proxy.kubeconfig(Path(tmp) / "proxy.kubeconfig"), ["bench"], Path(tmp) / "op.log"
            ).start()
            try:
                burst = "---\n".join(yaml.safe_dump(job(f"j{i}", gpus=1)) for i in range(args.jobs))
                kube.run("apply", "-f", "-", input=burst, check=True, timeout=600)
                t0 = time.time()
                time.sleep(args.seconds)  # a benchmark's measuring period, not synchronisation
                log = op.log_path.read_text(errors="replace")
            finally:
                op.stop()
        finally:
            proxy.stop()
            cluster.stop()
    seen = [t - t0 for t, _ in creates.seen if t >= t0]
    print(f"{args.jobs} jobs, every pod create answered 429, for {args.seconds:.0f}s:")
    print(f"  a fixed 5 s retry would send {args.jobs / 5:.0f} creates/s")
    start = 0.0
    while start < args.seconds:
        n = sum(1 for t in seen if start <= t < start + args.window)
        print(
            f"  {start:5.0f}-{start + args.window:<5.0f}s: {n / args.window:6.1f} refused creates/s"
        )
        start += args.window
    print(f"  tracebacks in the operator log: {log.count('Traceback')}")


if __name__ == "__main__":
    main()
