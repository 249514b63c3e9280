"""What a user does, end to end, with the commands README.md shows, on the local control plane.

``helm install`` the chart (CRD included) and wait for its operator Deployment to roll out,
``kubectl apply`` the CPU sample (2 nodes x 2 gloo ranks of the example trainer, 200 steps),
watch ``kubectl get gputrainingjobs`` until it succeeds, read the status, describe the job,
read a rank's ``kubectl logs``, then delete the job, read the operator's logs, uninstall the
release, and check nothing of either is left behind.

Choices that shape the test:
- The CRD is the chart's (``charts/gpujob/crds/``), not the session ``crd`` fixture's. Helm
  creates a ``crds/`` CRD when it is absent and skips it, without complaint, when it is already
  there (e.g. applied by an earlier test): the same ``helm install`` line works in both cases,
  and the test asserts the CRD is Established afterwards. Helm never deletes it on uninstall:
  asserted, then removed by hand with ``kubectl delete crd`` as the README shows, and restored
  afterwards when it was there before the test (later tests of the session may rely on it).
- The operator is the chart's Deployment, run by the node agent as a pod: its own projected
  ServiceAccount token (so the API server enforces exactly the chart's RBAC), its probes
  (``rollout status`` waits for Ready), its env and args. Its log comes through
  ``kubectl logs`` and is checked for RBAC refusals.
- Every command is spelled in :mod:`tests.e2e.commands` and run literally from the repository
  root (no shell); ``KUBECONFIG`` names a copy of the admin kubeconfig whose context namespace
  is the test's fresh namespace, so ``kubectl apply -f ...`` lands there as it would in a
  user's ``default``.
- The operator watches the whole cluster (the chart's default cluster mode).
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from gpujob_localcluster import tools
from gpujob_localcluster.cluster import LocalCluster
from gpujob_operator.api.display import ETA_WORDS
from gpujob_operator.monitoring.verdicts.verdict import VERDICTS
from tests.e2e import commands as c
from tests.support.incluster import rbac_denials
from tests.support.kube import Kube
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.timeout(900)]

REPO = Path(__file__).resolve().parents[2]
CRD_FILE = REPO / "crds" / f"{c.CRD_NAME}.yaml"
HEADER = list(c.HEADER)
PERCENT = re.compile(r"^\d{1,2}\.\d%$")
THROUGHPUT = re.compile(r"^\d+(\.\d+)?[kM]? samples/s$")
ETA = re.compile(r"^(\d+[dhms]){1,2}$")
BOTTLENECK = re.compile(r"^(?P<verdict>[A-Za-z]+)(\(r\d+\))?$")
JOB_DEADLINE = 480.0  # torch import + rendezvous (~40 s) + 200 steps on a loaded 2-core machine
TOTAL_STEPS = 200


class User:
    """A shell for the user's commands: repo root, the test's kubeconfig, the built tools."""

    def __init__(self, kubeconfig: Path, helm_home: Path) -> None:
        bins = [str(tools.bin_dir()), str(Path(sys.executable).parent)]
        self.env = {
            **os.environ,
            "KUBECONFIG": str(kubeconfig),
            "PATH": os.pathsep.join([*bins, os.environ.get("PATH", "")]),
        }
        for var in ("HELM_CACHE_HOME", "HELM_CONFIG_HOME", "HELM_DATA_HOME"):
            self.env[var] = str(helm_home / var.lower())
        self.ran: list[str] = []

    def argv(self, command: str) -> list[str]:
        assert command in c.E2E_COMMANDS, f"not a recorded README command: {command}"
        if command not in self.ran:
            self.ran.append(command)
        return shlex.split(command)

    def run(self, command: str, *, check: bool = True, timeout: float = 120) -> str:
        res = subprocess.run(
            self.argv(command),
            cwd=REPO,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if check and res.returncode != 0:
            raise AssertionError(f"$ {command}\nexit {res.returncode}\n{res.stdout}{res.stderr}")
        return res.stdout

    def start(self, command: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            self.argv(command),
            cwd=REPO,
            env=self.env,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def table(text: str) -> list[dict[str, str]]:
    """Rows of a ``kubectl get`` table, cut at the header's column offsets (cells may be empty)."""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    assert lines, "kubectl get printed nothing"
    header = lines[0].split()
    assert header == HEADER, f"columns: {header}"
    starts = [
        lines[0].index(f"{name} ") if name != header[-1] else lines[0].rindex(name)
        for name in header
    ]
    bounds = [*starts[1:], None]
    return [
        {
            name: ln[start:end].strip()
            for name, start, end in zip(header, starts, bounds, strict=True)
        }
        for ln in lines[1:]
    ]


class Watch:
    """``kubectl get gputrainingjobs --watch`` in the background, its lines collected."""

    def __init__(self, user: User) -> None:
        self.proc = user.start(c.WATCH)
        self.lines: list[str] = []
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def stop(self) -> list[str]:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)
        self._thread.join(10)
        return list(self.lines)


@pytest.fixture
def crd_was_there(cluster: LocalCluster) -> Iterator[bool]:
    """Whether an earlier test installed the CRD; if so it is restored after the test."""
    there = cluster.kubectl("get", "crd", c.CRD_NAME).returncode == 0
    yield there
    if there and cluster.kubectl("get", "crd", c.CRD_NAME).returncode != 0:
        res = cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CRD_FILE))
        assert res.returncode == 0, res.stderr
        cluster.kubectl("wait", "--for=condition=Established", f"crd/{c.CRD_NAME}", "--timeout=60s")


@pytest.fixture
def user(kube: Kube, tmp_path: Path) -> Iterator[User]:
    """The user's shell, its kubectl context defaulting to this test's fresh namespace."""
    cfg = yaml.safe_load(kube.kubeconfig.read_text())
    for ctx in cfg["contexts"]:
        ctx["context"]["namespace"] = kube.namespace
    path = tmp_path / "user.kubeconfig"
    path.write_text(yaml.safe_dump(cfg))
    u = User(path, tmp_path / "helm")
    yield u
    # Whatever an assertion left behind: the release and its namespace (idempotent).
    if kube.run("get", "namespace", c.SYSTEM_NS, ns=False).returncode == 0:
        subprocess.run(u.argv(c.HELM_UNINSTALL), env=u.env, cwd=REPO, capture_output=True)
        kube.run("delete", "namespace", c.SYSTEM_NS, "--wait=false", ns=False)


def release_objects(manifest: str) -> list[tuple[str, str, str]]:
    """(kind, namespace, name) of every object in ``helm get manifest`` output."""
    out = []
    for doc in yaml.safe_load_all(manifest):
        if doc:
            meta = doc["metadata"]
            out.append((doc["kind"], meta.get("namespace", ""), meta["name"]))
    return out


def check_running_row(row: dict[str, str]) -> bool:
    """A row of a running job that shows progress, ETA and throughput, each well formed."""
    if row["STATUS"] != "Running" or not (row["PROGRESS"] and row["THROUGHPUT"] and row["ETA"]):
        return False
    if row["ETA"] in ETA_WORDS:  # no ETA yet: "measuring" while warming up
        return False
    assert PERCENT.match(row["PROGRESS"]), row
    assert THROUGHPUT.match(row["THROUGHPUT"]), row
    assert ETA.match(row["ETA"]), row
    return True


def test_a_user_installs_runs_watches_and_cleans_up(
    cluster: LocalCluster, kube: Kube, user: User, crd_was_there: bool, tmp_path: Path
) -> None:
    # 1. Install the chart with its CRD; the operator's Deployment rolls out (Ready by its probes).
    out = user.run(c.HELM_INSTALL)
    assert "STATUS: deployed" in out and "kubectl get gputrainingjobs" in out, out
    user.run(c.CRD_ESTABLISHED)
    manifest = user.run(c.HELM_MANIFEST)
    objects = release_objects(manifest)
    kinds = {k for k, _, _ in objects}
    assert {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Deployment"} <= kinds, objects
    assert "successfully rolled out" in user.run(c.OPERATOR_ROLLOUT, timeout=200)
    # The API server publishes a new CRD's OpenAPI a moment after it is Established.
    explain = wait_until(
        lambda: user.run(c.EXPLAIN, check=False), 30, "kubectl explain to know the CRD"
    )
    assert "scrapeIntervalSeconds" in explain and "thresholds" in explain, explain

    # 2. The operator runs as the chart's pod, with its own ServiceAccount token.
    try:
        user_flow_with_operator(kube, user, tmp_path)
    except BaseException:
        print(user.run(c.OPERATOR_LOGS, check=False))
        raise
    operator_log = user.run(c.OPERATOR_LOGS)
    assert "reconciled" in operator_log and "AllRanksSucceeded" in operator_log, operator_log
    assert not rbac_denials(operator_log), operator_log

    # 6. Uninstall: every object of the release goes; the CRD stays (Helm never deletes crds/).
    assert f'release "{c.RELEASE}" uninstalled' in user.run(c.HELM_UNINSTALL)
    admin = Kube(cluster, c.SYSTEM_NS, cluster.kubeconfig)

    def leftovers() -> list[str]:
        left = [
            f"{kind}/{name}"
            for kind, ns, name in objects
            if admin.run("get", kind, name, *(["-n", ns] if ns else []), ns=False).returncode == 0
        ]
        selector = f"app.kubernetes.io/instance={c.RELEASE}"
        for kind in (
            "pods",
            "services",
            "serviceaccounts",
            "configmaps",
            "roles",
            "rolebindings",
            "deployments",
            "replicasets",
        ):
            left += [f"{kind}/{o['metadata']['name']}" for o in admin.list(kind, selector)]
        for kind in ("clusterroles", "clusterrolebindings"):
            res = admin.run("get", kind, "-l", selector, "-o", "name", ns=False, check=True)
            left += res.stdout.split()
        left += [f"secret/{o['metadata']['name']}" for o in admin.list("secrets", "owner=helm")]
        return left

    wait_until(lambda: not leftovers() or None, 60, "the release's objects gone")
    assert not leftovers()
    assert c.CRD_NAME in user.run(c.GET_CRD)
    assert not kube.list("pods") and not kube.list("services")

    # 7. The namespace helm created, then the CRD itself (which would delete every job).
    user.run(c.DELETE_SYSTEM_NS, timeout=180)
    assert kube.run("get", "namespace", c.SYSTEM_NS, ns=False).returncode != 0
    user.run(c.DELETE_CRD, timeout=180)
    assert kube.run("get", "crd", c.CRD_NAME, ns=False).returncode != 0
    assert sorted(user.ran) == sorted(c.E2E_COMMANDS), user.ran


def user_flow_with_operator(kube: Kube, user: User, tmp_path: Path) -> None:
    """Steps 3 to 5, while the operator runs (the caller stops it before the uninstall)."""
    watch: Watch | None = None
    observed = tmp_path / "kubectl-get.txt"  # what the user saw, kept for a failure's reader
    try:
        # 3. Apply the sample and watch it train to 100%.
        assert f"gputrainingjob.gpujob.dev/{c.JOB} created" in user.run(c.APPLY)
        watch = Watch(user)
        seen: dict[str, dict[str, str]] = {}

        def finished() -> dict[str, str] | None:
            text = user.run(c.GET)
            with observed.open("a") as f:
                f.write(text)
            rows = table(text)
            assert [r["NAME"] for r in rows] == [c.JOB], rows
            row = rows[0]
            if row["BOTTLENECK"]:
                m = BOTTLENECK.match(row["BOTTLENECK"])
                assert m and m["verdict"] in VERDICTS, row
            if "running" not in seen and check_running_row(row):
                seen["running"] = row
            if row["STATUS"] == "Failed":
                raise AssertionError(f"the job failed: {user.run(c.DESCRIBE)}")
            return row if row["STATUS"] == "Succeeded" else None

        final = wait_until(finished, JOB_DEADLINE, f"job {c.JOB} Succeeded", interval=1.0)
        pods = user.run(c.PODS)
        assert pods.count("Completed") == 2, pods
    finally:
        lines = watch.stop() if watch is not None else []

    assert "running" in seen, "never saw a Running row with progress, ETA and throughput"
    assert final["PROGRESS"] == "100.0%", final
    assert (final["NODES"], final["GPUS"]) == ("2", "0"), final
    # A finished job keeps its progress; ETA, throughput and verdict describe a live run.
    assert final["ETA"] == final["THROUGHPUT"] == final["BOTTLENECK"] == "", final
    assert lines and lines[0].split() == HEADER, lines[:3]
    wide = user.run(c.WIDE).splitlines()
    assert wide[0].split() == [*HEADER[:-1], "STEP", "GOODPUT", "RESTARTS", "AGE"], wide
    assert wide[1].split()[:2] == [c.JOB, "Succeeded"] and wide[1].split()[-2] == "0", wide
    assert any(" Running " in ln and re.search(r" \d{1,2}\.\d% ", ln) for ln in lines), lines
    assert any(" Succeeded " in ln and " 100.0% " in ln for ln in lines), lines

    # 4. The status in full, and what describe, events and the CLI show.
    job = yaml.safe_load(user.run(c.STATUS_YAML))
    status = job["status"]
    assert status["phase"] == "Succeeded"
    assert status["observedGeneration"] == job["metadata"]["generation"]
    conds = {cond["type"]: cond for cond in status["conditions"]}
    assert (conds["Created"]["status"], conds["Created"]["reason"]) == ("True", "PodsCreated")
    assert (conds["Succeeded"]["status"], conds["Succeeded"]["reason"]) == (
        "True",
        "AllRanksSucceeded",
    )
    assert conds["Running"]["status"] == "False"
    assert "Failed" not in conds or conds["Failed"]["status"] == "False"
    assert status["gang"]["replicas"] == {
        "desired": 2,
        "created": 2,
        "pending": 0,
        "running": 0,
        "succeeded": 2,
        "failed": 0,
    }
    assert status["gang"]["restarts"] == 0 and status["gang"]["gpus"]["requested"] == 0
    progress = status["progress"]
    assert progress["step"] == progress["totalSteps"] == TOTAL_STEPS, progress
    assert progress["percent"] == 100
    assert progress["samplesPerSecond"] > 0 and "loss" in progress
    assert status["startTime"] <= status["completionTime"]
    gpus = status["gang"]["gpus"]
    assert gpus["telemetry"].startswith("Unavailable"), gpus
    # a finished job's columns: its progress and the share of its GPU time that made steps
    assert set(status["display"]) == {"progress", "goodput"}, status["display"]
    assert status["display"]["progress"] == "100.0%"
    assert re.fullmatch(r"\d{1,3}\.\d%", status["display"]["goodput"]), status["display"]
    assert 0 < status["goodput"]["ratio"] <= 1 and status["goodput"]["gpuHours"] == 0

    described = user.run(c.DESCRIBE)
    assert re.search(rf"^Name:\s+{c.JOB}$", described, re.M), described
    assert re.search(r"^\s+Phase:\s+Succeeded$", described, re.M), described
    assert "AllRanksSucceeded" in described.split("Events:")[-1], described
    events = user.run(c.EVENTS)
    for reason in ("PodsCreating", "AllRanksRunning", "AllRanksSucceeded"):
        assert reason in events, events
    # kubectl logs of a rank: the node agent's kubelet endpoint, proxied by the API server.
    rank_log = user.run(c.RANK_LOGS)
    assert 0 < len(rank_log.splitlines()) <= 5, rank_log
    usage = user.run(c.DIAGNOSE_HELP)
    assert usage.startswith("usage: gpujob diagnose") and "--window" in usage, usage

    # 5. Delete the job: its pods and headless Service go with it (owner references).
    assert f'gputrainingjob.gpujob.dev "{c.JOB}" deleted' in user.run(c.DELETE_JOB)
    wait_until(lambda: not kube.list("pods", f"gpujob.dev/job-name={c.JOB}"), 60, "job pods gone")
    kube.wait_gone("service", c.JOB)
