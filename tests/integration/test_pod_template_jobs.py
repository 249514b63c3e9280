"""Jobs that use the whole pod template, end to end on the local cluster: an init container
that fetches the data and a native sidecar beside the trainer; two host-network jobs on one
node, each on its own ports, both scraped."""

from __future__ import annotations

import contextlib
import http.server
import json
import threading
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

from gpujob_localcluster.ports import free_port
from tests.integration.conftest import job_status, wait_job_phase
from tests.support.jobs import example_job, python_job
from tests.support.kube import Kube
from tests.support.operator import OperatorProcess
from tests.support.waiting import wait_until


@contextlib.contextmanager
def file_server(folder: Path) -> Iterator[str]:
    """A loopback HTTP server for `folder`: the "object store" an init container fetches from."""
    port = free_port()
    handler = partial(http.server.SimpleHTTPRequestHandler, directory=str(folder))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.shutdown()
        server.server_close()


def py(name: str, script: str) -> dict[str, Any]:
    return {"name": name, "image": "python:3.11-slim", "command": ["python", "-c", script]}


FETCH = """
import sys, urllib.request
with urllib.request.urlopen(sys.argv[1] + "/shard-0.txt", timeout=30) as r, open("/staged/shard-0.txt", "wb") as f:
    f.write(r.read())
"""
SIDECAR = """
import pathlib, time
beat = pathlib.Path("/staged/sidecar.log")
while True:
    with beat.open("a") as f:
        f.write("alive\\n")
    time.sleep(0.2)
"""
MAIN = """
import os, pathlib, time
staged = pathlib.Path("/staged")
deadline = time.monotonic() + 60
while not (staged / "sidecar.log").exists():
    assert time.monotonic() < deadline, "the sidecar never ran beside the trainer"
    time.sleep(0.1)
data = (staged / "shard-0.txt").read_text()
assert data == "tokens of shard 0\\n", data
print("rank", os.environ["RANK"], "read", data.strip(), flush=True)
"""


def test_init_container_fetches_and_a_native_sidecar_never_outlives_the_trainer(
    kube: Kube, operator: OperatorProcess, tmp_path: Path
) -> None:
    (tmp_path / "shard-0.txt").write_text("tokens of shard 0\n")
    with file_server(tmp_path) as url:
        fetch = py("fetch-dataset", FETCH)
        fetch["args"] = [url]
        fetch["volumeMounts"] = [{"name": "staged", "mountPath": "/staged"}]
        sidecar = py("heartbeat", SIDECAR)
        sidecar["restartPolicy"] = "Always"
        sidecar["volumeMounts"] = [{"name": "staged", "mountPath": "/staged"}]
        body = python_job(
            "staged",
            MAIN,
            gpus=0,
            template={
                "volumes": [{"name": "staged", "emptyDir": {}}],
                "volumeMounts": [{"name": "staged", "mountPath": "/staged"}],
                # Long enough that a sidecar keeping its pod alive would be seen.
                "terminationGracePeriodSeconds": 300,
                "initContainers": [fetch, sidecar],
            },
        )
        kube.apply(body)
        status = wait_job_phase(kube, "staged", ("Succeeded", "Failed"), timeout=180)
    assert status["phase"] == "Succeeded", status
    pods = kube.list("pods", "gpujob.dev/job-name=staged")
    assert len(pods) == 2
    for pod in pods:
        assert pod["status"]["phase"] == "Succeeded"
        init = {s["name"]: s for s in pod["status"]["initContainerStatuses"]}
        assert init["fetch-dataset"]["state"]["terminated"]["exitCode"] == 0
        assert "terminated" in init["heartbeat"]["state"], "the sidecar was stopped"
        trainer_done = pod["status"]["containerStatuses"][0]["state"]["terminated"]
        assert trainer_done["exitCode"] == 0
        log = kube.run("logs", pod["metadata"]["name"], "-c", "trainer", check=True).stdout
        assert "read tokens of shard 0" in log


def _node_names(kube: Kube) -> list[str]:
    nodes = json.loads(kube.run("get", "nodes", "-o", "json", ns=False, check=True).stdout)
    return sorted(n["metadata"]["name"] for n in nodes["items"])


def host_job(name: str, node: str) -> dict[str, Any]:
    steps = 160
    return example_job(
        name,
        [
            "--steps",
            str(steps),
            "--hidden",
            "64",
            "--layers",
            "2",
            "--batch-size",
            "64",
            "--slow-input",
            "0.25",
        ],
        steps,
        nodes=1,
        gpusPerNode=1,
        training={"rdzvTimeoutSeconds": 120},
        template={"hostNetwork": True, "nodeSelector": {"kubernetes.io/hostname": node}},
    )


def test_two_host_network_jobs_share_a_node_on_ports_of_their_own(
    kube: Kube, operator: OperatorProcess
) -> None:
    node = _node_names(kube)[0]
    for name in ("host-a", "host-b"):
        kube.apply(host_job(name, node))
    # Both scraped while both run: each one's progress moved before either finished.
    wait_until(
        lambda: all(
            job_status(kube, n).get("phase") == "Running"
            and (job_status(kube, n).get("progress") or {}).get("step", 0) > 0
            for n in ("host-a", "host-b")
        ),
        240,
        "both host-network jobs running with scraped progress",
    )
    pods = {p["metadata"]["name"]: p for p in kube.list("pods", "gpujob.dev/job-name")}
    a, b = pods["host-a-node-0"], pods["host-b-node-0"]
    assert a["spec"]["nodeName"] == b["spec"]["nodeName"] == node
    assert a["status"]["podIP"] == b["status"]["podIP"] == a["status"]["hostIP"]
    ports_a = {p["containerPort"] for p in a["spec"]["containers"][0]["ports"]}
    ports_b = {p["containerPort"] for p in b["spec"]["containers"][0]["ports"]}
    assert ports_a.isdisjoint(ports_b), (ports_a, ports_b)
    for pod in (a, b):
        assert all(
            p["hostPort"] == p["containerPort"] for p in pod["spec"]["containers"][0]["ports"]
        )
    for name in ("host-a", "host-b"):
        status = wait_job_phase(kube, name, ("Succeeded", "Failed"), timeout=240)
        assert status["phase"] == "Succeeded", status
        assert status["progress"]["step"] == 160


DRA_RANK = """
import os
devices = os.environ.get("GPUJOB_DRA_DEVICES", "")
print("rank", os.environ["RANK"], "devices", devices, flush=True)
assert len(devices.split(",")) == 4, devices
"""


def test_a_gang_gets_its_gpus_through_per_pod_resource_claims(
    kube: Kube, operator: OperatorProcess
) -> None:
    """DRA end to end: the local node agent publishes each node's GPUs as a ResourceSlice
    (driver gpu.gpujob.dev), each pod gets its own claim from the template, the scheduler
    allocates them, and the ranks see their devices; no nvidia.com/gpu is requested."""
    kube.apply(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaimTemplate",
            "metadata": {"name": "four-gpus"},
            "spec": {
                "spec": {
                    "devices": {
                        "requests": [
                            {
                                "name": "gpu",
                                "exactly": {"deviceClassName": "gpu.gpujob.dev", "count": 4},
                            }
                        ]
                    }
                }
            },
        }
    )
    body = python_job(
        "dra",
        DRA_RANK,
        gpus=4,
        gpusFrom="ResourceClaims",
        resources={"claims": [{"name": "gpus"}]},
        template={"resourceClaims": [{"name": "gpus", "resourceClaimTemplateName": "four-gpus"}]},
    )
    kube.apply(body)
    status = wait_job_phase(kube, "dra", ("Succeeded", "Failed"), timeout=180)
    assert status["phase"] == "Succeeded", status
    pods = kube.list("pods", "gpujob.dev/job-name=dra")
    assert len({p["spec"]["nodeName"] for p in pods}) == 2, "4 GPUs each: one pod per node"
    claims = set()
    for pod in pods:
        trainer = pod["spec"]["containers"][0]
        assert trainer["resources"] == {"claims": [{"name": "gpus"}]}
        (claim,) = pod["status"]["resourceClaimStatuses"]
        claims.add(claim["resourceClaimName"])
        log = kube.run("logs", pod["metadata"]["name"], check=True).stdout
        assert "devices gpu-" in log
    assert len(claims) == 2, "one claim per pod, from the template"


def test_a_helper_container_that_never_exits_does_not_keep_the_job_running(
    kube: Kube, operator: OperatorProcess
) -> None:
    """A regular container beside the trainer (not a native sidecar) keeps its pod Running
    forever under restartPolicy Never; the job still ends when the trainers do, and those
    pods go (they would hold their GPUs), whatever cleanPodPolicy says."""
    helper = py("fuse", "import time\nwhile True: time.sleep(1)")
    body = python_job(
        "helper",
        "print('trained', flush=True)",
        template={"containers": [helper]},
        runPolicy={"cleanPodPolicy": "None"},
    )
    kube.apply(body)
    status = wait_job_phase(kube, "helper", ("Succeeded", "Failed"), timeout=120)
    assert status["phase"] == "Succeeded", status
    wait_until(
        lambda: not kube.list("pods", "gpujob.dev/job-name=helper"),
        60,
        "the pods whose helper container kept them running deleted",
    )
