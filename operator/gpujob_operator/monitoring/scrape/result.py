"""What a scrape is about and what it yields: the endpoint, the outcome, why it failed.

A `ScrapeTarget` names one rank's endpoint and where it runs; a `ScrapeResult` is one
endpoint's outcome: its frame (the payload boiled down to window rows, after `guard`), or an
`ErrorKind` and a message. The scraper produces them, the monitor and the job loop read them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Final

from gpujob_operator.monitoring.scrape import expfmt
from gpujob_operator.monitoring.scrape.frame import Frame


class ErrorKind(StrEnum):
    """Why an endpoint gave no samples."""

    REFUSED = "refused"
    TIMEOUT = "timeout"
    HTTP_STATUS = "http_status"
    PARSE = "parse"
    TOO_LARGE = "too_large"
    TOO_MANY_CHUNKS = "too_many_chunks"
    """A chunked body in more chunks than any honest server sends (`httpclient.MAX_CHUNKS`)."""
    MISSING_RANK = "missing_rank"
    CONNECTION = "connection"
    NO_SLOT = "no_slot"
    """The operator's scrape slots stayed busy (with other slow endpoints) past the timeout."""


ENDPOINT_TEXT_MAX: Final = 200
"""Characters of one endpoint-supplied string (a reason phrase, a label value or list) quoted in
a message: the endpoint is untrusted, and what it says ends up in its job's status."""


@dataclass(frozen=True, slots=True)
class ScrapeTarget:
    """One rank's endpoint and where it runs."""

    url: str
    pod: str
    node: str = ""
    node_rank: int = -1
    local_rank: int = -1
    rank: int | None = None
    """The global rank expected there (None: accept whatever rank answers)."""
    token: str = field(default="", repr=False)
    """The job's endpoint token, presented as a bearer token ("" : none)."""


@dataclass(slots=True)
class ScrapeResult:
    """The outcome of one scrape: its frame (or samples), or an error kind and message."""

    target: ScrapeTarget
    t: float
    """When the response arrived (or the attempt failed), seconds since the epoch."""
    samples: list[expfmt.Sample] = field(default_factory=list)
    """The parsed samples, only when the scraper was given its own `wanted` set."""
    error: ErrorKind | None = None
    message: str = ""
    seconds: float = 0.0
    """How long the request took (after waiting for a slot)."""
    size: int = 0
    """Bytes of the body (on a failure: the bytes received and thrown away)."""
    frame: Frame | None = None
    """The payload boiled down to window rows (set on every successful scrape)."""
    dropped_series: int = 0
    """Series the payload carried that this target may not speak for (see `guard`)."""
    dropped_values: int = 0
    """Non-finite or implausible values turned into "absent"."""
    notes: tuple[tuple[str, str], ...] = ()
    """(kind, words) of what was dropped (`guard.Admitted.notes`)."""
    raw: bytes | None = None
    """The body as received, for a raw fetch (`Scraper.fetch_all`) only."""
    kept: Any = None
    """What a digesting fetch kept of the body instead of it (`Scraper.fetch_all`)."""
    cpu: float = 0.0
    """Operator CPU seconds spent reading the body (parse and guard): what the job's share
    of the scrape budget is charged (`budget.ScrapeBudget`)."""

    @property
    def ok(self) -> bool:
        return self.error is None
