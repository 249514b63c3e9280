"""A pod's files: its volumes' folders, its projected tokens, its hosts file.

Before a pod starts, every volume gets a folder: emptyDir an empty one, hostPath the host's,
configMap/secret/downwardAPI/projected one filled from the API (with the
``kube-api-access-*`` service-account token from the TokenRequest API); each container's
mounts are planned from them. Tokens are rewritten at 80% of their lifetime, and the
downwardAPI files of the pod's metadata whenever its labels or annotations change
(:func:`refresh_downward`). The hosts file of every pod of a headless-service group maps
its peers' DNS names to their addresses and is rewritten, in place, whenever the group
changes. The ConfigMap/Secret lookups here serve both the volumes and the containers' env.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any, cast

from kubernetes import client
from kubernetes.client.rest import ApiException

from gpujob_localcluster import podenv, tokens, volumes
from gpujob_localcluster.podrun import PodRun, ProjectedToken
from gpujob_localcluster.podstatus import PodReporter

log = logging.getLogger("gpujob.nodeagent")


def write_atomic(path: Path, text: str) -> None:
    """Replace a file in one step (a reader sees the old or the new content, never half)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def prepare_volumes(core: client.CoreV1Api, reporter: PodReporter, run: PodRun) -> None:
    """Fill every volume's folder (tokens included) and plan each container's mounts."""
    spec = run.pod.get("spec", {})
    folders: dict[str, Path | None] = {}
    lookup = volume_lookup(core, run.namespace)
    for vol in spec.get("volumes") or []:
        kind = volumes.kind_of(vol)
        folder = run.folder / "volumes" / vol["name"]
        if kind == "emptyDir":
            folder.mkdir(parents=True, exist_ok=True)
        elif kind == "hostPath":
            folder = Path(vol["hostPath"]["path"])
            if vol["hostPath"].get("type") == "DirectoryOrCreate":
                folder.mkdir(parents=True, exist_ok=True)
        elif kind in volumes.FILE_KINDS:
            files, sources = volumes.volume_contents(vol, run.pod, lookup)
            folder.mkdir(parents=True, exist_ok=True)
            for rel, text in files.items():
                write_atomic(folder / rel, text)
            for source in sources:
                tok = ProjectedToken(folder / source.path, source, 0.0)
                write_token(core, run, tok)
                run.tokens.append(tok)
        else:
            folders[vol["name"]] = None
            reporter.event(
                run,
                "Warning",
                "VolumeNotMounted",
                f"volume {vol['name']!r} ({kind or 'no source'}) is not supported by the "
                f"local node agent; containers see no mount at its mount paths",
            )
            continue
        folders[vol["name"]] = folder
    for c in [*(spec.get("initContainers") or []), *spec.get("containers", [])]:
        run.mounts[c["name"]] = volumes.container_mounts(c, folders)
    run.downward_seen = volumes.pod_metadata(run.pod)


def refresh_downward(run: PodRun) -> list[Path]:
    """Rewrite the downwardAPI files of the pod's metadata after its labels or annotations
    changed, as the kubelet does; returns the files rewritten.

    Nothing is read or written while the labels and annotations are the ones last seen
    (``run.downward_seen``). A file is replaced (:func:`write_atomic`) only when its text
    changed, at the path :func:`prepare_volumes` filled: the volume's folder, which each
    container sees through a bind mount of the directory, so the new file shows through.
    A file mounted on its own (``subPath``) is bound by inode and keeps its old content,
    as with the kubelet, which never updates ``subPath`` mounts either.
    """
    seen = volumes.pod_metadata(run.pod)
    if seen == run.downward_seen:
        return []
    written = []
    try:
        for vol in run.pod.get("spec", {}).get("volumes") or []:
            folder = run.folder / "volumes" / vol["name"]
            for rel, text in volumes.refreshable_files(vol, run.pod).items():
                path = folder / rel
                try:
                    current: str | None = path.read_text()
                except OSError:
                    current = None
                if current != text:
                    write_atomic(path, text)
                    written.append(path)
    except OSError as e:
        # Keep the old last-seen metadata: the next update of the pod tries again.
        log.warning("pod %s: rewriting its downwardAPI files failed: %s", run.key, e)
        return written
    run.downward_seen = seen
    if written:
        log.info(
            "pod %s: labels or annotations changed; rewrote %s",
            run.key,
            ", ".join(str(p.relative_to(run.folder)) for p in written),
        )
    return written


def write_token(core: client.CoreV1Api, run: PodRun, tok: ProjectedToken) -> None:
    """Ask for the token of a projected volume and write it (again, when refreshed)."""
    spec = run.pod.get("spec", {})
    sa = spec.get("serviceAccountName") or "default"
    body = tokens.token_request(tok.source, run.name, run.uid)
    write_atomic(tok.path, tokens.request_token(core, run.namespace, sa, body))
    tok.issued_at = time.monotonic()


def refresh_tokens(core: client.CoreV1Api, runs: Iterable[PodRun]) -> None:
    """Rewrite every token whose refresh is due (80% of its lifetime), as the kubelet does."""
    now = time.monotonic()
    for run in list(runs):
        if run.finished or run.deleting:
            continue
        for tok in run.tokens:
            if tokens.refresh_due(tok.issued_at, tok.source.expiration_seconds, now):
                try:
                    write_token(core, run, tok)
                    log.info("pod %s: refreshed the token in %s", run.key, tok.path)
                except ApiException as e:
                    # Keep the old token (still valid for the remaining 20%); retry shortly.
                    tok.issued_at += 10.0
                    log.warning("pod %s: token refresh failed: %s", run.key, e.reason)


def volume_lookup(core: client.CoreV1Api, namespace: str) -> volumes.Lookup:
    """A lookup of a ConfigMap's or Secret's data in ``namespace`` (None: it does not exist)."""

    def lookup(kind: str, name: str) -> dict[str, str] | None:
        try:
            if kind == "configMap":
                return dict(core.read_namespaced_config_map(name, namespace).data or {})
            secret = core.read_namespaced_secret(name, namespace)
            return volumes.secret_lookup_data(cast(Any, secret.data))
        except ApiException as e:
            if e.status == 404:
                return None
            raise

    return lookup


def env_lookup(core: client.CoreV1Api, namespace: str) -> Any:
    """The env lookup :func:`podenv.container_env` takes: one key, or ``*`` for all of them."""

    def lookup(kind: str, name: str, key: str) -> str | None:
        data = volume_lookup(core, namespace)(
            "configMap" if kind.startswith("configMap") else "secret", name
        )
        if data is None:
            return None
        if key == "*":
            return "\n".join(f"{k}={v}" for k, v in data.items())
        return data.get(key)

    return lookup


def refresh_hosts(
    runs: Iterable[PodRun], group: tuple[str, str] | None, also: PodRun | None = None
) -> None:
    """Rewrite the hosts files of every pod in a headless-service group (in place)."""
    members = [r for r in runs if group is not None and r.group() == group]
    if also is not None and also not in members:
        members.append(also)
    peers = [(r.pod, r.ip) for r in members]
    for r in members:
        path = r.folder / "hosts"
        text = podenv.hosts_file(r.pod, r.ip, peers)
        # Truncate and write in place: a bind mount follows the inode, not the name.
        with open(path, "a+") as f:
            f.seek(0)
            f.truncate()
            f.write(text)
