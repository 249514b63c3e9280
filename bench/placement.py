"""What keeping a gang off blamed nodes costs at frontier scale (issue 38 on issue 40's cluster).

A cluster of ``--nodes`` GPU nodes (8 GPUs each, realistic node objects: labels, taints,
conditions, images, managed fields), a gang of ``--pods`` pods x 8 GPUs, and ``--avoided``
blamed nodes. Prints, each the median of ``--rounds``:

- list: parsing and slimming the node list (the JSON body the API server sends), done in a
  worker thread by the node cache, and the slimmed list's size;
- place: the fit check and the exclusions on the event loop (``blame.placement``), once per
  pass that creates the attempt's pods, in the worst case (every exclusion given back one by
  one until the gang fits);
- exclude: adding the exclusions to one pod (done for each pod created).

Run: ``$(bash hack/venv.sh)/bin/python bench/placement.py [--nodes 2048 --pods 2048]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpujob_operator.lifecycle import blame
from gpujob_operator.runtime.nodecache import slim


def node(i: int) -> dict[str, Any]:
    """A node object about the size a real GPU node's is (some 20 KB of JSON)."""
    name = f"gpu-{i:05d}"
    return {
        "metadata": {
            "name": name,
            "labels": {f"feature.node.kubernetes.io/k{k}": "true" for k in range(40)}
            | {"kubernetes.io/hostname": name, "topology.kubernetes.io/zone": f"z{i % 4}"},
            "annotations": {f"a{k}": "x" * 40 for k in range(10)},
            "managedFields": [{"manager": "kubelet", "fieldsV1": {"f:status": {"x" * 30: {}}}}] * 8,
        },
        "spec": {"taints": [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}]},
        "status": {
            "allocatable": {"nvidia.com/gpu": "8", "cpu": "224", "memory": "2Ti"},
            "capacity": {"nvidia.com/gpu": "8", "cpu": "224", "memory": "2Ti"},
            "conditions": [{"type": t, "status": "False", "message": "m" * 60} for t in "ABCDE"],
            "images": [
                {"names": [f"registry/img{k}:{'v' * 20}"], "sizeBytes": 1} for k in range(50)
            ],
        },
    }


def median_seconds(fn: Callable[[], object], rounds: int) -> float:
    times = []
    for _ in range(rounds):
        began = time.perf_counter()
        fn()
        times.append(time.perf_counter() - began)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nodes", type=int, default=2048)
    ap.add_argument("--pods", type=int, default=2048)
    ap.add_argument("--avoided", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    body = json.dumps({"items": [node(i) for i in range(a.nodes)]}).encode()

    def parse() -> tuple[dict[str, Any], ...]:
        return tuple(slim(n) for n in json.loads(body)["items"])

    listed = median_seconds(parse, a.rounds)
    tracemalloc.start()
    nodes = parse()
    kept, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    pod = {
        "spec": {
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}],
            "containers": [{"resources": {"requests": {"nvidia.com/gpu": "8", "cpu": "200"}}}],
        }
    }
    # Worst case: the gang needs every node, so each exclusion is given back in turn.
    avoided = [
        {"node": f"gpu-{i:05d}", "reason": "Straggler", "since": f"2026-01-01T00:00:{i % 60:02d}Z"}
        for i in range(a.avoided)
    ]
    view = blame.NodeView(nodes)
    placed = blame.placement(avoided, pod, a.pods, view, 3)
    assert placed is not None
    place = median_seconds(lambda: blame.placement(avoided, pod, a.pods, view, 3), a.rounds)
    names = [str(x["node"]) for x in avoided]
    exclude = median_seconds(lambda: blame.exclude(pod, names), max(a.rounds, 50))
    print(
        f"{a.nodes} nodes ({len(body) / 2**20:.1f} MiB of JSON), gang of {a.pods} pods, "
        f"{a.avoided} avoided ({placed.reason}, {len(placed.excluded)} kept): list parse+slim "
        f"{listed * 1e3:.0f} ms in a thread ({kept / 2**20:.1f} MiB kept); place "
        f"{place * 1e3:.1f} ms on the loop; exclude {exclude * 1e6:.0f} us per pod"
    )


if __name__ == "__main__":
    main()
