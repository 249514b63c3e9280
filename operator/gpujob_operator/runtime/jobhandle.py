"""What the metrics task may use of its job loop: the narrow handle between the two.

:class:`~gpujob_operator.runtime.jobloop.JobLoop` owns a
:class:`~gpujob_operator.runtime.metricstask.MetricsTask` and hands it itself; the task sees
the loop only through :class:`JobHandle`. So the task names no loop type, the loop's
private methods stay its own, and the two modules import each other in one direction only
(jobloop → metricstask → jobhandle), which ``tests/unit/repo/test_repository.py`` keeps so.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from gpujob_operator.monitoring.scrape.scraper import Scraper
from gpujob_operator.runtime.kube import JobGone, Kube

EventPoster = Callable[[Mapping[str, Any], str, str, str], None]
"""Posts an Event about a job: (job, type, reason, message)."""


class JobHandle(Protocol):
    """The job loop as its metrics task sees it: read-only state and four calls."""

    @property
    def kube(self) -> Kube:
        """The API client (the hang evidence's ConfigMap)."""
        ...

    @property
    def scraper(self) -> Scraper | None:
        """The operator's one scraper; None: this loop scrapes nothing."""
        ...

    @property
    def post_event(self) -> EventPoster: ...

    @property
    def body(self) -> dict[str, Any]:
        """The job as the watch last delivered it."""
        ...

    @property
    def lock(self) -> asyncio.Lock:
        """Held while status is read, computed and written (by either task)."""
        ...

    @property
    def wake(self) -> asyncio.Event:
        """Set to make the lifecycle task plan again soon."""
        ...

    @property
    def ended(self) -> bool: ...

    @property
    def fault_at(self) -> str | None:
        """The write boundary at which this process dies (tests)."""
        ...

    @property
    def token_key(self) -> bytes | None:
        """The key of the job's endpoint token (None: its pods have none)."""
        ...

    @property
    def host_ports(self) -> tuple[int, int]:
        """Node ports (half-open) a host-network job may have scraped."""
        ...

    @property
    def resync_seconds(self) -> float:
        """How long the task sleeps when nothing is due."""
        ...

    def freshest(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """The live body, or the loop's own last write when the watch has not caught up."""
        ...

    def peek_status(self) -> Mapping[str, Any]:
        """The status `freshest` would give, not copied: only to be read, and at once."""
        ...

    def pods(self) -> list[Mapping[str, Any]]:
        """The job's pods from the index, less those proved gone."""
        ...

    async def write_status(self, ns: str, name: str, patch: dict[str, Any]) -> None:
        """Patch the job's status; raises JobGone when the job is gone."""
        ...

    def job_gone(self, why: JobGone) -> None:
        """The job is gone: stop the loop (both tasks) and forget it."""
        ...

    def side_failure(self, call: str, e: Exception, failures: int) -> float:
        """Log and count a failure off the lifecycle path; the seconds to back off."""
        ...
