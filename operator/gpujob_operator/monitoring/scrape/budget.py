"""The operator's scrape CPU, shared fairly between jobs: one job's endpoints slow that job only.

Every successful scrape costs the operator CPU to read its payload (the parse and the guard;
a 256 KiB body about 8 ms). A job with thousands of ranks, or one whose ranks answer with
large bodies at ``scrapeIntervalSeconds: 1``, could otherwise take the whole operator: every
other job's scrapes, watches and status writes would wait behind it on one event loop.

:class:`ScrapeBudget` keeps each job's demand (the cores its last round would use at its own
interval) and shares ``cores`` by max-min fairness: every job gets what it asks for up to a
level, the level set so the budget is used (so never less than an equal share, and two
heavy jobs get the same whoever came first). A job whose round costs more than its share at
its own interval is scraped less often: its interval is stretched to ``round CPU / share``,
and its ``MetricsAvailable`` condition says so with the numbers (:class:`Stretch`). Nothing is
dropped: every rank of every round is still read.

Pure bookkeeping with plain numbers in and out; the caller passes the clock.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Final

DEFAULT_CORES: Final = 1.0
"""The operator's scrape budget, in cores (``GPUJOB_SCRAPE_CPU_CORES``)."""
KEEP_ROUNDS: Final = 3.0
"""A job's cost counts for this many of its intervals after its last round (then it is gone:
a job that stopped scraping leaves its share to the others)."""
KEEP_MIN_SECONDS: Final = 60.0


@dataclass(frozen=True)
class Stretch:
    """A job scraped less often than it asks, and why (for ``MetricsAvailable``)."""

    wanted: float
    """The job's own interval, seconds."""
    interval: float
    """The interval it gets, seconds."""
    cpu: float
    """CPU seconds its last round took."""
    share: float
    """Its share of the budget, cores."""
    cores: float
    """The whole budget, cores."""
    ranks: int
    """Endpoints its round read."""

    def words(self) -> str:
        """The stretch in a sentence, its numbers rounded (a status is written when it
        changes, so it must not move with every round's noise)."""
        cpu = f"{self.cpu:.1f} s" if self.cpu >= 1 else f"{10 * round(100 * self.cpu)} ms"
        return (
            f"scrape interval stretched to {self.interval:g}s from {self.wanted:g}s: reading "
            f"its {self.ranks} endpoint(s) took {cpu} of operator CPU a round, over this "
            f"job's share of the scrape budget ({self.share:.2g} of {self.cores:g} core(s), "
            "GPUJOB_SCRAPE_CPU_CORES)"
        )


@dataclass
class ScrapeBudget:
    """Each job's recent demand for scrape CPU and the share of ``cores`` it may use."""

    cores: float = DEFAULT_CORES
    _demand: dict[str, tuple[float, float]] = field(default_factory=dict)
    """Job uid -> (cores its last round would use at its own interval, until when it counts)."""
    _level: float = math.inf
    """The max-min fair share (water level) of the demands: a job may use up to this."""
    _leveled: float = -math.inf

    def share(self, uid: str, now: float) -> float:
        """The cores `uid` may use now: the fair level, never below an equal share."""
        self._relevel(now)
        jobs = len(self._demand) + (uid not in self._demand)
        return max(self._level, self.cores / jobs)

    def pace(
        self, uid: str, wanted: float, cpu: float, ranks: int, now: float
    ) -> tuple[float, Stretch | None]:
        """Record a round of `cpu` seconds; returns the interval to the job's next round
        (`wanted`, or longer when its round costs more than its share) and the stretch."""
        share = self.share(uid, now)
        interval = wanted
        if share > 0 and cpu / share > wanted:
            interval = float(math.ceil(cpu / share))  # whole seconds: a steady sentence
        keep = max(KEEP_ROUNDS * interval, KEEP_MIN_SECONDS)
        if uid not in self._demand:
            self._leveled = -math.inf  # a job more: the level is taken again at the next ask
        # What it asks for, not what it got: a paced job keeps its claim on the level.
        self._demand[uid] = (cpu / wanted if wanted > 0 else 0.0, now + keep)
        if interval <= wanted:
            return wanted, None
        return interval, Stretch(wanted, interval, cpu, share, self.cores, ranks)

    def forget(self, uid: str) -> None:
        """The job stopped scraping (ended, deleted, not Running): its share goes back."""
        if self._demand.pop(uid, None) is not None:
            self._leveled = -math.inf  # at the next ask

    def _relevel(self, now: float) -> None:
        """Drop demands that stopped, then fill the budget: every job gets what it asks for
        up to a level, the level chosen so the budget is used (max-min fairness). A sort of
        the demands, at most once a second however many jobs ask."""
        if now - self._leveled < 1.0:
            return
        self._leveled = now
        for key in [key for key, (_, until) in self._demand.items() if until < now]:
            del self._demand[key]
        self._level = fair_level(sorted(d for d, _ in self._demand.values()), self.cores)

    @property
    def jobs(self) -> int:
        """Jobs whose demand counts now (for the operator's own metrics and tests)."""
        return len(self._demand)


def fair_level(demands: list[float], cores: float) -> float:
    """The water level of max-min fairness over sorted `demands`: each gets min(demand,
    level) and the budget is used; infinite when every demand fits."""
    left = cores
    for i, demand in enumerate(demands):
        fair = left / (len(demands) - i)
        if demand > fair:
            return fair
        left -= demand
    return math.inf
