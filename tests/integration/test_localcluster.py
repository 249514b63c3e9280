"""The local control plane and node agent behave like a real cluster where gpujob relies on it."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from gpujob_localcluster.cluster import LocalCluster
from gpujob_localcluster.controlplane import STATE_FILE, ControlPlane
from gpujob_localcluster.processes import ClusterError
from tests.support.kube import Kube, simple_pod
from tests.support.waiting import wait_until


def test_version_reports_the_built_release(kube: Kube) -> None:
    out = json.loads(kube.run("version", "-o", "json", ns=False, check=True).stdout)
    assert out["serverVersion"]["gitVersion"] == "v1.37.2"
    assert out["clientVersion"]["gitVersion"] == "v1.37.2"


def test_nodes_advertise_gpus(kube: Kube) -> None:
    nodes = kube.list("nodes", "gpujob.dev/local-node=true")
    assert {n["metadata"]["name"] for n in nodes} == {"gpu-node-0", "gpu-node-1"}
    for n in nodes:
        assert n["status"]["allocatable"]["nvidia.com/gpu"] == "4"
        ready = next(c for c in n["status"]["conditions"] if c["type"] == "Ready")
        assert ready["status"] == "True"


def test_rbac_is_enforced(kube: Kube, sa_kubeconfig) -> None:  # type: ignore[no-untyped-def]
    kube.run("create", "serviceaccount", "reader", check=True)
    as_reader = Kube(kube.cluster, kube.namespace, sa_kubeconfig(kube.namespace, "reader"))
    denied = as_reader.run("get", "pods")
    assert denied.returncode != 0
    assert (
        "Forbidden" in denied.stderr
        and f"system:serviceaccount:{kube.namespace}:reader" in denied.stderr
    )

    kube.run("create", "role", "pod-reader", "--verb=get,list", "--resource=pods", check=True)
    kube.run(
        "create",
        "rolebinding",
        "reader-pods",
        "--role=pod-reader",
        f"--serviceaccount={kube.namespace}:reader",
        check=True,
    )
    wait_until(lambda: as_reader.run("get", "pods").returncode == 0, 30, "the Role to take effect")
    still_denied = as_reader.run("get", "secrets")
    assert still_denied.returncode != 0 and "Forbidden" in still_denied.stderr
    assert as_reader.run("auth", "can-i", "delete", "pods").stdout.strip() == "no"


def test_gpu_pod_runs_to_success(kube: Kube, cluster: LocalCluster) -> None:
    kube.apply(simple_pod("ok", "import os; print('rank ok', os.environ['POD_IP'])", gpus=2))
    pod = kube.wait_phase("ok", ("Succeeded", "Failed"))
    assert pod["status"]["phase"] == "Succeeded"
    term = pod["status"]["containerStatuses"][0]["state"]["terminated"]
    assert term["exitCode"] == 0 and term["reason"] == "Completed"
    ip = pod["status"]["podIP"]
    assert ip.startswith("127.") and ip != "127.0.0.1"
    assert pod["spec"]["nodeName"] in ("gpu-node-0", "gpu-node-1")
    logs = list(cluster.pods_dir.glob(f"{kube.namespace}_ok_*/main.log"))
    assert len(logs) == 1 and f"rank ok {ip}" in logs[0].read_text()


def test_oversized_gpu_request_stays_pending_unschedulable(kube: Kube) -> None:
    kube.apply(simple_pod("huge", "print('never')", gpus=16))

    def unschedulable() -> dict | None:
        pod = kube.get("pod", "huge")
        conds = (pod or {}).get("status", {}).get("conditions", [])
        return next(
            (
                c
                for c in conds
                if c["type"] == "PodScheduled" and c.get("reason") == "Unschedulable"
            ),
            None,
        )

    cond = wait_until(unschedulable, 30, "the scheduler to mark the pod Unschedulable")
    assert "Insufficient nvidia.com/gpu" in cond["message"]
    assert kube.get("pod", "huge")["status"]["phase"] == "Pending"  # type: ignore[index]


def test_failing_command_reports_exit_code_and_log_tail(kube: Kube) -> None:
    kube.apply(simple_pod("bad", "import sys; print('boom: disk on fire'); sys.exit(3)"))
    pod = kube.wait_phase("bad", ("Succeeded", "Failed"))
    assert pod["status"]["phase"] == "Failed"
    term = pod["status"]["containerStatuses"][0]["state"]["terminated"]
    assert term["exitCode"] == 3 and term["reason"] == "Error"
    assert "boom: disk on fire" in term["message"]


def test_pods_reach_each_other_by_dns_over_tcp(kube: Kube) -> None:
    kube.apply(
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "peers"},
            "spec": {"clusterIP": "None", "selector": {"app": "peers"}, "ports": [{"port": 7000}]},
        }
    )
    server = textwrap.dedent("""
        import os, socket
        s = socket.create_server((os.environ['POD_IP'], 7000))
        conn, _ = s.accept()
        conn.sendall(b'hello from ' + socket.gethostname().encode())
        conn.close()
    """)
    client = textwrap.dedent("""
        import os, socket, sys, time
        name = 'server.peers.' + os.environ['NS'] + '.svc.cluster.local'
        deadline = time.time() + 60
        while True:
            try:
                with socket.create_connection((name, 7000), timeout=2) as c:
                    print(c.recv(100).decode()); break
            except OSError as e:
                if time.time() > deadline: raise
                time.sleep(0.2)
        c2 = socket.getaddrinfo('server.peers', 7000)[0][4][0]
        print('short name resolves to', c2)
    """)
    srv = simple_pod("server", server, hostname="server", subdomain="peers")
    srv["metadata"]["labels"] = {"app": "peers"}
    cli = simple_pod("client", client, hostname="client", subdomain="peers")
    cli["metadata"]["labels"] = {"app": "peers"}
    cli["spec"]["containers"][0]["env"].append({"name": "NS", "value": kube.namespace})
    kube.apply(cli)  # the client first: it must wait for its peer's name, as torchrun workers do
    kube.apply(srv)
    c = kube.wait_phase("client", ("Succeeded", "Failed"))
    s = kube.wait_phase("server", ("Succeeded", "Failed"))
    assert c["status"]["phase"] == "Succeeded", c["status"]
    assert s["status"]["phase"] == "Succeeded", s["status"]


def test_delete_sends_sigterm_then_pod_disappears(kube: Kube, tmp_path: Path) -> None:
    marker, ready = tmp_path / "got-sigterm", tmp_path / "handler-installed"
    script = textwrap.dedent(f"""
        import signal, sys, time
        def bye(*_):
            open({str(marker)!r}, 'w').write('term'); sys.exit(0)
        signal.signal(signal.SIGTERM, bye)
        open({str(ready)!r}, 'w').write('ready')
        while True: time.sleep(0.1)
    """)
    kube.apply(simple_pod("sleeper", script))
    kube.wait_phase("sleeper", ("Running",))
    # Running means the process started, not that Python has installed its handler yet: on a
    # loaded machine a SIGTERM sent before that kills it the default way, with no marker.
    wait_until(ready.exists, 60, "the pod's SIGTERM handler to be installed")
    kube.run("delete", "pod", "sleeper", "--wait=false", check=True)
    kube.wait_gone("pod", "sleeper", timeout=30)
    wait_until(marker.exists, 10, "the process to record SIGTERM")


def test_owner_deletion_garbage_collects_pods(kube: Kube) -> None:
    kube.run("create", "configmap", "owner", check=True)
    owner = kube.get("configmap", "owner")
    assert owner is not None
    pod = simple_pod("owned", "import time; time.sleep(600)")
    pod["metadata"]["ownerReferences"] = [
        {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": owner["metadata"]["uid"]}
    ]
    kube.apply(pod)
    kube.wait_phase("owned", ("Running",))
    kube.run("delete", "configmap", "owner", check=True)
    kube.wait_gone("pod", "owned", timeout=60)


def test_namespace_deletion_finishes(kube: Kube) -> None:
    ns = f"{kube.namespace}-x"
    kube.run("create", "namespace", ns, ns=False, check=True)
    other = Kube(kube.cluster, ns, kube.kubeconfig)
    wait_until(lambda: other.get("serviceaccount", "default"), 30, "default ServiceAccount")
    other.apply(simple_pod("lingering", "import time; time.sleep(600)"))
    other.wait_phase("lingering", ("Running",))
    kube.run("delete", "namespace", ns, "--wait=false", ns=False, check=True)
    wait_until(
        lambda: kube.run("get", "namespace", ns, ns=False).returncode != 0,
        90,
        f"namespace {ns} gone",
    )


def test_starting_twice_is_refused_clearly(cluster: LocalCluster) -> None:
    with pytest.raises(ClusterError, match="already runs in"):
        ControlPlane(cluster.folder).start()


def test_stale_folder_is_cleaned_with_a_message(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "etcd" / "member").mkdir(parents=True)
    (tmp_path / STATE_FILE).write_text(json.dumps({"pids": {"etcd": 2**22 + 7}}))
    ControlPlane(tmp_path)._check_stale()
    assert not (tmp_path / "etcd").exists() and not (tmp_path / STATE_FILE).exists()
    assert "stale cluster data" in caplog.text
