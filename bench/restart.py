"""How long a gang restart takes: one rank fails -> every rank of the next attempt steps again.

A fresh local control plane (2 nodes x 4 GPUs: real API server, scheduler, node agent) and
the operator (host mode). One job of 2 pods x 4 ranks under torchrun; every rank joins a gloo
group, then steps (an all-reduce and a tracker step every 50 ms). Each round the bench asks
one rank to fail (a file it polls) and measures, from that moment:

- detect: the job's status says Restarting (the operator saw the failed pod);
- gone: the old pods are deleted and gone;
- placed: every pod of the new attempt is bound to a node;
- running: every new pod is Running;
- stepping: all 8 ranks of the new attempt completed a step (each writes a file when it does).

The restart backoff is set to 0 (``GPUJOB_RESTART_BACKOFF_BASE_SECONDS``): it is policy, not
mechanism; by default the first restart waits 10 s more. Only ``Recreate`` exists today
(every pod deleted and created again); ``InPlace`` (containers restarted in their pods,
issue 38) is not built, so its column says so. Figures only, no assertion.

Run: ``$(bash hack/venv.sh)/bin/python bench/restart.py [--rounds 3]``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.integration.conftest import install_crd
from tests.support.jobs import python_job, repo_code_env
from tests.support.kube import Kube
from tests.support.operator import OperatorProcess
from tests.support.waiting import wait_until

from gpujob_localcluster.cluster import LocalCluster

NODES, PROCS = 2, 4
PHASES = ("detect", "gone", "placed", "running", "stepping")

RANK = """
import os, pathlib, sys, time
import torch
import torch.distributed as dist
from gpujob_trainer.tracker import Tracker

box = pathlib.Path(BOX)
attempt, rank = os.environ["ATTEMPT"], int(os.environ["RANK"])
dist.init_process_group("gloo")
tracker = Tracker(hook_optimizers=False)
t = torch.ones(16)
marked = False
while True:
    dist.all_reduce(t)
    tracker.end_step()
    if not marked:
        (box / f"step-{attempt}-{rank}").touch()
        marked = True
    if rank == PROCS + 1 and (box / f"fail-{attempt}").exists():
        sys.exit("the bench failed this rank")
    time.sleep(0.05)
"""


def job(box: Path) -> dict[str, Any]:
    script = box / "rank.py"
    script.write_text(RANK.replace("BOX", repr(str(box))).replace("PROCS", str(PROCS)))
    env = [
        repo_code_env(),
        {"name": "ATTEMPT", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['gpujob.dev/attempt']"}}},
    ]  # fmt: skip
    body = python_job(
        "restarts",
        "",
        nodes=NODES,
        gpus=4,
        env=env,
        training={"launcher": "torchrun", "procsPerNode": PROCS, "rdzvTimeoutSeconds": 120},
        runPolicy={"backoffLimit": 100, "maxRestartsWithoutProgress": 64},
        monitoring={"enabled": False},
    )
    body["spec"]["command"] = ["python", str(script)]
    return body


def pods(kube: Kube) -> list[dict[str, Any]]:
    return kube.list("pods", "gpujob.dev/job-name=restarts")


def of_attempt(kube: Kube, attempt: int) -> list[dict[str, Any]]:
    return [p for p in pods(kube) if p["metadata"]["labels"]["gpujob.dev/attempt"] == str(attempt)]


def one_round(kube: Kube, box: Path, attempt: int) -> dict[str, float]:
    ranks = NODES * PROCS
    wait_until(
        lambda: len(list(box.glob(f"step-{attempt}-*"))) == ranks,
        300,
        f"attempt {attempt} stepping",
    )
    began = time.monotonic()
    (box / f"fail-{attempt}").touch()
    out: dict[str, float] = {}

    def mark(name: str, check: Any, timeout: float = 300) -> None:
        wait_until(check, timeout, f"{name} of attempt {attempt + 1}", interval=0.05)
        out[name] = time.monotonic() - began

    def phase() -> str:
        obj = kube.get("gputrainingjob", "restarts") or {}
        return str(obj.get("status", {}).get("phase"))

    mark("detect", lambda: phase() == "Restarting")
    mark("gone", lambda: not of_attempt(kube, attempt))
    new = attempt + 1
    mark(
        "placed",
        lambda: (
            len(p := of_attempt(kube, new)) == NODES and all(x["spec"].get("nodeName") for x in p)
        ),
    )
    mark("running", lambda: len(p := of_attempt(kube, new)) == NODES and all(x["status"].get("phase") == "Running" for x in p))  # fmt: skip
    mark("stepping", lambda: len(list(box.glob(f"step-{new}-*"))) == ranks)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="gpujob-restart-bench-") as tmp:
        folder = Path(tmp)
        cluster = LocalCluster(folder / "cluster")
        cluster.start()
        op = None
        try:
            install_crd(cluster)
            kube = Kube(cluster, "bench", cluster.kubeconfig)
            kube.run("create", "namespace", "bench", ns=False, check=True)
            wait_until(lambda: kube.get("serviceaccount", "default"), 30, "default ServiceAccount")
            op = OperatorProcess(
                cluster.kubeconfig,
                ["bench"],
                folder / "operator.log",
                extra_env={"GPUJOB_RESTART_BACKOFF_BASE_SECONDS": "0"},
            ).start()
            box = folder / "box"
            box.mkdir()
            kube.apply(job(box))
            rows = []
            for n in range(args.rounds):
                row = one_round(kube, box, n)
                rows.append(row)
                print(
                    f"round {n + 1}: " + ", ".join(f"{k} {row[k]:.1f}s" for k in PHASES),
                    flush=True,
                )
        finally:
            if op is not None:
                op.stop()
            cluster.stop()
    med = {k: statistics.median(r[k] for r in rows) for k in PHASES}
    total = med["stepping"]
    print(
        f"restart of {NODES} x {PROCS} ranks, failure -> every rank stepping again (median of "
        f"{len(rows)}, restart backoff 0): Recreate {total:.1f}s (detect {med['detect']:.1f}, "
        f"old pods gone {med['gone']:.1f}, new pods bound {med['placed']:.1f}, running "
        f"{med['running']:.1f}); InPlace: not built (issue 38), so no ratio yet"
    )


if __name__ == "__main__":
    main()
