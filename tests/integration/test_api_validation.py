"""The API server itself refuses bad GPUTrainingJobs with a message that names the field."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from gpujob_operator.api import crd as crd_module
from gpujob_operator.lifecycle import builders
from tests.integration.conftest import FULL_TEMPLATE, full_template_prerequisites
from tests.support.format_cases import all_cases, job_with
from tests.support.kube import GET_COLUMNS, Kube
from tests.support.waiting import wait_until

REPO = Path(__file__).resolve().parents[2]
SAMPLES = sorted((REPO / "crds" / "samples").glob("*.yaml"))
BAD = sorted((REPO / "tests" / "data" / "bad_manifests").glob("*.yaml"))


def expectation(path: Path) -> str:
    text = path.read_text()
    m = re.search(r"^# expect-create: (.+)$", text, re.MULTILINE) or re.search(
        r"^# expect: (.+)$", text, re.MULTILINE
    )
    assert m, f"{path.name} lacks an '# expect:' line"
    return m.group(1).strip()


def test_the_catalog_is_large_enough() -> None:
    assert len(BAD) >= 15 and len(SAMPLES) >= 3


@pytest.mark.parametrize("sample", SAMPLES, ids=lambda p: p.stem)
def test_samples_pass_server_side_dry_run(kube: Kube, crd: Path, sample: Path) -> None:
    res = kube.run("apply", "--dry-run=server", "--validate=strict", "-f", str(sample))
    assert res.returncode == 0, res.stderr
    assert "(server dry run)" in res.stdout


def by_webhook(path: Path) -> bool:
    """Refused by the admission webhook (``# by: webhook``), not by the CRD."""
    return re.search(r"^# by: webhook$", path.read_text(), re.MULTILINE) is not None


@pytest.mark.parametrize("manifest", BAD, ids=lambda p: p.stem)
def test_bad_manifest_is_refused_with_its_message(kube: Kube, crd: Path, manifest: Path) -> None:
    res = kube.run("create", "--dry-run=server", "--validate=strict", "-f", str(manifest))
    if by_webhook(manifest):
        # The CRD alone (no webhook here) admits it: the webhook is what refuses it
        # (tests/integration/test_admission_webhook.py).
        assert res.returncode == 0, f"{manifest.name}: {res.stderr}"
        return
    assert res.returncode != 0, f"{manifest.name} was accepted"
    assert expectation(manifest) in res.stderr, res.stderr


def test_format_twins_agree_with_the_api_server(kube: Kube, crd: Path) -> None:
    """Each tricky value (tests/support/format_cases.py) is judged by the CEL rules as the
    table says; the unit tests hold the pydantic model to the same table."""
    wrong = []
    for i, (kind, value, valid) in enumerate(all_cases()):
        body = json.dumps(job_with(kind, value, name=f"case-{i}"))
        res = kube.run("create", "--dry-run=server", "-o", "name", "-f", "-", input=body)
        if (res.returncode == 0) != valid:
            wrong.append(
                f"{kind} {value!r}: expected {'valid' if valid else 'refused'}, got "
                f"{res.stderr.strip() or res.stdout.strip()}"
            )
    assert not wrong, "\n".join(wrong)


def test_annotations_over_256_kib_are_refused(kube: Kube, crd: Path) -> None:
    job = yaml.safe_load((REPO / "crds" / "samples" / "minimal.yaml").read_text())
    job["spec"]["template"] = {"annotations": {"a": "x" * 200_000, "b": "y" * 62_144}}
    res = kube.run("create", "--dry-run=server", "-f", "-", input=json.dumps(job))
    assert res.returncode != 0
    assert "spec.template.annotations must total at most 256 KiB (keys and values)" in res.stderr


def test_full_template_job_and_the_pods_built_from_it_pass_the_api_server(
    kube: Kube, crd: Path
) -> None:
    """Every pod-facing field set: admitted, and its pods and Service pass core/v1 (so the
    typed passthroughs dump what the pod API expects)."""
    job = yaml.safe_load(FULL_TEMPLATE.read_text())
    full_template_prerequisites(kube, job["spec"]["template"])
    res = kube.run("create", "--dry-run=server", "--validate=strict", "-f", str(FULL_TEMPLATE))
    assert res.returncode == 0, res.stderr
    job["metadata"].update(namespace=kube.namespace, uid="00000000-0000-0000-0000-000000000000")
    children = [builders.build_pod(job, rank, 0) for rank in range(job["spec"]["nodes"])]
    children.append(builders.build_service(job))
    for child in children:
        child["metadata"].pop("ownerReferences")  # the job itself is not created
        res = kube.run(
            "create", "--dry-run=server", "--validate=strict", "-f", "-", input=json.dumps(child)
        )
        assert res.returncode == 0, f"{child['metadata']['name']}: {res.stderr}"


def test_the_crds_cel_cost_leaves_headroom(kube: Kube, crd: Path) -> None:
    """The API server refuses a CRD whose estimated CEL cost is over budget (per rule and in
    all). A copy with every list and map bound 1.25x larger must still be accepted, so a new
    rule or a Kubernetes release that estimates a little higher does not break the CRD."""
    probe = crd_module.build_crd()
    probe["metadata"]["name"] = "probes.headroom.example.com"
    probe["spec"]["group"] = "headroom.example.com"
    probe["spec"]["names"] = {
        "kind": "Probe",
        "listKind": "ProbeList",
        "plural": "probes",
        "singular": "probe",
    }

    def widen(node: object) -> None:
        if isinstance(node, dict):
            for key in ("maxItems", "maxProperties"):
                if key in node:
                    node[key] = int(node[key] * 1.25)
            for value in node.values():
                widen(value)
        elif isinstance(node, list):
            for value in node:
                widen(value)

    widen(probe["spec"]["versions"])
    res = kube.run("create", "--dry-run=server", "-f", "-", input=json.dumps(probe), ns=False)
    assert res.returncode == 0, res.stderr


UPDATES = sorted((REPO / "tests" / "data" / "bad_updates").glob("*.yaml"))


@pytest.mark.parametrize("update", UPDATES, ids=lambda p: p.stem)
def test_immutable_fields_are_refused_on_update(kube: Kube, crd: Path, update: Path) -> None:
    base = re.search(r"^# base: (.+)$", update.read_text(), re.MULTILINE)
    assert base, f"{update.name} lacks a '# base:' line"
    kube.run("apply", "-f", str(REPO / base.group(1).strip()), check=True)
    res = kube.run("apply", "-f", str(update))
    assert res.returncode != 0, f"{update.name} was accepted"
    assert expectation(update) in res.stderr, res.stderr


def test_kubectl_explain_reads_well(kube: Kube, crd: Path) -> None:
    # The API server publishes a new CRD's OpenAPI a moment after it is Established.
    explained = wait_until(
        lambda: (
            (r := kube.run("explain", "gputrainingjob.spec.runPolicy", ns=False)).returncode == 0
            and r
        ),
        30,
        "kubectl explain to know the CRD",
    )
    out = explained.stdout
    for field in (
        "backoffLimit",
        "retryableExitCodes",
        "activeDeadlineSeconds",
        "ttlSecondsAfterFinished",
        "cleanPodPolicy",
        "suspend",
    ):
        assert field in out
    assert ("DESCRIPTION" in out and "Retries" in out) or "restart" in out.lower()


def test_short_names_and_printer_columns(kube: Kube, crd: Path) -> None:
    kube.apply(yaml.safe_load((REPO / "crds" / "samples" / "suspended.yaml").read_text()))
    out = kube.run("get", "gtj", check=True).stdout
    header = out.splitlines()[0].split()
    assert header == list(GET_COLUMNS)
    assert kube.run("get", "gpujob").returncode == 0
