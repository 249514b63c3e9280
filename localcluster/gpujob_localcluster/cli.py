"""``gpujob-localcluster up|down|status|serve``: the local cluster for ``make cluster`` and the demo.

``up`` starts a supervisor in the background (``serve``) and returns once the
cluster is usable, printing the ``export KUBECONFIG=...`` line; ``down`` stops it.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from gpujob_localcluster.cluster import DEFAULT_FOLDER, HollowConfig, LocalCluster, NodeConfig
from gpujob_localcluster.controlplane import STATE_FILE, stop_folder
from gpujob_localcluster.hollow.faults import KINDS, RankFault
from gpujob_localcluster.hollow.faults import parse as parse_faults
from gpujob_localcluster.hollow.kubelet import FAULTS_FILE, write_faults
from gpujob_localcluster.processes import ClusterError, log_tail, pid_alive


def _nodes(args: argparse.Namespace) -> NodeConfig:
    return NodeConfig(count=args.nodes, gpus=args.gpus_per_node)


def serve(args: argparse.Namespace) -> int:
    """Run the cluster in the foreground until SIGTERM/SIGINT; then tear it down."""
    folder = Path(args.dir)
    cluster = LocalCluster(
        folder,
        _nodes(args),
        gang_scheduling=args.gang_scheduling,
        kueue=args.kueue,
        hollow=HollowConfig(
            count=args.hollow_nodes,
            gpus=args.hollow_gpus_per_node,
            endpoint_processes=args.hollow_endpoint_processes,
        ),
    )
    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    try:
        cluster.start()
    except ClusterError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    assert cluster.cp is not None
    cluster.cp.register_pid("supervisor", os.getpid())
    (folder / "up").write_text("up\n")
    print(f"cluster up; export KUBECONFIG={cluster.kubeconfig}", flush=True)
    while not done.wait(1.0):
        problems = cluster.cp.problems()
        if problems:
            print("a component died:\n" + "\n".join(problems), file=sys.stderr, flush=True)
            break
    cluster.stop()
    (folder / "up").unlink(missing_ok=True)
    return 0


def up(args: argparse.Namespace) -> int:
    folder = Path(args.dir)
    state = folder / STATE_FILE
    if state.exists():
        pids = json.loads(state.read_text()).get("pids", {})
        if any(pid_alive(int(p)) for p in pids.values()) and (folder / "up").exists():
            print(f"# the local cluster already runs in {folder}", file=sys.stderr)
            print(f"export KUBECONFIG={folder / 'admin.kubeconfig'}")
            return 0
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "up").unlink(missing_ok=True)
    sup_log = folder / "supervisor.log"
    cmd = [
        sys.executable,
        "-m",
        "gpujob_localcluster.cli",
        "serve",
        "--dir",
        str(folder),
        "--nodes",
        str(args.nodes),
        "--gpus-per-node",
        str(args.gpus_per_node),
        *(["--gang-scheduling"] if args.gang_scheduling else []),
        *(["--kueue"] if args.kueue else []),
        "--hollow-nodes",
        str(args.hollow_nodes),
        "--hollow-gpus-per-node",
        str(args.hollow_gpus_per_node),
        "--hollow-endpoint-processes",
        str(args.hollow_endpoint_processes),
    ]
    with open(sup_log, "ab") as out:
        proc = subprocess.Popen(
            cmd,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    started = time.monotonic()
    print(f"# starting the local cluster in {folder} (log: {sup_log})", file=sys.stderr)
    while not (folder / "up").exists():
        if proc.poll() is not None:
            print(f"error: the cluster failed to start:\n{log_tail(sup_log, 40)}", file=sys.stderr)
            return 1
        if time.monotonic() - started > args.timeout:
            print(
                f"error: the cluster did not come up within {args.timeout}s; see {sup_log}",
                file=sys.stderr,
            )
            stop_folder(folder)
            return 1
        time.sleep(0.2)
    print(
        f"# local cluster up in {time.monotonic() - started:.1f}s: {args.nodes} nodes x "
        f"{args.gpus_per_node} nvidia.com/gpu"
        + (
            f" + {args.hollow_nodes} hollow nodes x {args.hollow_gpus_per_node}"
            if args.hollow_nodes
            else ""
        )
        + f"; logs in {folder / 'logs'}",
        file=sys.stderr,
    )
    print(f"export KUBECONFIG={folder / 'admin.kubeconfig'}")
    return 0


def down(args: argparse.Namespace) -> int:
    stopped = stop_folder(Path(args.dir))
    print("stopped: " + (", ".join(stopped) if stopped else "nothing was running"), file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="gpujob-localcluster", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    for name in ("up", "down", "serve"):
        s = sub.add_parser(name)
        s.add_argument("--dir", default=str(DEFAULT_FOLDER))
        s.add_argument("--nodes", type=int, default=2)
        s.add_argument("--gpus-per-node", type=int, default=4)
        s.add_argument("--timeout", type=float, default=600)
        s.add_argument(
            "--gang-scheduling",
            action="store_true",
            help="enable Kubernetes' native gang scheduling (GenericWorkload gate, "
            "scheduling.k8s.io Workload/PodGroup API, kube-scheduler GangScheduling plugin)",
        )
        s.add_argument(
            "--kueue",
            action="store_true",
            help="also run Kueue's manager (built by hack/build-kueue.sh), webhooks on loopback",
        )
        s.add_argument(
            "--hollow-nodes",
            type=int,
            default=0,
            help="also register this many hollow nodes (pods reported Running without a "
            "container, ranks served by light processes; see gpujob_localcluster.hollow)",
        )
        s.add_argument("--hollow-gpus-per-node", type=int, default=8)
        s.add_argument("--hollow-endpoint-processes", type=int, default=2)
    fault = sub.add_parser("hollow-fault", help="give a hollow job's rank a fault")
    fault.add_argument("--dir", default=str(DEFAULT_FOLDER))
    fault.add_argument("--namespace", "-n", default="default")
    fault.add_argument("--job", required=True)
    fault.add_argument("--rank", type=int, required=True)
    fault.add_argument("--kind", choices=KINDS, required=True)
    fault.add_argument("--clear", action="store_true", help="drop every fault instead")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    return {"up": up, "down": down, "serve": serve, "hollow-fault": hollow_fault}[args.cmd](args)


def hollow_fault(args: argparse.Namespace) -> int:
    """Add a fault to the hollow kubelet's fault file (or clear them all)."""
    state = Path(args.dir) / "hollow"
    path = state / FAULTS_FILE
    current = [] if args.clear or not path.exists() else parse_faults(path.read_text())
    if not args.clear:
        current.append(RankFault(args.namespace, args.job, args.rank, args.kind))
    write_faults(state, current)
    print(f"faults: {[f.key for f in current]}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
