"""Pod and Service builders: the DNS, torchrun and env contract as plain dicts."""

from __future__ import annotations

from typing import Any

import pytest

from gpujob_operator import api
from gpujob_operator.lifecycle import builders


def job(**spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"image": "trainer:1", "command": ["python", "-m", "pkg.train"]}
    body.update(spec)
    return {
        "apiVersion": api.API_VERSION,
        "kind": api.KIND,
        "metadata": {"name": "resnet", "namespace": "ml", "uid": "uid-1", "generation": 1},
        "spec": body,
    }


def env_of(pod: dict[str, Any]) -> dict[str, Any]:
    return {
        e["name"]: e.get("value", e.get("valueFrom")) for e in pod["spec"]["containers"][0]["env"]
    }


def test_service_is_headless_and_publishes_not_ready_addresses() -> None:
    svc = builders.build_service(job())
    assert svc["metadata"]["name"] == "resnet" and svc["metadata"]["namespace"] == "ml"
    assert svc["spec"]["clusterIP"] == "None"
    assert svc["spec"]["publishNotReadyAddresses"] is True
    assert svc["spec"]["selector"] == {"gpujob.dev/job-name": "resnet"}
    assert svc["spec"]["ports"][0]["port"] == 29500
    assert svc["metadata"]["ownerReferences"] == [
        {
            "apiVersion": "gpujob.dev/v1alpha1",
            "kind": "GPUTrainingJob",
            "name": "resnet",
            "uid": "uid-1",
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]


def test_pod_identity_dns_labels_and_owner() -> None:
    pod = builders.build_pod(job(nodes=2, gpusPerNode=8), node_rank=1, attempt=3)
    meta, spec = pod["metadata"], pod["spec"]
    assert meta["name"] == "resnet-node-1"
    assert spec["hostname"] == "resnet-node-1" and spec["subdomain"] == "resnet"
    assert spec["restartPolicy"] == "Never"
    assert meta["labels"] == {
        "gpujob.dev/job-name": "resnet",
        "gpujob.dev/node-rank": "1",
        "gpujob.dev/attempt": "3",
        "app.kubernetes.io/managed-by": "gpujob-operator",
    }
    assert meta["ownerReferences"][0]["controller"] is True
    assert meta["ownerReferences"][0]["blockOwnerDeletion"] is True
    assert spec["terminationGracePeriodSeconds"] == 30
    assert spec["enableServiceLinks"] is False


def test_gpus_requested_and_limited_and_omitted_on_cpu() -> None:
    pod = builders.build_pod(
        job(gpusPerNode=8, resources={"requests": {"cpu": "16"}, "limits": {"memory": "64Gi"}}),
        0,
        0,
    )
    res = pod["spec"]["containers"][0]["resources"]
    assert res == {
        "requests": {"cpu": "16", "nvidia.com/gpu": "8"},
        "limits": {"memory": "64Gi", "nvidia.com/gpu": "8"},
    }
    cpu = builders.build_pod(job(gpusPerNode=0), 0, 0)
    assert "resources" not in cpu["spec"]["containers"][0]


def test_metrics_ports_one_per_local_rank() -> None:
    pod = builders.build_pod(job(gpusPerNode=4, training={"metricsPort": 9500}), 0, 0)
    ports = pod["spec"]["containers"][0]["ports"]
    assert [(p["name"], p["containerPort"]) for p in ports] == [
        ("metrics-0", 9500),
        ("metrics-1", 9501),
        ("metrics-2", 9502),
        ("metrics-3", 9503),
        ("rendezvous", 29500),
    ]


def test_env_contract() -> None:
    pod = builders.build_pod(
        job(nodes=4, gpusPerNode=8, training={"totalSteps": 1000, "masterPort": 23456}), 2, 0
    )
    env = env_of(pod)
    assert env["MASTER_ADDR"] == "resnet-node-0.resnet"
    assert env["MASTER_PORT"] == "23456"
    assert env["WORLD_SIZE"] == "4" and env["RANK"] == "2"
    assert env["PET_NNODES"] == "4" and env["PET_NPROC_PER_NODE"] == "8"
    assert env["PET_NODE_RANK"] == "2"
    assert env["PET_MASTER_ADDR"] == "resnet-node-0.resnet"
    assert env["PET_MASTER_PORT"] == "23456"
    assert env["PYTHONUNBUFFERED"] == "1"
    assert env["GPUJOB_METRICS_PORT"] == "9400"
    assert env["GPUJOB_TOTAL_STEPS"] == "1000"
    assert env["GPUJOB_JOB_NAME"] == "resnet" and env["GPUJOB_NAMESPACE"] == "ml"
    assert all(isinstance(v, str) for k, v in env.items() if k != "GPUJOB_METRICS_ADDR")
    addr = next(
        e for e in pod["spec"]["containers"][0]["env"] if e["name"] == "GPUJOB_METRICS_ADDR"
    )
    assert addr["valueFrom"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    assert "GPUJOB_TOTAL_STEPS" not in env_of(builders.build_pod(job(), 0, 0))


def test_the_flight_recorder_is_on_by_default_and_a_users_value_wins_for_its_pair() -> None:
    env = env_of(builders.build_pod(job(), 0, 0))
    assert env["TORCH_FR_BUFFER_SIZE"] == env["TORCH_NCCL_TRACE_BUFFER_SIZE"] == "2000"
    assert env["TORCH_FR_DUMP_ON_TIMEOUT"] == env["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1"
    assert env["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"] == "/tmp/gpujob_fr_rank_"
    spec = api.parse_spec(job()["spec"]).model_copy(
        update={"env": [api.EnvVar(name="TORCH_NCCL_TRACE_BUFFER_SIZE", value="0")]}
    )
    names = [e["name"] for e in builders.build_env("resnet", "ml", spec, 0)]
    # off, as asked: neither name of the pair gets a default torch might read first
    assert "TORCH_FR_BUFFER_SIZE" not in names and names.count("TORCH_NCCL_TRACE_BUFFER_SIZE") == 1
    assert "TORCH_FR_DUMP_ON_TIMEOUT" in names  # the other pairs keep theirs


def test_user_env_follows_and_overrides_only_non_contract_defaults() -> None:
    spec = api.parse_spec(job()["spec"])
    spec = spec.model_copy(
        update={
            "env": [
                api.EnvVar(name="PYTHONUNBUFFERED", value="0"),
                api.EnvVar(name="ADDR", value="$(MASTER_ADDR):1"),
                api.EnvVar(name="TOKEN", value_from={"secretKeyRef": {"name": "s", "key": "k"}}),
                # Refused by the API; the builder still never lets it through.
                api.EnvVar.model_construct(name="MASTER_ADDR", value="evil"),
            ]
        }
    )
    env = builders.build_env("resnet", "ml", spec, 0)
    names = [e["name"] for e in env]
    assert names.count("PYTHONUNBUFFERED") == 1 and names.count("MASTER_ADDR") == 1
    by_name = {e["name"]: e for e in env}
    assert by_name["PYTHONUNBUFFERED"]["value"] == "0"
    assert by_name["MASTER_ADDR"]["value"] == "resnet-node-0.resnet"
    assert by_name["TOKEN"] == {
        "name": "TOKEN",
        "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}},
    }
    assert names.index("ADDR") > names.index("MASTER_ADDR"), "$(VAR) needs VAR defined earlier"


TORCHRUN = [
    "torchrun",
    "--nnodes=2",
    "--nproc-per-node=8",
    "--node-rank=1",
    "--master-addr=resnet-node-0.resnet",
    "--master-port=29500",
    "--rdzv-backend=static",
    "--rdzv-conf=timeout=600",
    "--max-restarts=0",
]


@pytest.mark.parametrize(
    ("command", "tail"),
    [
        (["python", "-m", "pkg.train", "--lr", "1"], ["-m", "pkg.train", "--lr", "1"]),
        (["python3", "train.py"], ["train.py"]),
        (["/usr/bin/python3.11", "train.py", "-x"], ["train.py", "-x"]),
        (["python", "-u", "train.py"], ["--no-python", "python", "-u", "train.py"]),
        (["bash", "-c", "run.sh"], ["--no-python", "bash", "-c", "run.sh"]),
        (["./train"], ["--no-python", "./train"]),
    ],
)
def test_torchrun_wrapping(command: list[str], tail: list[str]) -> None:
    pod = builders.build_pod(
        job(nodes=2, gpusPerNode=8, command=command, args=["--epochs", "3"]), 1, 0
    )
    container = pod["spec"]["containers"][0]
    assert container["command"] == TORCHRUN + tail
    assert container["args"] == ["--epochs", "3"]


def test_rendezvous_timeout_and_procs_flags() -> None:
    spec = api.parse_spec(
        job(nodes=3, training={"procsPerNode": 2, "rdzvTimeoutSeconds": 90})["spec"]
    )
    cmd = builders.torchrun_command("resnet", spec, 0)
    assert "--nproc-per-node=2" in cmd and "--nnodes=3" in cmd
    assert "--rdzv-conf=timeout=90" in cmd


def test_launcher_none_keeps_the_users_command() -> None:
    pod = builders.build_pod(
        job(command=["torchrun", "-m", "x"], training={"launcher": "none"}), 0, 0
    )
    assert pod["spec"]["containers"][0]["command"] == ["torchrun", "-m", "x"]
    bare = builders.build_pod(job(command=None, training={"launcher": "none"}), 0, 0)
    assert "command" not in bare["spec"]["containers"][0], "the image's entrypoint runs"


def test_template_passthrough() -> None:
    tpl: dict[str, Any] = {
        "labels": {"team": "vision"},
        "annotations": {"a": "b"},
        "nodeSelector": {"gpu": "h100"},
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "affinity": {
            "podAntiAffinity": {
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {
                        "weight": 10,
                        "podAffinityTerm": {
                            "topologyKey": "kubernetes.io/hostname",
                            "labelSelector": {"matchLabels": {"team": "vision"}},
                        },
                    }
                ]
            }
        },
        "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "d"}}],
        "volumeMounts": [{"name": "data", "mountPath": "/data"}],
        "securityContext": {"runAsNonRoot": True},
        "containerSecurityContext": {"allowPrivilegeEscalation": False},
        "serviceAccountName": "trainer",
        "priorityClassName": "high",
        "schedulerName": "gang",
        "imagePullSecrets": [{"name": "regcred"}],
        "imagePullPolicy": "Always",
        "terminationGracePeriodSeconds": 5,
        "shmSize": "8Gi",
    }
    pod = builders.build_pod(job(template=tpl), 0, 7)
    spec, container = pod["spec"], pod["spec"]["containers"][0]
    assert pod["metadata"]["labels"]["team"] == "vision"
    assert pod["metadata"]["labels"]["gpujob.dev/attempt"] == "7"
    assert pod["metadata"]["annotations"] == {"a": "b"}
    assert spec["nodeSelector"] == {"gpu": "h100"}
    assert spec["tolerations"] == tpl["tolerations"]
    assert spec["affinity"] == tpl["affinity"]
    assert spec["securityContext"] == {"runAsNonRoot": True}
    assert spec["serviceAccountName"] == "trainer"
    assert spec["priorityClassName"] == "high" and spec["schedulerName"] == "gang"
    assert spec["imagePullSecrets"] == [{"name": "regcred"}]
    assert spec["terminationGracePeriodSeconds"] == 5
    assert spec["volumes"] == [
        tpl["volumes"][0],
        {"name": "gpujob-shm", "emptyDir": {"medium": "Memory", "sizeLimit": "8Gi"}},
        {"name": "gpujob-profiles", "emptyDir": {}},
    ]
    assert container["volumeMounts"] == [
        {"name": "data", "mountPath": "/data"},
        {"name": "gpujob-shm", "mountPath": "/dev/shm"},
        {"name": "gpujob-profiles", "mountPath": "/var/run/gpujob/profiles"},
    ]
    assert container["securityContext"] == {"allowPrivilegeEscalation": False}
    assert container["imagePullPolicy"] == "Always"
    assert container["terminationMessagePolicy"] == "FallbackToLogsOnError"


def test_minimal_pod_has_no_empty_optional_fields() -> None:
    pod = builders.build_pod(job(), 0, 0)
    for key in ("nodeSelector", "tolerations", "affinity", "imagePullSecrets"):
        assert key not in pod["spec"], key
    # the one volume of a minimal pod: the operator's emptyDir for profile traces
    assert pod["spec"]["volumes"] == [{"name": "gpujob-profiles", "emptyDir": {}}]
    assert "annotations" not in pod["metadata"]
    assert "args" not in pod["spec"]["containers"][0]


def test_builders_accept_a_parsed_spec_and_do_not_touch_the_input() -> None:
    body = job(nodes=2)
    before = repr(body)
    spec = api.parse_spec(body["spec"])
    assert builders.build_pod(body, 1, 0, spec) == builders.build_pod(body, 1, 0)
    assert repr(body) == before


def _env(pod: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}


def test_profile_dir_defaults_to_the_operators_empty_dir() -> None:
    pod = builders.build_pod(job(), 0, 0)
    assert _env(pod)["GPUJOB_PROFILE_DIR"] == "/var/run/gpujob/profiles"
    assert {"name": "gpujob-profiles", "mountPath": "/var/run/gpujob/profiles"} in pod["spec"][
        "containers"
    ][0]["volumeMounts"]


def test_profile_path_is_the_users_volume_and_adds_none() -> None:
    tpl = {
        "volumes": [{"name": "traces", "persistentVolumeClaim": {"claimName": "t"}}],
        "volumeMounts": [{"name": "traces", "mountPath": "/traces"}],
    }
    pod = builders.build_pod(
        job(template=tpl, monitoring={"profile": {"path": "/traces/job"}}), 0, 0
    )
    assert _env(pod)["GPUJOB_PROFILE_DIR"] == "/traces/job"
    assert [v["name"] for v in pod["spec"]["volumes"]] == ["traces"]
    assert pod["spec"]["containers"][0]["volumeMounts"] == tpl["volumeMounts"]


def test_a_user_mount_at_the_default_path_is_kept_as_the_place() -> None:
    tpl = {
        "volumes": [{"name": "mine", "emptyDir": {}}],
        "volumeMounts": [{"name": "mine", "mountPath": "/var/run/gpujob/profiles"}],
    }
    pod = builders.build_pod(job(template=tpl), 0, 0)
    assert [v["name"] for v in pod["spec"]["volumes"]] == ["mine"]
    assert _env(pod)["GPUJOB_PROFILE_DIR"] == "/var/run/gpujob/profiles"


@pytest.mark.parametrize(("at", "read_only", "added"), [
    ("/var/run", True, False),  # the mount point could not be made: the pod would not start
    ("/var/run/gpujob/", True, False),
    ("/var/run", False, True),  # a writable folder above: the emptyDir nests in it
    ("/var/run/gpujob-other", True, True),  # not above the default path
])  # fmt: skip
def test_no_profile_volume_under_a_read_only_mount_of_the_users(
    at: str, read_only: bool, added: bool
) -> None:
    tpl = {
        "volumes": [{"name": "mine", "emptyDir": {}}],
        "volumeMounts": [{"name": "mine", "mountPath": at, "readOnly": read_only}],
    }
    pod = builders.build_pod(job(template=tpl), 0, 0)
    assert ("gpujob-profiles" in [v["name"] for v in pod["spec"]["volumes"]]) == added


def test_profile_dir_is_reserved_env() -> None:
    with pytest.raises(ValueError, match="GPUJOB_PROFILE_DIR"):
        api.parse_spec({**job()["spec"], "env": [{"name": "GPUJOB_PROFILE_DIR", "value": "/tmp"}]})
