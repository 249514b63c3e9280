"""The operator's scrape CPU, shared fairly between jobs: one job's endpoints slow that job only.

Every successful scrape costs the operator CPU to read its payload (the parse and the guard;
a 256 KiB body about 8 ms). A job with thousands of ranks, or one whose ranks answer with
large bodies at ``scrapeIntervalSeconds: 1``, could otherwise take the whole operator: every
other job's scrapes, watches and status writes would wait behind it on one event loop.

:class:`ScrapeBudget` keeps each job's recent cost (CPU seconds per second, from its last
round) and gives each a share of ``cores`` by max-min fairness: a job may use at least an
equal share (``cores / jobs``) and more while the others leave it unused. A job whose round
costs more than its share at its own interval is scraped less often: its interval is
stretched to ``round CPU / share``, and its ``MetricsAvailable`` condition says so with the
numbers (:class:`Stretch`). Nothing is dropped: every rank of every round is still read.

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
    """Each job's recent scrape cost and the share of ``cores`` it may use."""

    cores: float = DEFAULT_CORES
    _usage: dict[str, tuple[float, float]] = field(default_factory=dict)
    """Job uid -> (cores its last round used at the interval it got, until when it counts)."""
    _total: float = 0.0
    """The sum of the usages above (kept, not summed: a thousand jobs ask every few seconds)."""
    _swept: float = -1.0

    def share(self, uid: str, now: float) -> float:
        """The cores `uid` may use: an equal share, or what the others leave if more."""
        self._expire(now)
        own = self._usage.get(uid)
        others = max(0.0, self._total - (own[0] if own else 0.0))
        jobs = len(self._usage) + (own is None)
        return max(self.cores / jobs, self.cores - others)

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
        self.forget(uid)
        used = cpu / interval if interval > 0 else 0.0
        self._usage[uid] = (used, now + keep)
        self._total += used
        if interval <= wanted:
            return wanted, None
        return interval, Stretch(wanted, interval, cpu, share, self.cores, ranks)

    def forget(self, uid: str) -> None:
        """The job stopped scraping (ended, deleted, not Running): its share goes back."""
        old = self._usage.pop(uid, None)
        if old is not None:
            self._total = max(0.0, self._total - old[0]) if self._usage else 0.0

    def _expire(self, now: float) -> None:
        if now - self._swept < 1.0:  # a sweep a second at most, however many jobs ask
            return
        self._swept = now
        for key in [key for key, (_, until) in self._usage.items() if until < now]:
            self.forget(key)

    @property
    def jobs(self) -> int:
        """Jobs whose cost counts now (for the operator's own metrics and tests)."""
        return len(self._usage)
