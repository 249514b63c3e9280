"""The test harness reads over HTTPS only what kubectl would read the same way."""

from __future__ import annotations

from pathlib import Path

import yaml

from tests.support import rest


def kubeconfig(path: Path, user: dict[str, str], server: str = "https://127.0.0.1:6443") -> Path:
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "c",
                "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}],
                "clusters": [
                    {"name": "k", "cluster": {"server": server, "certificate-authority": "ca.crt"}}
                ],
                "users": [{"name": "u", "user": user}],
            }
        )
    )
    return path


def test_token_kubeconfigs_unknown_kinds_and_unreadable_files_are_left_to_kubectl(
    tmp_path: Path,
) -> None:
    token = kubeconfig(tmp_path / "token.kubeconfig", {"token": "t"})
    assert rest.reader(token, "pods") is None  # RBAC as that identity: kubectl's
    missing = kubeconfig(
        tmp_path / "certs.kubeconfig", {"client-certificate": "a.crt", "client-key": "a.key"}
    )
    assert rest.reader(missing, "pods") is None  # no such files: kubectl says why
    (tmp_path / "half.kubeconfig").write_text("apiVersion: v1\ncontexts: [")
    assert rest.reader(tmp_path / "half.kubeconfig", "pods") is None
    assert rest.reader(tmp_path / "absent.kubeconfig", "pods") is None


def test_the_kinds_tests_poll_map_to_their_api_paths() -> None:
    for name in ("pod", "pods", "Pod"):
        assert rest.RESOURCES[name.lower()].plural == "pods"
    assert not rest.RESOURCES["nodes"].namespaced
    job = rest.RESOURCES["gputrainingjob"]
    assert job is rest.RESOURCES["gputrainingjobs.gpujob.dev"]
    assert job.api_version == "gpujob.dev/v1alpha1" and job.kind == "GPUTrainingJob"
    assert rest.RESOURCES["events"].api_version == "v1"
    assert "deployment" not in rest.RESOURCES  # not polled: kubectl reads it
