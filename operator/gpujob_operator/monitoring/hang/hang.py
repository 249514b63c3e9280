"""A stalled job's ranks compared: who is not where the others are, and where it is instead.

Pure. Each rank's evidence arrives parsed (``monitoring/hang/hangdump.py``) or with why not;
:func:`reduce` compares them:

1. **Collectives first** (the Flight Recorder's pending entries). The largest group of ranks
   waiting in the same collective (process group, op, sequence number; a send or receive by
   its pair's number) is where "the others" are; between groups as large, the default
   process group's (the training loop's own sync) and then the furthest. Ranks split evenly
   between two ops at the very same position disagree, and no one is blamed for it. Every
   other rank is named: one in
   no collective (then where its main thread is), one that entered a different op at the
   same sequence number, one waiting in another group's collective.
2. **Stacks otherwise** (nobody in a collective): ranks are grouped by where their main
   threads are; a strict majority is "the others", the rest are named.
3. **Silence.** A rank that did not answer (timeout, refused) is named as silent: a Python
   that holds the GIL in native code, or a frozen process, cannot serve its stacks, and that
   is itself evidence. A rank that answered without usable evidence (an older trainer, the
   endpoint turned off, a broken document) is reported as such and blamed for nothing.

A place is told as the innermost frame of the training code, then the innermost library
frame, with what the library is doing when that is recognisable.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

from gpujob_operator.monitoring.hang.hangdump import (
    Collective,
    EvidenceError,
    RankDump,
    Thread,
    parse,
)
from gpujob_operator.monitoring.scrape.result import ScrapeTarget
from gpujob_trainer import contract

MAX_NAMED: Final = 3
"""Findings told one by one in the one-line answer; the rest are counted."""
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
ANSWERED_KINDS: Final = frozenset({"http_status"})
"""Fetch errors that still mean the rank's process answered (others: it did not)."""


@dataclass(frozen=True)
class RankAnswer:
    """What the operator got from one rank: its dump, or why none."""

    rank: int
    pod: str
    node: str = ""
    gpu: str = ""
    dump: RankDump | None = None
    error: str = ""
    answered: bool = False
    """The rank's process responded (with a dump, or with something unusable)."""
    text: str = ""
    """Its ``rank-N.txt`` for the ConfigMap, rendered when it arrived (then its dump is cut
    to what the comparison reads: ``hangtext.digested``); "" : rendered from the dump."""


@dataclass
class HangReport:
    """The comparison: one line for the status, one line per rank, and who is named."""

    summary: str
    culprits: list[int] = field(default_factory=list)
    """Ranks named as not where the others are (silent ones included)."""
    silent: list[int] = field(default_factory=list)
    unusable: list[int] = field(default_factory=list)
    where: dict[int, str] = field(default_factory=dict)
    """rank -> where it is (one line each)."""


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


def who(a: RankAnswer) -> str:
    """rank 5 (pod x-node-1, node n7, GPU GPU-…)."""
    parts = [f"pod {a.pod}"] + ([f"node {a.node}"] if a.node else [])
    parts += [f"GPU {a.gpu}"] if a.gpu else []
    return f"rank {a.rank} ({', '.join(parts)})"


def _group(answers: Sequence[RankAnswer]) -> str:
    """One rank with its pod, or several ranks with their first pods."""
    if len(answers) == 1:
        return who(answers[0])
    pods = ", ".join(a.pod for a in answers[:MAX_NAMED])
    more = f" and {len(answers) - MAX_NAMED} more" if len(answers) > MAX_NAMED else ""
    return f"ranks {ranks_text([a.rank for a in answers])} (pods {pods}{more})"


def _plural(ranks: Sequence[int], verb: str) -> str:
    """ "rank 0 waits" / "ranks 0-2 wait" (``verb`` in the singular: waits or is)."""
    if len(ranks) == 1:
        return f"rank {ranks_text(ranks)} {verb}"
    return f"ranks {ranks_text(ranks)} {'are' if verb == 'is' else verb.removesuffix('s')}"


@dataclass
class _Ranks:
    """The answers sorted out once: usable dumps with their place and pending collective."""

    usable: list[RankAnswer]
    silent: list[RankAnswer]
    unusable: list[RankAnswer]
    places: dict[int, str]
    bare: dict[int, str]
    """rank -> place without the activity (after "waits in X at")."""
    pending: dict[int, Collective | None]

    @classmethod
    def of(cls, answers: Sequence[RankAnswer]) -> _Ranks:
        ordered = sorted(answers, key=lambda a: a.rank)
        usable = [a for a in ordered if a.dump is not None]
        dumps: dict[int, RankDump] = {a.rank: a.dump for a in usable if a.dump is not None}
        return cls(
            usable=usable,
            silent=[a for a in ordered if a.dump is None and not a.answered],
            unusable=[a for a in ordered if a.dump is None and a.answered],
            places={r: place(d.main) for r, d in dumps.items()},
            bare={r: place(d.main, False) for r, d in dumps.items()},
            pending={r: d.pending for r, d in dumps.items()},
        )

    def where(self) -> dict[int, str]:
        return {
            a.rank: where_of(a)
            for a in sorted(self.silent + self.unusable + self.usable, key=lambda a: a.rank)
        }


def where_of(a: RankAnswer) -> str:
    """Where one rank is, in a line (its own answer alone decides it)."""
    if a.dump is None:
        if a.answered:
            return f"answered without usable evidence ({a.error})"
        return f"did not answer ({a.error or 'no evidence'})"
    p = a.dump.pending
    text = (
        f"waits in {p.label} at {place(a.dump.main, False)}" if p else f"is in {place(a.dump.main)}"
    )
    if not a.dump.recorder:
        text += f" (no collective trace: {a.dump.why or 'none'})"
    return text


def _by_collective(r: _Ranks, parts: list[str], culprits: list[RankAnswer]) -> str:
    """Findings from the pending collectives; returns what the others are doing."""
    groups: Counter[tuple[str, str, int]] = Counter()
    label: dict[tuple[str, str, int], str] = {}
    members: dict[tuple[str, str, int], list[int]] = {}
    for a in r.usable:
        p = r.pending[a.rank]
        if p is not None:
            groups[p.key] += 1
            label[p.key] = p.label
            members.setdefault(p.key, []).append(a.rank)
    # The most ranks; then the default group's collective (the training loop's own sync);
    # then the furthest. Only a different op at that very position is a true tie.
    top = max(groups, key=lambda k: (groups[k], k[0] in ("0", "default_pg"), k[2]))
    n = groups[top]
    tied = [top] + [k for k in groups if k != top and groups[k] == n and k[0::2] == top[0::2]]
    tie = len(tied) > 1
    if tie:
        parts.append(
            "the ranks disagree: "
            + "; ".join(f"{_plural(members[k], 'waits')} in {label[k]}" for k in tied[:MAX_NAMED])
        )
    waiting = members[top]
    others = f"{label[top]} where {_plural(waiting, 'waits')}"
    for a in r.usable:
        assert a.dump is not None
        p = r.pending[a.rank]
        if p is not None and p.key == top:
            continue
        if p is None and not a.dump.recorder:
            parts.append(
                f"{who(a)} has no collective trace ({a.dump.why or 'none'}); it is in "
                f"{r.places[a.rank]}"
            )
            continue
        if tie and p is not None:
            continue  # a tie: said above, and no one is blamed for it
        culprits.append(a)
        if p is None:
            elsewhere = "is in no collective" if tie else f"is not in {others}"
            parts.append(f"{who(a)} {elsewhere}; it is in {r.places[a.rank]}")
        elif not p.p2p and p.key[0] == top[0] and p.seq == top[2] and top[1] != "p2p":
            parts.append(f"{who(a)} entered {p.op} #{p.seq}, not {others}")
        else:
            parts.append(f"{who(a)} is not in {others}; it waits in {p.label} at {r.bare[a.rank]}")
    if not culprits and not r.silent and not parts:
        every = "every rank with evidence" if r.unusable else "every rank"
        parts.append(
            f"{every} ({ranks_text(waiting)}) waits in {label[top]}: none of them is "
            "elsewhere, so look outside these processes (a lost peer, the network)"
        )
    return "" if tie else f"{_plural(waiting, 'waits')} in {label[top]}"


def _by_stack(r: _Ranks, parts: list[str], culprits: list[RankAnswer]) -> str:
    """Findings from where the main threads are; returns what the others are doing."""
    counts = Counter(r.places[a.rank] for a in r.usable)
    if not counts:
        return ""
    common, n = counts.most_common(1)[0]
    at_common = [a.rank for a in r.usable if r.places[a.rank] == common]
    if len(counts) > 1 and n * 2 <= len(r.usable):
        parts.append(
            "the ranks are in different places: "
            + "; ".join(f"{p} ({c})" for p, c in counts.most_common(MAX_NAMED))
        )
        return ""
    for a in r.usable:
        if r.places[a.rank] != common:
            culprits.append(a)
            parts.append(
                f"{who(a)} is in {r.places[a.rank]}, where {_plural(at_common, 'is')} in {common}"
            )
    if not culprits and not r.silent:
        parts.append(f"every rank ({ranks_text(at_common)}) is in {common}")
    why = next((a.dump.why for a in r.usable if a.dump and a.dump.why), "")
    if why and parts:
        parts[-1] += f" (no collective trace: {why})"
    return f"{_plural(at_common, 'is')} in {common}"


def reduce(answers: Sequence[RankAnswer]) -> HangReport:
    """Compare the ranks (see the module docstring); the answer fits one status line."""
    r = _Ranks.of(answers)
    parts: list[str] = []
    culprits: list[RankAnswer] = []
    in_collective = any(p is not None for p in r.pending.values())
    doing = (_by_collective if in_collective else _by_stack)(r, parts, culprits)
    if r.silent:
        their = "its" if len(r.silent) == 1 else "their"
        tail = f", while {doing}" if doing else ""
        parts.append(
            f"{_group(r.silent)} did not answer ({r.silent[0].error or 'no evidence'}): "
            f"{their} Python may hold the GIL in native code, or the process is frozen{tail}"
        )
    if r.unusable:
        parts.append(
            f"{_group(r.unusable)} answered without usable evidence ({r.unusable[0].error}): "
            "an older trainer, GPUJOB_EVIDENCE=0, or a broken endpoint"
        )
    if not answers:
        parts.append("no rank to ask")
    shown = parts[:MAX_NAMED]
    more = len(parts) - len(shown)
    summary = "; ".join(shown) + (f"; and {more} more" if more > 0 else "")
    blamed = [a.rank for a in culprits] + ([a.rank for a in r.silent] if r.usable else [])
    return HangReport(
        summary=summary,
        culprits=blamed,
        silent=[a.rank for a in r.silent],
        unusable=[a.rank for a in r.unusable],
        where=r.where(),
    )


def evidence_targets(targets: Sequence[ScrapeTarget], token: str = "") -> list[ScrapeTarget]:
    """The same ranks' endpoints, asked for their evidence instead of their metrics (with the
    job's endpoint token, where its pods have one)."""
    return [
        dataclasses.replace(
            t,
            url=t.url.removesuffix(contract.METRICS_PATH) + contract.EVIDENCE_PATH,
            token=token or t.token,
        )
        for t in targets
    ]


Fetched = tuple[bytes | None, str | None, str]
"""What one fetch gave: the body, or None with the error kind and message."""


def answers_of(
    targets: Sequence[ScrapeTarget],
    fetched: Sequence[Fetched],
    gpus: Mapping[int, str] | None = None,
) -> list[RankAnswer]:
    """Pair each target with its body or error, parsing each body. A target of unknown rank
    (``gpujob diagnose`` on bare URLs) takes the rank its document says, else its position.
    ``gpus``: each rank's CUDA device UUID, where its metrics named one."""
    return [
        answer_of(i, t, one, gpus) for i, (t, one) in enumerate(zip(targets, fetched, strict=True))
    ]


def answer_of(
    i: int, t: ScrapeTarget, fetched: Fetched, gpus: Mapping[int, str] | None = None
) -> RankAnswer:
    """One target's answer from its body (parsed) or error; `i`: its position, the rank of
    last resort (see :func:`answers_of`)."""
    body, kind, message = fetched
    dump, error = None, f"{kind}: {message}" if kind else ""
    if body is not None:
        try:
            dump = parse(body)
        except EvidenceError as exc:
            error = f"unusable evidence: {exc}"
        else:
            if t.rank is not None and dump.rank is not None and dump.rank != t.rank:
                error = f"unusable evidence: it says rank {dump.rank}, not {t.rank}"
                dump = None
    rank = t.rank if t.rank is not None else dump.rank if dump and dump.rank is not None else i
    answered = body is not None or kind in ANSWERED_KINDS
    gpu = (gpus or {}).get(int(rank), "")
    return RankAnswer(int(rank), t.pod, t.node, gpu, dump, error, answered)


def compare(
    targets: Sequence[ScrapeTarget],
    fetched: Sequence[Fetched],
    gpus: Mapping[int, str] | None = None,
) -> tuple[list[RankAnswer], HangReport]:
    """Parse and compare (one call, to run off the event loop)."""
    answers = answers_of(targets, fetched, gpus)
    return answers, reduce(answers)
