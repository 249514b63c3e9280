"""The documented image -> command mapping: Dockerfiles read, Kubernetes' override rules."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

from gpujob_localcluster import images


def test_the_operator_image_runs_the_gpujob_console_script() -> None:
    table = images.load_table()
    operator = table["ghcr.io/gpujob/gpujob-operator"]
    assert operator == images.ImageConfig(("gpujob",), ("operator",))
    container = {"name": "operator", "image": "ghcr.io/gpujob/gpujob-operator:0.1.0"}
    assert images.container_argv(container, table) == ["gpujob", "operator"]
    assert images.container_argv({**container, "args": ["diagnose"]}, table) == [
        "gpujob",
        "diagnose",
    ]
    assert table["gpujob-trainer"].cmd[0] == "torchrun"


@pytest.mark.parametrize(
    ("image", "repo"),
    [
        ("gpujob-trainer:0.1.0", "gpujob-trainer"),
        ("localhost:5000/team/img:v1", "localhost:5000/team/img"),
        ("localhost:5000/img", "localhost:5000/img"),
        ("ghcr.io/x/y@sha256:abc", "ghcr.io/x/y"),
        ("ghcr.io/x/y:1@sha256:abc", "ghcr.io/x/y"),
    ],
)
def test_repository_drops_tag_and_digest(image: str, repo: str) -> None:
    assert images.repository(image) == repo


def test_command_replaces_the_entrypoint_and_drops_cmd() -> None:
    table = {"img": images.ImageConfig(("ep",), ("cmd",))}
    base = {"name": "c", "image": "img:1"}
    assert images.container_argv({**base, "command": ["x"]}, table) == ["x"]
    assert images.container_argv({**base, "command": ["x"], "args": ["y"]}, table) == ["x", "y"]
    assert images.container_argv(base, table) == ["ep", "cmd"]


def test_dockerfile_stages_shell_form_and_continuations() -> None:
    text = (
        'FROM builder AS b\nENTRYPOINT ["nope"]\nFROM python:3.11\nCMD python -m app \\\n  --flag\n'
    )
    assert images.parse_dockerfile(text) == images.ImageConfig(
        (), ("/bin/sh", "-c", "python -m app    --flag")
    )
    assert images.parse_dockerfile('ENTRYPOINT ["a"]\nCMD ["b"]\nENTRYPOINT ["c"]\n') == (
        images.ImageConfig(("c",), ())
    )


def test_an_unknown_image_without_command_is_refused_with_the_fix() -> None:
    with pytest.raises(images.UnknownImage, match="--image REPOSITORY=DOCKERFILE"):
        images.container_argv({"name": "c", "image": "example.com/x:1"}, {})


@pytest.mark.parametrize("dockerfile", ["Dockerfile", "trainer_image/Dockerfile"])
def test_the_modules_a_dockerfile_imports_to_check_its_build_exist(dockerfile: str) -> None:
    """The image build smoke-tests its install with `python -c "import ..."`: the names must
    be real modules, or `docker build` fails where no test here runs it (torch and NVML
    are the trainer image's own and are not checked here)."""
    text = (Path(__file__).resolve().parents[3] / dockerfile).read_text()
    names = [
        name.strip()
        for stmt in re.findall(r'python -c "import ([\w., ]+)[;"]', text)
        for name in stmt.split(",")
    ]
    ours = [n for n in names if n.startswith(("gpujob_operator", "gpujob_trainer"))]
    assert ours, f"{dockerfile}: no import of the project's modules found"
    missing = [n for n in ours if importlib.util.find_spec(n) is None]
    assert missing == []
