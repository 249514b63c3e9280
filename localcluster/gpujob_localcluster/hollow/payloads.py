"""What a hollow rank answers: its ``/metrics`` text at a step, and its hang evidence.

Pure. The text is a payload recorded from the example trainer (``tests/data/payloads``), its
rank labels made placeholders and its training series made functions of the step: counters
grow in proportion to the steps done (seconds in proportion to the time they took, so each
phase keeps its recorded share of the step), the histogram puts every step in the first
bucket that holds ``step_seconds``, and the timestamps say when the last step ended and when
the training thread last moved. The operator therefore parses what a real rank sends, with
values that advance as a real job's would.
"""

from __future__ import annotations

import functools
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from gpujob_trainer import contract

ROOT: Final = Path(__file__).resolve().parents[3]
RECORDED: Final = ROOT / "tests" / "data" / "payloads"
"""The recorded payloads (``<condition>-scrape2-rank<r>.prom``) and evidence files."""
EVIDENCE: Final = ROOT / "tests" / "data" / "evidence"

SCENARIOS: Final = ("healthy", "slow_rank", "slow_input", "comm_heavy")
"""Recorded conditions; ``slow_rank``'s rank 1 is the straggler, its rank 0 a fast rank."""

_STATIC, _COUNT, _SECONDS, _BUCKET, _DURATION_SUM, _TARGET, _LAST_STEP = range(7)
_LABEL_RE = re.compile(r'(?<![a-z_])(local_rank|node_rank|rank)="\d+"')
_LE_RE = re.compile(r'le="([^"]+)"')
_PLACEHOLDER = {"local_rank": "\x01", "node_rank": "\x02", "rank": "\x03"}


@dataclass(frozen=True)
class Template:
    """A recorded rank payload, ready to render for any rank at any step."""

    lines: tuple[tuple[str, int, float], ...]
    """(the sample's text before its value, with rank placeholders; how its value moves; the
    recorded value or, for a bucket, its bound)."""
    recorded_steps: float
    recorded_seconds: float

    @classmethod
    def parse(cls, text: str) -> Template:
        lines: list[tuple[str, int, float]] = []
        steps = seconds = 0.0
        for raw in text.splitlines():
            if not raw or raw.startswith("#"):
                continue
            head, _, value = raw.rpartition(" ")
            name = head.split("{", 1)[0]
            head = _LABEL_RE.sub(lambda m: f'{m.group(1)}="{_PLACEHOLDER[m.group(1)]}"', head)
            base = float(value)
            kind = _kind(name)
            if kind < 0:  # rendered for the rank's moment, below
                continue
            if name == contract.GPU_TELEMETRY_AVAILABLE.name:  # the hollow node has GPUs
                head, base = re.sub(r'reason="[^"]*"', 'reason="ok"', head), 1.0
            if kind == _BUCKET:
                le = _LE_RE.search(head)
                base = math.inf if le is None or le.group(1) == "+Inf" else float(le.group(1))
            if name == contract.STEPS.name:
                steps = base
            elif name == contract.STEP_DURATION.name + "_sum":
                seconds = base
            lines.append((head + " ", kind, base))
        return cls(tuple(lines), max(steps, 1.0), max(seconds, 1e-9))

    @classmethod
    def recorded(cls, scenario: str, rank: int) -> Template:
        """The recorded ``scenario``'s payload of rank ``rank`` (0 or 1)."""
        if scenario not in SCENARIOS:
            raise ValueError(f"no recorded payload for {scenario!r}; known: {SCENARIOS}")
        return cls.parse((RECORDED / f"{scenario}-scrape2-rank{rank}.prom").read_text())

    def render(self, ranks: RankLabels, at: StepClock, now: float, phase: str) -> str:
        """The rank's payload at ``now``: ``at.step(now)`` steps done, in ``phase``."""
        step = at.step(now)
        count = step / self.recorded_steps
        secs = step * at.step_seconds / self.recorded_seconds
        out: list[str] = []
        for head, kind, base in self.lines:
            if kind == _STATIC:
                v = base
            elif kind == _COUNT:
                v = base * count
            elif kind == _SECONDS:
                v = base * secs
            elif kind == _BUCKET:
                v = step if base >= at.step_seconds else 0
            elif kind == _DURATION_SUM:
                v = step * at.step_seconds
            elif kind == _TARGET:
                v = at.total_steps
            else:
                v = at.started + step * at.step_seconds
            out.append(f"{head}{float(v)!r}\n")
        lab = ranks.text
        out.append(f"{contract.HEARTBEAT_TIMESTAMP.name}{{{lab}}} {at.moved(now)!r}\n")
        out.append(f"{contract.CLOCK_TIMESTAMP.name}{{{lab}}} {now!r}\n")
        for p in contract.PHASES:
            on = 1.0 if p == phase else 0.0
            out.append(f'{contract.CURRENT_PHASE.name}{{{lab},phase="{p}"}} {on}\n')
        text = "".join(out)
        return ranks.fill(text)


def _kind(name: str) -> int:
    if not name.startswith("gpujob_train_"):
        return _STATIC
    if name == contract.TARGET_STEPS.name:
        return _TARGET
    if name == contract.LAST_STEP_TIMESTAMP.name:
        return _LAST_STEP
    if name in (
        contract.HEARTBEAT_TIMESTAMP.name,
        contract.CLOCK_TIMESTAMP.name,
        contract.CURRENT_PHASE.name,
    ):
        return -1
    if name.endswith("_bucket"):
        return _BUCKET
    if name == contract.STEP_DURATION.name + "_sum":
        return _DURATION_SUM
    if name.endswith("_seconds_total"):
        return _SECONDS
    if name.endswith(("_total", "_count")):
        return _COUNT
    return _STATIC


@dataclass(frozen=True)
class RankLabels:
    """A rank's identity in its labels."""

    rank: int
    local_rank: int
    node_rank: int

    @property
    def text(self) -> str:
        return f'local_rank="{self.local_rank}",node_rank="{self.node_rank}",rank="{self.rank}"'

    def fill(self, text: str) -> str:
        return (
            text.replace("\x01", str(self.local_rank))
            .replace("\x02", str(self.node_rank))
            .replace("\x03", str(self.rank))
        )


@dataclass
class StepClock:
    """Where a hollow job's training is: a step every ``step_seconds`` since ``started``, up to
    ``total_steps``, frozen from ``frozen_at`` on (a stall)."""

    started: float
    step_seconds: float = 1.0
    total_steps: int = 1_000_000
    frozen_at: float | None = None

    def step(self, now: float) -> int:
        if self.frozen_at is not None:
            now = min(now, self.frozen_at)
        done = int(max(0.0, now - self.started) // self.step_seconds)
        return min(done, self.total_steps)

    def moved(self, now: float) -> float:
        """When the training thread last entered a phase (it stops moving in a stall)."""
        return now if self.frozen_at is None else min(now, self.frozen_at)

    def finished_at(self) -> float:
        return self.started + self.total_steps * self.step_seconds


def gpu_series(gpus: int, node_rank: int = 0) -> str:
    """NVML and allocator series of a node with ``gpus`` GPUs, as the exporter renders them
    (local rank 0 of each pod serves its node's GPUs)."""
    out = []
    for spec in contract.GPU_METRICS:
        out.append(f"# HELP {spec.name} {spec.help}\n# TYPE {spec.name} {spec.type}\n")
        for g in range(gpus):
            lab = f'UUID="GPU-{g:08x}-1111-2222-3333-{node_rank:012x}",gpu="{g}",node_rank="{node_rank}"'
            if spec is contract.GPU_CLOCK_EVENT:
                for reason in contract.CLOCK_EVENT_REASONS:
                    out.append(f'{spec.name}{{{lab},reason="{reason}"}} 0.0\n')
            else:
                out.append(f"{spec.name}{{{lab}}} {1.2345e9 + g:.6e}\n")
    for spec in contract.CUDA_METRICS:
        out.append(f"# HELP {spec.name} {spec.help}\n# TYPE {spec.name} {spec.type}\n")
        lab = (
            f'UUID="GPU-00000000-1111-2222-3333-{node_rank:012x}",'
            f'local_rank="0",node_rank="{node_rank}",rank="{node_rank}"'
        )
        out.append(f"{spec.name}{{{lab}}} 1.0e9\n")
    return "".join(out)


@functools.cache
def _evidence_file(kind: str) -> str:
    return (EVIDENCE / f"{kind}-rank1.json").read_text()


def evidence(kind: str, rank: int, pid: int, now: float) -> bytes:
    """A rank's hang evidence (``/debug/evidence``): ``collective`` for a rank waiting in an
    all-reduce, ``loader`` for one stuck in its data loader (the culprit of a stall)."""
    doc: dict[str, Any] = json.loads(_evidence_file(kind))
    doc.update(rank=rank, pid=pid, time=now)
    return json.dumps(doc).encode()
