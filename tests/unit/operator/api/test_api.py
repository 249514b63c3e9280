"""The pydantic API model: defaults, wire format, and refusing what the API server refuses."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from gpujob_operator import api
from gpujob_operator.api import crd

ROOT = Path(__file__).resolve().parents[4]
SAMPLES = sorted((ROOT / "crds" / "samples").glob("*.yaml"))
BAD = sorted((ROOT / "tests" / "data" / "bad_manifests").glob("*.yaml"))
BAD_UPDATES = sorted((ROOT / "tests" / "data" / "bad_updates").glob("*.yaml"))


def spec(**kw: Any) -> api.GPUTrainingJobSpec:
    return api.GPUTrainingJobSpec.model_validate(
        {"image": "img", "command": ["python", "train.py"], **kw}
    )


def test_identity_constants() -> None:
    assert api.API_VERSION == "gpujob.dev/v1alpha1"
    assert (api.KIND, api.PLURAL, api.SHORT_NAMES) == (
        "GPUTrainingJob",
        "gputrainingjobs",
        ("gtj", "gpujob"),
    )
    assert api.CRD_NAME == "gputrainingjobs.gpujob.dev"


def test_defaults_fill_every_section() -> None:
    s = spec()
    assert (s.nodes, s.gpus_per_node, s.procs_per_node, s.total_gpus) == (1, 0, 1, 0)
    assert s.training.launcher == "torchrun"
    assert (s.training.metrics_port, s.training.master_port) == (9400, 29500)
    assert s.training.rdzv_timeout_seconds == 600
    m = s.monitoring
    assert (m.scrape_interval_seconds, m.stall_timeout_seconds) == (15, 300)
    t = m.thresholds
    assert (t.input_bound_ratio, t.input_warn_ratio, t.comm_bound_ratio) == (0.20, 0.05, 0.15)
    assert (t.straggler_score, t.memory_pressure_ratio, t.gpu_underutilized_ratio) == (
        0.75,
        0.90,
        0.50,
    )
    r = s.run_policy
    assert (r.backoff_limit, r.clean_pod_policy, r.suspend, r.restart_on_stall) == (
        3,
        "Running",
        False,
        False,
    )
    assert r.retryable_exit_codes is None


def test_procs_per_node_follows_gpus_unless_set() -> None:
    assert spec(gpusPerNode=8).procs_per_node == 8
    assert spec(gpusPerNode=8, training={"procsPerNode": 4}).procs_per_node == 4
    assert spec(gpusPerNode=0, training={"procsPerNode": 3}).procs_per_node == 3
    assert spec(nodes=4, gpusPerNode=8).total_gpus == 32


def test_wire_format_is_camel_case_and_accepts_snake_names() -> None:
    s = api.GPUTrainingJobSpec.model_validate(
        {"image": "i", "command": ["x"], "gpus_per_node": 2, "runPolicy": {"backoffLimit": 1}}
    )
    out = api.dump(s)
    assert out["gpusPerNode"] == 2 and out["runPolicy"]["backoffLimit"] == 1
    assert "gpus_per_node" not in out and "resources" not in out, "None fields are omitted"
    assert api.GPUTrainingJobSpec.model_validate(out) == s


def test_status_times_are_rfc3339_z_and_unknown_status_keys_ignored() -> None:
    st = api.parse_status(
        {
            "startTime": "2026-01-02T03:04:05Z",
            "gang": {"gpus": {"requested": 16}},
            "bottleneck": {"verdict": "Straggler", "rank": 13, "gpuUUID": "GPU-1"},
            "kopf": {"progress": {}},
        }
    )
    assert st.start_time == datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    out = api.dump(st)
    assert out == {
        "startTime": "2026-01-02T03:04:05Z",
        "gang": {"gpus": {"requested": 16}},
        "bottleneck": {"verdict": "Straggler", "rank": 13, "gpuUUID": "GPU-1"},
    }


@pytest.mark.parametrize("path", SAMPLES, ids=lambda p: p.name)
def test_samples_are_valid(path: Path) -> None:
    job = api.GPUTrainingJob.model_validate(yaml.safe_load(path.read_text()))
    assert job.spec.image


def test_sample_catalog_is_complete() -> None:
    names = {p.name for p in SAMPLES}
    assert {"ddp-2x8.yaml", "cpu-2x2-example.yaml", "minimal.yaml", "suspended.yaml"} <= names
    cpu = api.GPUTrainingJob.model_validate(
        yaml.safe_load((ROOT / "crds/samples/cpu-2x2-example.yaml").read_text())
    )
    assert cpu.spec.command == ["python", "-m", "gpujob_trainer.example"]
    assert cpu.spec.args[:2] == ["--steps", "200"]


def by_webhook(path: Path) -> bool:
    """A manifest only the admission webhook refuses (``# by: webhook``): its pods'
    mistakes are core/v1's to find; the model and the CRD accept it."""
    return "# by: webhook" in path.read_text().split("\napiVersion:", 1)[0].splitlines()


def expectations(path: Path) -> dict[str, str]:
    """The ``# expect*:`` header lines of a catalog file."""
    out: dict[str, str] = {}
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        key, sep, value = line[1:].strip().partition(": ")
        if sep and key.startswith("expect"):
            out[key] = value
    return out


def test_bad_manifest_catalog_shape() -> None:
    assert len(BAD) >= 15
    for path in BAD:
        exp = expectations(path)
        assert "expect" in exp or {"expect-apply", "expect-create"} <= exp.keys(), path.name
        assert all(v.strip() for v in exp.values()), path.name
        assert yaml.safe_load(path.read_text())["kind"] == "GPUTrainingJob"


@pytest.mark.parametrize("path", BAD, ids=lambda p: p.stem)
def test_bad_manifests_are_refused_by_the_model(path: Path) -> None:
    if by_webhook(path):
        api.GPUTrainingJob.model_validate(yaml.safe_load(path.read_text()))
        return
    with pytest.raises(ValidationError):
        api.GPUTrainingJob.model_validate(yaml.safe_load(path.read_text()))


def test_the_webhooks_catalog_is_large_enough() -> None:
    assert len([p for p in BAD if by_webhook(p)]) >= 8


def _cel_messages(node: Any) -> Iterator[str]:
    """Every CEL message under a schema node, transition rules (oldSelf) excepted."""
    if isinstance(node, dict):
        for rule in node.get("x-kubernetes-validations") or ():
            if "oldSelf" not in rule["rule"]:
                yield rule["message"]
        for value in node.values():
            yield from _cel_messages(value)
    elif isinstance(node, list):
        for value in node:
            yield from _cel_messages(value)


CEL_MESSAGES = sorted(set(_cel_messages(crd.openapi_schema())))
# Rules whose bad manifest would be unwieldy as a file; the integration tests build one.
BUILT_IN_TESTS = {"spec.template.annotations must total at most 256 KiB (keys and values)"}


def _expected(path: Path) -> str:
    return " ".join(expectations(path).values())


@pytest.mark.parametrize("message", CEL_MESSAGES)
def test_every_cel_rule_has_a_bad_manifest(message: str) -> None:
    if message in BUILT_IN_TESTS:
        return
    crd_only = [p for p in BAD if not by_webhook(p)]
    assert any(message in _expected(p) for p in crd_only), f"no bad manifest expects: {message}"


@pytest.mark.parametrize(
    "path",
    [p for p in BAD if not by_webhook(p) and any(m in _expected(p) for m in CEL_MESSAGES)],
    ids=lambda p: p.stem,
)
def test_the_model_refuses_with_the_servers_message(path: Path) -> None:
    """The pydantic twin of each CEL rule says exactly what the API server says."""
    with pytest.raises(ValidationError) as refused:
        api.GPUTrainingJob.model_validate(yaml.safe_load(path.read_text()))
    for message in (m for m in CEL_MESSAGES if m in _expected(path)):
        assert message in str(refused.value)


def test_full_template_is_valid_for_the_model() -> None:
    job = api.GPUTrainingJob.model_validate(
        yaml.safe_load((ROOT / "tests/data/full-template.yaml").read_text())
    )
    tpl = job.spec.template
    assert tpl is not None and tpl.volumes and tpl.volumes[1].empty_dir == {"sizeLimit": "20Gi"}
    assert job.spec.env and job.spec.env[1].value_from and job.spec.env[1].value_from.secret_key_ref


def test_annotations_size_limit() -> None:
    ok = {"image": "i", "command": ["x"], "template": {"annotations": {"a": "x" * 200_000}}}
    api.GPUTrainingJobSpec.model_validate(ok)
    big = {"a": "x" * 200_000, "b": "y" * 62_144}
    with pytest.raises(ValidationError, match="256 KiB"):
        api.GPUTrainingJobSpec.model_validate({**ok, "template": {"annotations": big}})


@pytest.mark.parametrize(
    "patch",
    [
        {
            "resources": {
                "requests": {"memory": "1Gi", "hugepages-1Gi": "2Gi"},
                "limits": {"hugepages-1Gi": "2Gi"},
            }
        },
        {"resources": {"requests": {"cpu": "500m"}, "limits": {"cpu": "0.5"}}},
        {"resources": {"limits": {"example.com/nic": 2}}},
        {"template": {"tolerations": [{"operator": "Exists"}]}},
        {"template": {"shmSize": 1}},
        {"template": {"labels": {"gpujob.dev.example.com/x": "ok"}}},
        {"monitoring": {"enabled": False, "warmupSteps": 50}, "training": {"totalSteps": 10}},
        {"monitoring": {"scrapeIntervalSeconds": 60, "window": {"durationSeconds": 120}}},
        {"template": {"securityContext": {"appArmorProfile": {"type": "RuntimeDefault"}}}},
    ],
)
def test_valid_edges_are_accepted(patch: dict[str, Any]) -> None:
    api.GPUTrainingJobSpec.model_validate({"image": "img", "command": ["python", "t.py"], **patch})


@pytest.mark.parametrize("path", BAD_UPDATES, ids=lambda p: p.stem)
def test_bad_updates_have_a_valid_base_and_a_valid_body(path: Path) -> None:
    """Immutability is only the server's to check; both sides are valid on their own."""
    header = {
        k: v
        for k, _, v in (
            line[1:].strip().partition(": ")
            for line in path.read_text().splitlines()
            if line.startswith("#")
        )
    }
    base = yaml.safe_load((ROOT / header["base"]).read_text())
    new = yaml.safe_load(path.read_text())
    assert header["expect"]
    assert base["metadata"]["name"] == new["metadata"]["name"]
    api.GPUTrainingJob.model_validate(base)
    api.GPUTrainingJob.model_validate(new)


@pytest.mark.parametrize(
    ("patch", "message"),
    [
        ({"gpusPerNode": 2, "training": {"procsPerNode": 4}}, "procsPerNode must be <="),
        ({"command": None}, "spec.command is required"),
        ({"env": [{"name": "RANK", "value": "3"}]}, "spec.env must not set"),
        ({"env": [{"name": "A", "value": "1"}, {"name": "A", "value": "2"}]}, "duplicate"),
        ({"resources": {"requests": {"nvidia.com/gpu": 1}}}, "nvidia.com/gpu"),
        ({"training": {"metricsPort": 65535, "procsPerNode": 2}}, "<= 65535"),
        ({"monitoring": {"scrapeIntervalSeconds": 60, "stallTimeoutSeconds": 30}}, "stall"),
        ({"runPolicy": {"retryableExitCodes": [256]}}, "less than or equal to 255"),
    ],
)
def test_cross_field_rules(patch: dict[str, Any], message: str) -> None:
    body = {"image": "img", "command": ["python", "t.py"], **patch}
    with pytest.raises(ValidationError, match=message):
        api.GPUTrainingJobSpec.model_validate(body)


def test_launcher_none_needs_no_command_and_pythonunbuffered_is_the_users() -> None:
    s = api.GPUTrainingJobSpec.model_validate(
        {
            "image": "i",
            "training": {"launcher": "none"},
            "env": [{"name": "PYTHONUNBUFFERED", "value": "0"}],
        }
    )
    assert s.command is None


def test_job_name_rule() -> None:
    ok = {
        "metadata": {"name": "a" * api.MAX_JOB_NAME_LENGTH},
        "spec": {"image": "i", "command": ["x"]},
    }
    api.GPUTrainingJob.model_validate(ok)
    for bad in ("a" * (api.MAX_JOB_NAME_LENGTH + 1), "1job", "Job", "job-"):
        with pytest.raises(ValidationError, match="DNS-1035"):
            api.GPUTrainingJob.model_validate({**ok, "metadata": {"name": bad}})


def test_core_imports_no_kopf_no_client_no_http_no_torch() -> None:
    """The pure core stays pure: plain data in, plain data out."""
    code = (
        "import sys\n"
        "import gpujob_operator.api, gpujob_operator.api.crd, gpujob_operator.api.conditions\n"
        "import gpujob_operator.lifecycle.builders, gpujob_operator.lifecycle.planner, gpujob_operator.api.display\n"
        "bad = ('kopf', 'kubernetes', 'aiohttp', 'requests', 'httpx', 'urllib3', 'torch')\n"
        "print(','.join(m for m in bad if m in sys.modules))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == ""


def test_spec_problems_read_like_the_api_server() -> None:
    body = {
        "image": "img",
        "command": ["x"],
        "template": {"labels": {"team": "a b"}, "tolerations": [{"operator": "Equal"}]},
    }
    with pytest.raises(ValidationError) as refused:
        api.parse_spec(body)
    text = api.spec_problems(refused.value)
    assert "spec.template.labels.team: must be a label value" in text
    assert (
        "spec.template.tolerations[0]: spec.template.tolerations[]: operator must be Exists" in text
    )
    assert "Value error" not in text
