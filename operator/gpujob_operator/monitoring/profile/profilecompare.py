"""The ranks' profiles compared, written down for a person and for the status.

Pure. The slowest rank is the one with the most busy time per step (compute and copies: the
step less idle and exposed communication); the median rank is the lower median of that; the
operation named is the one whose seconds per step differ most between the two (the slowest
rank's extra work first). The answer is one line, e.g. ``rank 13: aten::mm 41% vs 22% on
the median rank (rank 4)`` (shares of each rank's step time).

The ConfigMap holds ``summary`` (the answer, a per-rank table of the parts with a small bar,
the ranks that gave nothing and why) and ``rank-<R>.json`` (each rank's checked summary),
capped below 900 KiB, the slowest and median ranks first.
"""

from __future__ import annotations

import dataclasses
import json
import urllib.parse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from gpujob_operator.api.profile import wait_seconds
from gpujob_operator.monitoring.profile.profiledoc import (
    ProfileDocError,
    RankState,
    Summary,
    parse,
)
from gpujob_operator.monitoring.scrape.result import ScrapeTarget
from gpujob_trainer import contract

MAX_CONFIGMAP_BYTES: Final = 900 * 1024
SUMMARY_BYTES: Final = 256 * 1024
MAX_FAILED: Final = 64
BAR_WIDTH: Final = 20
BAR_CHARS: Final = {"compute": "#", "communication": "=", "copy": "~", "idle": "."}
Fetched = tuple[bytes | None, str | None, str]
"""What one fetch gave: the body, or None with the error kind and message."""


def profile_targets(
    targets: Sequence[ScrapeTarget], capture_id: str, steps: int, token: str = ""
) -> list[ScrapeTarget]:
    """The ranks' endpoints, asked to ensure capture ``capture_id`` of ``steps`` steps
    (idempotent: the same call polls it)."""
    query = urllib.parse.urlencode({"id": capture_id, "steps": steps})
    return [
        dataclasses.replace(
            t,
            url=t.url.removesuffix(contract.METRICS_PATH) + f"{contract.PROFILE_PATH}?{query}",
            token=token or t.token,
        )
        for t in targets
    ]


def capture_deadline(steps: int, step_seconds: float | None = None) -> float:
    """Seconds to wait for every rank (:func:`gpujob_operator.api.profile.wait_seconds`)."""
    return wait_seconds(steps, step_seconds)


@dataclass(frozen=True)
class RankProfile:
    """One rank's answer: its state, or why none (fetch error, unusable document)."""

    rank: int
    pod: str = ""
    state: RankState | None = None
    error: str = ""
    transient: bool = False
    """The rank did not answer this time (a timeout, a refused connection): asked again
    until the deadline, as a rank busy stopping its profiler answers late."""

    @property
    def summary(self) -> Summary | None:
        return self.state.summary if self.state is not None else None

    @property
    def settled(self) -> bool:
        """Nothing more will come: a summary, a failure, or no usable answer."""
        if self.state is None:
            return not self.transient
        return not self.state.working

    @property
    def why(self) -> str:
        """Why this rank has no summary ("" when it has one)."""
        if self.summary is not None:
            return ""
        if self.error:
            return self.error
        s = self.state
        assert s is not None
        if s.state == "busy":
            return f"busy with another capture ({s.busy_with or 'unknown id'})"
        if s.state == "idle":
            return "the rank holds no such capture (idle)"
        if s.working:
            return f"still {s.state} ({s.steps_done or 0} of {s.steps or '?'} steps)"
        return f"{s.state}: {s.error or 'no reason given'}"


def answers_of(
    targets: Sequence[ScrapeTarget], fetched: Sequence[Fetched], capture_id: str
) -> list[RankProfile]:
    """Pair each target with its state or why none. A target of unknown rank takes the rank
    its document says, else its position. A document about another capture is unusable."""
    out = []
    for i, (t, (body, kind, message)) in enumerate(zip(targets, fetched, strict=True)):
        rank = t.rank if t.rank is not None else i
        if body is None:
            out.append(RankProfile(rank, t.pod, error=f"{kind}: {message}"[:512], transient=True))
            continue
        try:
            state = parse(body)
        except ProfileDocError as e:
            out.append(RankProfile(rank, t.pod, error=f"unusable answer: {e}"[:512]))
            continue
        if t.rank is None and state.rank is not None:
            rank = state.rank
        elif state.rank is not None and state.rank != rank:
            out.append(RankProfile(rank, t.pod, error=f"answered as rank {state.rank}"))
            continue
        if state.state not in ("busy", "unavailable") and state.id != capture_id:
            why = f"answered about capture {state.id!r}, not {capture_id!r}"
            out.append(RankProfile(rank, t.pod, error=why[:512]))
            continue
        if state.summary is not None and state.summary.rank != rank:
            out.append(RankProfile(rank, t.pod, error="its summary names another rank"))
            continue
        out.append(RankProfile(rank, t.pod, state=state))
    return out


def settled(answers: Sequence[RankProfile]) -> bool:
    """Every rank is done, failed or unusable: no more polling."""
    return all(a.settled for a in answers)


def at_deadline(answers: Sequence[RankProfile]) -> list[RankProfile]:
    """The answers as final: a rank still working is reported as not finished (with where
    it was), so the comparison goes ahead with the ranks that did finish."""
    return [
        a
        if a.settled
        else RankProfile(a.rank, a.pod, error=f"not finished at the deadline: {a.why}")
        for a in answers
    ]


def capturing(answers: Sequence[RankProfile]) -> bool:
    """Some rank has started (``status.profile.state`` Capturing)."""
    return any(
        a.state is not None and a.state.state in ("capturing", "summarizing") for a in answers
    )


@dataclass
class ProfileReport:
    """The comparison: the answer, who was compared with whom, and over what."""

    answer: str
    slowest_rank: int | None = None
    median_rank: int | None = None
    operation: str | None = None
    usable: list[RankProfile] = field(default_factory=list)
    failed: list[tuple[int, str]] = field(default_factory=list)


def _pct(x: float) -> str:
    return f"{100 * x:.0f}%"


def compare(answers: Sequence[RankProfile]) -> ProfileReport:
    """The slowest rank against the median, and the operation that differs most."""
    usable = sorted((a for a in answers if a.summary is not None), key=lambda a: a.rank)
    failed = sorted(((a.rank, a.why) for a in answers if a.summary is None), key=lambda x: x[0])
    if not usable:
        first = f" (rank {failed[0][0]}: {failed[0][1]})" if failed else ""
        return ProfileReport(f"no rank gave a profile{first}", failed=failed)
    by_busy = sorted(usable, key=lambda a: (_s(a).busy_seconds, -a.rank))
    slow, med = by_busy[-1], by_busy[(len(by_busy) - 1) // 2]
    s, m = _s(slow), _s(med)
    if slow is med:
        top = s.top[0] if s.top else None
        what = f"{top.name} {_pct(top.share)} of its step" if top else "no operation recorded"
        answer = f"rank {slow.rank}: {what} (one rank profiled, nothing to compare)"
        return ProfileReport(answer, slow.rank, med.rank, top.name if top else None, usable, failed)
    names = {o.name for o in s.top} | {o.name for o in m.top}
    if not names:
        answer = (
            f"rank {slow.rank}: busy {s.busy_seconds:.3g}s per step vs {m.busy_seconds:.3g}s on "
            f"the median rank (rank {med.rank}); no operation recorded"
        )
        return ProfileReport(answer, slow.rank, med.rank, None, usable, failed)

    def diff(name: str) -> tuple[float, float, str]:
        a, b = s.op(name), m.op(name)
        d = (a.seconds if a else 0.0) - (b.seconds if b else 0.0)
        return (d if d > 0 else 0.0, abs(d), name)

    op = max(sorted(names), key=diff)
    a, b = s.op(op), m.op(op)
    there = _pct(b.share) if b else "not in the top 10"
    here = _pct(a.share) if a else "not in the top 10"
    answer = f"rank {slow.rank}: {op} {here} vs {there} on the median rank (rank {med.rank})"
    return ProfileReport(answer, slow.rank, med.rank, op, usable, failed)


def _s(a: RankProfile) -> Summary:
    assert a.summary is not None
    return a.summary


def bar(parts: Mapping[str, float], width: int = BAR_WIDTH) -> str:
    """The step split as text: ``#`` compute, ``=`` communication, ``~`` copies, ``.`` idle."""
    total = sum(parts.values()) or 1.0
    cells, used = [], 0
    for i, part in enumerate(contract.PROFILE_PARTS):
        n = (
            width - used
            if i == len(contract.PROFILE_PARTS) - 1
            else round(width * parts.get(part, 0.0) / total)
        )
        n = max(0, min(n, width - used))
        cells.append(BAR_CHARS[part] * n)
        used += n
    return "[" + "".join(cells) + "]"


def table(report: ProfileReport) -> list[str]:
    """One line per usable rank: step, the parts' shares, a bar, the top operation."""
    lines = [
        f"{'rank':>6} {'step':>9} {'compute':>8} {'comm':>6} {'copy':>6} {'idle':>6}  "
        f"{'split':<{BAR_WIDTH + 2}}  top operation"
    ]
    for a in report.usable:
        s = _s(a)
        role = (
            " slowest"
            if a.rank == report.slowest_rank
            else " median"
            if a.rank == report.median_rank
            else ""
        )
        share = {p: s.parts[p] / s.step_seconds for p in contract.PROFILE_PARTS}
        top = f"{s.top[0].name[:60]} {_pct(s.top[0].share)}" if s.top else "-"
        lines.append(
            f"{a.rank:>6} {s.step_seconds * 1000:>7.1f}ms {_pct(share['compute']):>8} "
            f"{_pct(share['communication']):>6} {_pct(share['copy']):>6} {_pct(share['idle']):>6}  "
            f"{bar(s.parts)}  {top}{role}"
        )
    lines.append(f"(bar: {', '.join(f'{c} {p}' for p, c in BAR_CHARS.items())})")
    return lines


def render_text(report: ProfileReport, kept: int | None = None) -> str:
    """The report a person reads (the ConfigMap's ``summary``; ``gpujob diagnose --profile``
    and ``gpujob profile --wait`` print the same)."""
    lines = [report.answer, ""]
    if report.usable:
        lines += table(report)
    if report.failed:
        lines += ["", "ranks without a profile:"]
        lines += [f"  rank {r}: {why}" for r, why in report.failed[:MAX_FAILED]]
        if len(report.failed) > MAX_FAILED:
            lines.append(f"  ... and {len(report.failed) - MAX_FAILED} more")
    if kept is not None and kept < len(report.usable):
        lines += [
            "",
            f"{kept} of {len(report.usable)} ranks' summaries kept in this ConfigMap (size "
            "cap), the slowest and median first",
        ]
    text = "\n".join(lines) + "\n"
    data = text.encode()
    if len(data) > SUMMARY_BYTES:
        text = data[: SUMMARY_BYTES - 40].decode(errors="ignore") + "\n... cut (size cap)\n"
    return text


def configmap_data(report: ProfileReport, max_bytes: int = MAX_CONFIGMAP_BYTES) -> dict[str, str]:
    """``summary`` and one ``rank-<R>.json`` per usable rank, within ``max_bytes`` in all:
    the slowest and median ranks first, then the others by rank, while the space lasts."""
    named = {report.slowest_rank, report.median_rank}
    ordered = sorted(report.usable, key=lambda a: (a.rank not in named, a.rank))
    docs = {a.rank: json.dumps(_s(a).to_json(), sort_keys=True) for a in ordered}
    budget = max_bytes - len(render_text(report, kept=0).encode()) - 256
    kept: dict[str, str] = {}
    for a in ordered:
        key, doc = f"rank-{a.rank}.json", docs[a.rank]
        size = len(key) + len(doc.encode())
        if size > budget:
            break
        kept[key] = doc
        budget -= size
    summary = render_text(report, kept=len(kept))
    return {"summary": summary, **dict(sorted(kept.items(), key=lambda kv: _rank_key(kv[0])))}


def _rank_key(key: str) -> int:
    return int(key.removeprefix("rank-").removesuffix(".json"))


def record(
    started: Mapping[str, Any],
    report: ProfileReport,
    now: str,
    config_map: str | None,
    note: str | None = None,
) -> dict[str, Any]:
    """The finished ``status.profile``: the started record with the answer (Captured when
    any rank gave a summary, else Failed with why)."""
    ok = bool(report.usable)
    reason = None if ok else report.answer
    if note:
        reason = f"{reason}; {note}" if reason else note
    return {
        **dict(started),
        "state": "Captured" if ok else "Failed",
        "reason": reason[:1024] if reason else None,
        "capturedAt": now,
        "answer": report.answer[:1024],
        "slowestRank": report.slowest_rank,
        "medianRank": report.median_rank,
        "operation": report.operation[:256] if report.operation else None,
        "configMap": config_map,
        "failedRanks": [{"rank": r, "why": why[:512]} for r, why in report.failed[:MAX_FAILED]]
        or None,
    }
