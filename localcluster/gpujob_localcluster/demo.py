"""``make demo``: a local cluster, the chart, the operator, and a job training to 100%.

Steps: start (or reuse) the local control plane, ``helm install`` the chart with its
default values (the node agent runs the operator Deployment's pod like a kubelet: its own
ServiceAccount token, so the chart's RBAC is what the API server enforces, and its
probes), wait for the rollout, apply a 2 nodes x 2 ranks CPU job of the example trainer,
and show live progress until it ends; then a summary, ``kubectl logs`` of rank 0, and
what to look at next. ``--bottleneck slow-input`` (or another switch) plants a bottleneck so the
verdict appears. With ``CI=true`` (or no TTY) it prints plain lines instead of a
redrawn table. Ctrl-C tears everything down.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from gpujob_localcluster.controlplane import ControlPlane, stop_folder
from gpujob_localcluster.processes import wait_for
from gpujob_localcluster.tools import REPO_ROOT, bin_dir

DEMO_DIR = Path(os.environ.get("GPUJOB_DEMO_DIR", "/tmp/gpujob-demo"))
NAMESPACE = "gpujob-demo"
SYSTEM_NS = "gpujob-system"
RELEASE = "gpujob"
SWITCHES = {
    "none": [],  # sized so that on CPU compute dominates gloo's all-reduce (a Healthy run)
    "slow-input": ["--slow-input", "0.4"],
    "straggler": ["--slow-rank", "1", "--slow-factor", "4"],
    "comm-heavy": ["--comm-heavy"],
}
SIZE = ["--hidden", "512", "--layers", "4", "--batch-size", "2048"]
COLUMNS = ("STATUS", "PROGRESS", "ETA", "THROUGHPUT", "BOTTLENECK")


def demo_job(name: str, steps: int, bottleneck: str) -> dict[str, Any]:
    """The demo's job: the CPU sample with the chosen switch and step count."""
    body = yaml.safe_load((REPO_ROOT / "crds" / "samples" / "cpu-2x2-example.yaml").read_text())
    body["metadata"] = {"name": name, "namespace": NAMESPACE}
    body["spec"]["args"] = ["--steps", str(steps), *SIZE, *SWITCHES[bottleneck]]
    body["spec"]["training"]["totalSteps"] = steps
    body["spec"].setdefault("monitoring", {})["scrapeIntervalSeconds"] = 2
    body["spec"]["runPolicy"].pop("ttlSecondsAfterFinished", None)
    return body


def bar(percent: float, width: int = 24) -> str:
    """A text progress bar: [#########...............]."""
    filled = round(width * max(0.0, min(percent, 100.0)) / 100)
    return "[" + "#" * filled + "." * (width - filled) + "]"


class Demo:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.folder = Path(args.dir)
        self.live = sys.stdout.isatty() and os.environ.get("CI", "").lower() not in ("true", "1")
        self.bins = bin_dir()
        self.cp = ControlPlane.attach(self.folder)

    def say(self, text: str) -> None:
        print(f"==> {text}", flush=True)

    def kubectl(self, *args: str, input: str | None = None, check: bool = True) -> str:
        res = self.cp.kubectl(*args, input=input)
        if check and res.returncode != 0:
            raise SystemExit(f"kubectl {' '.join(args)} failed: {res.stderr.strip()}")
        return res.stdout

    def helm(self, *args: str) -> str:
        env = {**os.environ, "KUBECONFIG": str(self.cp.admin_kubeconfig)}
        for var in ("HELM_CACHE_HOME", "HELM_CONFIG_HOME", "HELM_DATA_HOME"):
            env[var] = str(self.folder / "helm" / var.lower())
        res = subprocess.run(
            [str(self.bins / "helm"), *args], capture_output=True, text=True, env=env
        )
        if res.returncode != 0:
            raise SystemExit(f"helm {' '.join(args)} failed: {res.stderr.strip()}")
        return res.stdout

    def start_cluster(self) -> None:
        if (self.folder / "up").exists() and self.cp.kubectl(
            "get", "--raw", "/readyz"
        ).returncode == 0:
            self.say(f"reusing the local cluster in {self.folder}")
            return
        self.say(
            "starting the local control plane (etcd, kube-apiserver, controller-manager, scheduler, node agent)"
        )
        started = time.monotonic()
        res = subprocess.run(
            [sys.executable, "-m", "gpujob_localcluster.cli", "up", "--dir", str(self.folder)],
            capture_output=True,
            text=True,
        )
        if res.returncode != 0:
            raise SystemExit(res.stderr)
        self.cp = ControlPlane.attach(self.folder)
        self.say(
            f"cluster up in {time.monotonic() - started:.0f}s: "
            + " ".join(
                self.kubectl("get", "nodes", "-o", "jsonpath={.items[*].metadata.name}").split()
            )
        )

    def install_chart(self) -> None:
        self.say(f"helm install {RELEASE} charts/gpujob --namespace {SYSTEM_NS} --create-namespace")
        started = time.monotonic()
        self.helm(
            "upgrade",
            "--install",
            RELEASE,
            str(REPO_ROOT / "charts" / "gpujob"),
            "--namespace",
            SYSTEM_NS,
            "--create-namespace",
        )
        self.kubectl(
            "wait", "--for=condition=Established", "crd/gputrainingjobs.gpujob.dev", "--timeout=60s"
        )
        res = self.cp.kubectl(
            "-n", SYSTEM_NS, "rollout", "status", f"deployment/{RELEASE}", "--timeout=180s",
            timeout=200,
        )  # fmt: skip
        if res.returncode != 0:
            logs = self.cp.kubectl("-n", SYSTEM_NS, "logs", f"deployment/{RELEASE}", "--tail=30")
            raise SystemExit(
                f"the operator did not become Ready: {res.stderr.strip()}\n{logs.stdout}{logs.stderr}"
            )
        pod = self.kubectl(
            "-n", SYSTEM_NS, "get", "pods", "-l", f"app.kubernetes.io/instance={RELEASE}",
            "-o", "jsonpath={.items[0].metadata.name} {.items[0].status.podIP}",
        ).split()  # fmt: skip
        self.say(
            f"operator pod {SYSTEM_NS}/{pod[0]} Ready at {pod[1]} in "
            f"{time.monotonic() - started:.0f}s (its ServiceAccount token, its probes)"
        )

    def run_job(self) -> dict[str, Any]:
        name = f"demo-{self.args.bottleneck}" if self.args.bottleneck != "none" else "demo"
        self.kubectl("create", "namespace", NAMESPACE, check=False)
        wait_for(
            lambda: self.cp.kubectl("get", "sa", "default", "-n", NAMESPACE).returncode == 0,
            30,
            "default SA",
        )
        self.kubectl("delete", "gtj", name, "-n", NAMESPACE, "--ignore-not-found", "--wait=true")
        body = demo_job(name, self.args.steps, self.args.bottleneck)
        self.say(
            f"kubectl apply: GPUTrainingJob {NAMESPACE}/{name}, 2 nodes x 2 ranks, {self.args.steps} steps"
            + (
                f", planted bottleneck: {self.args.bottleneck}"
                if self.args.bottleneck != "none"
                else ""
            )
        )
        self.kubectl("apply", "-f", "-", input=yaml.safe_dump(body))
        return self.watch(name)

    def watch(self, name: str) -> dict[str, Any]:
        started = time.monotonic()
        verdicts: list[str] = []
        last_cells: list[str] = []
        throughput = "-"
        job: dict[str, Any] = {}
        while True:
            job = json.loads(self.kubectl("get", "gtj", name, "-n", NAMESPACE, "-o", "json"))
            status = job.get("status", {})
            display = status.get("display", {})
            verdict = (status.get("bottleneck") or {}).get("verdict")
            if verdict and (not verdicts or verdicts[-1] != verdict):
                verdicts.append(verdict)
            throughput = display.get("throughput") or throughput
            percent = float((status.get("progress") or {}).get("percent") or 0.0)
            cells = [
                status.get("phase", "-"),
                display.get("progress", "-"),
                display.get("eta", "-"),
                display.get("throughput", "-"),
                display.get("bottleneck", "-"),
            ]
            line = f"{time.monotonic() - started:5.0f}s {bar(percent)} " + "  ".join(
                f"{k}={v}" for k, v in zip(COLUMNS, cells, strict=True)
            )
            if self.live:
                print("\r\033[K" + line, end="", flush=True)
            elif cells != last_cells:
                print(line, flush=True)
            last_cells = cells
            if status.get("phase") in ("Succeeded", "Failed"):
                break
            if time.monotonic() - started > self.args.timeout:
                raise SystemExit(f"\nthe job did not finish within {self.args.timeout}s")
            time.sleep(1)
        if self.live:
            print()
        job["_demo"] = {
            "seconds": time.monotonic() - started,
            "verdicts": verdicts,
            "throughput": throughput,
        }
        return job

    def summary(self, job: dict[str, Any]) -> None:
        status, extra = job.get("status", {}), job["_demo"]
        progress = status.get("progress") or {}
        name = job["metadata"]["name"]
        print()
        self.say(
            f"job {NAMESPACE}/{name} {status.get('phase')} in {extra['seconds']:.0f}s: "
            f"{progress.get('step', '?')}/{progress.get('totalSteps', '?')} steps, "
            f"last throughput {extra['throughput']}, "
            f"verdicts seen: {', '.join(extra['verdicts']) or 'none (Healthy)'}"
        )
        print(self.kubectl("get", "gputrainingjobs", "-n", NAMESPACE))
        self.say(f"kubectl logs {name}-node-0 -n {NAMESPACE} --tail 5")
        print(self.kubectl("logs", f"{name}-node-0", "-n", NAMESPACE, "--tail", "5", check=False))
        kc = self.cp.admin_kubeconfig
        print(f"""Look further:
  export KUBECONFIG={kc}
  kubectl get gputrainingjobs -A
  kubectl describe gputrainingjob {name} -n {NAMESPACE}
  kubectl get events -n {NAMESPACE} --field-selector involvedObject.name={name}
  kubectl logs {name}-node-1 -n {NAMESPACE}          # a rank's output (-f to follow)
  kubectl logs -n {SYSTEM_NS} deployment/{RELEASE}    # the operator
  control plane and node agent logs: {self.folder}/logs/
  make demo-down     # stop the cluster (and with it the operator)""")

    def main(self) -> int:
        self.start_cluster()
        self.install_chart()
        job = self.run_job()
        self.summary(job)
        return 0 if job.get("status", {}).get("phase") == "Succeeded" else 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="make demo", description=__doc__.splitlines()[0])
    p.add_argument("--dir", default=str(DEMO_DIR))
    p.add_argument("--steps", type=int, default=200)
    p.add_argument(
        "--bottleneck",
        choices=sorted(SWITCHES),
        default=os.environ.get("BOTTLENECK", "none") or "none",
    )
    p.add_argument("--timeout", type=float, default=900)
    p.add_argument("--down", action="store_true", help="stop the demo's cluster (and operator)")
    args = p.parse_args(argv)
    if args.down:
        stopped = stop_folder(Path(args.dir))
        print("stopped: " + (", ".join(stopped) or "nothing was running"))
        return 0
    demo = Demo(args)

    def interrupted(*_: object) -> None:
        print("\ninterrupted: tearing the demo down", flush=True)
        stop_folder(demo.folder)
        raise SystemExit(130)

    signal.signal(signal.SIGINT, interrupted)
    signal.signal(signal.SIGTERM, interrupted)
    return demo.main()


if __name__ == "__main__":
    sys.exit(main())
