"""Chaos-tier fixtures: the ledger, a watched operator, a pod recorder; the summary at the end."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import pytest

from tests.chaos.harness import ChaosOperator, PodRecorder
from tests.chaos.ledger import Ledger
from tests.integration.conftest import crd  # noqa: F401 - the session CRD fixture, shared
from tests.support.kube import Kube
from tests.support.waiting import wait_until

LEDGER = Ledger()


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test under tests/chaos is in the chaos tier (``-m chaos`` selects it)."""
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.chaos)
            item.add_marker(pytest.mark.cluster)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):  # type: ignore[no-untyped-def]
    outcome = yield
    report = outcome.get_result()
    if item.get_closest_marker("chaos") is not None:
        LEDGER.timed(item.nodeid, not report.failed, report.duration)
    if report.when == "call" or (report.when == "setup" and report.failed):
        detail = ""
        if report.failed:
            text = (
                str(report.longrepr.reprcrash.message)
                if hasattr(report.longrepr, "reprcrash")
                else str(report.longrepr)
            )
            detail = text.strip().splitlines()[0][:300] if text.strip() else "failed"
        LEDGER.settle(item.nodeid, report.passed, detail)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """The ledger, after every run that ran a chaos case (CI's log shows it)."""
    if not LEDGER.cases:
        return
    terminalreporter.section("chaos summary")
    for line in LEDGER.summary():
        terminalreporter.write_line(line)
    out = os.environ.get("GPUJOB_CHAOS_REPORT")
    if out:
        Path(out).write_text(json.dumps(LEDGER.as_json(), indent=2))


@pytest.fixture
def ledger(request: pytest.FixtureRequest) -> Ledger:
    LEDGER.current_test = request.node.nodeid
    return LEDGER


FAST_RESTARTS: Final = {
    "GPUJOB_RESTART_BACKOFF_BASE_SECONDS": "1",
    "GPUJOB_RESTART_BACKOFF_MAX_SECONDS": "2",
}
"""The chaos tier is about what survives a fault, not the back-off between restarts (10 s by
default, which the refusal tests pin): each Recreate restart here waits 1 s."""


@pytest.fixture
def chaos_operator(
    kube: Kube,
    crd: Path,  # noqa: F811 - the imported fixture, requested
    tmp_path: Path,
    ledger: Ledger,
) -> Iterator[ChaosOperator]:
    """An operator for this test's namespace, not yet started (tests start it with their env)."""
    op = ChaosOperator(ledger, kube.kubeconfig, [kube.namespace], tmp_path, FAST_RESTARTS)
    yield op
    op.stop()


@pytest.fixture
def pods(kube: Kube) -> Iterator[PodRecorder]:
    """Every job pod of this test's namespace, recorded from a watch of its own."""
    rec = PodRecorder(kube.kubeconfig, kube.namespace)
    rec.start()
    wait_until(lambda: rec.relists > 0, 30, "the pod recorder's first list")
    yield rec
    rec.stop()
