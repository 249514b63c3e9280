"""A short, memory-lean window of scrapes per job: the recent rows of each rank and GPU.

The operator holds a window for every job it watches (a thousand jobs of eight ranks must
fit in well under 150 MB): each endpoint's scrape arrives as a `frame.Frame` of rows (see
`rows`), appended to the series of its (pod, rank) and (pod, GPU), each bounded by count
and by age; label strings live once per series, never per point. The window also keeps
the stall clock: when the ranks' step counters last moved, as the operator saw it (on first
sight, the last step's age on the rank's own clock: a node's time is never compared with
the operator's).
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Final, TypeVar

from gpujob_operator.monitoring.rows import (
    NAN,
    R_HEARTBEAT,
    R_LAST_STEP,
    R_STEPS,
    latest,
    own_clock_age,
)
from gpujob_operator.monitoring.scrape.frame import Frame

T = TypeVar("T")


@dataclass(slots=True)
class RankSeries:
    """The recent rows of one rank of one pod."""

    pod: str
    node: str
    rank: int
    local_rank: int
    node_rank: int
    uuid: str = ""
    rows: list[array[float]] = field(default_factory=list)
    buckets: array[float] | None = None
    """The latest cumulative step time histogram (the run's distribution so far)."""
    devices: tuple[str, ...] = ()
    """UUIDs of the GPUs the rank drives (several under nn.DataParallel; first gathers)."""
    device_name: str = ""
    """The GPU product name the rank's peak FLOP/s is for."""
    beat: float = NAN
    """The rank's latest heartbeat (R_HEARTBEAT) as exported."""
    beat_since: float = NAN
    """When that heartbeat was first seen, in operator time (a changed heartbeat is the rank
    changing phase; the first one seen counts its age on the rank's own clock, or from now
    when the rank exports no clock)."""


@dataclass(slots=True)
class GPUSeries:
    """The recent rows of one GPU, as its node's local rank 0 reported them."""

    pod: str
    node: str
    node_rank: int
    gpu: int
    uuid: str
    rows: list[array[float]] = field(default_factory=list)


MAX_SERIES: Final = 4096
"""The default cap on a window's rank and GPU series."""


@dataclass(slots=True)
class Window:
    """The last scrapes of one job: bounded by count and by age, per series."""

    max_points: int = 10
    max_age: float = 120.0
    max_series: int = MAX_SERIES
    """Rank and GPU series kept in all; new ones beyond are dropped (and counted)."""
    dropped_series: int = 0
    """Series refused for the cap since the window was made (a running count)."""
    ranks: dict[tuple[str, int], RankSeries] = field(default_factory=dict)
    gpus: dict[tuple[str, int], GPUSeries] = field(default_factory=dict)
    telemetry: dict[str, str] = field(default_factory=dict)
    """Pod -> telemetry reason reported by its local rank 0 ("ok" when available)."""
    times: list[float] = field(default_factory=list)
    """When each scrape round of the job was added (bounded like the series)."""
    progress_steps: float = NAN
    """Sum of the ranks' latest step counters at the last change (NaN before any)."""
    progress_time: float = NAN
    """When that sum last changed, as the operator saw it (the stall clock)."""

    def add(self, t: float, pod: str, node: str, fr: Frame) -> None:
        """Append one endpoint's frame (scraped at t) to the series of its pod."""
        buckets = fr.buckets  # derived from the rows: once per frame
        for rank, row in fr.ranks.items():
            key = (pod, rank)
            s = self.ranks.get(key)
            if s is None:
                if len(self.ranks) + len(self.gpus) >= self.max_series:
                    self.dropped_series += 1
                    continue
                s = self.ranks[key] = RankSeries(
                    pod, node, rank, fr.local_rank.get(rank, -1), fr.node_rank.get(rank, -1)
                )
            s.node = node or s.node
            if rank in fr.cuda_uuid:
                s.uuid = fr.cuda_uuid[rank]
            if rank in buckets:
                s.buckets = buckets[rank]
            if fr.devices and rank in fr.devices:
                s.devices = fr.devices[rank]
            if fr.device_names and rank in fr.device_names:
                s.device_name = fr.device_names[rank]
            _append(s.rows, row, self.max_points, t - self.max_age)
            beat = row[R_HEARTBEAT]
            if beat == beat and beat != s.beat:  # a phase change since the last scrape
                s.beat_since = t
                if math.isnan(s.beat):  # first sight: its age on the rank's own clock
                    _, age = own_clock_age((row,), R_HEARTBEAT)
                    s.beat_since = t - age if age == age else t
                s.beat = beat
        for gpu, (uuid, row) in fr.gpus.items():
            gkey = (pod, gpu)
            g = self.gpus.get(gkey)
            if g is None:
                if len(self.ranks) + len(self.gpus) >= self.max_series:
                    self.dropped_series += 1
                    continue
                nr = next(iter(fr.node_rank.values()), -1)
                g = self.gpus[gkey] = GPUSeries(pod, node, nr, gpu, uuid)
            g.uuid = uuid or g.uuid
            _append(g.rows, row, self.max_points, t - self.max_age)
        if fr.telemetry is not None:
            self.telemetry[pod] = fr.telemetry

    def end_round(self, t: float, live_pods: Iterable[str] | None = None) -> None:
        """Close a scrape round: note its time and progress, drop old rows and gone pods."""
        _append(self.times, t, self.max_points, t - self.max_age)
        self._note_progress(t)
        cutoff = t - self.max_age
        if live_pods is not None:
            live = set(live_pods)
            for key in [k for k in self.ranks if k[0] not in live]:
                del self.ranks[key]
            for gkey in [k for k in self.gpus if k[0] not in live]:
                del self.gpus[gkey]
            for pod in [p for p in self.telemetry if p not in live]:
                del self.telemetry[pod]
        for s in self.ranks.values():
            _trim(s.rows, cutoff)
        for g in self.gpus.values():
            _trim(g.rows, cutoff)

    def _note_progress(self, t: float) -> None:
        # Any rank finishing a step (or restarting: its counter drops) is progress. On the
        # first sight (a restart, a handover, a spec edit), the newest step's age on its
        # rank's own clock counts; a rank without a clock (an older trainer) counts from now.
        # Never a node's timestamp against the operator's clock: nodes are minutes off.
        steps = [latest(s.rows, R_STEPS) for s in self.ranks.values()]
        steps = [v for v in steps if not math.isnan(v)]
        if not steps:
            return
        total = float(sum(steps))
        if math.isnan(self.progress_time):
            seen = []
            for s in self.ranks.values():
                at, age = own_clock_age(s.rows, R_LAST_STEP)
                if not math.isnan(at):
                    seen.append(at - age if not math.isnan(age) else t)
            self.progress_time = min(t, max(seen)) if seen else t
            self.progress_steps = total
        elif total != self.progress_steps:
            self.progress_steps = total
            self.progress_time = t

    def clear(self) -> None:
        """Forget everything (e.g. after a gang restart)."""
        self.ranks.clear()
        self.gpus.clear()
        self.telemetry.clear()
        self.times.clear()
        self.progress_steps = NAN
        self.progress_time = NAN


def _append(rows: list[T], row: T, max_points: int, cutoff: float) -> None:
    rows.append(row)
    if len(rows) > max_points:
        del rows[: len(rows) - max_points]
    _trim(rows, cutoff)


def _trim(rows: list[T], cutoff: float) -> None:
    # Keep at least two rows so a rate stays computable when scrapes are sparse.
    drop = 0
    while drop < len(rows) - 2 and _time(rows[drop]) < cutoff:
        drop += 1
    if drop:
        del rows[:drop]


def _time(row: object) -> float:
    if isinstance(row, float | int):
        return float(row)
    assert isinstance(row, array)
    return row[0]
