"""One rank's profile state document (``GET /debug/profile``), parsed and checked.

The document is untrusted input: its size is capped before it is decoded, every number must
be finite and in range, every string is cut, lists are bounded, and anything missing or of
the wrong type makes the whole document unusable with a reason (:class:`ProfileDocError`),
never a crash and never a number that was not there.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from gpujob_trainer import contract

MAX_BYTES: Final = 64 * 1024
"""The contract's bound on a state document; a larger body is refused unread."""
MAX_TOP: Final = 10
MAX_NAME: Final = 200
MAX_TEXT: Final = 512
MAX_STEP_SECONDS: Final = 86400.0
SUM_TOLERANCE: Final = 0.25
"""How far the parts may miss the step time (share of it) before the summary is refused."""
STATES: Final = frozenset(
    {"idle", "pending", "capturing", "summarizing", "done", "failed", "busy", "unavailable"}
)
WORKING: Final = frozenset({"pending", "capturing", "summarizing"})
KINDS: Final = frozenset({"compute", "communication", "copy"})


class ProfileDocError(ValueError):
    """Why a document is unusable (one short sentence)."""


@dataclass(frozen=True)
class Op:
    """One of a rank's top operations by self time: seconds per step and share of the step."""

    name: str
    kind: str
    seconds: float
    share: float


@dataclass(frozen=True)
class Summary:
    """A rank's summary of one capture (per-step means; see the contract)."""

    rank: int
    steps: int
    device: str
    step_seconds: float
    steps_seconds: tuple[float, ...]
    parts: dict[str, float]
    communication_seconds: float
    overlap: float | None
    top: tuple[Op, ...]

    @property
    def busy_seconds(self) -> float:
        """Busy time per step: compute and copies (the step less idle and exposed comm)."""
        return self.parts["compute"] + self.parts["copy"]

    def op(self, name: str) -> Op | None:
        return next((o for o in self.top if o.name == name), None)

    def to_json(self) -> dict[str, Any]:
        """The checked summary again as the contract's JSON (what the ConfigMap keeps)."""
        return {
            "version": 1,
            "rank": self.rank,
            "steps": self.steps,
            "device": self.device,
            "stepSeconds": self.step_seconds,
            "stepsSeconds": list(self.steps_seconds),
            "parts": dict(self.parts),
            "communicationSeconds": self.communication_seconds,
            "overlap": self.overlap,
            "top": [
                {"name": o.name, "kind": o.kind, "seconds": o.seconds, "share": o.share}
                for o in self.top
            ],
        }


@dataclass(frozen=True)
class RankState:
    """What a rank said about its capture."""

    rank: int | None
    id: str | None
    state: str
    steps: int | None = None
    steps_done: int | None = None
    error: str | None = None
    trace: str | None = None
    trace_bytes: int | None = None
    busy_with: str | None = None
    summary: Summary | None = None

    @property
    def working(self) -> bool:
        return self.state in WORKING


def _num(v: Any, what: str, lo: float = 0.0, hi: float = MAX_STEP_SECONDS) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise ProfileDocError(f"{what} is not a number")
    f = float(v)
    if not math.isfinite(f) or not lo <= f <= hi:
        raise ProfileDocError(f"{what} is out of range ({str(v)[:20]})")
    return f


def _int(v: Any, what: str, lo: int = 0, hi: int = 10**9) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise ProfileDocError(f"{what} is not an integer in {lo}..{hi}")
    return v


def _opt_int(v: Any, what: str) -> int | None:
    return None if v is None else _int(v, what, 0, 2**53)


def _text(v: Any, limit: int = MAX_TEXT) -> str | None:
    if v is None:
        return None
    return str(v)[:limit] if isinstance(v, str | int | float) else None


def parse_summary(doc: Any) -> Summary:
    """A SUMMARY object, checked."""
    if not isinstance(doc, Mapping):
        raise ProfileDocError("summary is not an object")
    if doc.get("version") != 1:
        raise ProfileDocError(f"summary version {str(doc.get('version'))[:20]} is not 1")
    step = _num(doc.get("stepSeconds"), "stepSeconds")
    if step <= 0:
        raise ProfileDocError("stepSeconds is not positive")
    raw_parts = doc.get("parts")
    if not isinstance(raw_parts, Mapping):
        raise ProfileDocError("parts is not an object")
    parts = {p: _num(raw_parts.get(p), f"parts.{p}") for p in contract.PROFILE_PARTS}
    total = sum(parts.values())
    if abs(total - step) > SUM_TOLERANCE * step:
        raise ProfileDocError(
            f"parts add up to {total:.4g}s, not the step's {step:.4g}s: the summary is inconsistent"
        )
    raw_steps = doc.get("stepsSeconds") or []
    if not isinstance(raw_steps, list):
        raise ProfileDocError("stepsSeconds is not a list")
    steps_seconds = tuple(
        _num(s, "stepsSeconds[]") for s in raw_steps[: contract.PROFILE_MAX_STEPS]
    )
    overlap_raw = doc.get("overlap")
    overlap = None if overlap_raw is None else _num(overlap_raw, "overlap", 0.0, 1.0)
    raw_top = doc.get("top") or []
    if not isinstance(raw_top, list):
        raise ProfileDocError("top is not a list")
    top: list[Op] = []
    for entry in raw_top[:MAX_TOP]:
        if not isinstance(entry, Mapping) or not isinstance(entry.get("name"), str):
            raise ProfileDocError("top[] is not an object with a name")
        kind = entry.get("kind")
        if kind not in KINDS:
            raise ProfileDocError(f"top[].kind {str(kind)[:20]!r} is unknown")
        seconds = _num(entry.get("seconds"), "top[].seconds")
        top.append(
            Op(
                name=entry["name"][:MAX_NAME],
                kind=str(kind),
                seconds=seconds,
                share=seconds / step,
            )
        )
    device = doc.get("device")
    return Summary(
        rank=_int(doc.get("rank"), "summary rank", 0, 10**7),
        steps=_int(doc.get("steps"), "summary steps", 1, contract.PROFILE_MAX_STEPS),
        device=device if device in ("cuda", "cpu") else "unknown",
        step_seconds=step,
        steps_seconds=steps_seconds,
        parts=parts,
        communication_seconds=_num(doc.get("communicationSeconds", 0.0), "communicationSeconds"),
        overlap=overlap,
        top=tuple(top),
    )


def parse(body: bytes) -> RankState:
    """A state document, checked (raises :class:`ProfileDocError` with why not)."""
    if len(body) > MAX_BYTES:
        raise ProfileDocError(f"the document is {len(body)} bytes; at most {MAX_BYTES}")
    try:
        doc = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise ProfileDocError(f"not JSON: {str(e)[:100]}") from None
    if not isinstance(doc, Mapping):
        raise ProfileDocError("the document is not a JSON object")
    if doc.get("version") != 1:
        raise ProfileDocError(f"version {str(doc.get('version'))[:20]} is not 1")
    state = doc.get("state")
    if state not in STATES:
        raise ProfileDocError(f"state {str(state)[:20]!r} is unknown")
    rank = doc.get("rank")
    summary = None
    if state == "done":
        if doc.get("summary") is None:
            raise ProfileDocError("state done without a summary")
        summary = parse_summary(doc["summary"])
    return RankState(
        rank=None if rank is None else _int(rank, "rank", 0, 10**7),
        id=_text(doc.get("id"), 64),
        state=str(state),
        steps=_opt_int(doc.get("steps"), "steps"),
        steps_done=_opt_int(doc.get("stepsDone"), "stepsDone"),
        error=_text(doc.get("error")),
        trace=_text(doc.get("trace"), 4096),
        trace_bytes=_opt_int(doc.get("traceBytes"), "traceBytes"),
        busy_with=_text(doc.get("busyWith"), 64),
        summary=summary,
    )
