"""README.md stays true: every command it shows is run by someone, its tables come from the code.

The rule: each ``$ `` line of a ```console block is either run literally by the e2e user flow
(:data:`tests.e2e.commands.E2E_COMMANDS`), or listed in :data:`ALLOWED` with what runs it (a
Makefile target, checked to exist). The local cluster runs the chart as a real cluster does,
so no command needs a local variant. A README command nobody runs fails here. Commands compare as shell words
(``shlex``, comments dropped), so spacing and quoting do not matter.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Final

from gpujob_operator import api
from gpujob_operator.api import conditions
from gpujob_operator.monitoring.verdicts.verdict import ADVICE, VERDICTS
from tests.e2e import commands as c
from tests.e2e import readme_tables

REPO: Final = Path(__file__).resolve().parents[2]
README: Final = REPO / "README.md"
MAKEFILE: Final = REPO / "Makefile"
TRAINER_README: Final = REPO / "trainer_image" / "README.md"

ALLOWED: Final[dict[str, str]] = {
    "make demo": "Makefile target demo (gpujob_localcluster.demo)",
    "make demo BOTTLENECK=slow-input": "Makefile target demo (BOTTLENECK -> demo --bottleneck)",
    "make demo-down": "Makefile target demo-down",
    "make test": "Makefile target test (every tier; runs this test too)",
    'make test PYTEST_ARGS="tests/e2e -q"': "Makefile target test (PYTEST_ARGS -> pytest)",
    "make unit": "Makefile target unit",
    "make lint": "Makefile target lint",
    "make fmt": "Makefile target fmt",
    "make help": "Makefile target help",
    "make cluster": "Makefile target cluster (gpujob_localcluster.cli up)",
    "make cluster-down": "Makefile target cluster-down",
}
"""README commands run by ``make demo`` / the Makefile, each with what runs it."""

UNUSED_REASONS: Final = {conditions.NOT_STARTED}
"""Defined in conditions.py but set by no code path, so the README does not list them."""


def words(command: str) -> tuple[str, ...]:
    return tuple(shlex.split(command, comments=True))


def console_commands(text: str) -> list[str]:
    """Every ``$ `` line of every ```console block, without the prompt."""
    out = []
    for block in re.findall(r"^```console\n(.*?)^```", text, re.S | re.M):
        out += [ln[2:] for ln in block.splitlines() if ln.startswith("$ ")]
    return out


def readme() -> str:
    return README.read_text()


def test_every_readme_command_is_run_by_someone() -> None:
    e2e = {words(x) for x in c.E2E_COMMANDS}
    allowed = {words(x) for x in ALLOWED}
    shown = console_commands(readme())
    assert len(shown) > 20, shown
    nobody = [x for x in shown if words(x) not in e2e | allowed]
    assert not nobody, f"README commands that no test, make target or demo runs: {nobody}"


def test_every_e2e_command_is_shown_and_every_allowance_is_used() -> None:
    shown = {words(x) for x in console_commands(readme())}
    assert [x for x in c.E2E_COMMANDS if words(x) not in shown] == []
    assert [x for x in ALLOWED if words(x) not in shown] == []


def test_allowed_commands_name_real_make_targets() -> None:
    makefile = MAKEFILE.read_text()
    for command, runner in ALLOWED.items():
        argv = words(command)
        assert argv[0] == "make", (command, "only make targets are allowed here")
        target = argv[1]
        assert re.search(rf"^{re.escape(target)}:", makefile, re.M), (command, runner)
        assert f"target {target}" in runner, (command, runner)
        for assignment in argv[2:]:
            var = assignment.split("=", 1)[0]
            assert var in makefile, (command, f"{var} is not read by the Makefile")


def test_generated_tables_match_the_code() -> None:
    got = readme_tables.blocks(readme())
    assert set(got) == set(readme_tables.TABLES), sorted(got)
    for key, render in readme_tables.TABLES.items():
        assert got[key] == render(), (
            f"README table {key} is stale: python -m tests.e2e.readme_tables"
        )


def test_the_training_example_is_the_trainer_readmes() -> None:
    def python_blocks(text: str) -> list[str]:
        return re.findall(r"^```python\n(.*?)^```", text, re.S | re.M)

    assert python_blocks(readme()) == python_blocks(TRAINER_README.read_text())[:1]


def test_conditions_reasons_and_verdicts_are_all_documented() -> None:
    text = readme()
    missing = [t for t in conditions.ALL_TYPES if f"`{t}`" not in text]
    reasons = {
        v
        for k, v in vars(conditions).items()
        if k.isupper()
        and isinstance(v, str)
        and re.fullmatch(r"[A-Z][A-Za-z]+", v)
        and not k.startswith("PHASE")
        and k not in ("TRUE", "FALSE", "UNKNOWN")
    }
    missing += [r for r in sorted(reasons - UNUSED_REASONS) if f"`{r}`" not in text]
    missing += [v for v in VERDICTS if f"`{v}`" not in text]
    flat = " ".join(text.split())
    missing += [v for v, advice in ADVICE.items() if advice and advice not in flat]
    assert not missing, missing


def test_spec_groups_and_columns_are_documented() -> None:
    text = readme()
    fields = [f.alias or name for name, f in api.GPUTrainingJobSpec.model_fields.items()]
    assert [f for f in fields if f"`{f}`" not in text] == []
    assert "docs/api.md" in text
    headers = [ln.split() for ln in text.splitlines() if ln.startswith("NAME ")]
    wide = (*c.HEADER[:-1], "STEP", "GOODPUT", "RESTARTS", "AGE")
    assert headers and all(tuple(h) in (c.HEADER, wide) for h in headers), headers
