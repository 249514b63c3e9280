"""Write, or with ``--check`` verify, every artefact the repository commits from the code.

``python -m gpujob_operator.generate`` renders the CRD (twice: ``crds/`` and the chart's
``crds/``), the API reference (``docs/api.md``), the Grafana dashboards and the Prometheus
rules from their single sources of truth, and writes the ones that differ. ``--check``
writes nothing and exits 1 naming each file that drifted, which is what the drift tests
and CI run. The renderers are pure; this module is the only one that touches the files.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Final

from gpujob_operator.api import crd, reference
from gpujob_operator.observability import alerts, dashboards

COMMAND: Final = "python -m gpujob_operator.generate"

RENDERERS: Final[tuple[Callable[[], dict[Path, str]], ...]] = (
    crd.artefacts,
    reference.artefacts,
    dashboards.artefacts,
    alerts.artefacts,
)
"""Each generator's files, relative to the repository root, with the text they must hold."""


def repo_root() -> Path:
    """The checkout this package was imported from (operator/gpujob_operator/ -> ../..)."""
    return Path(__file__).resolve().parents[2]


def artefacts() -> dict[Path, str]:
    """Every generated file, relative to the repository root, with its text."""
    out: dict[Path, str] = {}
    for render in RENDERERS:
        out.update(render())
    return out


def drifted(root: Path, wanted: Mapping[Path, str]) -> list[Path]:
    """The files under ``root`` whose text differs from ``wanted`` (missing ones included)."""
    return [
        rel
        for rel, text in wanted.items()
        if not (root / rel).exists() or (root / rel).read_text() != text
    ]


def main(argv: list[str] | None = None) -> int:
    """Write the artefacts that differ, or with --check list them and fail."""
    parser = argparse.ArgumentParser(prog=COMMAND, description=__doc__)
    parser.add_argument("--check", action="store_true", help="write nothing; fail on drift")
    parser.add_argument("--root", type=Path, default=repo_root(), help="repository root")
    args = parser.parse_args(argv)
    wanted = artefacts()
    stale = drifted(args.root, wanted)
    if args.check:
        for rel in stale:
            print(f"{rel} drifted from its source: run `{COMMAND}`", file=sys.stderr)
        return 1 if stale else 0
    for rel in stale:
        path = args.root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(wanted[rel])
        print(f"wrote {rel}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
