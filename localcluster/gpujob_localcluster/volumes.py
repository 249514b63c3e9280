"""A pod's volumes as local folders, and the bind mounts that put them where containers expect.

Pure planning: which files a configMap/secret/downwardAPI/projected volume holds (the
service-account token is requested elsewhere, see :mod:`tokens`), which folder each
``volumeMount`` binds; :mod:`podinit` does the mounts inside the pod's mount namespace. Supported: emptyDir, hostPath, configMap, secret, downwardAPI, projected
(serviceAccountToken, configMap, secret, downwardAPI). Other kinds (a PVC, say) are not
mounted; the agent says so in a Warning Event. The downwardAPI files of the pod's metadata
(:func:`refreshable_files`) follow its labels and annotations while it runs, as the
kubelet's do.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpujob_localcluster import podenv

FILE_KINDS = ("configMap", "secret", "downwardAPI", "projected")

Lookup = Callable[[str, str], Mapping[str, str] | None]
"""``lookup(kind, name)``: a ConfigMap's data or a Secret's decoded data, None when absent."""


class VolumeNotReady(RuntimeError):
    """A volume cannot be filled yet (a ConfigMap or Secret it needs does not exist)."""


@dataclass(frozen=True)
class TokenSource:
    """A projected ``serviceAccountToken``: where it goes in the volume and what to request."""

    path: str
    audience: str | None = None
    expiration_seconds: int = 3600


@dataclass(frozen=True)
class Mount:
    """One bind mount inside the pod's mount namespace."""

    source: Path
    target: str
    read_only: bool = False


def kind_of(volume: Mapping[str, Any]) -> str:
    """The volume's source kind (``emptyDir``, ``projected`` ...), or "" when none is set."""
    return next((k for k in volume if k != "name"), "")


def _items(
    data: Mapping[str, str], items: Sequence[Mapping[str, Any]] | None, what: str
) -> dict[str, str]:
    if not items:
        return dict(data)
    out = {}
    for item in items:
        if item["key"] not in data:
            raise VolumeNotReady(f"{what} has no key {item['key']!r}")
        out[str(item["path"])] = data[item["key"]]
    return out


def _source_files(
    kind: str, src: Mapping[str, Any], pod: Mapping[str, Any], lookup: Lookup
) -> dict[str, str]:
    if kind in ("configMap", "secret"):
        name = src.get("name") or src.get("secretName") or ""
        data = lookup(kind, name)
        what = f"{kind} {name!r}"
        if data is None:
            if src.get("optional"):
                return {}
            raise VolumeNotReady(f"{what} not found")
        return _items(data, src.get("items"), what)
    if kind == "downwardAPI":
        out = {}
        for item in src.get("items") or []:
            if "fieldRef" in item:
                out[str(item["path"])] = downward_field(pod, item["fieldRef"]["fieldPath"])
        return out
    return {}


def downward_field(pod: Mapping[str, Any], path: str) -> str:
    """A downwardAPI volume file: whole label/annotation maps as ``key="value"`` lines."""
    if path in ("metadata.labels", "metadata.annotations"):
        items = pod.get("metadata", {}).get(path.split(".")[1]) or {}
        return "".join(f"{k}={json.dumps(str(v))}\n" for k, v in sorted(items.items()))
    return podenv.field_ref(pod, path)


REFRESHED_FIELDS = (
    "metadata.labels",
    "metadata.annotations",
    "metadata.name",
    "metadata.namespace",
    "metadata.uid",
)
"""The downwardAPI field paths whose files follow the pod while it runs (one label or
annotation, ``metadata.labels['key']``, too); the others are written once at the start."""


def refreshed(field_path: str) -> bool:
    """Whether a downwardAPI file of ``field_path`` is rewritten when the pod changes."""
    return field_path in REFRESHED_FIELDS or field_path.startswith(
        ("metadata.labels[", "metadata.annotations[")
    )


def pod_metadata(pod: Mapping[str, Any]) -> tuple[dict[str, str], dict[str, str]]:
    """The pod's labels and annotations: what the refreshed downwardAPI files follow (its
    name, namespace and uid never change), compared before any file is looked at."""
    meta = pod.get("metadata", {})
    return dict(meta.get("labels") or {}), dict(meta.get("annotations") or {})


def refreshable_files(volume: Mapping[str, Any], pod: Mapping[str, Any]) -> dict[str, str]:
    """The files of a volume that follow the pod's metadata while it runs, by relative path:
    the :data:`REFRESHED_FIELDS` items of a ``downwardAPI`` volume or of the ``downwardAPI``
    sources of a ``projected`` one, rendered from ``pod`` as :func:`volume_contents` does.
    Empty for every other volume (and item: ``resourceFieldRef``, ``spec.*``, ``status.*``)."""
    kind = kind_of(volume)
    src = volume.get(kind) or {}
    if kind == "downwardAPI":
        sources = [src]
    elif kind == "projected":
        sources = [s["downwardAPI"] for s in src.get("sources") or [] if "downwardAPI" in s]
    else:
        return {}
    out = {}
    for source in sources:
        for item in (source or {}).get("items") or []:
            path = (item.get("fieldRef") or {}).get("fieldPath", "")
            if refreshed(path):
                out[str(item["path"])] = downward_field(pod, path)
    return out


def volume_contents(
    volume: Mapping[str, Any], pod: Mapping[str, Any], lookup: Lookup
) -> tuple[dict[str, str], list[TokenSource]]:
    """The files of a file-backed volume, by relative path, and the tokens it projects."""
    kind = kind_of(volume)
    src = volume.get(kind) or {}
    if kind != "projected":
        return _source_files(kind, src, pod, lookup), []
    files: dict[str, str] = {}
    tokens: list[TokenSource] = []
    for source in src.get("sources") or []:
        sub = kind_of(source)
        if sub == "serviceAccountToken":
            tok = source[sub]
            tokens.append(
                TokenSource(
                    path=str(tok["path"]),
                    audience=tok.get("audience") or None,
                    expiration_seconds=int(tok.get("expirationSeconds") or 3600),
                )
            )
        else:
            files.update(_source_files(sub, source[sub], pod, lookup))
    return files, tokens


def secret_lookup_data(raw: Mapping[str, str] | None) -> dict[str, str]:
    """A Secret's ``data`` (base64) decoded to text."""
    return {k: base64.b64decode(v).decode() for k, v in (raw or {}).items()}


def container_mounts(
    container: Mapping[str, Any], folders: Mapping[str, Path | None]
) -> list[Mount]:
    """The bind mounts of a container's ``volumeMounts``; ``folders`` maps volume -> folder
    (None for a volume the agent does not mount)."""
    out = []
    for vm in container.get("volumeMounts") or []:
        folder = folders.get(vm["name"])
        if folder is None:
            continue
        sub = str(vm.get("subPath") or "")
        source = folder / sub if sub else folder
        out.append(Mount(source, str(vm["mountPath"]), bool(vm.get("readOnly"))))
    return out


def init_spec(
    mounts: Sequence[Mount], hosts: Path, hostname: str, image: Sequence[Path] = ()
) -> dict[str, Any]:
    """What :mod:`podinit` sets up inside the pod's namespaces before the command runs;
    `image` are the host folders that play the container image (kept visible)."""
    return {
        "hosts": str(hosts),
        "hostname": hostname,
        "image": [str(p) for p in image],
        "mounts": [
            {"source": str(m.source), "target": m.target, "readOnly": m.read_only} for m in mounts
        ],
    }
