"""How the node agent turns a container into a local command, since it cannot pull images.

The agent runs every container with this machine's Python environment (the venv's ``bin``
first on ``PATH``). A container that spells its ``command`` runs it as Kubernetes would.
A container that relies on its image's entrypoint gets the ``ENTRYPOINT``/``CMD`` of the
Dockerfile that builds that image in this repository, read from the Dockerfile itself, so
the mapping cannot drift from the image: the operator image's entrypoint is the ``gpujob``
console script, which the venv installs too. The table is :data:`IMAGE_DOCKERFILES`;
``--image REPOSITORY=DOCKERFILE`` on the agent adds more.

Kubernetes' rules apply unchanged: ``command`` replaces ``ENTRYPOINT`` (and drops ``CMD``),
``args`` replaces ``CMD``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]

IMAGE_DOCKERFILES: dict[str, str] = {
    "ghcr.io/gpujob/gpujob-operator": "Dockerfile",
    "gpujob-trainer": "trainer_image/Dockerfile",
}
"""Image repository (no tag or digest) -> the Dockerfile in this repository that builds it."""


@dataclass(frozen=True)
class ImageConfig:
    """The parts of an image's config that decide what a container runs."""

    entrypoint: tuple[str, ...] = ()
    cmd: tuple[str, ...] = ()


class UnknownImage(ValueError):
    """A container without a command names an image the agent has no Dockerfile for."""


def repository(image: str) -> str:
    """``registry/repo:tag@sha256:...`` -> ``registry/repo`` (a registry port is kept)."""
    name = image.split("@", 1)[0]
    slash = name.rfind("/")
    colon = name.rfind(":")
    return name[:colon] if colon > slash else name


def _exec_form(value: str) -> tuple[str, ...]:
    value = value.strip()
    if value.startswith("["):
        parsed = json.loads(value)
        return tuple(str(v) for v in parsed)
    # Shell form: Docker runs it under /bin/sh -c.
    return ("/bin/sh", "-c", value)


def parse_dockerfile(text: str) -> ImageConfig:
    """ENTRYPOINT and CMD of a Dockerfile's final stage (later lines win, as in Docker)."""
    entrypoint: tuple[str, ...] = ()
    cmd: tuple[str, ...] = ()
    joined = re.sub(r"\\\n", " ", text)
    for line in joined.splitlines():
        m = re.match(r"^\s*(FROM|ENTRYPOINT|CMD)\b\s*(.*)$", line, re.IGNORECASE)
        if not m:
            continue
        keyword, rest = m.group(1).upper(), m.group(2)
        if keyword == "FROM":  # a new stage starts from its base image's config
            entrypoint, cmd = (), ()
        elif keyword == "ENTRYPOINT":
            entrypoint = _exec_form(rest)
            cmd = ()  # Docker resets CMD when ENTRYPOINT is set in the same stage
        else:
            cmd = _exec_form(rest)
    return ImageConfig(entrypoint, cmd)


def load_table(
    extra: Mapping[str, str] | None = None, root: Path = REPO_ROOT
) -> dict[str, ImageConfig]:
    """Every known image's config, read from its Dockerfile (missing files are skipped)."""
    table: dict[str, ImageConfig] = {}
    for repo, dockerfile in {**IMAGE_DOCKERFILES, **(extra or {})}.items():
        path = Path(dockerfile)
        path = path if path.is_absolute() else root / path
        if path.is_file():
            table[repository(repo)] = parse_dockerfile(path.read_text())
    return table


def container_argv(container: Mapping[str, Any], table: Mapping[str, ImageConfig]) -> list[str]:
    """The argv a container runs, by Kubernetes' command/args-over-image rules."""
    command: Sequence[str] = container.get("command") or ()
    args: Sequence[str] | None = container.get("args")
    if command:
        return [*command, *(args or ())]
    image = str(container.get("image", ""))
    config = table.get(repository(image))
    if config is None:
        raise UnknownImage(
            f"container {container.get('name')!r} has no command and the local node agent "
            f"does not know image {image!r}: give the container a command, or map the image "
            f"to a Dockerfile (nodeagent --image REPOSITORY=DOCKERFILE)"
        )
    argv = [*config.entrypoint, *(args if args else config.cmd)]
    if not argv:
        raise UnknownImage(f"image {image!r} has neither ENTRYPOINT nor CMD, and no command")
    return argv
