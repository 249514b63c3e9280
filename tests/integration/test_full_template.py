"""The whole pod template through the real API server and operator: every field the
template accepts lands in the operator's pods as written (after the server's defaults)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from gpujob_operator.api.pod.template import TRAINER_FIELDS
from tests.integration.conftest import FULL_TEMPLATE, full_template_prerequisites
from tests.support.kube import Kube
from tests.support.operator import OperatorProcess
from tests.support.waiting import wait_until


def contains(expected: Any, actual: Any, path: str = "") -> list[str]:
    """Where `actual` lacks what `expected` says (maps: a subset; lists: item by item)."""
    if isinstance(expected, dict):
        if not isinstance(actual, dict):
            return [f"{path}: {actual!r} is no map"]
        return [m for k, v in expected.items() for m in contains(v, actual.get(k), f"{path}.{k}")]
    if isinstance(expected, list):
        if not isinstance(actual, list) or len(actual) != len(expected):
            return [f"{path}: {actual!r} != {expected!r}"]
        return [
            m
            for i, (e, a) in enumerate(zip(expected, actual, strict=True))
            for m in contains(e, a, f"{path}[{i}]")
        ]
    if expected is False and actual is None:
        return []  # core/v1 omits a false that has omitempty
    if str(expected) != str(actual):
        return [f"{path}: {actual!r} != {expected!r}"]
    return []


def test_every_template_field_reaches_the_pods(
    kube: Kube, crd: Path, operator: OperatorProcess
) -> None:
    job = yaml.safe_load(FULL_TEMPLATE.read_text())
    spec = job["spec"]
    tpl = spec["template"]
    full_template_prerequisites(kube, tpl)
    res = kube.run("create", "--validate=strict", "-f", str(FULL_TEMPLATE))
    assert res.returncode == 0, res.stderr
    pods = wait_until(
        lambda: len(p := kube.list("pods")) == spec["nodes"] and p,
        90,
        "the operator's pods of the full template",
    )
    trainer_only = {"volumeMounts", "containerSecurityContext", "ports", *TRAINER_FIELDS}
    merged = {"labels", "annotations", "shmSize", "containers", "volumes", *trainer_only}
    for pod in pods:
        pspec, trainer = pod["spec"], pod["spec"]["containers"][0]
        problems: list[str] = []
        for key, value in tpl.items():
            if key not in merged:
                problems += contains(value, pspec.get(key), f"spec.{key}")
        for key in TRAINER_FIELDS:
            if key in tpl:
                problems += contains(tpl[key], trainer.get(key), f"trainer.{key}")
        problems += contains(
            tpl["containerSecurityContext"], trainer["securityContext"], "trainer.securityContext"
        )
        problems += contains(
            tpl["labels"], {k: pod["metadata"]["labels"][k] for k in tpl["labels"]}, "labels"
        )
        problems += contains(tpl["annotations"], pod["metadata"].get("annotations"), "annotations")
        # The operator's own come first; the user's follow, as written.
        user_ports = trainer["ports"][-len(tpl["ports"]) :]
        problems += contains(tpl["ports"], user_ports, "trainer.ports")
        assert [p["name"] for p in trainer["ports"][:2]] == ["metrics-0", "metrics-1"]
        mounts = trainer["volumeMounts"]
        problems += contains(
            tpl["volumeMounts"], mounts[: len(tpl["volumeMounts"])], "trainer.volumeMounts"
        )
        assert mounts[len(tpl["volumeMounts"])]["mountPath"] == "/dev/shm"
        volumes = pspec["volumes"]
        problems += contains(tpl["volumes"], volumes[: len(tpl["volumes"])], "volumes")
        assert [c["name"] for c in pspec["containers"]] == ["trainer"] + [
            c["name"] for c in tpl["containers"]
        ]
        problems += contains(tpl["containers"], pspec["containers"][1:], "containers")
        problems += contains(spec["resources"]["claims"], trainer["resources"]["claims"], "claims")
        assert "nvidia.com/gpu" not in trainer["resources"].get("limits", {}), (
            "claims give the GPUs"
        )
        env = {e["name"]: e for e in trainer["env"]}
        for entry in spec["env"]:
            problems += contains(entry, env.get(entry["name"]), f"env.{entry['name']}")
        assert not problems, "\n".join(problems)
        # What the operator owns, whatever the template said.
        assert pspec["restartPolicy"] == "Never"
        assert pspec["hostname"] == pod["metadata"]["name"]
        assert all(p["hostPort"] == p["containerPort"] for p in trainer["ports"])
