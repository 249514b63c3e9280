"""The repository explains itself: no tracked file points at documents outside it."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# Spelled in pieces so that this file, checked like every other, does not hold them whole.
OUTSIDE = ("../" + "shared", "DESIGN" + ".md")


def test_no_tracked_file_refers_outside_the_repository() -> None:
    listed = subprocess.run(
        ["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True
    ).stdout.decode()
    offenders = []
    for rel in filter(None, listed.split("\0")):
        path = REPO / rel
        if not path.is_file():
            continue
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        offenders += [f"{rel}: {needle}" for needle in OUTSIDE if needle in text]
    assert offenders == []


def test_the_architecture_map_names_only_modules_that_exist() -> None:
    text = (REPO / "docs" / "architecture.md").read_text()
    pkg = REPO / "operator" / "gpujob_operator"
    named = set(
        re.findall(r"`((?:api|lifecycle|monitoring|observability|runtime)/[\w/]+\.py)", text)
    )
    assert named, "the map names no module"
    missing = sorted(rel for rel in named if not (pkg / rel).is_file())
    assert missing == []


def test_ci_runs_the_readme_test_command_then_the_chaos_tier() -> None:
    """A tier nobody runs stops proving anything: CI runs lint, the README's test command,
    then ``make chaos``, in that order, and stops at the first failure."""
    ci = (REPO / ".ci" / "run").read_text()
    readme_head = "\n".join((REPO / "README.md").read_text().splitlines()[:8])
    assert "$ make test" in readme_head
    assert "set -euo pipefail" in ci
    steps = [ln.strip() for ln in ci.splitlines() if ln.strip().startswith("make ")]
    assert steps == ["make lint", "make test", "make chaos"]
