"""A stalled job's evidence, compared across ranks: who is not where the others are.

Pure. Each rank's ``/debug/evidence`` document (``gpujob_trainer/evidence.py``) is untrusted
input: :func:`parse` accepts only the expected shape, caps every list and string, and turns
anything else into a refusal that names the rank, never an exception. :func:`reduce` then
compares the ranks:

1. **Collectives first** (the Flight Recorder's pending entries): the largest group of ranks
   waiting in the same collective (process group, sequence number, op) is where "the others"
   are. Every other rank is named: one that entered a different op at the same sequence
   number, one waiting in another group's collective, or one in no collective at all (then
   where its main thread is instead).
2. **Stacks otherwise** (no recorder, or nobody in a collective): ranks are grouped by where
   their main thread is; the largest group is "the others", the rest are named.
3. A rank that did not answer is named too: a Python that holds the GIL in native code, or
   a frozen process, cannot serve its stacks, and that silence is itself evidence.

A place is told as the innermost frame of the training code, then the innermost library
frame, with what the library is doing when that is recognisable (the data loader, a
checkpoint save, a collective call, backward).
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from gpujob_operator.monitoring.scrape_result import ScrapeTarget
from gpujob_trainer import contract

MAX_BYTES: Final = 64 * 1024
"""Bytes one rank's evidence may have (the trainer's own caps keep it near 10 KiB)."""
MAX_THREADS: Final = 64
MAX_FRAMES: Final = 64
MAX_ENTRIES: Final = 128
MAX_TEXT: Final = 200
MAX_NAMED: Final = 3
"""Ranks named one by one in the one-line answer; the rest are counted."""

LIBRARY_MARKERS: Final = ("/site-packages/", "/dist-packages/", "/lib/python3", "<frozen ")
"""A frame whose file is under one of these is library code (the standard library too)."""
USER_CODE: Final = ("gpujob_trainer/example.py",)
"""Library-installed files that are a user's training loop (the project's own sample)."""
ACTIVITIES: Final = (
    ("torch/utils/data/", "the data loader"),
    ("torch/distributed/checkpoint", "a checkpoint save"),
    ("torch/serialization.py", "a checkpoint save"),
    ("torch/distributed/", "a collective call"),
    ("torch/cuda/", "a CUDA call"),
    ("torch/autograd/", "backward"),
)
"""What a rank is doing, by the first of its main thread's frames (innermost first) that
lives in one of these library folders."""


class EvidenceError(ValueError):
    """A payload that is not a rank's evidence document; the message says what was wrong."""


@dataclass(frozen=True)
class StackFrame:
    file: str
    line: int
    function: str

    @property
    def short(self) -> str:
        return f"{self.file.rsplit('/', 1)[-1]}:{self.line} {self.function}"

    @property
    def library(self) -> bool:
        if any(self.file.endswith(u) for u in USER_CODE):
            return False
        return any(m in self.file for m in LIBRARY_MARKERS) or "gpujob_trainer/" in self.file


@dataclass(frozen=True)
class Thread:
    name: str
    main: bool
    frames: tuple[StackFrame, ...]
    """Outermost first."""


@dataclass(frozen=True)
class Collective:
    pg: str
    """The process group's id (its name when the recorder gave none)."""
    pg_name: str
    seq: int
    op: str
    pending: bool
    """Not retired: this rank entered it and it has not completed."""
    sizes: str = ""

    @property
    def label(self) -> str:
        named = self.pg_name not in ("", "undefined", "default_pg")
        group = (
            ""
            if self.pg in ("0", "default_pg")
            else f" of group {self.pg_name if named else self.pg}"
        )
        return f"{self.op} #{self.seq}{group}"


@dataclass(frozen=True)
class RankDump:
    """One rank's parsed evidence."""

    rank: int | None
    threads: tuple[Thread, ...]
    recorder: bool
    """The Flight Recorder answered with entries."""
    backend: str = ""
    why: str = ""
    """Why there are no collectives (the trainer's words)."""
    collectives: tuple[Collective, ...] = ()
    """Oldest first."""

    @property
    def main(self) -> Thread | None:
        return next((t for t in self.threads if t.main), self.threads[0] if self.threads else None)

    @property
    def pending(self) -> Collective | None:
        """The newest collective this rank waits in."""
        waiting = [c for c in self.collectives if c.pending]
        return max(waiting, key=lambda c: (c.pg != "0", c.seq)) if waiting else None


@dataclass(frozen=True)
class RankAnswer:
    """What the operator got from one rank: its dump, or why none."""

    rank: int
    pod: str
    node: str = ""
    gpu: str = ""
    dump: RankDump | None = None
    error: str = ""


@dataclass
class HangReport:
    """The comparison: one line for the status, one line per rank, and who is named."""

    summary: str
    culprits: list[int] = field(default_factory=list)
    silent: list[int] = field(default_factory=list)
    where: dict[int, str] = field(default_factory=dict)
    """rank -> where it is (one line each)."""


def _text(value: Any) -> str:
    if not isinstance(value, str):
        raise EvidenceError(f"expected a string, got {type(value).__name__}")
    return value[:MAX_TEXT]


def _int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise EvidenceError(f"expected a number, got {type(value).__name__}")
    if isinstance(value, float) and not math.isfinite(value):
        raise EvidenceError("expected a finite number")
    return int(value)


def _list(value: Any, cap: int) -> list[Any]:
    if not isinstance(value, list):
        raise EvidenceError(f"expected a list, got {type(value).__name__}")
    return value[-cap:]


def _dict(value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise EvidenceError(f"expected an object, got {type(value).__name__}")
    return value


def parse(body: bytes) -> RankDump:
    """One rank's document, shape-checked and capped; :class:`EvidenceError` otherwise."""
    if len(body) > MAX_BYTES:
        raise EvidenceError(f"{len(body)} bytes, over the {MAX_BYTES} allowed")
    try:
        doc = json.loads(body)
    except (ValueError, RecursionError) as exc:
        raise EvidenceError(f"not JSON: {str(exc)[:80]}") from None
    doc = _dict(doc)
    if doc.get("error"):
        raise EvidenceError(f"the rank could not take its evidence: {_text(doc['error'])}")
    rank = doc.get("rank")
    threads = []
    for raw in _list(doc.get("threads", []), MAX_THREADS):
        t = _dict(raw)
        frames = tuple(
            StackFrame(_text(f.get("file")), _int(f.get("line")), _text(f.get("function")))
            for f in map(_dict, _list(t.get("frames", []), MAX_FRAMES))
        )
        threads.append(Thread(_text(t.get("name", "")), bool(t.get("main")), frames))
    col = _dict(doc.get("collectives") or {})
    entries = []
    for raw in _list(col.get("entries") or [], MAX_ENTRIES):
        e = _dict(raw)
        pg_name = _text(e.get("pg", ""))
        sizes = e.get("sizes")
        entries.append(
            Collective(
                pg=_text(e.get("pgId", "")) or pg_name,
                pg_name=pg_name,
                seq=_int(e.get("seq")),
                op=_text(e.get("op", "")) or "collective",
                pending=not bool(e.get("retired")),
                sizes=json.dumps(sizes)[:80] if isinstance(sizes, list) else "",
            )
        )
    return RankDump(
        rank=_int(rank) if rank is not None else None,
        threads=tuple(threads),
        recorder=bool(col.get("available")) and bool(entries),
        backend=_text(col.get("backend", "")),
        why=_text(col.get("why", "")),
        collectives=tuple(entries),
    )


def place(thread: Thread | None, activity: bool = True) -> str:
    """Where a thread is: the training code's innermost frame, then the library's, and what
    the library is doing when that is recognisable."""
    if thread is None or not thread.frames:
        return "no Python frame"
    frames = thread.frames
    user = next((f for f in reversed(frames) if not f.library), None)
    inner = frames[-1]
    doing = next(
        (what for f in reversed(frames) for marker, what in ACTIVITIES if marker in f.file), ""
    )
    if user is None:
        text = inner.short
    elif inner is user:
        text = user.short
    else:
        text = f"{user.short} → {inner.short}"
    return f"{doing}: {text}" if doing and activity else text


def ranks_text(ranks: Sequence[int]) -> str:
    """0-4,6-7 (runs folded, as a person writes them)."""
    out: list[str] = []
    nums = sorted(set(ranks))
    i = 0
    while i < len(nums):
        j = i
        while j + 1 < len(nums) and nums[j + 1] == nums[j] + 1:
            j += 1
        out.append(str(nums[i]) if i == j else f"{nums[i]}-{nums[j]}")
        i = j + 1
    return ",".join(out)


def _who(a: RankAnswer) -> str:
    parts = [f"pod {a.pod}"] + ([f"node {a.node}"] if a.node else [])
    parts += [f"GPU {a.gpu}"] if a.gpu else []
    return f"rank {a.rank} ({', '.join(parts)})"


def _plural(ranks: Sequence[int], verb: str) -> str:
    """ "rank 0 waits" / "ranks 0-2 wait" (``verb`` in the singular: waits or is)."""
    if len(ranks) == 1:
        return f"rank {ranks_text(ranks)} {verb}"
    return f"ranks {ranks_text(ranks)} {'are' if verb == 'is' else verb.removesuffix('s')}"


def reduce(answers: Sequence[RankAnswer]) -> HangReport:
    """Compare the ranks (see the module docstring); the answer fits one status line."""
    answered = [a for a in answers if a.dump is not None]
    silent = sorted((a for a in answers if a.dump is None), key=lambda a: a.rank)
    where: dict[int, str] = {}
    for a in silent:
        where[a.rank] = f"did not answer ({a.error or 'no evidence'})"
    for a in answered:
        assert a.dump is not None
        pending = a.dump.pending
        at = place(a.dump.main)
        in_op = f"waits in {pending.label} at {place(a.dump.main, False)}" if pending else ""
        where[a.rank] = in_op or f"is in {at}"

    groups: Counter[tuple[str, int, str]] = Counter()
    label: dict[tuple[str, int, str], str] = {}
    for a in answered:
        assert a.dump is not None
        p = a.dump.pending
        if p is not None:
            k = (p.pg, p.seq, p.op)
            groups[k] += 1
            label[k] = p.label
    parts: list[str] = []
    culprits: list[RankAnswer] = []
    if groups:
        top = max(groups, key=lambda k: (groups[k], k[0] == "0", k[1]))
        waiting = sorted(
            a.rank
            for a in answered
            if a.dump is not None
            and (p := a.dump.pending) is not None
            and (p.pg, p.seq, p.op) == top
        )
        others = f"{label[top]} where {_plural(waiting, 'waits')}"
        for a in sorted(answered, key=lambda a: a.rank):
            assert a.dump is not None
            p = a.dump.pending
            if p is not None and (p.pg, p.seq, p.op) == top:
                continue
            culprits.append(a)
            if p is not None and (p.pg, p.seq) == top[:2]:
                parts.append(f"{_who(a)} entered {p.op} #{p.seq}, not {others}")
            elif p is not None:
                parts.append(
                    f"{_who(a)} is not in {others}; it waits in {p.label} at "
                    f"{place(a.dump.main, False)}"
                )
            else:
                parts.append(f"{_who(a)} is not in {others}; it is in {place(a.dump.main)}")
        if not culprits and not silent:
            parts.append(
                f"every rank ({ranks_text(waiting)}) waits in {label[top]}: none of them is "
                "elsewhere, so look outside these processes (a lost peer, the network)"
            )
        silent_tail = f", while {_plural(waiting, 'waits')} in {label[top]}"
    else:
        places = Counter(place(a.dump.main) for a in answered if a.dump is not None)
        silent_tail = ""
        if places:
            common, n = places.most_common(1)[0]
            at_common = sorted(
                a.rank for a in answered if a.dump is not None and place(a.dump.main) == common
            )
            if len(places) == 1 or n * 2 > len(answered):
                for a in sorted(answered, key=lambda a: a.rank):
                    assert a.dump is not None
                    at = place(a.dump.main)
                    if at != common:
                        culprits.append(a)
                        parts.append(
                            f"{_who(a)} is in {at}, where {_plural(at_common, 'is')} in {common}"
                        )
                if not culprits and not silent:
                    parts.append(f"every rank ({ranks_text(at_common)}) is in {common}")
            else:
                parts.append(
                    "the ranks are in "
                    + "; ".join(f"{p} ({n})" for p, n in places.most_common(MAX_NAMED))
                )
            silent_tail = f", while {_plural(at_common, 'is')} in {common}"
        recorderless = next((a.dump for a in answered if a.dump and a.dump.why), None)
        if recorderless is not None and parts:
            parts[-1] += f" (no collective trace: {recorderless.why})"
    for a in silent:
        parts.append(
            f"{_who(a)} did not answer ({a.error or 'no evidence'}): its Python may hold the "
            f"GIL in native code, or the process is frozen{silent_tail}"
        )
    if not answers:
        parts.append("no rank to ask")
    shown = parts[:MAX_NAMED]
    more = len(parts) - len(shown)
    summary = "; ".join(shown) + (f"; and {more} more" if more > 0 else "")
    return HangReport(
        summary=summary,
        culprits=sorted(a.rank for a in culprits) + [a.rank for a in silent],
        silent=[a.rank for a in silent],
        where=dict(sorted(where.items())),
    )


def rank_text(answer: RankAnswer, max_chars: int) -> str:
    """One rank's dump as a person reads it (the ConfigMap's ``rank-N.txt``), capped."""
    lines = [f"{_who(answer)}"]
    d = answer.dump
    if d is None:
        lines.append(f"did not answer: {answer.error or 'no evidence'}")
    else:
        pending = d.pending
        lines.append(f"collective: waits in {pending.label}" if pending else "collective: none")
        for t in d.threads:
            lines.append("")
            lines.append(f'thread "{t.name}"{" (main)" if t.main else ""}, innermost last:')
            lines.extend(f"  {f.file}:{f.line} in {f.function}" for f in t.frames)
        lines.append("")
        if d.recorder:
            lines.append(f"recent collectives ({d.backend}), oldest first:")
            lines.extend(
                f"  {c.label} {c.sizes} {'PENDING' if c.pending else 'completed'}"
                for c in d.collectives[-32:]
            )
        else:
            lines.append(f"no collective trace: {d.why or 'the recorder gave none'}")
    text = "\n".join(lines) + "\n"
    if len(text) > max_chars:
        note = f"\n... cut at {max_chars} characters\n"
        text = text[: max(0, max_chars - len(note))] + note
    return text


def configmap_data(
    summary: str, answers: Sequence[RankAnswer], max_chars: int = 512 * 1024
) -> dict[str, str]:
    """The ConfigMap's keys: ``summary.txt`` and one ``rank-N.txt`` each, within
    ``max_chars`` in all (a ConfigMap holds at most 1 MiB)."""
    per_rank = max(2048, (max_chars - 4096) // max(1, len(answers)))
    data = {"summary.txt": summary[:4096] + "\n"}
    used = len(data["summary.txt"])
    for a in sorted(answers, key=lambda a: a.rank):
        text = rank_text(a, per_rank)
        if used + len(text) > max_chars:
            data["summary.txt"] += f"(ranks from {a.rank} on left out: the ConfigMap is full)\n"
            break
        data[f"rank-{a.rank}.txt"] = text
        used += len(text)
    return data


def evidence_targets(targets: Sequence[ScrapeTarget]) -> list[ScrapeTarget]:
    """The same ranks' endpoints, asked for their evidence instead of their metrics."""
    return [
        dataclasses.replace(
            t, url=t.url.removesuffix(contract.METRICS_PATH) + contract.EVIDENCE_PATH
        )
        for t in targets
    ]


def answers_of(
    targets: Sequence[Mapping[str, Any]], bodies: Sequence[tuple[bytes | None, str]]
) -> list[RankAnswer]:
    """Pair each target (rank, pod, node, gpu) with its body or error, parsing each body.
    A target of unknown rank (``gpujob diagnose`` on bare URLs) takes the rank its document
    says, else its position."""
    out = []
    for i, (t, (body, error)) in enumerate(zip(targets, bodies, strict=True)):
        dump = None
        expected = t.get("rank")
        if body is not None:
            try:
                dump = parse(body)
            except EvidenceError as exc:
                error = f"unusable evidence: {exc}"
            else:
                if expected is not None and dump.rank is not None and dump.rank != expected:
                    error = f"unusable evidence: it says rank {dump.rank}, not {expected}"
                    dump = None
        rank = (
            expected if expected is not None else dump.rank if dump and dump.rank is not None else i
        )
        out.append(
            RankAnswer(
                int(rank),
                str(t.get("pod", "")),
                str(t.get("node", "")),
                str(t.get("gpu", "")),
                dump,
                error,
            )
        )
    return out
