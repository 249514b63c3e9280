"""Volume contents and mounts: the kube-api-access projection, ConfigMaps, downward API."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, cast

import pytest

from gpujob_localcluster import podfiles, podinit, volumes
from gpujob_localcluster.podrun import PodRun

POD: dict[str, Any] = {
    "metadata": {"name": "p", "namespace": "ns", "uid": "u", "labels": {"b": "2", "a": "x y"}},
    "spec": {},
}
KUBE_API_ACCESS = {
    "name": "kube-api-access-abcde",
    "projected": {
        "defaultMode": 420,
        "sources": [
            {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
            {
                "configMap": {
                    "name": "kube-root-ca.crt",
                    "items": [{"key": "ca.crt", "path": "ca.crt"}],
                }
            },
            {
                "downwardAPI": {
                    "items": [
                        {
                            "path": "namespace",
                            "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"},
                        }
                    ]
                }
            },
        ],
    },
}


def lookup(kind: str, name: str) -> dict[str, str] | None:
    return {"ca.crt": "CERT"} if (kind, name) == ("configMap", "kube-root-ca.crt") else None


def test_the_service_account_projection() -> None:
    files, tokens = volumes.volume_contents(KUBE_API_ACCESS, POD, lookup)
    assert files == {"ca.crt": "CERT", "namespace": "ns"}
    assert tokens == [volumes.TokenSource("token", None, 3607)]


def test_a_missing_configmap_waits_unless_optional() -> None:
    vol = {"name": "v", "configMap": {"name": "absent"}}
    with pytest.raises(volumes.VolumeNotReady, match="absent"):
        volumes.volume_contents(vol, POD, lookup)
    vol["configMap"]["optional"] = True  # type: ignore[index]
    assert volumes.volume_contents(vol, POD, lookup) == ({}, [])


def test_downward_api_labels_file() -> None:
    vol = {
        "name": "info",
        "downwardAPI": {
            "items": [{"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}}]
        },
    }
    files, _ = volumes.volume_contents(vol, POD, lookup)
    assert files == {"labels": 'a="x y"\nb="2"\n'}


def test_mounts_follow_volume_mounts_and_skip_unmounted_volumes(tmp_path: Path) -> None:
    container = {
        "volumeMounts": [
            {"name": "tmp", "mountPath": "/tmp"},
            {"name": "cfg", "mountPath": "/etc/app/x.conf", "subPath": "x.conf", "readOnly": True},
            {"name": "pvc", "mountPath": "/data"},
        ]
    }
    folders = {"tmp": tmp_path / "tmp", "cfg": tmp_path / "cfg", "pvc": None}
    assert volumes.container_mounts(container, folders) == [
        volumes.Mount(tmp_path / "tmp", "/tmp"),
        volumes.Mount(tmp_path / "cfg" / "x.conf", "/etc/app/x.conf", True),
    ]
    spec = volumes.init_spec(volumes.container_mounts(container, folders), tmp_path / "h", "p")
    assert spec["hostname"] == "p" and spec["mounts"][1]["readOnly"] is True


def test_image_paths_under_a_volume_are_kept_visible(tmp_path: Path) -> None:
    """The venv and checkout play the image: a volume above them must not hide them."""
    image = ["/tmp/cache/venv", "/work/repo", "/tmpfoo/venv"]
    assert podinit.hidden(image, ["/tmp", "/etc/app/x.conf"]) == ["/tmp/cache/venv"]
    assert podinit.hidden(image, ["/tmp/"]) == ["/tmp/cache/venv"]
    assert podinit.hidden(image, ["/work/repo"]) == []  # mounted exactly there: the user's call
    assert podinit.hidden(image, []) == []
    spec = volumes.init_spec([], tmp_path / "h", "p", [Path("/tmp/cache/venv")])
    assert spec["image"] == ["/tmp/cache/venv"]


def field(path: str, field_path: str) -> dict[str, Any]:
    return {"path": path, "fieldRef": {"fieldPath": field_path}}


INFO = {
    "name": "info",
    "downwardAPI": {
        "items": [
            field("labels", "metadata.labels"),
            field("annotations", "metadata.annotations"),
            field("meta/name", "metadata.name"),
            field("a", "metadata.labels['a']"),
            field("node", "spec.nodeName"),
            {
                "path": "cpu",
                "resourceFieldRef": {"containerName": "main", "resource": "limits.cpu"},
            },
        ]
    },
}


def test_refreshable_files_are_the_metadata_items_of_a_downward_api_volume() -> None:
    pod = copy.deepcopy(POD)
    pod["metadata"]["annotations"] = {"note": "hi"}
    assert volumes.refreshable_files(INFO, pod) == {
        "labels": 'a="x y"\nb="2"\n',
        "annotations": 'note="hi"\n',
        "meta/name": "p",
        "a": "x y",
    }


def test_refreshable_files_of_a_projected_volume_come_from_its_downward_api_sources() -> None:
    vol: dict[str, Any] = copy.deepcopy(KUBE_API_ACCESS)
    vol["projected"]["sources"].append(
        {"downwardAPI": {"items": [field("labels", "metadata.labels")]}}
    )
    assert volumes.refreshable_files(vol, POD) == {"namespace": "ns", "labels": 'a="x y"\nb="2"\n'}
    for other in (
        {"name": "cfg", "configMap": {"name": "c"}},
        {"name": "tmp", "emptyDir": {}},
        {"name": "empty", "downwardAPI": {}},
    ):
        assert volumes.refreshable_files(other, POD) == {}


def test_pod_metadata_is_labels_and_annotations() -> None:
    assert volumes.pod_metadata(POD) == ({"b": "2", "a": "x y"}, {})
    assert volumes.pod_metadata({}) == ({}, {})


def test_downward_api_files_follow_the_pods_labels_and_annotations(tmp_path: Path) -> None:
    projected = {
        "name": "proj",
        "projected": {
            "sources": [{"downwardAPI": {"items": [field("ann", "metadata.annotations")]}}]
        },
    }
    pod = copy.deepcopy(POD)
    pod["metadata"]["annotations"] = {"stage": "one"}
    pod["spec"] = {
        "volumes": [INFO, projected],
        "containers": [{"name": "main", "volumeMounts": [{"name": "info", "mountPath": "/i"}]}],
    }
    run = PodRun("u", "ns", "p", pod, "10.0.0.1", tmp_path)
    # No configMap, secret or token here: neither the API nor the reporter is called.
    podfiles.prepare_volumes(cast(Any, None), cast(Any, None), run)
    folder = run.mounts["main"][0].source  # what the container sees at /i
    assert (folder / "annotations").read_text() == 'stage="one"\n'

    # An update that leaves labels and annotations alone touches no file.
    (folder / "annotations").unlink()
    assert podfiles.refresh_downward(run) == []
    assert not (folder / "annotations").exists()
    (folder / "annotations").write_text('stage="one"\n')

    # Only the files whose text changed are rewritten, where the container reads them.
    pod["metadata"]["annotations"] = {"stage": "two"}
    proj = tmp_path / "volumes" / "proj"
    assert podfiles.refresh_downward(run) == [folder / "annotations", proj / "ann"]
    assert (folder / "annotations").read_text() == 'stage="two"\n'
    assert (proj / "ann").read_text() == 'stage="two"\n'
    assert (folder / "labels").read_text() == 'a="x y"\nb="2"\n'
    assert not list(folder.glob(".*.tmp"))

    pod["metadata"]["labels"] = {"a": "z"}
    assert podfiles.refresh_downward(run) == [folder / "labels", folder / "a"]
    assert (folder / "a").read_text() == "z"
    assert podfiles.refresh_downward(run) == []
