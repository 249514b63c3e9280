"""Frontier scale on hollow nodes: one wide job beside many small ones, the operator measured.

    python bench/frontier.py [--big-pods 2048] [--ranks 8] [--template-kb 400]
                             [--small-jobs 1000] [--gpus-per-node 8] [--dir DIR]

A fresh local control plane (real etcd, API server, scheduler, controller-manager) with hollow
nodes (``gpujob_localcluster.hollow``: pods reported Running without a container, every
rank's /metrics and evidence served by light processes from recorded payloads) and the
operator as a host process watching two namespaces. The small jobs (1 pod x ``--ranks``
each) are applied first and left to run; then the wide job (``--big-pods`` x ``--ranks``, a
pod template of ``--template-kb`` of env). Measured, in order:

- apiserver: what the API server admits without the operator: the wide job's own pods (the
  operator's builder, same bytes) POSTed straight to it, ``--raw-concurrency`` at a time, in a
  namespace the operator does not watch, before the wide job (same cluster, same small jobs
  scraped); then deleted and waited for;
- create / running: apply -> every pod of the wide job exists -> every one Running; beside
  it the API server's own pod-create rate over the same window (its /metrics: POSTs to pods,
  the scheduler's bindings included), and ``create_vs_apiserver``, the operator's create time
  over the bare API server's for the same pods (the target when the API server is the limit:
  <= 1.2);
- scrape: over a steady minute, the operator's scrapes per second against the rate every
  rank at its interval asks for (round_s: how long one round over every rank takes at that
  rate), and the operator's CPU (cores) in that minute;
- prometheus: a real Prometheus scraping the same rank endpoints at the same interval, its
  CPU (cores) over the same length of time;
- restart: one rank fails -> the job Running as attempt 1 (every pod of it Running, and
  released when it restarted in place) -> the job's last step newer than that (stepping
  again); ``--restart-strategy`` picks the strategy (default: the operator's, InPlace on
  hollow nodes);
- stall: one rank hangs -> Stalled -> the culprit named in status.hangEvidence;
- the operator's peak RSS (VmHWM) and longest event-loop lag (the loop-lag histogram's
  bucket) over the whole run.

Figures only; the last line is every figure as key=value. Targets (issue 40, at 2,048 x 8
beside 1,000 x 8): RSS <= 300 MiB, loop lag <= 0.1 s, created <= 60 s, named <= 60 s after
Stalled, round <= 5 s at <= 1 core and <= 0.5x Prometheus's CPU, restart <= 90 s (created
<= 1.2x the bare API server's time where that is the limit).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.scrape_scale import proc_cpu
from kubernetes import client, config
from tests.integration.conftest import install_crd
from tests.support.jobs import hollow_job
from tests.support.kube import Kube
from tests.support.operator import OperatorProcess
from tests.support.waiting import wait_until

from gpujob_localcluster.cluster import HollowConfig, LocalCluster, NodeConfig
from gpujob_localcluster.hollow.faults import RankFault
from gpujob_localcluster.ports import free_port
from gpujob_operator import api
from gpujob_operator.lifecycle.builders import build_pod
from gpujob_operator.observability.looplag import LAG_CAUSES, SAYS

BIG_NS, SMALL_NS, RAW_NS = "frontier-big", "frontier-small", "frontier-raw"
INTERVAL = 5


def job(
    name: str, pods: int, ranks: int, template_kb: int = 0, strategy: str = ""
) -> dict[str, Any]:
    """A hollow job; ``strategy`` its runPolicy.restartStrategy (empty: the operator's
    choice, InPlace on hollow nodes, which declare the feature)."""
    policy: dict[str, Any] = {"backoffLimit": 5}
    if strategy:
        policy["restartStrategy"] = strategy
    return hollow_job(
        name,
        pods,
        ranks,
        template_kb,
        monitoring={"scrapeIntervalSeconds": INTERVAL, "stallTimeoutSeconds": 15},
        runPolicy=policy,
    )


class Pods:
    """Pod phases by server-side table (names and STATUS only, never the 400 KB bodies)."""

    def __init__(self, kubeconfig: Path, connections: int = 32) -> None:
        cfg = client.Configuration()
        config.load_kube_config(config_file=str(kubeconfig), client_configuration=cfg)
        cfg.connection_pool_maxsize = connections  # the baseline's threads each keep one
        self.api = client.ApiClient(cfg)

    def get(self, path: str, query: list[tuple[str, str]], accept: str) -> bytes:
        args = self.api.param_serialize(
            "GET", path, query_params=query, header_params={"Accept": accept},
            auth_settings=["BearerToken"],
        )  # fmt: skip
        resp = self.api.call_api(*args)
        resp.read()
        return bytes(resp.data)

    def phases(self, ns: str, selector: str) -> dict[str, str]:
        table = json.loads(
            self.get(
                f"/api/v1/namespaces/{ns}/pods",
                [("labelSelector", selector), ("includeObject", "None")],
                "application/json;as=Table;v=v1;g=meta.k8s.io",
            )
        )
        cols = [c["name"] for c in table["columnDefinitions"]]
        name, status = cols.index("Name"), cols.index("Status")
        return {r["cells"][name]: r["cells"][status] for r in table.get("rows") or ()}

    def ips(self, ns: str) -> list[str]:
        table = json.loads(
            self.get(
                f"/api/v1/namespaces/{ns}/pods",
                [("includeObject", "None")],
                "application/json;as=Table;v=v1;g=meta.k8s.io",
            )
        )
        col = [c["name"] for c in table["columnDefinitions"]].index("IP")
        return [r["cells"][col] for r in table.get("rows") or () if r["cells"][col] != "<none>"]

    def send(self, method: str, path: str, body: Any = None, **query: str) -> None:
        """One request whose answer is only checked (2xx)."""
        args = self.api.param_serialize(
            method, path, query_params=list(query.items()), body=body,
            header_params={"Content-Type": "application/json", "Accept": "application/json"},
            auth_settings=["BearerToken"],
        )  # fmt: skip
        resp = self.api.call_api(*args, _request_timeout=(10, 120))
        resp.read()
        if not 200 <= resp.status < 300:
            raise RuntimeError(f"{method} {path}: {resp.status} {resp.data[:200]!r}")

    def counter(self, metric: str, labels: dict[str, str]) -> float:
        """Sum of an API server counter's series that carry ``labels``."""
        text = self.get("/metrics", [], "text/plain").decode()
        total = 0.0
        for line in text.splitlines():
            if line.startswith(metric + "{") and all(
                f'{k}="{v}"' in line for k, v in labels.items()
            ):
                total += float(line.rsplit(" ", 1)[1])
        return total


def op_metrics(op: OperatorProcess) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{op.metrics_port}/metrics", timeout=30) as r:
        return str(r.read().decode())


def op_value(text: str, name: str, labels: str = "") -> float:
    for line in text.splitlines():
        if line.startswith(name + (labels or "")) and (labels or line[len(name)] in " {"):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def top_bucket(text: str, name: str, labels: str = "") -> str:
    """The upper bound of a histogram's highest bucket that holds an observation
    (``labels``: the series' other labels, as rendered before ``le``)."""
    rows = re.findall(rf'{name}_bucket{{{labels}le="([^"]+)"}} (\S+)', text)
    prev, top = 0.0, "0"
    for le, count in rows:
        if float(count) > prev:
            top = le
        prev = float(count)
    return top


STALL_LINE = re.compile(r"the event loop was stalled for ([0-9.]+)s .*?; it was in (.*)$")


def loop_stalls(log_text: str) -> list[tuple[float, str, str]]:
    """The stalls over 0.5 s the operator's stall watch logged: (seconds, innermost frame and
    what else the line says, what held the loop: a `looplag` cause or "?"), longest first."""
    found = []
    for m in (STALL_LINE.search(line) for line in log_text.splitlines()):
        if m:
            cause = next((c for c, says in SAYS.items() if m.group(2).endswith(says)), "?")
            found.append((float(m.group(1)), m.group(2), cause))
    return sorted(found, reverse=True)


def job_pods(body: dict[str, Any], ns: str) -> list[dict[str, Any]]:
    """The pods the operator would create for ``body`` (attempt 0) in ``ns``, without an
    owner: the same bytes, for the bare API server's baseline."""
    uid = "00000000-0000-0000-0000-000000000000"
    whole = {**body, "metadata": {**body["metadata"], "namespace": ns, "uid": uid}}
    spec = api.parse_spec(body["spec"])
    out = []
    for rank in range(spec.nodes):
        pod = build_pod(whole, rank, 0, spec)
        pod["metadata"].pop("ownerReferences", None)
        out.append(pod)
    return out


def raw_create(pods: Pods, ns: str, bodies: list[dict[str, Any]], concurrency: int) -> float:
    """Seconds to POST every pod of ``bodies`` straight to the API server, ``concurrency``
    at a time (what it admits without the operator); then every one deleted and gone."""
    path = f"/api/v1/namespaces/{ns}/pods"
    t0 = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
        for f in [pool.submit(pods.send, "POST", path, b) for b in bodies]:
            f.result()
        seconds = time.monotonic() - t0
        # One by one (a DeleteCollection runs one server worker and can outlast its 60 s).
        names = [b["metadata"]["name"] for b in bodies]
        for f in [pool.submit(pods.send, "DELETE", f"{path}/{n}") for n in names]:
            f.result()
    wait_until(lambda: not pods.phases(ns, ""), 900, "the baseline's pods gone", interval=2.0)
    return seconds


def status(kube: Kube, name: str) -> dict[str, Any]:
    return dict((kube.get("gputrainingjob", name) or {}).get("status") or {})


def rss_mib(pid: int, field: str) -> float:
    """A process's VmRSS or VmHWM (its peak) in MiB."""
    text = Path(f"/proc/{pid}/status").read_text()
    return round(int(text.split(f"{field}:")[1].split()[0]) / 1024, 1)


def rank_endpoints(pods: Pods, ns: str, ranks: int) -> list[str]:
    """Every rank's address, from the pods' table (never their bodies)."""
    return [f"{ip}:{9400 + r}" for ip in pods.ips(ns) for r in range(ranks)]


def prometheus_cpu(targets: list[str], seconds: float) -> dict[str, float] | str:
    binary = shutil.which("prometheus") or "/usr/bin/prometheus"
    if not Path(binary).exists():
        return "prometheus not installed"
    tmp = Path(tempfile.mkdtemp(prefix="frontier-prom-"))
    (tmp / "targets.json").write_text(json.dumps([{"targets": targets}]))
    (tmp / "prometheus.yml").write_text(
        f"global: {{scrape_interval: {INTERVAL}s, scrape_timeout: {INTERVAL}s}}\n"
        "scrape_configs:\n- job_name: ranks\n  file_sd_configs:\n"
        f"  - files: ['{tmp / 'targets.json'}']\n"
    )
    web = free_port()
    log = open(tmp / "prometheus.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen(
        [binary, f"--config.file={tmp / 'prometheus.yml'}", f"--storage.tsdb.path={tmp / 'data'}",
         f"--web.listen-address=127.0.0.1:{web}", "--log.level=warn"],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    try:
        time.sleep(2 * INTERVAL)  # its first scrapes are spread over an interval: let them pass
        c0, t0 = proc_cpu(proc.pid), time.monotonic()
        time.sleep(seconds)  # the measurement period itself
        c1, t1 = proc_cpu(proc.pid), time.monotonic()
        q = f"http://127.0.0.1:{web}/api/v1/query?query=count(up%3D%3D1)"
        with urllib.request.urlopen(q, timeout=30) as r:
            up = json.loads(r.read())["data"]["result"]
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=60)
        log.close()
        shutil.rmtree(tmp, ignore_errors=True)
    return {"cores": (c1 - c0) / (t1 - t0), "up": float(up[0]["value"][1]) if up else 0.0}


def main() -> int:
    # A SIGTERM (timeout, kill) unwinds like Ctrl-C, so the cluster and the operator stop.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--big-pods", type=int, default=2048)
    p.add_argument("--ranks", type=int, default=8)
    p.add_argument("--template-kb", type=int, default=400)
    p.add_argument("--small-jobs", type=int, default=1000)
    p.add_argument("--gpus-per-node", type=int, default=8, help="per hollow node")
    p.add_argument("--endpoint-processes", type=int, default=4)
    p.add_argument("--steady-seconds", type=float, default=60)
    p.add_argument(
        "--restart-strategy", default="", choices=("", "InPlace", "Recreate"),
        help="the wide job's runPolicy.restartStrategy (default: the operator's choice)",
    )  # fmt: skip
    p.add_argument("--dir", default="")
    p.add_argument(
        "--raw-concurrency", type=int, default=16,
        help="POSTs in flight for the bare API server's baseline (0: no baseline)",
    )  # fmt: skip
    p.add_argument(
        "--operator-env", action="append", default=[], metavar="NAME=VALUE",
        help="extra environment of the operator process (repeatable)",
    )  # fmt: skip
    a = p.parse_args()
    per_node = max(1, a.gpus_per_node // a.ranks)
    nodes = -(-(a.big_pods + a.small_jobs) // per_node) + 2
    folder = Path(a.dir or tempfile.mkdtemp(prefix="gpujob-frontier-"))
    fig: dict[str, Any] = {"big_pods": a.big_pods, "ranks": a.ranks, "small_jobs": a.small_jobs,
                           "template_kb": a.template_kb, "hollow_nodes": nodes}  # fmt: skip
    t = time.monotonic()
    lc = LocalCluster(
        folder,
        NodeConfig(count=1),
        hollow=HollowConfig(
            count=nodes,
            gpus=a.gpus_per_node,
            endpoint_processes=a.endpoint_processes,
            lease_seconds=15.0,
        ),
    )
    lc.start(timeout=900)
    print(f"# cluster with {nodes} hollow nodes up in {time.monotonic() - t:.0f}s ({folder})")
    op: OperatorProcess | None = None
    try:
        install_crd(lc)
        big, small = Kube(lc, BIG_NS, lc.kubeconfig), Kube(lc, SMALL_NS, lc.kubeconfig)
        for k in (big, small):
            k.run("create", "namespace", k.namespace, ns=False, check=True)
        big.run("create", "namespace", RAW_NS, ns=False, check=True)
        pods = Pods(lc.kubeconfig, connections=max(32, a.raw_concurrency))
        # The wide job is the one the operator's pod bound (GPUJOB_MAX_JOB_POD_BYTES, 64 MiB)
        # refuses at its defaults (400 KB x 2,048 pods): the bench measures what it costs
        # when an operator given the memory for it lifts the bound.
        extra = {"GPUJOB_MAX_JOB_POD_BYTES": "0"} | dict(kv.split("=", 1) for kv in a.operator_env)
        op = OperatorProcess(
            lc.kubeconfig, [BIG_NS, SMALL_NS], folder / "operator.log", extra_env=extra
        )
        op.start(timeout=120)
        # The small jobs first, applied in chunks, and left to run.
        t = time.monotonic()
        for start in range(0, a.small_jobs, 100):
            docs = [
                job(f"s{i:04d}", 1, a.ranks) for i in range(start, min(a.small_jobs, start + 100))
            ]
            small.run(
                "apply", "-f", "-", input="\n---\n".join(json.dumps(d) for d in docs), check=True
            )
        wait_until(
            lambda: sum(v == "Running" for v in pods.phases(SMALL_NS, "gpujob.dev/job-name").values()) >= a.small_jobs,
            1800, "every small job's pod Running", interval=2.0,
        )  # fmt: skip
        fig["small_running_s"] = round(time.monotonic() - t, 1)
        print(f"# {a.small_jobs} small jobs Running in {fig['small_running_s']}s")
        wide_body = job("wide", a.big_pods, a.ranks, a.template_kb, a.restart_strategy)
        if a.raw_concurrency > 0:
            raw = raw_create(pods, RAW_NS, job_pods(wide_body, RAW_NS), a.raw_concurrency)
            fig["apiserver_raw_create_s"] = round(raw, 1)
            print(f"# bare API server: {a.big_pods} pods created in {raw:.1f}s")
        # The wide job.
        creates0 = pods.counter(
            "apiserver_request_total", {"verb": "POST", "resource": "pods", "code": "201"}
        )
        t0 = time.monotonic()
        # create, not apply: apply would keep the whole 400 KB spec in an annotation (256 KB max)
        wide = json.dumps(wide_body)
        big.run("create", "-f", "-", input=wide, check=True)
        sel = "gpujob.dev/job-name=wide"
        wait_until(
            lambda: len(pods.phases(BIG_NS, sel)) >= a.big_pods,
            1800,
            "all wide pods created",
            interval=1.0,
        )
        fig["create_s"] = round(time.monotonic() - t0, 1)
        creates1 = pods.counter(
            "apiserver_request_total", {"verb": "POST", "resource": "pods", "code": "201"}
        )
        fig["apiserver_pod_creates_per_s"] = round(
            (creates1 - creates0) / max(fig["create_s"], 0.1), 1
        )
        if "apiserver_raw_create_s" in fig:
            fig["create_vs_apiserver"] = round(
                fig["create_s"] / max(fig["apiserver_raw_create_s"], 0.1), 2
            )
        wait_until(
            lambda: sum(v == "Running" for v in pods.phases(BIG_NS, sel).values()) >= a.big_pods,
            1800, "all wide pods Running", interval=1.0,
        )  # fmt: skip
        fig["running_s"] = round(time.monotonic() - t0, 1)
        assert op.proc is not None
        fig["operator_rss_after_create_mib"] = rss_mib(op.proc.pid, "VmRSS")
        fig["operator_peak_rss_after_create_mib"] = rss_mib(op.proc.pid, "VmHWM")
        print(f"# wide job: created {fig['create_s']}s, Running {fig['running_s']}s")
        # Steady state: the operator's scrape rate and CPU over a minute.
        wait_until(
            lambda: (status(big, "wide").get("progress") or {}).get("step"),
            300,
            "wide job progress",
            interval=2.0,
        )
        assert op.proc is not None
        m0, c0, t1 = op_metrics(op), proc_cpu(op.proc.pid), time.monotonic()
        time.sleep(a.steady_seconds)  # the measurement period itself
        m1, c1, t2 = op_metrics(op), proc_cpu(op.proc.pid), time.monotonic()
        total_ranks = (a.big_pods + a.small_jobs) * a.ranks
        scrapes = sum(
            op_value(m1, "gpujob_operator_scrapes_total", f'{{result="{r}"}}')
            - op_value(m0, "gpujob_operator_scrapes_total", f'{{result="{r}"}}')
            for r in ("ok", "error")
        )
        rate = scrapes / (t2 - t1)
        fig["scrapes_per_s"] = round(rate, 1)
        fig["scrapes_per_s_asked"] = round(total_ranks / INTERVAL, 1)
        fig["scrape_round_s"] = round(total_ranks / rate, 1) if rate else "inf"
        fig["operator_cores"] = round((c1 - c0) / (t2 - t1), 2)
        print(
            f"# steady: {fig['scrapes_per_s']} scrapes/s of {fig['scrapes_per_s_asked']} asked, operator {fig['operator_cores']} cores"
        )
        targets = rank_endpoints(pods, BIG_NS, a.ranks) + rank_endpoints(pods, SMALL_NS, a.ranks)
        prom = prometheus_cpu(targets, a.steady_seconds)
        if isinstance(prom, dict):
            fig["prometheus_cores"] = round(prom["cores"], 2)
            fig["prometheus_targets_up"] = int(prom["up"])
            fig["operator_vs_prometheus_cpu"] = round(
                fig["operator_cores"] / max(prom["cores"], 1e-6), 2
            )
        else:
            fig["prometheus_cores"] = prom
        # Restart: a rank of the wide job fails.
        culprit = a.big_pods * a.ranks - 3
        t3 = time.monotonic()
        lc.hollow_faults([RankFault(BIG_NS, "wide", culprit, "fail")])
        # Running again: the job's own word (every pod of attempt 1 Running; in place, also
        # released), not the pods' phase, which an in-place pod keeps while it restarts.
        wait_until(
            lambda: (s := status(big, "wide")).get("phase") == "Running"
            and (s.get("gang") or {}).get("attempt") == 1,
            1800, "attempt 1 Running", interval=1.0,
        )  # fmt: skip
        fig["restart_running_s"] = round(time.monotonic() - t3, 1)
        gang = status(big, "wide").get("gang") or {}
        fig["restart_strategy"] = (gang.get("restartStrategy") or {}).get("strategy", "?")
        since = time.time()
        wait_until(
            lambda: (s := (status(big, "wide").get("progress") or {}).get("lastStepTime")) and time.mktime(time.strptime(s, "%Y-%m-%dT%H:%M:%SZ")) - time.timezone >= since,
            600, "stepping again", interval=1.0,
        )  # fmt: skip
        fig["restart_stepping_s"] = round(time.monotonic() - t3, 1)
        fig["operator_peak_rss_after_restart_mib"] = rss_mib(op.proc.pid, "VmHWM")
        print(
            f"# restart ({fig['restart_strategy']}): Running {fig['restart_running_s']}s, "
            f"stepping {fig['restart_stepping_s']}s"
        )
        # Stall: a rank of attempt 1 hangs in its loader.
        stalled_rank = a.big_pods * a.ranks // 2 + 5
        t4 = time.monotonic()
        lc.hollow_faults([RankFault(BIG_NS, "wide", stalled_rank, "stall", "1")])

        def stalled() -> bool:
            conds = status(big, "wide").get("conditions") or []
            return any(c["type"] == "Stalled" and c["status"] == "True" for c in conds)

        wait_until(stalled, 600, "Stalled", interval=1.0)
        t5 = time.monotonic()
        ev = wait_until(
            lambda: status(big, "wide").get("hangEvidence"), 900, "hang evidence", interval=1.0
        )
        fig["stalled_s"] = round(t5 - t4, 1)
        fig["named_after_stalled_s"] = round(time.monotonic() - t5, 1)
        fig["culprit_named"] = ev.get("culprits") == [stalled_rank]
        print(
            f"# stall: Stalled {fig['stalled_s']}s, named {fig['named_after_stalled_s']}s later: {ev.get('summary', '')[:160]}"
        )
        end = op_metrics(op)
        lag = "gpujob_operator_event_loop_lag_seconds"
        fig["loop_lag_max_le_s"] = top_bucket(end, lag)
        # The probe wakes every 0.1 s: lags over 0.1 s are the waits the target counts.
        fig["loop_lags_over_0_1s"] = int(
            op_value(end, f"{lag}_count") - op_value(end, f"{lag}_bucket", '{le="0.1"}')
        )
        for cause in LAG_CAUSES:  # what held the loop: its own work, the GIL, or no CPU
            fig[f"loop_lags_over_0_1s_{cause}"] = int(
                op_value(end, "gpujob_operator_event_loop_lags_total", f'{{cause="{cause}"}}')
            )
        gc_pause = "gpujob_operator_gc_pause_seconds"
        full = 'generation="2",'
        fig["gc_full_collections"] = int(op_value(end, f"{gc_pause}_count", "{" + full[:-1] + "}"))
        fig["gc_full_pause_max_le_s"] = top_bucket(end, gc_pause, full)
        fig["gc_seconds"] = round(
            sum(op_value(end, f"{gc_pause}_sum", f'{{generation="{g}"}}') for g in range(3)), 1
        )
        stalls = loop_stalls(op.log_path.read_text(errors="replace"))
        fig["loop_stalls_over_0_5s"] = len(stalls)
        for cause in LAG_CAUSES:
            fig[f"loop_stalls_over_0_5s_{cause}"] = sum(c == cause for _, _, c in stalls)
        fig["loop_stall_max_s"] = stalls[0][0] if stalls else 0.0
        for seconds, frame, _ in stalls[:5]:
            print(f"# loop stall {seconds:.2f}s in {frame}")
        fig["operator_peak_rss_mib"] = rss_mib(op.proc.pid, "VmHWM")
    except Exception as e:
        # A phase that timed out: say so in the figures, and whether the cluster, not the
        # operator, took the pods away (hollow nodes marked Unknown and their pods evicted).
        fig["failed"] = re.sub(r"\s+", "_", str(e))[:120]
        print(f"# failed: {e}")
        with contextlib.suppress(Exception):
            for line in cluster_health(Pods(lc.kubeconfig), (BIG_NS, SMALL_NS)):
                print(f"# cluster: {line}")
        if op is not None and op.proc is not None:
            with contextlib.suppress(OSError):
                fig["operator_peak_rss_mib"] = rss_mib(op.proc.pid, "VmHWM")
    finally:
        if op is not None:
            op.stop()
        lc.stop()
    if "failed" in fig:
        print(f"# the cluster's folder (logs) is kept: {folder}")
    print(" ".join(f"{k}={v}" for k, v in fig.items()))
    return 1 if "failed" in fig else 0


def cluster_health(pods: Pods, namespaces: tuple[str, ...]) -> list[str]:
    """What the cluster itself did to the bench's pods: nodes not Ready or tainted by the
    node lifecycle controller, and the pods it evicted (their Events)."""
    nodes = json.loads(pods.get("/api/v1/nodes", [], "application/json"))["items"]
    not_ready = [
        n["metadata"]["name"]
        for n in nodes
        if not any(
            c["type"] == "Ready" and c["status"] == "True"
            for c in (n.get("status") or {}).get("conditions") or ()
        )
    ]
    tainted: dict[str, int] = {}
    for n in nodes:
        for taint in (n.get("spec") or {}).get("taints") or ():
            if taint["key"].startswith("node.kubernetes.io/"):
                tainted[taint["key"]] = tainted.get(taint["key"], 0) + 1
    lines = [
        f"{len(nodes)} nodes, {len(not_ready)} not Ready {not_ready[:5]}",
        f"lifecycle taints: {tainted or 'none'}",
    ]
    for ns in namespaces:
        events = json.loads(
            pods.get(
                f"/api/v1/namespaces/{ns}/events",
                [("fieldSelector", "reason=TaintManagerEviction")],
                "application/json",
            )
        )["items"]
        lines.append(f"{ns}: {len(events)} pods evicted by the taint manager")
    return lines


if __name__ == "__main__":
    sys.exit(main())
