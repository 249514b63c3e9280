"""How long a gang restart takes: one rank fails -> every rank of the next attempt steps again.

A fresh local control plane (2 nodes x 4 GPUs: real API server, scheduler, node agent, whose
nodes declare RestartAllContainersOnContainerExits) and the operator (host mode). One job of
2 pods x 4 ranks under torchrun per restart strategy; every rank joins a gloo group, then
steps (an all-reduce and a tracker step every 50 ms). Each round the bench asks one rank to
fail (a file it polls) and measures, from that moment (each round a fresh job, so every
restart measured is its job's first):

- detect: the job's status counts the next attempt (the operator saw the failure);
- placed: every pod of the new attempt exists and is bound to a node (Recreate: the old pods
  deleted and gone, new ones created and scheduled; InPlace: the same pods, moved);
- running: the job is Running again, every rank of the new attempt up (InPlace: every pod
  restarted in place and released);
- stepping: all 8 ranks of the new attempt completed a step (each writes a file when it does).

The restart backoff is set to 0 (``GPUJOB_RESTART_BACKOFF_BASE_SECONDS``): it is policy, not
mechanism; by default a Recreate restart waits 10 s more. An in-place restart is spaced by
the kubelet's crash-loop back-off instead, which lets a pod's first restart through at once
and its later ones after 10 s, 20 s ... (a fresh job per round keeps both out). The
last line gives both times and their ratio. Figures only, no assertion.

Run: ``$(bash hack/venv.sh)/bin/python bench/restart.py [--rounds 3] [--strategy both]``.
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
PHASES = ("detect", "placed", "running", "stepping")
STRATEGIES = ("Recreate", "InPlace")

RANK = """
import os, pathlib, sys, time
import torch
import torch.distributed as dist
from gpujob_trainer.tracker import Tracker

box = pathlib.Path(BOX)
# The supervisor of an in-place pod knows the attempt its run belongs to; a recreated pod's
# label does (a container restarted in place keeps the env it was created with).
attempt = os.environ.get("GPUJOB_ATTEMPT") or os.environ["ATTEMPT"]
rank = int(os.environ["RANK"])
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


def job(box: Path, strategy: str) -> dict[str, Any]:
    script = box / "rank.py"
    script.write_text(RANK.replace("BOX", repr(str(box))).replace("PROCS", str(PROCS)))
    env = [
        repo_code_env(),
        {"name": "ATTEMPT", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['gpujob.dev/attempt']"}}},
    ]  # fmt: skip
    body = python_job(
        NAME[strategy],
        "",
        nodes=NODES,
        gpus=4,
        env=env,
        training={"launcher": "torchrun", "procsPerNode": PROCS, "rdzvTimeoutSeconds": 120},
        runPolicy={
            "backoffLimit": 100,
            "maxRestartsWithoutProgress": 64,
            "restartStrategy": strategy,
        },
        monitoring={"enabled": False},
    )
    body["spec"]["command"] = ["python", str(script)]
    return body


NAME = {"Recreate": "recreate", "InPlace": "inplace"}


def of_attempt(kube: Kube, name: str, attempt: int) -> list[dict[str, Any]]:
    pods = kube.list("pods", f"gpujob.dev/job-name={name}")
    return [p for p in pods if p["metadata"]["labels"]["gpujob.dev/attempt"] == str(attempt)]


def one_round(kube: Kube, box: Path, name: str, attempt: int) -> dict[str, float]:
    ranks = NODES * PROCS
    wait_until(
        lambda: len(list(box.glob(f"step-{attempt}-*"))) == ranks,
        300,
        f"attempt {attempt} stepping",
    )
    began = time.monotonic()
    (box / f"fail-{attempt}").touch()
    out: dict[str, float] = {}

    def mark(what: str, check: Any, timeout: float = 300) -> None:
        wait_until(check, timeout, f"{what} of attempt {attempt + 1}", interval=0.05)
        out[what] = time.monotonic() - began

    def status() -> dict[str, Any]:
        return dict((kube.get("gputrainingjob", name) or {}).get("status") or {})

    new = attempt + 1
    mark("detect", lambda: status().get("gang", {}).get("attempt") == new)
    mark(
        "placed",
        lambda: (
            len(p := of_attempt(kube, name, new)) == NODES
            and all(x["spec"].get("nodeName") for x in p)
        ),
    )
    mark(
        "running",
        lambda: (
            (st := status()).get("phase") == "Running" and st.get("gang", {}).get("attempt") == new
        ),
    )
    mark("stepping", lambda: len(list(box.glob(f"step-{new}-*"))) == ranks)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--strategy", choices=(*STRATEGIES, "both"), default="both")
    args = ap.parse_args()
    strategies = STRATEGIES if args.strategy == "both" else (args.strategy,)
    rows: dict[str, list[dict[str, float]]] = {}
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
            for strategy in strategies:
                rows[strategy] = []
                for n in range(args.rounds):
                    # A fresh job each round: every restart is a job's first, so neither the
                    # operator's restart back-off nor the kubelet's crash-loop back-off (which
                    # spaces a pod's repeated in-place restarts: 10 s, 20 s ...) is measured.
                    box = folder / f"{strategy}-{n}"
                    box.mkdir()
                    kube.apply(job(box, strategy))
                    got = wait_until(
                        lambda s=strategy: (
                            (kube.get("gputrainingjob", NAME[s]) or {})
                            .get("status", {})
                            .get("gang", {})
                            .get("restartStrategy")
                        ),
                        120,
                        f"the {strategy} job's restart strategy",
                    )
                    assert got["strategy"] == strategy, got
                    row = one_round(kube, box, NAME[strategy], 0)
                    rows[strategy].append(row)
                    print(
                        f"{strategy} round {n + 1}: "
                        + ", ".join(f"{k} {row[k]:.1f}s" for k in PHASES),
                        flush=True,
                    )
                    kube.run("delete", "gputrainingjob", NAME[strategy], "--wait=true", check=True)
                    wait_until(
                        lambda s=strategy: not kube.list("pods", f"gpujob.dev/job-name={NAME[s]}"),
                        120,
                        "the job's pods gone",
                    )
        finally:
            if op is not None:
                op.stop()
            cluster.stop()
    med = {s: {k: statistics.median(r[k] for r in rows[s]) for k in PHASES} for s in rows}
    parts = [
        f"{s} {m['stepping']:.1f}s (detect {m['detect']:.1f}, placed {m['placed']:.1f}, "
        f"running {m['running']:.1f})"
        for s, m in med.items()
    ]
    ratio = ""
    if len(med) == 2:
        ratio = f"; InPlace/Recreate {med['InPlace']['stepping'] / med['Recreate']['stepping']:.2f}"
    print(
        f"restart of {NODES} x {PROCS} ranks, failure -> every rank stepping again (median of "
        f"{args.rounds}, restart backoff 0): " + ", ".join(parts) + ratio
    )


if __name__ == "__main__":
    main()
