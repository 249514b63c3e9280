"""A hung job's evidence as a person reads it: the ConfigMap's ``summary.txt`` and
``rank-N.txt`` (every thread's stack, innermost frame last, and the recent collectives).

Pure. A ConfigMap holds at most 1 MiB, so the text is capped in bytes (UTF-8), and the ranks
the comparison named are written first: a cut never drops the rank that matters.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Final

from gpujob_operator.monitoring.hang.hang import (
    ACTIVITIES,
    HangReport,
    RankAnswer,
    ranks_text,
    where_of,
    who,
)
from gpujob_operator.monitoring.hang.hangdump import digest

MAX_BYTES: Final = 512 * 1024
"""Bytes of text one ConfigMap gets, all ranks together."""
SUMMARY_BYTES: Final = 4096
MIN_RANK_BYTES: Final = 2048
RECENT: Final = 32
"""Collectives listed per rank (the newest)."""


def _cut(text: str, max_bytes: int) -> str:
    data = text.encode()
    if len(data) <= max_bytes:
        return text
    note = f"\n... cut at {max_bytes} bytes\n"
    return data[: max(0, max_bytes - len(note))].decode(errors="ignore") + note


def rank_text(answer: RankAnswer, where: str, max_bytes: int) -> str:
    """One rank's dump, capped at ``max_bytes`` (UTF-8)."""
    lines = [who(answer), where]
    d = answer.dump
    if d is not None:
        for t in d.threads:
            lines += ["", f'thread "{t.name}"{" (main)" if t.main else ""}, innermost last:']
            lines.extend(f"  {f.file}:{f.line} in {f.function}" for f in t.frames)
        lines.append("")
        if d.recorder:
            lines.append(f"recent collectives ({d.backend}), oldest first:")
            lines.extend(
                f"  {c.label} {c.sizes} {'PENDING' if c.pending else 'completed'}"
                for c in d.collectives[-RECENT:]
            )
        else:
            lines.append(f"no collective trace: {d.why or 'the recorder gave none'}")
    return _cut("\n".join(lines) + "\n", max_bytes)


_MARKERS: Final = tuple(marker for marker, _ in ACTIVITIES)
"""The library folders that tell what a rank is doing: the frames a digest must keep."""


def rank_bytes(ranks: int, max_bytes: int = MAX_BYTES) -> int:
    """The bytes one rank's text may take when `ranks` share the ConfigMap."""
    return max(MIN_RANK_BYTES, (max_bytes - SUMMARY_BYTES) // max(1, ranks))


def digested(answer: RankAnswer, ranks: int) -> RankAnswer:
    """The answer as a capture keeps it while the others arrive: its ConfigMap text
    rendered now (within its share of the ConfigMap among `ranks`), its dump cut to what
    the comparison reads (``hangdump.digest``)."""
    if answer.dump is None:
        return answer
    text = rank_text(answer, where_of(answer), rank_bytes(ranks))
    return dataclasses.replace(answer, dump=digest(answer.dump, _MARKERS), text=text)


def configmap_data(
    report: HangReport, answers: Sequence[RankAnswer], max_bytes: int = MAX_BYTES
) -> dict[str, str]:
    """``summary.txt`` and one ``rank-N.txt`` each, within ``max_bytes`` in all; the named
    ranks first, then the others in rank order, until the space runs out (a rank's text as
    rendered on arrival, where it was)."""
    named = set(report.culprits) | set(report.silent)
    ordered = sorted(answers, key=lambda a: (a.rank not in named, a.rank))
    per_rank = rank_bytes(len(answers), max_bytes)
    summary = _cut(report.summary + "\n", SUMMARY_BYTES)
    used = len(summary.encode())
    data: dict[str, str] = {}
    left_out = []
    for a in ordered:
        text = a.text or rank_text(a, report.where.get(a.rank, ""), per_rank)
        size = len(text.encode())
        if used + size > max_bytes:
            left_out.append(a.rank)
            continue
        data[f"rank-{a.rank}.txt"] = text
        used += size
    if left_out:
        summary += f"(ranks {ranks_text(left_out)} left out: the ConfigMap is full)\n"
    return {"summary.txt": summary, **dict(sorted(data.items()))}
