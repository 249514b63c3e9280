"""The node agent runs the whole pod template as a kubelet does: init containers in order
(the "fetch a dataset" pattern through an emptyDir), native sidecars beside the regular
containers and stopped after them, hostNetwork pods on their node's own address, and DRA
claims allocated from the nodes' ResourceSlices."""

from __future__ import annotations

import socket
import textwrap
from pathlib import Path
from typing import Any

from kubernetes import config

from gpujob_localcluster import dra
from gpujob_localcluster.nodes import Nodes, NodeShape
from gpujob_localcluster.processes import pid_alive
from tests.support.kube import Kube, simple_pod
from tests.support.waiting import wait_until

SHARED = {"name": "shared", "mountPath": "/shared"}


def python_container(name: str, script: str, **extra: Any) -> dict[str, Any]:
    return {
        "name": name,
        "image": "python:3.11-slim",
        "command": ["python", "-c", textwrap.dedent(script)],
        "volumeMounts": [SHARED],
        **extra,
    }


def pod_with(name: str, main: str, inits: list[dict[str, Any]], **spec: Any) -> dict[str, Any]:
    pod = simple_pod(name, textwrap.dedent(main), volumes=[{"name": "shared", "emptyDir": {}}])
    pod["spec"]["containers"][0]["volumeMounts"] = [SHARED]
    pod["spec"]["initContainers"] = inits
    pod["spec"].update(spec)
    return pod


def statuses(pod: dict[str, Any], key: str) -> dict[str, dict[str, Any]]:
    return {s["name"]: s for s in pod["status"].get(key) or []}


def conditions(pod: dict[str, Any]) -> dict[str, str]:
    return {c["type"]: c["status"] for c in pod["status"].get("conditions", [])}


def test_an_init_container_fetches_what_the_main_container_reads(kube: Kube) -> None:
    fetch = python_container(
        "fetch",
        """
        import os
        open("/shared/dataset.txt", "w").write("rows=42")
        print("fetched into", os.uname().nodename)
        """,
    )
    check = python_container(
        "check", "print('second init sees', open('/shared/dataset.txt').read())"
    )
    pod = pod_with(
        "fetcher",
        """
        print("main reads", open("/shared/dataset.txt").read())
        """,
        [fetch, check],
    )
    kube.apply(pod)
    done = kube.wait_phase("fetcher", ("Succeeded", "Failed"), timeout=90)
    main_log = kube.run("logs", "fetcher", "-c", "main", timeout=60).stdout
    assert done["status"]["phase"] == "Succeeded", (done["status"], main_log)
    assert "main reads rows=42" in main_log
    inits = statuses(done, "initContainerStatuses")
    assert list(inits) == ["fetch", "check"]
    for name in ("fetch", "check"):
        term = inits[name]["state"]["terminated"]
        assert term["exitCode"] == 0 and term["reason"] == "Completed", inits[name]
        assert inits[name]["ready"] is True and inits[name]["restartCount"] == 0
    # They ran one after the other, each to completion, before the main container.
    main_started = statuses(done, "containerStatuses")["main"]["state"]["terminated"]["startedAt"]
    assert (
        inits["fetch"]["state"]["terminated"]["finishedAt"]
        <= (inits["check"]["state"]["terminated"]["startedAt"])
    )
    assert inits["check"]["state"]["terminated"]["finishedAt"] <= main_started
    assert conditions(done)["Initialized"] == "True"
    # kubectl logs reaches an init container's log too.
    assert "fetched into fetcher" in kube.run("logs", "fetcher", "-c", "fetch").stdout
    assert "second init sees rows=42" in kube.run("logs", "fetcher", "-c", "check").stdout


def test_a_failing_init_container_fails_the_pod_under_restart_policy_never(kube: Kube) -> None:
    broken = python_container("fetch", "import sys; print('no dataset'); sys.exit(3)")
    never = python_container("later", "print('must not run')")
    pod = pod_with("badfetch", "print('main must not run')", [broken, never])
    kube.apply(pod)
    done = kube.wait_phase("badfetch", ("Succeeded", "Failed", "Running"), timeout=90)
    assert done["status"]["phase"] == "Failed", done["status"]
    inits = statuses(done, "initContainerStatuses")
    term = inits["fetch"]["state"]["terminated"]
    assert term["exitCode"] == 3 and term["reason"] == "Error", term  # kubectl: Init:Error
    assert inits["later"]["state"] == {"waiting": {"reason": "PodInitializing"}}
    main = statuses(done, "containerStatuses")["main"]
    assert main["state"] == {"waiting": {"reason": "PodInitializing"}}
    assert main["restartCount"] == 0 and main["started"] is False
    conds = conditions(done)
    assert conds["Initialized"] == "False" and conds["Ready"] == "False"
    assert "Init:Error" in kube.run("get", "pod", "badfetch", check=True).stdout


def test_a_failing_init_container_is_retried_under_on_failure(kube: Kube) -> None:
    # Fails on its first attempt, succeeds on the second (the emptyDir keeps the marker).
    flaky = python_container(
        "flaky",
        """
        import os, sys
        if not os.path.exists("/shared/tried"):
            open("/shared/tried", "w").close()
            sys.exit(1)
        """,
    )
    pod = pod_with("retried", "print('main ran')", [flaky], restartPolicy="OnFailure")
    kube.apply(pod)
    done = kube.wait_phase("retried", ("Succeeded", "Failed"), timeout=90)
    assert done["status"]["phase"] == "Succeeded", done["status"]
    flaky_status = statuses(done, "initContainerStatuses")["flaky"]
    assert flaky_status["restartCount"] == 1, flaky_status
    assert flaky_status["lastState"]["terminated"]["exitCode"] == 1
    assert flaky_status["state"]["terminated"]["exitCode"] == 0


def test_a_native_sidecar_runs_beside_the_main_container_and_stops_after_it(
    kube: Kube,
) -> None:
    sidecar = python_container(
        "proxy",
        """
        import os, time
        time.sleep(1)  # a slow start: the startupProbe holds the next init container back
        open("/shared/proxy.pid", "w").write(str(os.getpid()))
        while True:
            time.sleep(3600)
        """,
        restartPolicy="Always",
        startupProbe={"exec": {"command": ["test", "-f", "/shared/proxy.pid"]}, "periodSeconds": 1},
    )
    after = python_container(
        "after-proxy", "print('proxy pid file there:', open('/shared/proxy.pid').read())"
    )
    main = """
        import os
        pid = int(open("/shared/proxy.pid").read())
        print("proxy alive while main runs:", os.path.exists(f"/proc/{pid}"))
        print("proxy pid", pid)
    """
    # A long grace period: the pod ends promptly only because SIGTERM stops the sidecar.
    pod = pod_with("withproxy", main, [sidecar, after], terminationGracePeriodSeconds=300)
    kube.apply(pod)

    done = kube.wait_phase("withproxy", ("Succeeded", "Failed"), timeout=60)
    out = kube.run("logs", "withproxy", "-c", "main", timeout=60).stdout
    assert done["status"]["phase"] == "Succeeded", (done["status"], out)
    assert "proxy alive while main runs: True" in out
    pid = int(out.split("proxy pid ", 1)[1].split()[0])
    assert not pid_alive(pid), f"the sidecar's process {pid} outlived its pod"
    inits = statuses(done, "initContainerStatuses")
    assert "terminated" in inits["proxy"]["state"], inits["proxy"]
    assert inits["proxy"]["restartCount"] == 0
    assert inits["after-proxy"]["state"]["terminated"]["exitCode"] == 0
    main_status = statuses(done, "containerStatuses")["main"]
    assert main_status["state"]["terminated"]["exitCode"] == 0


def test_a_sidecar_that_exits_is_restarted_while_the_pod_runs(kube: Kube) -> None:
    # Exits once, early; the main container waits until the restarted one is there.
    sidecar = python_container(
        "agent",
        """
        import os, time
        n = len(os.listdir("/shared"))
        open(f"/shared/agent-{n}", "w").close()
        if n == 0:
            raise SystemExit(1)
        while True:
            time.sleep(3600)
        """,
        restartPolicy="Always",
    )
    main = """
        import os, time
        deadline = time.monotonic() + 60
        while not os.path.exists("/shared/agent-1") and time.monotonic() < deadline:
            time.sleep(0.1)
        print("restarted sidecar seen:", os.path.exists("/shared/agent-1"))
    """
    kube.apply(pod_with("restartside", main, [sidecar]))
    done = kube.wait_phase("restartside", ("Succeeded", "Failed"), timeout=90)
    out = kube.run("logs", "restartside", "-c", "main", timeout=60).stdout
    assert done["status"]["phase"] == "Succeeded", (done["status"], out)
    assert "restarted sidecar seen: True" in out
    agent = statuses(done, "initContainerStatuses")["agent"]
    assert agent["restartCount"] >= 1, agent


def free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def bind_script(port: int, hold: bool) -> str:
    return textwrap.dedent(
        f"""
        import os, socket, time
        s = socket.socket()
        try:
            s.bind((os.environ["POD_IP"], {port}))
        except OSError as e:
            print("bind failed:", e.errno, flush=True)
        else:
            s.listen()
            print("bound", flush=True)
            while {hold}:
                time.sleep(3600)
        """
    )


def host_pod(name: str, node: str, script: str, **extra: Any) -> dict[str, Any]:
    return simple_pod(
        name,
        script,
        hostNetwork=True,
        nodeSelector={"kubernetes.io/hostname": node},
        **extra,
    )


def test_host_network_pods_share_their_nodes_address_and_its_ports(kube: Kube) -> None:
    nodes = {n["metadata"]["name"]: n for n in kube.list("nodes", "gpujob.dev/local-node=true")}
    address = {
        name: next(a["address"] for a in n["status"]["addresses"] if a["type"] == "InternalIP")
        for name, n in nodes.items()
    }
    first, second = sorted(address)[:2]
    assert address[first] != address[second], address
    port = free_port(address[first])
    holder = host_pod("holder", first, bind_script(port, hold=True))
    # hostPort is informational here (the scheduler keeps such pods apart): it must run.
    holder["spec"]["containers"][0]["ports"] = [{"containerPort": port, "hostPort": port}]
    kube.apply(holder)
    wait_until(
        lambda: "bound" in kube.run("logs", "holder").stdout, 60, "the holder pod to bind its port"
    )
    kube.apply(host_pod("sameport", first, bind_script(port, hold=False)))
    kube.apply(host_pod("othernode", second, bind_script(port, hold=False)))
    kube.apply(simple_pod("ownip", "print('own')", nodeSelector={"kubernetes.io/hostname": first}))
    same = kube.wait_phase("sameport", ("Succeeded", "Failed"), timeout=60)
    other = kube.wait_phase("othernode", ("Succeeded", "Failed"), timeout=60)
    own = kube.wait_phase("ownip", ("Succeeded", "Failed"), timeout=60)
    held = kube.get("pod", "holder") or {}
    for pod, node in ((held, first), (same, first), (other, second)):
        status = pod["status"]
        assert status["podIP"] == status["hostIP"] == address[node], status
        assert status["podIPs"] == [{"ip": address[node]}]
    # Two hostNetwork pods on one node collide on a port; another node's address is free.
    assert "bind failed: 98" in kube.run("logs", "sameport").stdout  # EADDRINUSE
    assert "bound" in kube.run("logs", "othernode").stdout
    # A pod without hostNetwork keeps an address of its own on the same node.
    assert own["status"]["hostIP"] == address[first]
    assert own["status"]["podIP"] not in address.values()
    kube.run("delete", "pod", "holder", "--wait=false", check=True)


def claim_spec(count: int) -> dict[str, Any]:
    return {
        "devices": {
            "requests": [
                {"name": "gpu", "exactly": {"deviceClassName": dra.DEVICE_CLASS, "count": count}}
            ]
        }
    }


def test_dra_claims_are_allocated_from_the_nodes_slices_and_reach_the_containers(
    kube: Kube, tmp_path: Path
) -> None:
    slices = {s["spec"]["nodeName"]: s for s in kube.list("resourceslices")}
    for node in ("gpu-node-0", "gpu-node-1"):
        assert slices[node]["spec"]["driver"] == dra.DRIVER
        listed = slices[node]["spec"]["devices"]
        assert [d["attributes"]["index"]["int"] for d in listed] == list(range(len(listed)))
        assert listed and all(d["attributes"]["uuid"]["string"] for d in listed)
    assert kube.get("deviceclass", dra.DEVICE_CLASS) is not None
    rv1 = "resource.k8s.io/v1"
    kube.apply(
        {
            "apiVersion": rv1,
            "kind": "ResourceClaimTemplate",
            "metadata": {"name": "two-gpus"},
            "spec": {"spec": claim_spec(2)},
        }
    )
    kube.apply(
        {
            "apiVersion": rv1,
            "kind": "ResourceClaim",
            "metadata": {"name": "one-gpu"},
            "spec": claim_spec(1),
        }
    )
    show = "import os; print('devices:', os.environ.get('GPUJOB_DRA_DEVICES', '<none>'))"
    # The helper holds the pod until the test has read the claim (deallocated once unused).
    hold = textwrap.dedent(
        f"""
        import os, time
        {show}
        deadline = time.monotonic() + 60
        while not os.path.exists("/release/go") and time.monotonic() < deadline:
            time.sleep(0.1)
        """
    )
    pod = simple_pod(
        "drapod",
        show,
        volumes=[{"name": "release", "hostPath": {"path": str(tmp_path)}}],
    )
    main = pod["spec"]["containers"][0]
    main["resources"] = {"claims": [{"name": "gpus"}, {"name": "extra"}]}
    helper = {
        **main,
        "name": "helper",
        "command": ["python", "-c", hold],
        "resources": {"claims": [{"name": "extra"}]},
        "volumeMounts": [{"name": "release", "mountPath": "/release"}],
    }
    plain = {k: v for k, v in main.items() if k != "resources"} | {"name": "plain"}
    pod["spec"]["containers"] = [main, helper, plain]
    pod["spec"]["resourceClaims"] = [
        {"name": "gpus", "resourceClaimTemplateName": "two-gpus"},
        {"name": "extra", "resourceClaimName": "one-gpu"},
    ]
    kube.apply(pod)

    def allocated() -> list[dict[str, Any]] | None:
        claim = kube.get("resourceclaim", "one-gpu") or {}
        allocation = claim.get("status", {}).get("allocation")
        return allocation["devices"]["results"] if allocation else None

    results = wait_until(allocated, 60, "the ResourceClaim one-gpu to be allocated")
    (tmp_path / "go").touch()
    done = kube.wait_phase("drapod", ("Succeeded", "Failed"), timeout=90)
    assert done["status"]["phase"] == "Succeeded", done["status"]
    assert [s["name"] for s in done["status"]["resourceClaimStatuses"]] == ["gpus"]
    assert [r["pool"] for r in results] == [done["spec"]["nodeName"]]

    def devices(container: str) -> list[str]:
        out = kube.run("logs", "drapod", "-c", container, check=True).stdout
        return out.split("devices: ", 1)[1].split()[0].split(",")

    assert devices("helper") == [r["device"] for r in results]
    main_devices = devices("main")
    assert len(main_devices) == 3 and len(set(main_devices)) == 3, main_devices
    assert results[0]["device"] in main_devices
    assert devices("plain") == ["<none>"]


def test_a_restarted_agent_publishes_its_slices_again_in_place(kube: Kube) -> None:
    # What a restarted agent's registration does: the class and slices exist already.
    api = config.new_client_from_config(config_file=str(kube.kubeconfig))
    before = {s["metadata"]["name"]: s for s in kube.list("resourceslices")}
    gpus = len(before[dra.slice_name("gpu-node-0")]["spec"]["devices"])
    names = ["gpu-node-0", "gpu-node-1"]
    Nodes(api, names, NodeShape(gpus=gpus), dict.fromkeys(names, "127.0.0.1"), {}).publish_devices()
    after = {s["metadata"]["name"]: s for s in kube.list("resourceslices")}
    assert after.keys() == before.keys()
    for name, old in before.items():
        assert after[name]["metadata"]["uid"] == old["metadata"]["uid"]  # replaced, not recreated
        assert after[name]["spec"]["devices"] == old["spec"]["devices"]


def test_a_restart_all_containers_rule_restarts_the_whole_pod_in_place(kube: Kube) -> None:
    """KEP-5532 as the kubelet does it: one container's matching exit kills every container
    at once, and the pod starts over from its init containers: same pod, UID, address and
    volumes; each container's restart counted, its killed attempt its last state."""
    prepare = python_container("prepare", "open('/shared/inits', 'a').write('init\\n')")
    trainer = python_container(
        "trainer",
        """
        import os, sys, time
        runs = open("/shared/runs", "a+")
        runs.write("run\\n"); runs.flush(); runs.seek(0)
        if len(runs.read().split()) == 1:
            while not os.path.exists("/shared/peer-1"):
                time.sleep(0.05)
            sys.exit(42)  # the first run fails as a rank does
        inits = len(open("/shared/inits").read().split())
        print(f"second run: inits={inits} at {os.environ['POD_IP']}")
        open("/shared/done", "w").close()
        """,
        restartPolicy="Never",
        restartPolicyRules=[
            {"action": "RestartAllContainers", "exitCodes": {"operator": "In", "values": [42]}}
        ],
        env=[{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}],
    )
    peer = python_container(
        "peer",
        """
        import os, time
        n = len(open("/shared/inits").read().split())
        open(f"/shared/peer-{n}", "w").close()
        while not os.path.exists("/shared/done"):
            time.sleep(0.05)
        """,
    )
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "in-place"},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 30,
            "volumes": [{"name": "shared", "emptyDir": {}}],
            "initContainers": [prepare],
            "containers": [trainer, peer],
        },
    }
    kube.apply(pod)
    first = kube.wait_phase("in-place", ("Running", "Succeeded", "Failed"), timeout=90)
    done = kube.wait_phase("in-place", ("Succeeded", "Failed"), timeout=120)
    assert done["status"]["phase"] == "Succeeded", done["status"]
    assert done["metadata"]["uid"] == first["metadata"]["uid"]
    assert done["status"]["podIP"] == first["status"]["podIP"]
    regular = statuses(done, "containerStatuses")
    assert regular["trainer"]["restartCount"] == 1
    assert regular["trainer"]["lastState"]["terminated"]["exitCode"] == 42
    assert regular["peer"]["restartCount"] == 1
    assert regular["peer"]["lastState"]["terminated"]["exitCode"] == 137, "killed, no grace"
    init = statuses(done, "initContainerStatuses")["prepare"]
    assert init["restartCount"] == 1 and init["state"]["terminated"]["exitCode"] == 0
    cond = {c["type"]: c for c in done["status"]["conditions"]}["AllContainersRestarting"]
    assert (cond["status"], cond["reason"]) == ("False", "AllContainersRestartCleanedUp")
    # The init container ran again before it, and the emptyDir (the run count) outlived it.
    logs = kube.run("logs", "in-place", "-c", "trainer", timeout=60).stdout
    assert f"second run: inits=2 at {first['status']['podIP']}" in logs, logs


def test_a_pod_winding_down_does_not_restart_itself_by_its_sidecars_rule(kube: Kube) -> None:
    """A sidecar's "RestartAllContainers on any failure" rule must not fire on the SIGTERM
    the pod's own end sends it: the kubelet evaluates no rule on a pod it terminates."""
    sidecar = python_container(
        "watch",
        "import time\nwhile True: time.sleep(0.1)",
        restartPolicy="Always",
        restartPolicyRules=[
            {"action": "RestartAllContainers", "exitCodes": {"operator": "NotIn", "values": [0]}}
        ],
    )
    kube.apply(pod_with("winds-down", "print('main done')", [sidecar]))
    done = kube.wait_phase("winds-down", ("Succeeded", "Failed"), timeout=90)
    assert done["status"]["phase"] == "Succeeded", done["status"]
    assert "AllContainersRestarting" not in conditions(done)
    assert statuses(done, "containerStatuses")["main"]["restartCount"] == 0


def test_a_downward_api_volume_follows_the_pods_annotations(kube: Kube) -> None:
    """As the kubelet does, the agent rewrites a running pod's downwardAPI files when its
    annotations change: the container sees the new file through its volume's mount."""
    script = textwrap.dedent(
        """
        import sys, time
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            text = open("/podinfo/annotations").read()
            if 'gpujob.dev/stage="go"' in text:
                print("saw the new annotation", flush=True)
                sys.exit(0)
            time.sleep(0.1)
        print("timed out; the file holds:", text, flush=True)
        sys.exit(1)
        """
    )
    items = [{"path": "annotations", "fieldRef": {"fieldPath": "metadata.annotations"}}]
    pod = simple_pod(
        "follows", script, volumes=[{"name": "podinfo", "downwardAPI": {"items": items}}]
    )
    pod["metadata"]["annotations"] = {"gpujob.dev/stage": "wait"}
    pod["spec"]["containers"][0]["volumeMounts"] = [
        {"name": "podinfo", "mountPath": "/podinfo", "readOnly": True}
    ]
    kube.apply(pod)
    running = kube.wait_phase("follows", ("Running", "Succeeded", "Failed"), timeout=60)
    assert running["status"]["phase"] == "Running", running["status"]
    kube.run("annotate", "pod", "follows", "gpujob.dev/stage=go", "--overwrite", check=True)
    done = kube.wait_phase("follows", ("Succeeded", "Failed"), timeout=90)
    out = kube.run("logs", "follows", timeout=60).stdout
    assert done["status"]["phase"] == "Succeeded", (done["status"], out)
    assert "saw the new annotation" in out
