"""Volume contents and mounts: the kube-api-access projection, ConfigMaps, downward API."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gpujob_localcluster import podinit, volumes

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
