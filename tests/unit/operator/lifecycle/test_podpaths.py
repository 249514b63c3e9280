"""The pod's field paths mapped back to the job's fields the user wrote."""

from __future__ import annotations

from typing import Any

import pytest

from gpujob_operator.lifecycle.apiserver.podpaths import parse, render, user_path
from gpujob_operator.lifecycle.builders import build_pod


def job(**spec: Any) -> dict[str, Any]:
    base = {"image": "img:1", "command": ["python", "-m", "train"]}
    return {
        "apiVersion": "gpujob.dev/v1alpha1",
        "kind": "GPUTrainingJob",
        "metadata": {"name": "j", "namespace": "ns", "uid": "u"},
        "spec": {**base, **spec},
    }


def mapped(pod_path: str, **spec: Any) -> str:
    j = job(**spec)
    return str(user_path(pod_path, j["spec"], build_pod(j, 0, 0)))


def test_parse_and_render_round_trip() -> None:
    for path in (
        "spec.containers[0].env[14].valueFrom.fieldRef.fieldPath",
        "spec.containers[0].resources.requests[cpu]",
        "metadata.labels",
    ):
        assert render(parse(path)) == path


def test_user_env_after_the_operators_maps_by_name() -> None:
    env = [
        {"name": "A", "value": "1"},
        {"name": "TEAM", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['x y']"}}},
    ]
    j = job(env=env)
    pod = build_pod(j, 0, 0)
    names = [e["name"] for e in pod["spec"]["containers"][0]["env"]]
    k = names.index("TEAM")
    assert k > 5  # the operator's entries come first
    got = user_path(f"spec.containers[0].env[{k}].valueFrom.fieldRef", j["spec"], pod)
    assert str(got) == "spec.env[1].valueFrom.fieldRef"
    first = user_path("spec.containers[0].env[0].value", j["spec"], pod)
    assert first.operator and str(first) == "spec.containers[0].env[0].value (set by the operator)"


def test_torchrun_wrapped_command_maps_to_the_users_index() -> None:
    j = job(command=["python", "-m", "train", "--lr", "x"])
    pod = build_pod(j, 0, 0)
    command = pod["spec"]["containers"][0]["command"]
    assert command[0] == "torchrun"
    k = command.index("--lr")
    assert str(user_path(f"spec.containers[0].command[{k}]", j["spec"], pod)) == ("spec.command[3]")
    flag = user_path("spec.containers[0].command[1]", j["spec"], pod)
    assert flag.operator
    assert str(user_path("spec.containers[0].command", j["spec"], pod)) == "spec.command"


def test_unwrapped_command_and_args_keep_their_index() -> None:
    spec = {"command": ["bash", "-c", "run"], "args": ["a", "b"]}
    training = {"launcher": "none"}
    assert mapped("spec.containers[0].command[2]", training=training, **spec) == ("spec.command[2]")
    assert mapped("spec.containers[0].args[1]", **spec) == "spec.args[1]"


@pytest.mark.parametrize(
    ("pod_path", "want"),
    [
        ("metadata.labels", "spec.template.labels"),
        ("metadata.annotations[note]", "spec.template.annotations[note]"),
        ("spec.containers[0].image", "spec.image"),
        (
            "spec.containers[0].securityContext.privileged",
            "spec.template.containerSecurityContext.privileged",
        ),
        (
            "spec.volumes[0].persistentVolumeClaim.claimName",
            "spec.template.volumes[1].persistentVolumeClaim.claimName",
        ),
        ("spec.containers[0].volumeMounts[0].mountPath", "spec.template.volumeMounts[1].mountPath"),
        ("spec.securityContext.runAsUser", "spec.template.securityContext.runAsUser"),
        ("spec.tolerations[0].value", "spec.template.tolerations[0].value"),
        ("spec.containers[0].imagePullPolicy", "spec.template.imagePullPolicy"),
        ("spec.containers[0].resources.limits[cpu]", "spec.resources.limits[cpu]"),
    ],
)
def test_the_table(pod_path: str, want: str) -> None:
    tpl = {
        "labels": {"a": "b"},
        "annotations": {"note": "c"},
        "containerSecurityContext": {"privileged": True},
        "securityContext": {"runAsUser": 1},
        "volumes": [{"name": "x", "emptyDir": {}}, {"name": "data", "persistentVolumeClaim": {}}],
        "volumeMounts": [
            {"name": "x", "mountPath": "/x"},
            {"name": "data", "mountPath": "/data"},
        ],
        "tolerations": [{"key": "k", "operator": "Exists"}],
        "imagePullPolicy": "Never",
    }
    # a profile path of the user's own, so the pod holds only the user's volumes
    j = job(
        template=tpl,
        resources={"limits": {"cpu": "1"}},
        monitoring={"profile": {"path": "/data/profiles"}},
    )
    pod = build_pod(j, 0, 0)
    # the pod's volumes and mounts, in another order than the user's, map by name / path
    pod["spec"]["volumes"].reverse()
    pod["spec"]["containers"][0]["volumeMounts"].reverse()
    assert str(user_path(pod_path, j["spec"], pod)) == want


def test_new_template_fields_map_without_a_change() -> None:
    """A pod field the template gains later: same name under spec.template, index kept."""
    spec = job()["spec"]
    spec["template"] = {
        "initContainers": [{"name": "i"}],
        "containers": [{"name": "side"}],
        "ports": [{"containerPort": 9000}],
        "topologySpreadConstraints": [{}, {"maxSkew": 0}],
        "workingDir": "/w",
    }
    pod = build_pod(job(), 0, 0)
    pod["spec"]["initContainers"] = spec["template"]["initContainers"]
    pod["spec"]["containers"].append({"name": "side"})
    pod["spec"]["containers"][0]["ports"].append({"containerPort": 9000})
    ports = len(pod["spec"]["containers"][0]["ports"])
    cases = {
        "spec.initContainers[0].image": "spec.template.initContainers[0].image",
        "spec.containers[1].image": "spec.template.containers[0].image",
        f"spec.containers[0].ports[{ports - 1}].containerPort": "spec.template.ports[0].containerPort",
        "spec.topologySpreadConstraints[1].maxSkew": "spec.template.topologySpreadConstraints[1].maxSkew",
        "spec.containers[0].workingDir": "spec.template.workingDir",
    }
    for pod_path, want in cases.items():
        assert str(user_path(pod_path, spec, pod)) == want
    assert user_path("spec.containers[0].ports[0].containerPort", spec, pod).operator


@pytest.mark.parametrize(
    "pod_path",
    [
        "spec.hostname",
        "spec.restartPolicy",
        "metadata.name",
        "spec.containers[0].terminationMessagePolicy",
        "spec.volumes[0].emptyDir.medium",
    ],
)
def test_operator_set_fields_keep_the_pods_path(pod_path: str) -> None:
    j = job(template={"shmSize": "1Gi"})
    got = user_path(pod_path, j["spec"], build_pod(j, 0, 0))
    assert got.operator and got.path == pod_path


def test_the_shared_memory_size_is_the_users_shm_size() -> None:
    assert mapped("spec.volumes[0].emptyDir.sizeLimit", template={"shmSize": "1Gi"}) == (
        "spec.template.shmSize"
    )


def test_gpu_resources_are_gpus_per_node() -> None:
    got = mapped("spec.containers[0].resources.limits[nvidia.com/gpu]", gpusPerNode=2)
    assert got == "spec.gpusPerNode"


def test_the_operators_profile_volume_is_the_operators() -> None:
    j = job()
    pod = build_pod(j, 0, 0)
    assert user_path("spec.volumes[0].emptyDir", j["spec"], pod).operator
