"""The node agent does what a kubelet does where the chart's Deployment and users rely on it:
the service-account token, volumes, probes, restarts with back-off, ``kubectl logs``, images."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

from gpujob_localcluster.cluster import LocalCluster
from tests.support.kube import Kube, simple_pod
from tests.support.waiting import wait_until

SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"


def container_status(kube: Kube, pod: str) -> dict[str, Any]:
    obj = kube.get("pod", pod) or {}
    statuses = obj.get("status", {}).get("containerStatuses") or [{}]
    return dict(statuses[0])


def condition(kube: Kube, pod: str, ctype: str) -> str | None:
    obj = kube.get("pod", pod) or {}
    conds = {c["type"]: c["status"] for c in obj.get("status", {}).get("conditions", [])}
    return conds.get(ctype)


def event_reasons(kube: Kube, pod: str) -> list[str]:
    return [e["reason"] for e in kube.list("events") if e["involvedObject"].get("name") == pod]


def logs(kube: Kube, *args: str) -> subprocess.CompletedProcess[str]:
    return kube.run("logs", *args, timeout=60)


def test_in_cluster_client_authenticates_with_the_projected_token(kube: Kube) -> None:
    kube.run("create", "serviceaccount", "runner", check=True)
    kube.run("create", "role", "pods", "--verb=get", "--resource=pods", check=True)
    kube.run(
        "create",
        "rolebinding",
        "runner-pods",
        "--role=pods",
        f"--serviceaccount={kube.namespace}:runner",
        check=True,
    )
    script = textwrap.dedent(
        f"""
        import base64, json, os
        from kubernetes import client, config
        config.load_incluster_config()  # KUBERNETES_SERVICE_HOST/PORT + the mounted files
        api = client.CoreV1Api()
        me = api.read_namespaced_pod(os.environ["HOSTNAME_POD"], open("{SA_DIR}/namespace").read())
        print("read myself:", me.metadata.name)
        try:
            api.list_namespaced_secret(me.metadata.namespace)
        except client.ApiException as e:
            print("secrets:", e.status)
        claims = open("{SA_DIR}/token").read().split(".")[1]
        claims = json.loads(base64.urlsafe_b64decode(claims + "=="))
        print("claims:", json.dumps(claims["kubernetes.io"]))
        print("ca:", open("{SA_DIR}/ca.crt").read().startswith("-----BEGIN CERTIFICATE"))
        """
    )
    pod = simple_pod("incluster", script, serviceAccountName="runner")
    pod["spec"]["containers"][0]["env"].append(
        {"name": "HOSTNAME_POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}
    )
    kube.apply(pod)
    status = kube.wait_phase("incluster", ("Succeeded", "Failed"), timeout=90)
    out = logs(kube, "incluster").stdout
    assert status["status"]["phase"] == "Succeeded", out
    assert "read myself: incluster" in out and "secrets: 403" in out and "ca: True" in out
    claims = json.loads(out.split("claims: ", 1)[1].splitlines()[0])
    # Bound to this pod and its ServiceAccount: the token dies with the pod.
    assert claims["pod"]["name"] == "incluster" and claims["serviceaccount"]["name"] == "runner"
    vols = [v for v in status["spec"]["volumes"] if v["name"].startswith("kube-api-access-")]
    assert len(vols) == 1, status["spec"]["volumes"]


def test_volumes_are_mounted_where_the_container_expects_them(kube: Kube) -> None:
    kube.run("create", "configmap", "settings", "--from-literal=mode=fast", check=True)
    script = textwrap.dedent(
        """
        import os
        print("mode:", open("/etc/settings/mode").read())
        print("labels:", open("/etc/podinfo/labels").read().strip())
        open("/scratch/x", "w").write("ok")
        try:
            open("/etc/settings/new", "w")
        except OSError as e:
            print("read-only:", e.errno)
        print("hostname:", os.uname().nodename)
        """
    )
    pod = simple_pod(
        "mounts",
        script,
        volumes=[
            {"name": "settings", "configMap": {"name": "settings"}},
            {
                "name": "podinfo",
                "downwardAPI": {
                    "items": [{"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}}]
                },
            },
            {"name": "scratch", "emptyDir": {}},
        ],
    )
    pod["metadata"]["labels"] = {"app": "demo"}
    pod["spec"]["containers"][0]["volumeMounts"] = [
        {"name": "settings", "mountPath": "/etc/settings", "readOnly": True},
        {"name": "podinfo", "mountPath": "/etc/podinfo"},
        {"name": "scratch", "mountPath": "/scratch"},
    ]
    kube.apply(pod)
    status = kube.wait_phase("mounts", ("Succeeded", "Failed"), timeout=60)
    out = logs(kube, "mounts").stdout
    assert status["status"]["phase"] == "Succeeded", out
    assert "mode: fast" in out and "read-only: 30" in out and "hostname: mounts" in out, out
    assert 'labels: app="demo"' in out, out


PROBED = textwrap.dedent(
    """
    import http.server, os
    with open("/state/attempts", "a") as f:
        f.write("x")
    attempt = len(open("/state/attempts").read())
    print("attempt", attempt, flush=True)
    hits = {"/ready": 0, "/live": 0}
    class H(http.server.BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass
        def do_GET(self):
            hits[self.path] = hits.get(self.path, 0) + 1
            n = hits[self.path]
            # Not ready for the first two probes; the first attempt's liveness fails from the 6th.
            bad = (self.path == "/ready" and n <= 2) or (
                self.path == "/live" and attempt == 1 and n > 5
            )
            self.send_response(503 if bad else 200)
            self.end_headers()
    http.server.HTTPServer((os.environ["POD_IP"], 8080), H).serve_forever()
    """
)


def test_probes_drive_ready_and_a_failed_liveness_restarts_the_container(kube: Kube) -> None:
    pod = simple_pod("probed", PROBED, volumes=[{"name": "state", "emptyDir": {}}])
    pod["spec"]["restartPolicy"] = "Always"
    container = pod["spec"]["containers"][0]
    container["volumeMounts"] = [{"name": "state", "mountPath": "/state"}]
    container["ports"] = [{"name": "http", "containerPort": 8080}]
    container["readinessProbe"] = {
        "httpGet": {"path": "/ready", "port": "http"},
        "periodSeconds": 1,
    }
    container["livenessProbe"] = {
        "httpGet": {"path": "/live", "port": 8080},
        "initialDelaySeconds": 1,
        "periodSeconds": 1,
        "failureThreshold": 2,
    }
    kube.apply(pod)
    kube.wait_phase("probed", ("Running",))
    assert condition(kube, "probed", "Ready") == "False"  # readiness has not passed yet
    wait_until(lambda: condition(kube, "probed", "Ready") == "True", 60, "Ready after 3 probes")
    # Liveness fails from the 6th probe: the container is killed and started again in place.
    restarted = wait_until(
        lambda: (s := container_status(kube, "probed")).get("restartCount") == 1 and s,
        60,
        "restart",
    )
    assert "terminated" in restarted["lastState"], restarted
    wait_until(lambda: condition(kube, "probed", "Ready") == "True", 60, "Ready again")
    reasons = event_reasons(kube, "probed")
    assert {"Unhealthy", "Killing"} <= set(reasons), reasons
    # Repeats of one event are one Event with a count, as the kubelet's recorder does.
    failed = [
        e
        for e in kube.list("events")
        if e["involvedObject"].get("name") == "probed"
        and "statuscode: 503" in e["message"]
        and e["message"].startswith("Liveness")
    ]
    assert len(failed) == 1 and failed[0]["count"] >= 2, failed
    # The emptyDir outlived the first attempt; kubectl logs shows each attempt's output.
    wait_until(lambda: "attempt 2" in logs(kube, "probed").stdout, 30, "second attempt's log")
    assert "attempt 1" in logs(kube, "probed", "--previous").stdout
    assert container_status(kube, "probed")["restartCount"] == 1


def test_crashing_container_backs_off_and_on_failure_stops_at_success(kube: Kube) -> None:
    crash = simple_pod("crash", "import sys; print('crashing'); sys.exit(3)")
    crash["spec"]["restartPolicy"] = "Always"
    kube.apply(crash)
    waiting = wait_until(
        lambda: (s := container_status(kube, "crash")).get("state", {}).get("waiting") and s,
        60,
        "CrashLoopBackOff",
    )
    state = waiting["state"]["waiting"]
    assert state["reason"] == "CrashLoopBackOff", waiting
    assert state["message"].startswith("back-off 10s restarting failed container=main pod=crash_")
    assert waiting["restartCount"] == 1 and waiting["lastState"]["terminated"]["exitCode"] == 3
    assert "BackOff" in event_reasons(kube, "crash")
    assert (kube.get("pod", "crash") or {})["status"]["phase"] == "Running"

    flaky = simple_pod(
        "flaky",
        "import os, sys; first = not os.path.exists('/state/ran'); "
        "open('/state/ran', 'w').close(); sys.exit(1 if first else 0)",
        volumes=[{"name": "state", "emptyDir": {}}],
    )
    flaky["spec"]["restartPolicy"] = "OnFailure"
    flaky["spec"]["containers"][0]["volumeMounts"] = [{"name": "state", "mountPath": "/state"}]
    kube.apply(flaky)
    done = kube.wait_phase("flaky", ("Succeeded", "Failed"), timeout=60)
    assert done["status"]["phase"] == "Succeeded"
    assert done["status"]["containerStatuses"][0]["restartCount"] == 1
    # Deleting a pod in back-off cancels the pending restart.
    kube.run("delete", "pod", "crash", "--wait=true", check=True, timeout=60)


def test_kubectl_logs_follow_tail_and_previous(kube: Kube) -> None:
    script = (
        "import time\nfor i in range(6):\n    print('line', i, flush=True)\n    time.sleep(0.5)"
    )
    kube.apply(simple_pod("talker", script))
    kube.wait_phase("talker", ("Running", "Succeeded"))
    followed = logs(kube, "-f", "talker")  # returns once the container has exited
    assert followed.returncode == 0, followed.stderr
    assert [ln for ln in followed.stdout.splitlines()] == [f"line {i}" for i in range(6)]
    kube.wait_phase("talker", ("Succeeded",))
    assert logs(kube, "talker", "--tail", "2").stdout.splitlines() == ["line 4", "line 5"]
    assert logs(kube, "talker", "--limit-bytes", "6").stdout == "line 0"
    previous = logs(kube, "talker", "--previous")
    assert previous.returncode != 0 and "previous terminated container" in previous.stderr
    missing = logs(kube, "talker", "-c", "nope")
    assert missing.returncode != 0 and "nope" in missing.stderr


def test_deployment_becomes_available_through_its_readiness_probe(kube: Kube) -> None:
    serve = (
        "import os, socket\ns = socket.create_server((os.environ['POD_IP'], 9000))\n"
        "while True:\n    s.accept()[0].close()"
    )
    pod = simple_pod("web", serve)
    container = pod["spec"]["containers"][0]
    container["readinessProbe"] = {"tcpSocket": {"port": 9000}, "periodSeconds": 1}
    deploy = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "web"},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {"containers": [container], "terminationGracePeriodSeconds": 5},
            },
        },
    }
    kube.apply(deploy)
    res = kube.run("rollout", "status", "deployment/web", "--timeout=90s", timeout=100)
    assert res.returncode == 0, res.stderr
    status = (kube.get("deployment", "web") or {})["status"]
    assert status["availableReplicas"] == 2


def test_a_container_without_command_runs_its_images_entrypoint(
    kube: Kube, cluster: LocalCluster
) -> None:
    # The operator image's ENTRYPOINT (Dockerfile) is the gpujob console script.
    pod = simple_pod("entry", "")
    container = pod["spec"]["containers"][0]
    del container["command"]
    container["image"] = "ghcr.io/gpujob/gpujob-operator:0.1.0"
    container["args"] = ["diagnose", "--help"]
    unknown = simple_pod("unknown", "")
    del unknown["spec"]["containers"][0]["command"]
    unknown["spec"]["containers"][0]["image"] = "example.com/not-here:1"
    kube.apply(pod)
    kube.apply(unknown)
    done = kube.wait_phase("entry", ("Succeeded", "Failed"))
    assert done["status"]["phase"] == "Succeeded"
    assert logs(kube, "entry").stdout.startswith("usage: gpujob diagnose")
    failed = kube.wait_phase("unknown", ("Failed",))
    term = failed["status"]["containerStatuses"][0]["state"]["terminated"]
    assert term["reason"] == "StartError" and "does not know image" in term["message"], term


def test_a_volume_above_the_venv_does_not_hide_the_image(kube: Kube) -> None:
    """The venv and the checkout play the container image; a volume mounted above them (the
    chart's emptyDir on /tmp when the venv cache lives under /tmp) must leave them visible,
    as a real image's files are: the venv's `gpujob` console script still runs."""
    above = Path(sys.prefix).parent  # e.g. ~/.cache/gpujob: never "/"
    pod = simple_pod("above", "", volumes=[{"name": "scratch", "emptyDir": {}}])
    container = pod["spec"]["containers"][0]
    container["command"] = ["/bin/sh", "-c", f"ls -A '{above}'; gpujob diagnose --help"]
    container["volumeMounts"] = [{"name": "scratch", "mountPath": str(above)}]
    kube.apply(pod)
    status = kube.wait_phase("above", ("Succeeded", "Failed"), timeout=60)
    out = logs(kube, "above").stdout
    assert status["status"]["phase"] == "Succeeded", out
    # the (empty) volume holds only the venv's mount point, and the image's program runs
    assert out.splitlines()[0] == Path(sys.prefix).name, out
    assert "usage: gpujob diagnose" in out, out
