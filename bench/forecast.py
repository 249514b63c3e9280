"""What the start-time forecast costs at fleet scale: one pass over every waiting job.

A synthetic cluster as the API would return it: ``--nodes`` GPU nodes of 8 GPUs in four
labelled pools, ``--running`` gpujob jobs holding them (each a gang of 1-4 nodes, an ETA
each, a tenth without one), foreign GPU pods, and ``--waiting`` jobs queued by age with
node selectors. The same fleet under Kueue: four ClusterQueues in one cohort, every
running job an admitted Workload, every waiting one pending.

Prints, for each view: the time to read the objects into pools (``queueview``), the
simulation (``simulation``), the whole pass including the status blocks (``queuestatus``),
and the confidences it gave; the median of ``--repeat`` passes. No asserts: figures only.
Run: ``$(bash hack/venv.sh)/bin/python bench/forecast.py``.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpujob_operator import api
from gpujob_operator.lifecycle.forecast import queuestatus, queueview
from gpujob_operator.lifecycle.forecast.simulation import forecast_all

NOW = 1_796_000_000.0
POOLS = ("a", "b", "c", "d")


def iso(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def job(
    name: str,
    nodes: int,
    gpus: int,
    pool: str,
    phase: str,
    eta: float | None,
    age: int,
    kueue: bool,
) -> dict[str, Any]:
    status: dict[str, Any] = {"phase": phase}
    if eta is not None:
        status["progress"] = {"estimatedCompletionTime": iso(NOW + eta), "etaSeconds": eta}
    labels = {api.KUEUE_QUEUE_LABEL: f"lq-{pool}"} if kueue else {}
    return {
        "apiVersion": api.API_VERSION,
        "kind": api.KIND,
        "metadata": {
            "name": name,
            "namespace": "ml",
            "uid": f"uid-{name}",
            "creationTimestamp": iso(NOW - 86400 + age),
            "labels": labels,
        },
        "spec": {
            "image": "t:1",
            "command": ["python", "-m", "train"],
            "nodes": nodes,
            "gpusPerNode": gpus,
            "template": {"nodeSelector": {"pool": pool}},
        },
        "status": status,
    }


def gpu_pod(name: str, node: str, owner: str | None, gpus: int = 4) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "ml"}
    if owner:
        meta["ownerReferences"] = [{"uid": f"uid-{owner}", "controller": True, "kind": api.KIND}]
    return {
        "metadata": meta,
        "spec": {
            "nodeName": node,
            "containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": gpus}}}],
        },
        "status": {"phase": "Running"},
    }


def native_fleet(
    n_nodes: int, n_running: int, n_waiting: int, rng: random.Random
) -> tuple[list, queueview.World]:
    nodes = [
        {
            "metadata": {"name": f"n{i}", "labels": {"pool": POOLS[i % 4]}},
            "spec": {},
            "status": {"allocatable": {"nvidia.com/gpu": "8"}},
        }
        for i in range(n_nodes)
    ]
    # Two 4-GPU slots per node: the running jobs (gangs of 1-2 nodes) fill most of them.
    free = {p: [] for p in POOLS}
    for n in nodes:
        free[n["metadata"]["labels"]["pool"]] += [n["metadata"]["name"]] * 2
    jobs, pods = [], []
    for i in range(n_running):
        pool = POOLS[i % 4]
        size = 1 if i % 3 else 2
        eta = None if i % 10 == 0 else rng.uniform(60, 86400)
        name = f"run{i}"
        if len(free[pool]) < size:
            continue
        jobs.append(job(name, size, 4, pool, "Running", eta, i, False))
        for r in range(size):
            pods.append(gpu_pod(f"{name}-node-{r}", free[pool].pop(), name))
    for i in range(n_nodes // 20):  # foreign pods (no ETA) on some of what is left
        pool = POOLS[i % 4]
        if free[pool]:
            pods.append(gpu_pod(f"notebook{i}", free[pool].pop(), None))
    for i in range(n_waiting):
        size, gpus = rng.randint(1, 4), rng.choice((4, 8))
        jobs.append(job(f"wait{i}", size, gpus, POOLS[i % 4], "Pending", None, 50_000 + i, False))
    return jobs, queueview.World(nodes=nodes, pods=pods)


def kueue_fleet(
    n_nodes: int, n_running: int, n_waiting: int, rng: random.Random
) -> tuple[list, queueview.World]:
    quota = n_nodes * 8 // 4
    cqs = [
        {
            "metadata": {"name": f"cq-{p}"},
            "spec": {
                "cohortName": "all",
                "resourceGroups": [
                    {
                        "coveredResources": ["nvidia.com/gpu"],
                        "flavors": [
                            {
                                "name": "gpu",
                                "resources": [{"name": "nvidia.com/gpu", "nominalQuota": quota}],
                            }
                        ],
                    }
                ],
            },
        }
        for p in POOLS
    ]
    lqs = [
        {"metadata": {"name": f"lq-{p}", "namespace": "ml"}, "spec": {"clusterQueue": f"cq-{p}"}}
        for p in POOLS
    ]
    jobs, wls = [], []
    used = Counter[str]()
    i = 0
    while i < n_running + n_waiting:
        pool = POOLS[i % 4]
        size = rng.randint(1, 4)
        running = i < n_running
        if running and used[pool] + size * 8 > quota:
            n_running -= 1  # this pool's quota is full: the rest of the fleet waits
            continue
        eta = None if i % 10 == 0 else rng.uniform(60, 86400)
        name = f"j{i}"
        phase = "Running" if running else "Pending"
        jobs.append(job(name, size, 8, pool, phase, eta if running else None, i, True))
        wl: dict[str, Any] = {
            "metadata": {
                "name": f"wl-{name}",
                "namespace": "ml",
                "creationTimestamp": iso(NOW - 86400 + i),
                "labels": {"gpujob.dev/job-name": name},
            },
            "spec": {
                "queueName": f"lq-{pool}",
                "podSets": [
                    {
                        "name": "workers",
                        "count": size,
                        "template": {
                            "spec": {
                                "containers": [
                                    {"name": "c", "resources": {"requests": {"nvidia.com/gpu": 8}}}
                                ]
                            }
                        },
                    }
                ],
            },
            "status": {},
        }
        if running:
            used[pool] += size * 8
            wl["status"]["admission"] = {
                "clusterQueue": f"cq-{pool}",
                "podSetAssignments": [
                    {
                        "name": "workers",
                        "flavors": {"nvidia.com/gpu": "gpu"},
                        "resourceUsage": {"nvidia.com/gpu": str(size * 8)},
                    }
                ],
            }
        else:
            jobs[-1]["status"]["gang"] = {"admitted": False}
        wls.append(wl)
        i += 1
    return jobs, queueview.World(cluster_queues=cqs, local_queues=lqs, workloads=wls)


def timed(fn: Callable[[], Any], repeat: int) -> tuple[float, Any]:
    times, out = [], None
    for _ in range(repeat):
        began = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - began)
    return statistics.median(times), out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", type=int, default=500)
    p.add_argument("--running", type=int, default=1000)
    p.add_argument("--waiting", type=int, default=1000)
    p.add_argument("--repeat", type=int, default=5)
    a = p.parse_args()
    rng = random.Random(7)
    print(
        f"fleet: {a.nodes} nodes x 8 GPUs, {a.running} running jobs, {a.waiting} waiting; median of {a.repeat}"
    )
    for label, build in (("native", native_fleet), ("kueue", kueue_fleet)):
        jobs, world = build(a.nodes, a.running, a.waiting, rng)
        measure(label, jobs, world, a.repeat)


def measure(label: str, jobs: list[Any], world: queueview.World, repeat: int) -> None:
    """Time reading the fleet into pools, the simulation, and the whole pass; print them."""
    if label == "native":

        def read() -> queueview.View:
            return queueview.node_view(NOW, jobs, world.nodes, world.pods, "None")
    else:

        def read() -> queueview.View:
            return queueview.kueue_view(
                NOW, jobs, world.cluster_queues, world.local_queues, world.workloads
            )

    t_read, view = timed(read, repeat)
    t_sim, _ = timed(lambda: forecast_all(NOW, view.capacity, view.holders, view.waiters), repeat)
    t_pass, blocks = timed(lambda: queuestatus.forecast_blocks(NOW, jobs, world, "None"), repeat)
    conf = Counter(b["confidence"] for b in blocks.values())
    print(
        f"{label:7s} pools={len(view.capacity):4d} holders={len(view.holders):5d} "
        f"waiters={len(view.waiters):5d} | read {t_read * 1000:7.1f} ms  "
        f"simulate {t_sim * 1000:7.1f} ms  whole pass {t_pass * 1000:7.1f} ms | "
        + ", ".join(f"{k} {v}" for k, v in sorted(conf.items()))
    )


if __name__ == "__main__":
    main()
