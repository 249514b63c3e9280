"""Every dashboard query and alert expression against a real Prometheus.

One module-wide stack: the operator (its /metrics on a free loopback port), a running 2-node
job whose pods each run two fake-GPU ranks (:func:`tests.support.prometheus.fake_trainer_main`:
the real tracker and exporter collectors, a fake NVML and fake allocator stats), and a
Prometheus that scrapes the operator statically and the ranks through Kubernetes pod
discovery with the chart's own PodMonitor relabelings. Queries wait for data with a deadline.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpujob_localcluster.cluster import LocalCluster
from gpujob_localcluster.ports import free_port
from gpujob_operator.observability import alerts, dashboards, opfamilies
from tests.integration.conftest import wait_job_phase
from tests.support.chart import PODMONITOR, find, render
from tests.support.jobs import repo_code_env
from tests.support.kube import Kube
from tests.support.operator import OperatorProcess
from tests.support.prometheus import REPO, Prometheus, QueryError, promtool
from tests.support.waiting import wait_until

JOB = "gpt"
WAITER = "next"
DEAF = "deaf"
"""A job that needs every GPU of both nodes: it waits for gpt, so it has a start forecast."""
FAKE_TRAINER = "from tests.support.prometheus import fake_trainer_main; fake_trainer_main()"
NODES, PROCS = 2, 2
DATA_DEADLINE = 120.0
OPERATOR_WIRED_PREFIXES = ("gpujob_job_",)
"""Series the operator exports only once the reconciler feeds JobMetrics.update()."""


def podmonitor_relabel_configs() -> list[dict[str, Any]]:
    """What the Prometheus Operator generates for the chart's PodMonitor, as plain config.

    The implicit part (select pods by the PodMonitor's selector, add namespace/pod/container)
    is spelled out here; the explicit relabelings are taken from the rendered chart.
    """
    objs = render(PODMONITOR)
    (pm,) = find(objs, "PodMonitor")
    (endpoint,) = pm["spec"]["podMetricsEndpoints"]
    meta = "__meta_kubernetes_"
    implicit = [
        {
            "action": "keep",
            "source_labels": [f"{meta}pod_labelpresent_gpujob_dev_job_name"],
            "regex": "true",
        },
        {"action": "replace", "source_labels": [f"{meta}namespace"], "target_label": "namespace"},
        {"action": "replace", "source_labels": [f"{meta}pod_name"], "target_label": "pod"},
        {
            "action": "replace",
            "source_labels": [f"{meta}pod_container_name"],
            "target_label": "container",
        },
    ]
    keys = {"sourceLabels": "source_labels", "targetLabel": "target_label"}
    explicit = [{keys.get(k, k): v for k, v in r.items()} for r in endpoint["relabelings"]]
    return implicit + explicit


def pod_discovery(pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Kubernetes pod discovery (role: pod) written as file_sd target groups.

    Debian's Prometheus is built without the Kubernetes SD, so the test lists the pods itself
    and gives each container port the same ``__meta_kubernetes_*`` labels the SD would; the
    PodMonitor's relabelings then run unchanged (including dropping non-metrics ports).
    """
    groups = []
    for pod in pods:
        meta, spec, status = pod["metadata"], pod["spec"], pod["status"]
        m = "__meta_kubernetes_"
        base = {
            f"{m}namespace": meta["namespace"],
            f"{m}pod_name": meta["name"],
            f"{m}pod_phase": status.get("phase", ""),
            f"{m}pod_node_name": spec.get("nodeName", ""),
        }
        for key, value in meta.get("labels", {}).items():
            safe = "".join(ch if ch.isalnum() else "_" for ch in key)
            base[f"{m}pod_label_{safe}"] = value
            base[f"{m}pod_labelpresent_{safe}"] = "true"
        for c in spec["containers"]:
            for port in c.get("ports", []):
                groups.append(
                    {
                        "targets": [f"{status['podIP']}:{port['containerPort']}"],
                        "labels": {
                            **base,
                            f"{m}pod_container_name": c["name"],
                            f"{m}pod_container_port_name": port.get("name", ""),
                        },
                    }
                )
    return groups


@dataclass
class Stack:
    prometheus: Prometheus
    namespace: str
    operator: OperatorProcess


def substitute(expr: str, namespace: str) -> str:
    """Grafana's template variables, as a user looking at this job would have them; a
    variable's ``label_values(m, l)`` becomes the PromQL Grafana evaluates for it."""
    expr = re.sub(r"^label_values\((.*),\s*(\w+)\)$", r"group by (\2) (\1)", expr.strip())
    for var, value in (
        ("$__rate_interval", "15s"),
        ("$__range", "5m"),
        ("$__interval", "5s"),
        ("$namespace", namespace),
        ("$job", JOB),
    ):
        expr = expr.replace(var, value)
    return expr


@pytest.fixture(scope="module")
def stack(
    cluster: LocalCluster, crd: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    folder = tmp_path_factory.mktemp("prometheus-stack")
    ns = f"prom-dashboards-{uuid.uuid4().hex[:5]}"
    kube = Kube(cluster, ns, cluster.kubeconfig)
    kube.run("create", "namespace", ns, ns=False, check=True)
    wait_until(lambda: kube.get("serviceaccount", "default"), 30, f"default ServiceAccount in {ns}")
    op = OperatorProcess(cluster.kubeconfig, [ns], folder / "operator.log").start()
    metrics_port = op.metrics_port  # OperatorProcess picks a free one
    prom: Prometheus | None = None
    try:
        kube.apply(
            {
                "apiVersion": "gpujob.dev/v1alpha1",
                "kind": "GPUTrainingJob",
                "metadata": {"name": JOB},
                "spec": {
                    "image": "python:3.11-slim",
                    "nodes": NODES,
                    "gpusPerNode": PROCS,
                    "command": [
                        "python",
                        "-c",
                        FAKE_TRAINER,
                    ],
                    "env": [repo_code_env()],
                    "training": {
                        "launcher": "none",
                        "procsPerNode": PROCS,
                        "totalSteps": 10**6,
                        "metricsPort": free_port(PROCS),
                    },
                    "monitoring": {"scrapeIntervalSeconds": 2},
                },
            }
        )
        wait_job_phase(kube, JOB, ("Running",), timeout=120)
        # A job the operator cannot see step (monitoring off): its GPU time is unobserved,
        # the fleet's "Unobserved GPU-hours" panel's data (one GPU of the two gpt leaves).
        kube.apply(
            {
                "apiVersion": "gpujob.dev/v1alpha1",
                "kind": "GPUTrainingJob",
                "metadata": {"name": DEAF},
                "spec": {
                    "image": "python:3.11-slim",
                    "gpusPerNode": 1,
                    "command": ["python", "-c", "import time; time.sleep(3600)"],
                    "training": {"launcher": "none"},
                    "monitoring": {"enabled": False, "startupTimeoutSeconds": 2},
                },
            }
        )
        kube.apply(
            {
                "apiVersion": "gpujob.dev/v1alpha1",
                "kind": "GPUTrainingJob",
                "metadata": {"name": WAITER},
                "spec": {
                    "image": "python:3.11-slim",
                    "nodes": NODES,
                    "gpusPerNode": cluster.nodes.gpus,
                    "command": ["python", "-c", "pass"],
                    "training": {"launcher": "none"},
                },
            }
        )
        pods = kube.list("pods", f"gpujob.dev/job-name={JOB}")
        sd_file = folder / "pods.json"
        sd_file.write_text(json.dumps(pod_discovery(pods)))
        config = {
            "global": {
                "scrape_interval": "1s",
                "scrape_timeout": "1s",
                "evaluation_interval": "1s",
            },
            "rule_files": [str(REPO / alerts.RULES_FILE)],
            "scrape_configs": [
                {
                    "job_name": opfamilies.OPERATOR_JOB,
                    "honor_labels": True,
                    "static_configs": [{"targets": [f"127.0.0.1:{metrics_port}"]}],
                },
                {
                    "job_name": "gpujob-trainers",
                    "file_sd_configs": [{"files": [str(sd_file)]}],
                    "relabel_configs": podmonitor_relabel_configs(),
                },
            ],
        }
        prom = Prometheus(folder / "prom", config, free_port()).start()

        def all_up() -> list[dict[str, Any]] | None:
            targets = [t for t in prom.targets() if t["health"] == "up"]
            by_job = [t["labels"]["job"] for t in targets]
            ok = (
                by_job.count("gpujob-trainers") == NODES * PROCS
                and opfamilies.OPERATOR_JOB in by_job
            )
            return targets if ok else None

        targets = wait_until(all_up, 90, "operator and every rank scraped")
        ranks = {
            (t["labels"]["pod"], t["discoveredLabels"]["__meta_kubernetes_pod_container_port_name"])
            for t in targets
            if t["labels"]["job"] == "gpujob-trainers"
        }
        assert {port for _, port in ranks} == {"metrics-0", "metrics-1"}
        yield Stack(prom, ns, op)
    except BaseException:
        print(op.log_tail(60))
        if prom is not None:
            print(prom.log_tail())
        raise
    finally:
        if prom is not None:
            prom.stop()
        # The waiter first: once gpt is gone it would take every GPU of the shared cluster.
        kube.run("delete", "gputrainingjob", WAITER)
        kube.run("delete", "gputrainingjob", DEAF, "--wait=false")
        kube.run("delete", "gputrainingjob", JOB, "--wait=false")
        op.stop()
        kube.run("delete", "namespace", ns, "--wait=false", ns=False)


def dashboard_queries(wired: bool) -> list[tuple[str, str]]:
    """(where, expr) of every dashboard query that needs (or not) the operator's job series."""
    out = []
    for uid, make in dashboards.DASHBOARDS.items():
        for title, expr in dashboards.queries(make()):
            if any(p in expr for p in OPERATOR_WIRED_PREFIXES) == wired:
                out.append((f"{uid} / {title}", expr))
    return out


def wait_for_data(
    prom: Prometheus, queries: list[tuple[str, str]], namespace: str
) -> dict[str, str]:
    """Query until each returns at least one sample or the deadline passes; returns failures."""
    pending = {f"{where}: {expr}": substitute(expr, namespace) for where, expr in queries}
    why: dict[str, str] = {}
    deadline = time.monotonic() + DATA_DEADLINE
    while pending and time.monotonic() < deadline:
        for key, expr in list(pending.items()):
            try:
                result = prom.query(expr)
            except QueryError as e:  # a broken query never heals: report at once
                why[key] = f"error {e}"
                del pending[key]
                continue
            if result:
                del pending[key]
                why.pop(key, None)
            else:
                why[key] = "no data"
        if pending:
            time.sleep(1.0)  # poll interval between rounds, not synchronisation
    return {k: v for k, v in why.items() if k in pending or v.startswith("error")}


def test_trainer_gpu_and_operator_health_panels_return_data(stack: Stack) -> None:
    queries = dashboard_queries(wired=False)
    assert len(queries) > 30
    failures = wait_for_data(stack.prometheus, queries, stack.namespace)
    assert not failures, "panels without data:\n" + "\n".join(
        f"- {k} -> {v}" for k, v in failures.items()
    )


def test_job_level_panels_return_data(stack: Stack) -> None:
    """Needs the operator's JobMetrics.update() in the reconcile loop (progress, ETA, verdict)."""
    queries = dashboard_queries(wired=True)
    failures = wait_for_data(stack.prometheus, queries, stack.namespace)
    assert not failures, (
        "panels without data (the reconciler must call "
        "opmetrics.METRICS.update(ns, name, status)):\n"
        + "\n".join(f"- {k} -> {v}" for k, v in failures.items())
    )


def test_every_alert_expression_evaluates_without_error(stack: Stack) -> None:
    rules = [r for g in alerts.groups()["groups"] for r in g["rules"]]
    for r in rules:
        stack.prometheus.query(r["expr"])  # raises QueryError on a bad expression

    def evaluated() -> list[dict[str, Any]] | None:
        loaded = [r for r in stack.prometheus.rules() if r["type"] == "alerting"]
        done = len(loaded) == len(rules) and all(r["lastEvaluation"] > "2000" for r in loaded)
        return loaded if done else None

    loaded = wait_until(evaluated, 30, "every alerting rule evaluated by Prometheus")
    bad = {r["name"]: r.get("lastError") for r in loaded if r["health"] != "ok"}
    assert not bad, bad
    firing = {r["name"] for r in loaded if r["state"] == "firing"}
    # A healthy, running job with a live operator: nothing may fire.
    assert not firing & {
        "GPUJobOperatorDown",
        "GPUJobFailed",
        "GPUJobStalled",
        "GPUJobHardwareFault",
    }


def test_rules_pass_promtool(tmp_path: Path) -> None:
    res = promtool("check", "rules", str(REPO / alerts.RULES_FILE))
    assert res.returncode == 0 and "SUCCESS: 8 rules found" in res.stdout, res.stdout + res.stderr
    (rule,) = find(render({"prometheusRule": {"enabled": True}}), "PrometheusRule")
    spec = tmp_path / "from-chart.rules.yaml"
    spec.write_text(yaml.safe_dump(rule["spec"]))
    res = promtool("check", "rules", str(spec))
    assert res.returncode == 0, res.stdout + res.stderr
