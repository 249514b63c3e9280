"""One rank's hang evidence as the operator reads it: untrusted JSON into a small model.

Pure. The document ``gpujob_trainer/evidence.py`` serves is untrusted input: :func:`parse`
accepts only the expected shape, caps every list and string (keeping the main thread and
the newest collectives), and turns anything else into an :class:`EvidenceError` that says
what was wrong, never another exception. ``monitoring/hang/hang.py`` compares the parsed ranks.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from typing import Any, Final

MAX_BYTES: Final = 64 * 1024
"""Bytes one rank's evidence may have (the trainer's own caps keep it near 10 KiB)."""
MAX_THREADS: Final = 64
MAX_FRAMES: Final = 64
MAX_ENTRIES: Final = 128
MAX_TEXT: Final = 200
LIBRARY_MARKERS: Final = ("/site-packages/", "/dist-packages/", "/lib/python3", "<frozen ")
"""A frame whose file is under one of these is library code (the standard library too)."""
USER_CODE: Final = ("gpujob_trainer/example.py",)
"""Library-installed files that are a user's training loop (the project's own sample)."""


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
    p2p: bool = False
    """A send or receive: numbered by ``p2p_seq`` per pair, not by ``seq``."""
    p2p_seq: int = 0

    @property
    def key(self) -> tuple[str, str, int]:
        """What ranks in the same collective share (p2p ops: the pair's number only)."""
        return (self.pg, "p2p", self.p2p_seq) if self.p2p else (self.pg, self.op, self.seq)

    @property
    def label(self) -> str:
        named = self.pg_name not in ("", "undefined", "default_pg")
        group = (
            ""
            if self.pg in ("0", "default_pg")
            else f" of group {self.pg_name if named else self.pg}"
        )
        if self.p2p:
            return f"{self.op} (p2p #{self.p2p_seq}){group}"
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
        """The collective this rank waits in: of another group than the default one first
        (entered last, from the default group's point of view), then the newest."""
        waiting = [c for c in self.collectives if c.pending]
        return max(waiting, key=lambda c: (c.pg != "0", c.seq, c.p2p_seq)) if waiting else None


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


def _list(value: Any, cap: int, newest: bool = True) -> list[Any]:
    """At most ``cap`` items: the last ones (newest), or the first (threads: main first)."""
    if not isinstance(value, list):
        raise EvidenceError(f"expected a list, got {type(value).__name__}")
    return value[-cap:] if newest else value[:cap]


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
    for raw in _list(doc.get("threads", []), MAX_THREADS, newest=False):
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
                p2p=bool(e.get("p2p")),
                p2p_seq=_int(e.get("p2pSeq", 0)),
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


def _innermost(frames: tuple[StackFrame, ...], keep: Any) -> StackFrame | None:
    return next((f for f in reversed(frames) if keep(f)), None)


def digest(dump: RankDump, markers: tuple[str, ...]) -> RankDump:
    """What the comparison reads of a dump, and nothing more: the main thread cut to the
    frames that say where it is (its innermost frame, its innermost training-code frame, and
    its innermost frame in one of `markers`, the library folders that tell an activity) and
    the one collective it waits in. A capture keeps this per rank as the answers arrive
    (with the rank's text for the ConfigMap rendered first), not every thread's stack: at
    thousands of ranks the full dumps were hundreds of MiB."""
    main = dump.main
    threads: tuple[Thread, ...] = ()
    if main is not None:
        kept = {
            id(f)
            for f in (
                main.frames[-1] if main.frames else None,
                _innermost(main.frames, lambda f: not f.library),
                _innermost(main.frames, lambda f: any(m in f.file for m in markers)),
            )
            if f is not None
        }
        threads = (Thread(main.name, main.main, tuple(f for f in main.frames if id(f) in kept)),)
    pending = dump.pending
    return replace(dump, threads=threads, collectives=(pending,) if pending is not None else ())
