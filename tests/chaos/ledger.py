"""The chaos tier's ledger: what each case injected, what became of it, what it cost.

The tier prints it at the end of every run (CI's log shows it), as a benchmark prints its
figures: a table of the cases (outcome, wall time, the operator's CPU seconds and peak RSS),
each fault and whether it was survived, the figures a case measured, and the totals.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

PREFIX = "tests/chaos/"


@dataclass
class Fault:
    """One fault a test injected; ``survived`` is settled when the test's checks finish."""

    test: str
    name: str
    survived: bool | None = None
    detail: str = ""


@dataclass
class Case:
    """One test of the tier: its outcome, its wall time over setup, call and teardown, and
    what its operator processes used."""

    passed: bool = True
    seconds: float = 0.0
    operator_cpu: float = 0.0
    operator_processes: int = 0
    operator_peak_rss: int = 0
    figures: dict[str, str] = field(default_factory=dict)


def short(test: str) -> str:
    """A node id without the tier's folder: ``test_operator_kills.py::test_...[boundary]``."""
    return test.removeprefix(PREFIX)


@dataclass
class Ledger:
    """Everything the tier reports at the end of the run."""

    faults: list[Fault] = field(default_factory=list)
    wrong_jobs: list[str] = field(default_factory=list)
    operator_restarts: int = 0
    """Starts of an operator after another one of the same test died (killed or crashed)."""
    operator_kills: int = 0
    operator_crashes: list[str] = field(default_factory=list)
    cases: dict[str, Case] = field(default_factory=dict)
    current_test: str = ""

    @property
    def peak_rss(self) -> int:
        """The most any case's operator held, in bytes."""
        return max((c.operator_peak_rss for c in self.cases.values()), default=0)

    def case(self, test: str | None = None) -> Case:
        return self.cases.setdefault(self.current_test if test is None else test, Case())

    def inject(self, name: str) -> Fault:
        fault = Fault(self.current_test, name)
        self.faults.append(fault)
        return fault

    def job_ended(self, job: str, expected: str, actual: str | None) -> None:
        if actual != expected:
            self.wrong_jobs.append(f"{self.current_test}: {job} ended {actual}, not {expected}")

    def figure(self, name: str, value: str) -> None:
        """A figure the current case measured (printed under its name)."""
        self.case().figures[name] = value

    def operator_used(self, cpu_seconds: float, processes: int, peak_rss: int) -> None:
        """What the current case's operator processes used, summed over its restarts."""
        case = self.case()
        case.operator_cpu += cpu_seconds
        case.operator_processes += processes
        case.operator_peak_rss = max(case.operator_peak_rss, peak_rss)

    def timed(self, test: str, passed: bool, seconds: float) -> None:
        """One phase (setup, call, teardown) of a case ended; a failed phase fails the case."""
        case = self.case(test)
        case.passed = case.passed and passed
        case.seconds += seconds

    def settle(self, test: str, passed: bool, detail: str) -> None:
        for fault in self.faults:
            if fault.test == test and fault.survived is None:
                fault.survived = passed
                fault.detail = "" if passed else detail

    def summary(self) -> list[str]:
        lines = ["each case:", "  result  wall s  operator CPU s (processes)  peak RSS MiB  case"]
        for test, c in self.cases.items():
            used = f"{c.operator_cpu:6.1f} ({c.operator_processes})" if c.operator_processes else ""
            rss = f"{c.operator_peak_rss / 2**20:.1f}" if c.operator_peak_rss else ""
            lines.append(
                f"  {'passed' if c.passed else 'FAILED'}  {c.seconds:6.1f}  {used:>26}  "
                f"{rss:>12}  {short(test)}"
            )
        lines.append("faults injected and what became of them:")
        for f in self.faults:
            mark = {True: "survived", False: "FAILED", None: "unsettled"}[f.survived]
            lines.append(f"  {mark:<9} {f.name}" + (f"  -- {f.detail}" if f.detail else ""))
        measured = [(t, c) for t, c in self.cases.items() if c.figures]
        if measured:
            lines.append("figures:")
        for test, c in measured:
            lines.append(f"  {short(test)}")
            lines += [f"    {k}: {v}" for k, v in c.figures.items()]
        lines += [f"ended wrong: {w}" for w in self.wrong_jobs]
        lines += [f"operator crash: {c}" for c in self.operator_crashes]
        return lines + self.totals()

    def totals(self) -> list[str]:
        passed = sum(1 for c in self.cases.values() if c.passed)
        return [
            f"cases: {passed} passed, {len(self.cases) - passed} failed, "
            f"{sum(c.seconds for c in self.cases.values()) / 60:.1f} min",
            f"faults injected: {len(self.faults)}",
            f"faults survived: {sum(1 for f in self.faults if f.survived)}",
            f"jobs that ended wrong: {len(self.wrong_jobs)}",
            f"operator restarts: {self.operator_restarts} "
            f"({self.operator_kills} killed by the tier, {len(self.operator_crashes)} crashed)",
            f"peak operator RSS: {self.peak_rss / 2**20:.1f} MiB",
        ]

    def as_json(self) -> dict[str, Any]:
        return {
            "faults_injected": len(self.faults),
            "faults_survived": sum(1 for f in self.faults if f.survived),
            "jobs_ended_wrong": len(self.wrong_jobs),
            "operator_restarts": self.operator_restarts,
            "peak_operator_rss_bytes": self.peak_rss,
            "faults": [asdict(f) for f in self.faults],
            "wrong_jobs": self.wrong_jobs,
            "operator_crashes": self.operator_crashes,
            "cases": {t: asdict(c) for t, c in self.cases.items()},
        }
