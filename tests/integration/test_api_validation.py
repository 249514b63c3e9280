"""The API server itself refuses bad GPUTrainingJobs with a message that names the field."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

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


@pytest.mark.parametrize("manifest", BAD, ids=lambda p: p.stem)
def test_bad_manifest_is_refused_with_its_message(kube: Kube, crd: Path, manifest: Path) -> None:
    res = kube.run("create", "--dry-run=server", "--validate=strict", "-f", str(manifest))
    assert res.returncode != 0, f"{manifest.name} was accepted"
    assert expectation(manifest) in res.stderr, res.stderr


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
