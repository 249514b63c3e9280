"""A rank's counters: what the tracker's step attribution adds up, and the copy a scrape takes.

The tracker adds each attributed step to its `Counters` (under its lock); a scrape copies them,
with the tracker's other counters, into a frozen `Snapshot`, which the exporter renders. This
module imports neither the tracker nor the exporter, so both import it.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from gpujob_trainer import contract
from gpujob_trainer.env import RankInfo


@dataclass(frozen=True)
class Snapshot:
    """A consistent copy of a rank's counters, taken at scrape time."""

    rank: RankInfo
    steps: int
    target_steps: int | None
    samples: int
    tokens: int | None
    epoch: int | None
    loss: float | None
    phase_seconds: dict[str, float]
    compute_seconds: float
    step_count: int
    step_sum: float
    step_buckets: tuple[int, ...]
    """Cumulative counts per bound of `contract.STEP_DURATION_BUCKETS`, then +Inf."""
    last_step_timestamp: float | None
    heartbeat_timestamp: float | None = None
    """Unix time the training thread last changed phase (or made the tracker)."""
    clock_timestamp: float | None = None
    """Unix time the snapshot was taken, on the same clock as the two times above."""
    current_phase: str = contract.PHASE_OTHER
    """The phase the rank is in now (the innermost one)."""
    model_flops: float | None = None
    """Model FLOPs of the work done so far (None until a count is known)."""
    peak: Peak | None = None
    devices: tuple[str, ...] = ()
    """UUIDs of the GPUs the rank drives (several under nn.DataParallel)."""
    start_step: int = 0
    """The run's step this process started from (`Tracker.resume`); global = start + steps."""

    @property
    def global_step(self) -> int:
        """The run's step: where this process started plus the steps it made."""
        return self.start_step + self.steps


@dataclass(frozen=True)
class Peak:
    """The dense peak FLOP/s the rank's MFU is taken against, or why there is none."""

    flops: float | None
    device: str
    dtype: str
    reason: str


@dataclass
class Counters:
    """What attribution adds up (under the tracker's lock)."""

    epoch: int | None = None
    phase_seconds: dict[str, float] = field(
        default_factory=lambda: dict.fromkeys(contract.PHASES, 0.0)
    )
    compute_seconds: float = 0.0
    step_count: int = 0
    step_sum: float = 0.0
    step_hits: list[int] = field(
        default_factory=lambda: [0] * (len(contract.STEP_DURATION_BUCKETS) + 1)
    )

    def account(self, phases: dict[str, float]) -> None:
        """Add one attributed step: its seconds per phase."""
        totals = self.phase_seconds
        duration = 0.0
        for name, seconds in phases.items():
            totals[name] += seconds
            duration += seconds
        self.compute_seconds += (
            phases[contract.PHASE_FORWARD]
            + phases[contract.PHASE_BACKWARD]
            + phases[contract.PHASE_OPTIMIZER]
        )
        self.step_count += 1
        self.step_sum += duration
        self.step_hits[bisect.bisect_left(contract.STEP_DURATION_BUCKETS, duration)] += 1

    def step_buckets(self) -> tuple[int, ...]:
        """The step-duration histogram's cumulative bucket counts (`Snapshot.step_buckets`)."""
        cumulative: list[int] = []
        running = 0
        for hits in self.step_hits:
            running += hits
            cumulative.append(running)
        return tuple(cumulative)
