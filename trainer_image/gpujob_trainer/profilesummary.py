"""A captured profile's summary: where the steps' time went, from the chrome trace alone.

Pure Python over the trace's ``traceEvents`` (the JSON list ``torch.profiler`` exports): no
torch, so the rank computes it on a background thread and the CLI can compute it again from
a trace file it copied. :func:`summarize` returns the SUMMARY document of
``/debug/profile`` (version 1), or raises :class:`SummaryError` saying why there is none.

How the time is split:

* **Steps.** The ``ProfilerStep#k`` annotations torch's profiler puts around each step. On
  CUDA the GPU lanes carry the same names (``gpu_user_annotation``: from a step's first
  kernel to its last), and the window is taken there, where the work ran; otherwise on the
  thread that holds the host annotations. The window runs from the first step's start to
  the last one's end; the step time is the window over the steps.
* **Lanes.** With GPU work in the trace (kernels, memcpy, memset), each GPU stream is a
  lane and its operations are what counts. Without, the training thread (the one holding
  the steps) and every thread that ran a communication op; there a collective's span is
  an annotation on the backend's thread (``gloo:all_reduce``), which counts as an op.
* **Segments.** On each lane the operations are swept as a tree (a child that outlives its
  parent is cut at the parent's end): every moment belongs to the innermost operation
  open then, except that everything under a communication op is communication.
* **Kinds.** Communication: NCCL/gloo kernels and c10d ops (``nccl*``, ``gloo*``,
  ``c10d::*``, ``record_param_comms``, all-reduce, all-gather, reduce-scatter, broadcast,
  barrier, send, recv...). Copy: ``gpu_memcpy``/``gpu_memset`` events and ``Memcpy``/
  ``Memset`` names. Compute: every other operation (``cpu_op``, ``kernel``). Annotations
  (``user_annotation``, ``gpu_user_annotation``, ``python_function``) are no operations,
  but for the host's communication spans above.
* **Parts.** Across lanes a moment counts for the first of compute, communication, copy
  that runs then, else it is idle, so the parts are exclusive and add up to the step time;
  ``communication`` is therefore the exposed part, ``communicationSeconds`` all of it, and
  ``overlap`` the share of the communication time during which compute ran.
* **Top.** The operations with the most self time (their time less their children's on
  the same lane), per step, with their share of the step.

Malformed events (not objects, no numeric ``ts``/``dur``, a negative or non-finite
duration) are skipped, never raised on.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from typing import Any, Final

from gpujob_trainer import contract

VERSION: Final = 1
MAX_NAME: Final = 200
"""Characters kept of an operation's name (kernel names run to thousands)."""
MAX_TOP: Final = 10
COMPUTE, COMMUNICATION, COPY, IDLE = contract.PROFILE_PARTS
_US: Final = 1e-6
"""Trace times are microseconds."""

STEP_NAME: Final = re.compile(r"ProfilerStep#(\d+)")
GPU_OP_CATS: Final = frozenset(("kernel", "gpu_memcpy", "gpu_memset"))
COPY_CATS: Final = frozenset(("gpu_memcpy", "gpu_memset"))
CPU_OP_CATS: Final = frozenset(("cpu_op", "operator"))
"""Host operations (``operator`` is what older exporters called them)."""
GPU_ANNOTATION: Final = "gpu_user_annotation"
COMM_ANNOTATION_CATS: Final = frozenset(("user_annotation",))
"""On the host, a collective's own span is an annotation on the backend's thread (gloo's
``gloo:all_reduce``): annotations named as communication count as communication ops."""
_COMM_PREFIX: Final = re.compile(r"(nccl|gloo|c10d::|c10d_|_c10d_|record_param_comms)", re.I)
_COMM_WORD: Final = re.compile(
    r"(?:^|[^a-z0-9])(all_?reduce|all_?gather|reduce_?scatter|all_?to_?all|broadcast|barrier|"
    r"send|recv)(?:[^a-z0-9]|$)",
    re.I,
)
_COPY_NAME: Final = re.compile(r"(memcpy|memset)", re.I)


class SummaryError(ValueError):
    """Why a trace gives no summary (no step annotations, no time in the window...)."""


def kind_of(name: str, cat: str) -> str:
    """The part an operation's time belongs to: communication, copy or compute."""
    if _COMM_PREFIX.match(name) or (
        not name.startswith("aten::") and _COMM_WORD.search(name) is not None
    ):
        return COMMUNICATION
    if cat in COPY_CATS or _COPY_NAME.match(name):
        return COPY
    return COMPUTE


class _Event:
    __slots__ = ("cat", "end", "lane", "name", "start")

    def __init__(self, name: str, cat: str, lane: tuple[str, str], start: float, end: float):
        self.name, self.cat, self.lane, self.start, self.end = name, cat, lane, start, end


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    v = float(value)
    return v if math.isfinite(v) else None


def _events(raw: Iterable[Any]) -> list[_Event]:
    """The complete ("X") events that are well formed; the rest is skipped."""
    out: list[_Event] = []
    for e in raw:
        if not isinstance(e, dict) or e.get("ph", "X") != "X":
            continue
        ts, dur = _number(e.get("ts")), _number(e.get("dur"))
        if ts is None or dur is None or dur < 0:
            continue
        name, cat = e.get("name"), e.get("cat")
        lane = (str(e.get("pid", "")), str(e.get("tid", "")))
        out.append(
            _Event(
                name if isinstance(name, str) else str(name),
                cat.lower() if isinstance(cat, str) else "",
                lane,
                ts,
                ts + dur,
            )
        )
    return out


def _steps(events: Sequence[_Event], gpu: bool) -> list[tuple[float, float]]:
    """Each step's (start, end), in step order: the GPU lanes' spans when there are any,
    else the host annotations on the thread holding the most of them."""
    if gpu:
        spans: dict[int, list[float]] = {}
        for e in events:
            m = STEP_NAME.fullmatch(e.name) if e.cat == GPU_ANNOTATION else None
            if m is not None:
                k = int(m.group(1))
                span = spans.setdefault(k, [e.start, e.end])
                span[0], span[1] = min(span[0], e.start), max(span[1], e.end)
        if spans:
            return [(s, t) for _, (s, t) in sorted(spans.items())]
    by_lane: dict[tuple[str, str], dict[int, tuple[float, float]]] = {}
    for e in events:
        m = STEP_NAME.fullmatch(e.name) if e.cat != GPU_ANNOTATION else None
        if m is not None:
            by_lane.setdefault(e.lane, {})[int(m.group(1))] = (e.start, e.end)
    if not by_lane:
        return []
    lane = max(by_lane, key=lambda k: len(by_lane[k]))
    return [by_lane[lane][k] for k in sorted(by_lane[lane])]


def _training_lane(events: Sequence[_Event]) -> tuple[str, str] | None:
    counts: dict[tuple[str, str], int] = {}
    for e in events:
        if e.cat != GPU_ANNOTATION and STEP_NAME.fullmatch(e.name):
            counts[e.lane] = counts.get(e.lane, 0) + 1
    return max(counts, key=lambda k: counts[k]) if counts else None


Interval = tuple[float, float]


def _sweep(
    ops: list[_Event], lo: float, hi: float, self_time: dict[tuple[str, str], float]
) -> dict[str, list[Interval]]:
    """One lane's labelled time: each kind's intervals (unmerged) within [lo, hi], and each
    operation's self time added to `self_time` by (name, kind)."""
    out: dict[str, list[Interval]] = {COMPUTE: [], COMMUNICATION: [], COPY: []}
    ops.sort(key=lambda e: (e.start, -e.end))
    # The stack: [end, kind, (name, kind), cursor] of each open operation, outermost first;
    # the cursor is where the operation's own (self) time resumes.
    stack: list[list[Any]] = []

    def own(frame: list[Any], until: float) -> None:
        start, end = max(frame[3], lo), min(until, hi)
        if end > start:
            out[frame[1]].append((start, end))
            key = frame[2]
            self_time[key] = self_time.get(key, 0.0) + (end - start)

    def close_until(t: float) -> None:
        while stack and stack[-1][0] <= t:
            top = stack.pop()
            own(top, top[0])
            if stack:
                stack[-1][3] = top[0]

    for e in ops:
        close_until(e.start)
        end = e.end
        kind = kind_of(e.name, e.cat)
        if stack:
            parent = stack[-1]
            end = min(end, parent[0])  # a child cannot outlive its parent
            own(parent, e.start)
            parent[3] = end  # resumes after the child (set again when the child closes)
            if parent[1] == COMMUNICATION:
                kind = COMMUNICATION  # the work under a collective is the collective's
        stack.append([end, kind, (e.name[:MAX_NAME], kind), e.start])
    close_until(math.inf)
    return out


def _merge(intervals: list[Interval]) -> list[Interval]:
    out: list[Interval] = []
    for s, t in sorted(intervals):
        if out and s <= out[-1][1]:
            if t > out[-1][1]:
                out[-1] = (out[-1][0], t)
        else:
            out.append((s, t))
    return out


def _measure(intervals: Sequence[Interval]) -> float:
    return sum(t - s for s, t in intervals)


def _intersection(a: Sequence[Interval], b: Sequence[Interval]) -> float:
    """Measure of the intersection of two merged interval lists."""
    i = j = 0
    total = 0.0
    while i < len(a) and j < len(b):
        s, t = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if t > s:
            total += t - s
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def summarize(
    trace_events: Any, *, rank: int | None = None, requested_steps: int | None = None
) -> dict[str, Any]:
    """The SUMMARY (version 1) of a chrome trace's ``traceEvents`` list (or the whole trace
    document); raises :class:`SummaryError` when the trace gives none.

    `requested_steps` bounds the steps used (the last ones) when the trace holds more.
    """
    if isinstance(trace_events, dict):
        trace_events = trace_events.get("traceEvents")
    if not isinstance(trace_events, list):
        raise SummaryError("the trace has no traceEvents list")
    events = _events(trace_events)
    gpu_ops = [e for e in events if e.cat in GPU_OP_CATS]
    gpu = bool(gpu_ops)
    steps = _steps(events, gpu)
    limit = min(contract.PROFILE_MAX_STEPS, requested_steps or contract.PROFILE_MAX_STEPS)
    steps = steps[-limit:]
    if not steps:
        raise SummaryError("the trace holds no ProfilerStep# annotation")
    lo, hi = steps[0][0], max(t for _, t in steps)
    if not hi > lo:
        raise SummaryError("the captured steps span no time")
    n = len(steps)

    if gpu:
        ops = gpu_ops
    else:
        train = _training_lane(events)
        cpu_ops = [
            e
            for e in events
            if e.cat in CPU_OP_CATS
            or (e.cat in COMM_ANNOTATION_CATS and kind_of(e.name, e.cat) == COMMUNICATION)
        ]
        comm_lanes = {e.lane for e in cpu_ops if kind_of(e.name, e.cat) == COMMUNICATION}
        lanes = comm_lanes | ({train} if train is not None else set())
        ops = [e for e in cpu_ops if e.lane in lanes]
    by_lane: dict[tuple[str, str], list[_Event]] = {}
    for e in ops:
        if e.end > lo and e.start < hi:
            by_lane.setdefault(e.lane, []).append(e)
    self_time: dict[tuple[str, str], float] = {}
    kinds: dict[str, list[Interval]] = {COMPUTE: [], COMMUNICATION: [], COPY: []}
    for lane_ops in by_lane.values():
        for kind, intervals in _sweep(lane_ops, lo, hi, self_time).items():
            kinds[kind] += intervals

    compute, comm, copy = (_merge(kinds[k]) for k in (COMPUTE, COMMUNICATION, COPY))
    window = hi - lo
    compute_s = _measure(compute)
    comm_s = _measure(comm)
    hidden = _intersection(comm, compute)
    exposed = comm_s - hidden
    copy_s = _measure(copy) - _intersection(copy, _merge(compute + comm))
    idle = max(0.0, window - compute_s - exposed - copy_s)
    per = _US / n
    step_seconds = window * per
    parts = {
        COMPUTE: compute_s * per,
        COMMUNICATION: exposed * per,
        COPY: copy_s * per,
        IDLE: idle * per,
    }
    top = sorted(self_time.items(), key=lambda kv: kv[1], reverse=True)[:MAX_TOP]
    return {
        "version": VERSION,
        "rank": rank,
        "steps": n,
        "device": "cuda" if gpu else "cpu",
        "stepSeconds": step_seconds,
        "stepsSeconds": [(t - s) * _US for s, t in steps],
        "parts": parts,
        "communicationSeconds": comm_s * per,
        "overlap": (hidden / comm_s) if comm_s > 0 else None,
        "top": [
            {
                "name": name,
                "kind": kind,
                "seconds": seconds * per,
                "share": seconds * per / step_seconds,
            }
            for (name, kind), seconds in top
        ],
    }


def summarize_file(
    path: str, *, rank: int | None = None, requested_steps: int | None = None
) -> dict[str, Any]:
    """:func:`summarize` of a trace file."""
    import json

    with open(path, encoding="utf-8") as f:
        doc = json.load(f)
    return summarize(doc, rank=rank, requested_steps=requested_steps)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m gpujob_trainer.profilesummary TRACE [RANK] [STEPS]``: the summary as JSON
    on stdout (exit 0), or why none on stderr (exit 2). The rank runs it as a child process,
    so reading a large trace holds neither its GIL nor its memory."""
    import json
    import sys

    args = list(sys.argv[1:] if argv is None else argv)
    if not 1 <= len(args) <= 3:
        sys.stderr.write("usage: python -m gpujob_trainer.profilesummary TRACE [RANK] [STEPS]\n")
        return 2
    rank = int(args[1]) if len(args) > 1 and args[1] != "-" else None
    steps = int(args[2]) if len(args) > 2 else None
    try:
        summary = summarize_file(args[0], rank=rank, requested_steps=steps)
    except (OSError, ValueError) as exc:  # SummaryError and json's errors are ValueErrors
        kind = "" if isinstance(exc, SummaryError) else f"{type(exc).__name__}: "
        sys.stderr.write(f"{kind}{str(exc)[:400]}\n")
        return 2
    sys.stdout.write(json.dumps(summary, separators=(",", ":")))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
