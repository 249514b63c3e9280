"""Every generated artefact is committed as the code renders it, and drift is named."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpujob_operator import generate
from gpujob_operator.api import crd, reference
from gpujob_operator.observability import alerts, dashboards

REPO = Path(__file__).resolve().parents[3]
WANTED = generate.artefacts()
"""Rendered once for the module: every test below compares against the same render."""


def test_generate_knows_every_artefact() -> None:
    wanted = WANTED
    assert set(crd.CRD_PATHS) <= set(wanted)
    assert reference.DOC_PATH in wanted
    assert alerts.RULES_FILE in wanted
    committed = {p.relative_to(REPO) for p in (REPO / dashboards.DASHBOARD_DIR).glob("*.json")}
    assert committed == {rel for rel in wanted if rel.parent == dashboards.DASHBOARD_DIR}


@pytest.mark.parametrize("rel", sorted(WANTED), ids=str)
def test_committed_artefact_matches_its_source(rel: Path) -> None:
    """Drift test: regenerate and compare with the committed file byte for byte."""
    path = REPO / rel
    assert path.exists(), f"{rel} is missing: run `{generate.COMMAND}`"
    assert path.read_text() == WANTED[rel], (
        f"{rel} drifted from its source: run `{generate.COMMAND}`"
    )


def test_the_repository_passes_check() -> None:
    assert generate.main(["--check"]) == 0


def test_check_mode_names_each_drifted_file_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    wanted = WANTED
    assert generate.main(["--check", "--root", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert all(str(rel) in err for rel in wanted)
    assert not any(tmp_path.iterdir())
    assert generate.main(["--root", str(tmp_path)]) == 0
    assert generate.main(["--check", "--root", str(tmp_path)]) == 0
    (tmp_path / crd.CRD_PATHS[1]).write_text("stale\n")
    capsys.readouterr()
    assert generate.main(["--check", "--root", str(tmp_path)]) == 1
    assert capsys.readouterr().err.splitlines() == [
        f"{crd.CRD_PATHS[1]} drifted from its source: run `{generate.COMMAND}`"
    ]
