"""How fast a standby operator replica takes over when the active one goes away, mid-job.

The chart is installed with two replicas and kopf peering on a fresh local cluster; the
operators are the Deployment's pods (in-cluster token, probes). Each round runs a 2-rank
job, takes the active replica away while it runs, and at the same moment deletes one rank
pod, which only a working operator can repair (a gang restart). Scenarios:

- ``delete-pod``: ``kubectl delete pod`` of the active replica (a clean exit: kopf withdraws
  it from the peering object at once);
- ``sigkill``: SIGKILL of the active replica's process (its keep-alive has to lapse:
  ``peering.lifetime``); the pod restarts the container in place;
- ``helm-upgrade``: ``helm upgrade`` that changes the pod template (a rolling update).

Prints per round: the handover (disturbance -> another replica active by kopf's rule), the
recovery (disturbance -> the lost rank's restart counted in the job's status), the job's
final restarts (must be 1) and the most pods seen per rank (must be 1). Figures only.
Run: ``$(bash hack/venv.sh)/bin/python bench/takeover.py [--rounds 2] [--lifetime 20]``.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.integration.conftest import install_crd
from tests.support.incluster import ChartOperator, PodCensus, sleeper_job
from tests.support.kube import Kube
from tests.support.waiting import wait_until

from gpujob_localcluster.cluster import LocalCluster

SCENARIOS = ("delete-pod", "sigkill", "helm-upgrade")


def status(kube: Kube, job: str) -> dict[str, Any]:
    return dict((kube.get("gputrainingjob", job) or {}).get("status", {}))


def disturb(scenario: str, op: ChartOperator, victim: str, values: dict[str, Any], n: int) -> None:
    if scenario == "delete-pod":
        op.kubectl("delete", "pod", victim, "--wait=false")
    elif scenario == "sigkill":
        os.kill(op.main_pid(victim), signal.SIGKILL)
    else:
        op.upgrade({**values, "podAnnotations": {"bench/round": str(n)}}, "--skip-crds")


def one_round(
    scenario: str, n: int, op: ChartOperator, kube: Kube, values: dict[str, Any], logs: Path
) -> dict[str, Any]:
    job = f"{scenario}-{n}"
    op.wait_available()
    kube.apply(sleeper_job(job, 30))
    census = PodCensus(kube.cluster, kube.namespace, job)
    wait_until(lambda: status(kube, job).get("phase") == "Running", 180, f"{job} Running")
    victim = wait_until(op.active_pod, 60, "an active replica")
    t0 = time.monotonic()
    disturb(scenario, op, victim, values, n)
    kube.run("delete", "pod", f"{job}-node-1", "--wait=false", check=True)
    handover = recovery = None
    deadline = t0 + 240
    while time.monotonic() < deadline and (handover is None or recovery is None):
        now = time.monotonic()
        if handover is None:
            active = op.active_pod()
            if active is not None and active != victim:
                handover = now - t0
        if recovery is None and int(status(kube, job).get("gang", {}).get("restarts") or 0) >= 1:
            recovery = now - t0
        time.sleep(0.2)
    final = wait_until(
        lambda: (s := status(kube, job)).get("phase") in ("Succeeded", "Failed") and s,
        300,
        f"{job} finished",
    )
    census.stop()
    # Every operator pod's log from the node agent's folders, deleted pods included.
    parts = [
        f"----- {path.parent.name}/{path.name}\n{path.read_text(errors='replace')}"
        for path in sorted(op.cluster.pods_dir.glob(f"{op.namespace}_{op.deployment}-*/*.log"))
    ]
    (logs / f"{job}.log").write_text("\n".join(parts))
    return {
        "scenario": scenario,
        "round": n,
        "handover_s": handover,
        "recovery_s": recovery,
        "phase": final.get("phase"),
        "restarts": final.get("gang", {}).get("restarts"),
        "pods_per_rank": census.per_rank_max,
    }


def fmt(v: Any) -> str:
    if v is None:
        return "-"
    return f"{v:.1f}" if isinstance(v, float) else str(v)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--lifetime", type=int, default=20, help="peering.lifetime (seconds)")
    p.add_argument("--scenarios", default=",".join(SCENARIOS))
    args = p.parse_args()
    values = {"replicaCount": 2, "peering": {"enabled": True, "lifetime": args.lifetime}}
    with tempfile.TemporaryDirectory(prefix="gpujob-takeover-") as tmp:
        folder = Path(tmp)
        cluster = LocalCluster(folder / "cluster").start()
        try:
            install_crd(cluster)
            cluster.kubectl("create", "namespace", "bench")
            kube = Kube(cluster, "bench", cluster.kubeconfig)
            wait_until(lambda: kube.get("serviceaccount", "default"), 30, "default SA")
            op = ChartOperator(cluster, "bench", folder / "helm")
            started = time.monotonic()
            op.install(values, "--skip-crds")
            print(
                f"helm install -> Deployment Available (2 replicas): {time.monotonic() - started:.1f}s"
            )
            rows = []
            for scenario in args.scenarios.split(","):
                for n in range(args.rounds):
                    row = one_round(scenario, n, op, kube, values, folder)
                    rows.append(row)
                    print(
                        "  ".join(f"{k}={fmt(v)}" for k, v in row.items()),
                        flush=True,
                    )
            print("\nsummary (median over rounds):")
            for scenario in args.scenarios.split(","):
                mine = [r for r in rows if r["scenario"] == scenario]
                hand = [r["handover_s"] for r in mine if r["handover_s"] is not None]
                rec = [r["recovery_s"] for r in mine if r["recovery_s"] is not None]
                ok = sum(
                    r["phase"] == "Succeeded" and r["restarts"] == 1 and r["pods_per_rank"] == 1
                    for r in mine
                )
                print(
                    f"  {scenario:13s} handover {fmt(statistics.median(hand) if hand else None)}s"
                    f"  recovery {fmt(statistics.median(rec) if rec else None)}s"
                    f"  correct {ok}/{len(mine)} (Succeeded, restarts=1, one pod per rank)"
                )
            bad = [r for r in rows if r["restarts"] != 1]
            if bad:
                keep = Path(tempfile.mkdtemp(prefix="gpujob-takeover-logs-"))
                for r in bad:
                    name = f"{r['scenario']}-{r['round']}.log"
                    (keep / name).write_text((folder / name).read_text())
                print(f"operator logs of the rounds with restarts != 1: {keep}")
        finally:
            cluster.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
