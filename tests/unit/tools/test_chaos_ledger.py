"""The chaos tier's ledger: a failed case fails its faults, and the totals add up."""

from __future__ import annotations

from tests.chaos.ledger import Ledger

KILL = "tests/chaos/test_operator_kills.py::test_killed[after-status-write]"
HOSTILE = "tests/chaos/test_hostile_endpoints.py::test_contained[silent]"


def run_two_cases() -> Ledger:
    ledger = Ledger()
    ledger.current_test = KILL
    ledger.inject("operator killed after-status-write")
    ledger.operator_restarts, ledger.operator_kills = 2, 1
    ledger.operator_used(1.5, 2, 90 * 2**20)
    ledger.operator_used(1.0, 1, 100 * 2**20)
    for phase_seconds in (0.5, 12.0, 3.0):
        ledger.timed(KILL, True, phase_seconds)
    ledger.settle(KILL, True, "")

    ledger.current_test = HOSTILE
    ledger.inject("hostile endpoint: silent")
    ledger.figure("canary exit-to-Succeeded", "0.2s")
    ledger.job_ended("canary", "Succeeded", "Failed")
    ledger.timed(HOSTILE, True, 0.2)
    ledger.timed(HOSTILE, False, 20.0)
    ledger.settle(HOSTILE, False, "AssertionError: the canary took 9.0s")
    return ledger


def test_a_failed_phase_fails_the_case_and_its_faults() -> None:
    ledger = run_two_cases()
    assert [c.passed for c in ledger.cases.values()] == [True, False]
    assert [f.survived for f in ledger.faults] == [True, False]
    assert ledger.faults[1].detail.startswith("AssertionError")


def test_operator_usage_adds_up_over_its_restarts() -> None:
    case = run_two_cases().cases[KILL]
    assert (case.seconds, case.operator_cpu, case.operator_processes) == (15.5, 2.5, 3)
    assert case.operator_peak_rss == 100 * 2**20


def test_the_summary_shows_each_case_each_fault_and_the_totals() -> None:
    lines = run_two_cases().summary()
    text = "\n".join(lines)
    kill_row = next(
        ln for ln in lines if ln.endswith("test_operator_kills.py::test_killed[after-status-write]")
    )
    assert kill_row.split()[:5] == ["passed", "15.5", "2.5", "(3)", "100.0"]
    assert "  FAILED    hostile endpoint: silent  -- AssertionError: the canary took 9.0s" in lines
    assert "  survived  operator killed after-status-write" in lines
    assert "    canary exit-to-Succeeded: 0.2s" in text
    assert (
        "ended wrong: tests/chaos/test_hostile_endpoints.py::test_contained[silent]: canary" in text
    )
    assert lines[-6:] == [
        "cases: 1 passed, 1 failed, 0.6 min",
        "faults injected: 2",
        "faults survived: 1",
        "jobs that ended wrong: 1",
        "operator restarts: 2 (1 killed by the tier, 0 crashed)",
        "peak operator RSS: 100.0 MiB",
    ]


def test_the_json_report_carries_the_same_figures() -> None:
    report = run_two_cases().as_json()
    assert (report["faults_injected"], report["faults_survived"]) == (2, 1)
    assert report["cases"][HOSTILE]["figures"] == {"canary exit-to-Succeeded": "0.2s"}
    assert report["cases"][KILL]["operator_processes"] == 3
