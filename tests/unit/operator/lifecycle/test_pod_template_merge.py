"""The whole pod template: what passes through, what the operator merges, host ports."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from gpujob_operator import api
from gpujob_operator.api import hostports
from gpujob_operator.lifecycle import builders
from gpujob_operator.monitoring import monitor
from tests.unit.operator.lifecycle.test_builders import env_of, job

SIDECAR = {
    "name": "log-shipper",
    "image": "fluent-bit:3",
    "restartPolicy": "Always",
    "startupProbe": {"tcpSocket": {"port": 2020}},
}
FETCH = {"name": "fetch", "image": "busybox", "command": ["sh", "-c", "cp /src/x /data/"]}


def pod_of(rank: int = 0, uid: str = "uid-1", **spec: Any) -> dict[str, Any]:
    body = job(**spec)
    body["metadata"]["uid"] = uid
    return builders.build_pod(body, rank, attempt=0)


def test_pod_fields_pass_through_under_their_core_names() -> None:
    tpl = {
        "runtimeClassName": "nvidia",
        "hostIPC": True,
        "initContainers": [FETCH, SIDECAR],
        "containers": [
            {"name": "fuse", "image": "gcsfuse:1", "securityContext": {"privileged": True}}
        ],
        "dnsPolicy": "None",
        "dnsConfig": {"nameservers": ["10.0.0.10"], "options": [{"name": "ndots", "value": "2"}]},
        "hostAliases": [{"ip": "10.1.2.3", "hostnames": ["storage.local"]}],
        "topologySpreadConstraints": [
            {"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "DoNotSchedule"}
        ],
        "enableServiceLinks": True,
        "preemptionPolicy": "Never",
        "resourceClaims": [{"name": "gpus", "resourceClaimTemplateName": "eight-gpus"}],
        "schedulingGates": [{"name": "example.com/quota"}],
        "os": {"name": "linux"},
        "setHostnameAsFQDN": True,
    }
    pod = pod_of(template=tpl)
    spec = pod["spec"]
    for key, value in tpl.items():
        if key != "containers":
            assert spec[key] == value, key
    names = [c["name"] for c in spec["containers"]]
    assert names == ["trainer", "fuse"], "the trainer comes first, further containers follow"
    assert spec["containers"][1] == tpl["containers"][0]
    # What the operator keeps for itself, whatever the template says elsewhere.
    assert spec["restartPolicy"] == "Never"
    assert spec["hostname"] == "resnet-node-0" and spec["subdomain"] == "resnet"


def test_trainer_container_fields_and_their_order() -> None:
    tpl = {
        "workingDir": "/workspace",
        "ports": [{"name": "tensorboard", "containerPort": 6006}],
        "envFrom": [{"configMapRef": {"name": "settings"}}],
        "lifecycle": {"preStop": {"exec": {"command": ["sh", "-c", "sleep 5"]}}},
        "livenessProbe": {"httpGet": {"path": "/metrics", "port": 9400}},
        "terminationMessagePolicy": "File",
        "tty": True,
    }
    trainer = pod_of(template=tpl, gpusPerNode=2)["spec"]["containers"][0]
    for key in ("workingDir", "envFrom", "lifecycle", "livenessProbe", "tty"):
        assert trainer[key] == tpl[key], key
    assert trainer["terminationMessagePolicy"] == "File", "a user's policy replaces the default"
    ports = [p["name"] for p in trainer["ports"]]
    assert ports == ["metrics-0", "metrics-1", "rendezvous", "tensorboard"]
    assert all("hostPort" not in p for p in trainer["ports"])


def test_defaults_the_user_did_not_set() -> None:
    spec = pod_of()["spec"]
    assert spec["enableServiceLinks"] is False
    assert "dnsPolicy" not in spec
    assert spec["containers"][0]["terminationMessagePolicy"] == "FallbackToLogsOnError"


def test_claims_replace_the_gpu_extended_resource() -> None:
    claims = [{"name": "gpus"}]
    res = pod_of(gpusPerNode=4, gpusFrom="ResourceClaims", resources={"claims": claims})
    assert res["spec"]["containers"][0]["resources"] == {"claims": claims}
    # A claim for something else (an RDMA NIC) leaves the device plugin's GPUs in place.
    nic = pod_of(gpusPerNode=4, resources={"claims": [{"name": "rdma"}]})
    resources = nic["spec"]["containers"][0]["resources"]
    assert resources["limits"][api.GPU_RESOURCE] == "4" and resources["claims"] == [
        {"name": "rdma"}
    ]
    with pytest.raises(ValidationError, match=r"spec\.gpusFrom ResourceClaims needs"):
        api.parse_spec({"image": "x", "command": ["python", "t.py"], "gpusFrom": "ResourceClaims"})


def test_host_network_gives_each_job_a_block_of_host_ports() -> None:
    tpl = {"hostNetwork": True}
    a = pod_of(uid="uid-a", template=tpl, gpusPerNode=2)
    b = pod_of(uid="uid-b", template=tpl, gpusPerNode=2)
    ports_a = {p["name"]: p for p in a["spec"]["containers"][0]["ports"]}
    ports_b = {p["name"]: p for p in b["spec"]["containers"][0]["ports"]}
    for ports in (ports_a, ports_b):
        assert all(p["hostPort"] == p["containerPort"] for p in ports.values())
        low, high = hostports.RANGE
        assert all(low <= p["containerPort"] < high for p in ports.values())
        assert ports["rendezvous"]["containerPort"] == ports["metrics-1"]["containerPort"] + 1
    assert {p["containerPort"] for p in ports_a.values()}.isdisjoint(
        p["containerPort"] for p in ports_b.values()
    )
    # Env, torchrun and the Service agree with the ports.
    env = env_of(a)
    assert env["MASTER_PORT"] == str(ports_a["rendezvous"]["containerPort"])
    assert env[api.ENV_METRICS_PORT] == str(ports_a["metrics-0"]["containerPort"])
    assert f"--master-port={env['MASTER_PORT']}" in a["spec"]["containers"][0]["command"]
    svc = builders.build_service(
        {
            **job(template=tpl, gpusPerNode=2),
            "metadata": a["metadata"] | {"uid": "uid-a", "name": "resnet"},
        }
    )
    assert svc["spec"]["ports"][0]["port"] == int(env["MASTER_PORT"])
    assert a["spec"]["dnsPolicy"] == "ClusterFirstWithHostNet"
    # The same job always gets the same block (operator restarts, the webhook, the scraper).
    assert pod_of(uid="uid-a", template=tpl, gpusPerNode=2) == a


def test_host_network_ports_as_written_with_spec() -> None:
    pod = pod_of(
        template={
            "hostNetwork": True,
            "dnsPolicy": "None",
            "dnsConfig": {"nameservers": ["10.96.0.10"]},
        },
        training={"hostNetworkPorts": "Spec", "metricsPort": 9500, "masterPort": 29600},
    )
    ports = {p["name"]: p for p in pod["spec"]["containers"][0]["ports"]}
    assert ports["metrics-0"] == {
        "name": "metrics-0",
        "containerPort": 9500,
        "hostPort": 9500,
        "protocol": "TCP",
    }
    assert ports["rendezvous"]["hostPort"] == 29600
    assert pod["spec"]["dnsPolicy"] == "None", "a user's dnsPolicy wins"


def test_block_size_grows_with_the_ranks_and_stays_aligned() -> None:
    spec = api.parse_spec(
        {
            "image": "x",
            "command": ["python", "t.py"],
            "gpusPerNode": 0,
            "training": {"procsPerNode": 40},
            "template": {"hostNetwork": True},
        }
    )
    ports = hostports.rank_ports(spec, "some-uid")
    assert (ports.metrics - hostports.RANGE[0]) % 48 == 0
    assert ports.master == ports.metrics + 40 < hostports.RANGE[1]


def test_scrape_targets_follow_the_pods_ports() -> None:
    pod = pod_of(uid="uid-a", template={"hostNetwork": True}, gpusPerNode=2)
    pod["status"] = {"phase": "Running", "podIP": "127.0.0.9"}
    targets = monitor.scrape_targets(
        job(gpusPerNode=2, template={"hostNetwork": True})["spec"], [pod]
    )
    declared = [p["containerPort"] for p in pod["spec"]["containers"][0]["ports"][:2]]
    assert [t.url for t in targets] == [f"http://127.0.0.9:{p}/metrics" for p in declared]


@pytest.mark.parametrize(
    ("template", "message"),
    [
        ({"restartPolicy": "Always"}, "spec.template.restartPolicy is set by the operator"),
        ({"nodeName": "n1"}, "use nodeSelector or affinity"),
        ({"hostNetwork": True, "dnsPolicy": "ClusterFirst"}, "must be ClusterFirstWithHostNet"),
        ({"containers": [{"name": "trainer", "image": "x"}]}, "the operator's trainer container"),
        (
            {"initContainers": [{"name": "s", "resources": {"requests": {api.GPU_RESOURCE: 1}}}]},
            "belongs to the trainer container",
        ),
    ],
)
def test_owned_fields_are_refused_with_their_reason(template: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        api.parse_spec({"image": "x", "template": template})


def test_quantities_reach_the_pod_as_strings() -> None:
    """YAML numbers (cpu: 4) are strings in the pod: the typed client refuses numbers there."""
    pod = pod_of(
        resources={
            "requests": {"cpu": 4, "example.com/fpga": 1},
            "limits": {"cpu": 5, "example.com/fpga": 1},
        },
        env=[
            {
                "name": "M",
                "valueFrom": {"resourceFieldRef": {"resource": "limits.cpu", "divisor": 1}},
            }
        ],
        template={
            "containers": [{"name": "s", "resources": {"limits": {"memory": 1024}}}],
            "resources": {"requests": {"cpu": 2}},
            "volumes": [{"name": "v", "emptyDir": {"sizeLimit": 1000}}],
            "hostNetwork": True,
        },
    )
    spec = pod["spec"]
    assert spec["containers"][0]["resources"]["requests"]["cpu"] == "4"
    assert spec["containers"][0]["resources"]["limits"]["cpu"] == "5"
    assert spec["containers"][1]["resources"]["limits"]["memory"] == "1024"
    assert spec["resources"]["requests"]["cpu"] == "2"
    assert spec["volumes"][0]["emptyDir"]["sizeLimit"] == "1000"
    assert env_of(pod)["M"]["resourceFieldRef"]["divisor"] == "1"
    assert spec["hostNetwork"] is True and isinstance(
        spec["containers"][0]["ports"][0]["hostPort"], int
    )


def _running_pod(trainer_exit: int, helpers: int) -> dict[str, Any]:
    pod = pod_of(template={"containers": [{"name": f"h{i}", "image": "x"} for i in range(helpers)]})
    pod["status"] = {
        "phase": "Running",
        "containerStatuses": [
            {"name": "trainer", "state": {"terminated": {"exitCode": trainer_exit}}},
            *({"name": f"h{i}", "state": {"running": {}}} for i in range(helpers)),
        ],
    }
    return pod


@pytest.mark.parametrize(("code", "phase"), [(0, "Succeeded"), (3, "Failed")])
def test_a_helper_container_does_not_hide_the_trainers_exit(code: int, phase: str) -> None:
    from gpujob_operator.lifecycle.observations import observe_pod

    seen = observe_pod(_running_pod(code, helpers=1))
    # Judged by the trainer, and still active: the pod holds its node's GPUs until deleted.
    assert (seen.phase, seen.lingering, seen.active) == (phase, True, True)
    assert seen.exit_code == code
    # Without helpers the kubelet's phase stands (a sidecar is stopped by the kubelet).
    alone = observe_pod(_running_pod(code, helpers=0))
    assert (alone.phase, alone.lingering) == ("Running", False)


def test_a_helpers_own_failure_does_not_fail_a_rank_that_trained() -> None:
    from gpujob_operator.lifecycle.observations import observe_pod

    pod = _running_pod(0, helpers=1)
    pod["status"]["phase"] = "Failed"
    pod["status"]["containerStatuses"][1]["state"] = {"terminated": {"exitCode": 2}}
    seen = observe_pod(pod)
    assert (seen.phase, seen.lingering, seen.active) == ("Succeeded", False, False)


@pytest.mark.parametrize("how", ["deleted", "disrupted", "evicted"])
def test_a_rank_lost_with_its_helpers_is_not_a_finished_rank(how: str) -> None:
    """A trainer that exits on the SIGTERM of a deletion, drain or preemption is lost, not done."""
    from gpujob_operator.lifecycle.observations import observe_pod

    pod = _running_pod(0, helpers=1)
    if how == "deleted":
        pod["metadata"]["deletionTimestamp"] = "2026-12-05T00:00:00Z"
    elif how == "disrupted":
        pod["status"]["conditions"] = [
            {"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler"}
        ]
    else:
        pod["status"].update(phase="Failed", reason="Evicted")
    seen = observe_pod(pod)
    assert not seen.lingering
    assert seen.phase == ("Failed" if how == "evicted" else "Running")
