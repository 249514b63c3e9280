"""A short, memory-lean window of scrapes per job, and reset-aware counter arithmetic.

The operator holds a window for every job it watches (a thousand jobs of eight ranks must
fit in well under 150 MB), so a scrape is boiled down at once to fixed-position rows of
floats (`array('d')`), one per (pod, rank) and one per GPU; label strings live once per
series, never per point. Absent values are NaN.
"""

from __future__ import annotations

import math
import re
from array import array
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Final, TypeVar

from gpujob_operator.monitoring.expfmt import Sample, common_prefix, parse, sample_names
from gpujob_trainer import contract

NAN: Final = math.nan
T = TypeVar("T")

# ---- rank rows: one per scrape of a rank ------------------------------------------------
R_T: Final = 0
"""Scrape time, seconds since the epoch."""
R_STEPS, R_TARGET, R_SAMPLES, R_TOKENS, R_EPOCH, R_LOSS = 1, 2, 3, 4, 5, 6
R_STEP_COUNT, R_STEP_SUM, R_COMPUTE, R_LAST_STEP = 7, 8, 9, 10
R_CUDA_RESERVED, R_CUDA_RETRIES, R_CUDA_OOMS = 11, 12, 13
R_PHASE0: Final = 14
R_PHASE: Final = {name: R_PHASE0 + i for i, name in enumerate(contract.PHASES)}
R_HEARTBEAT: Final = R_PHASE0 + len(contract.PHASES)
"""Unix time the rank last changed phase (its liveness between steps)."""
R_CURRENT_PHASE: Final = R_HEARTBEAT + 1
"""Index in `contract.PHASES` of the phase the rank is in (NaN: not exported)."""
R_WIDTH: Final = R_CURRENT_PHASE + 1
_PHASE_INDEX: Final = {name: float(i) for i, name in enumerate(contract.PHASES)}

_RANK_FIELDS: Final = {
    contract.STEPS.name: R_STEPS,
    contract.TARGET_STEPS.name: R_TARGET,
    contract.SAMPLES.name: R_SAMPLES,
    contract.TOKENS.name: R_TOKENS,
    contract.EPOCH.name: R_EPOCH,
    contract.LOSS.name: R_LOSS,
    contract.STEP_DURATION.name + "_count": R_STEP_COUNT,
    contract.STEP_DURATION.name + "_sum": R_STEP_SUM,
    contract.COMPUTE_SECONDS.name: R_COMPUTE,
    contract.LAST_STEP_TIMESTAMP.name: R_LAST_STEP,
    contract.HEARTBEAT_TIMESTAMP.name: R_HEARTBEAT,
    contract.CUDA_MEMORY_RESERVED.name: R_CUDA_RESERVED,
    contract.CUDA_ALLOC_RETRIES.name: R_CUDA_RETRIES,
    contract.CUDA_OOMS.name: R_CUDA_OOMS,
}
_BUCKETS: Final = contract.STEP_DURATION.name + "_bucket"
_BUCKET_INDEX: Final = {float(b): i for i, b in enumerate(contract.STEP_DURATION_BUCKETS)}

# ---- GPU rows: one per scrape of a GPU (exported by local rank 0 of its node) ----------
G_T, G_UTIL, G_MEM_USED, G_MEM_TOTAL, G_POWER, G_POWER_LIMIT = 0, 1, 2, 3, 4, 5
G_TEMP, G_SM_CLOCK, G_THROTTLE, G_XID, G_ECC = 6, 7, 8, 9, 10
G_WIDTH: Final = 11
"""G_THROTTLE is a bit mask of the active `contract.THROTTLE_REASONS` (bit i = reason i)."""

_GPU_FIELDS: Final = {
    contract.GPU_UTILIZATION.name: G_UTIL,
    contract.GPU_MEMORY_USED.name: G_MEM_USED,
    contract.GPU_MEMORY_TOTAL.name: G_MEM_TOTAL,
    contract.GPU_POWER.name: G_POWER,
    contract.GPU_POWER_LIMIT.name: G_POWER_LIMIT,
    contract.GPU_TEMPERATURE.name: G_TEMP,
    contract.GPU_SM_CLOCK.name: G_SM_CLOCK,
    contract.GPU_XID_ERRORS.name: G_XID,
    contract.GPU_ECC_UNCORRECTED.name: G_ECC,
}
_THROTTLE_BIT: Final = {name: 1 << i for i, name in enumerate(contract.THROTTLE_REASONS)}


def throttle_reasons(mask: float) -> list[str]:
    """The throttle reason names set in a G_THROTTLE mask."""
    if math.isnan(mask):
        return []
    m = int(mask)
    return [name for name, bit in _THROTTLE_BIT.items() if m & bit]


def _row(width: int, t: float) -> array[float]:
    row = array("d", [NAN]) * width
    row[0] = t
    return row


@dataclass(frozen=True, slots=True)
class Frame:
    """One endpoint's scrape boiled down to rows (what the window stores)."""

    ranks: dict[int, array[float]]
    """Global rank -> rank row."""
    buckets: dict[int, array[float]]
    """Global rank -> cumulative step time histogram counts per contract bucket, then +Inf."""
    cuda_uuid: dict[int, str]
    gpus: dict[int, tuple[str, array[float]]]
    """GPU index -> (UUID, GPU row)."""
    telemetry: str | None
    """The `reason` of gpujob_gpu_telemetry_available when the endpoint exports it."""
    local_rank: dict[int, int]
    node_rank: dict[int, int]
    steps_local_ranks: tuple[str, ...] = ()
    """The `local_rank` label of each step counter series, in payload order ("?" when absent,
    and one entry per series whether or not it carries a rank): which rank answered."""


def frame(samples: Iterable[Sample], t: float) -> Frame:
    """Boil one endpoint's samples down to rows; samples without a rank label are skipped."""
    ranks: dict[int, array[float]] = {}
    buckets: dict[int, array[float]] = {}
    cuda_uuid: dict[int, str] = {}
    gpus: dict[int, tuple[str, array[float]]] = {}
    local: dict[int, int] = {}
    node: dict[int, int] = {}
    telemetry: str | None = None
    steps: list[str] = []
    nb = len(contract.STEP_DURATION_BUCKETS) + 1
    for name, labels, value, _ in samples:
        if name == _STEPS:
            steps.append(labels.get(contract.LABEL_LOCAL_RANK, "?"))
        gi = _GPU_FIELDS.get(name)
        if gi is not None or name == contract.GPU_CLOCK_EVENT.name:
            gpu = _int(labels.get(contract.LABEL_GPU))
            if gpu is None:
                continue
            entry = gpus.get(gpu)
            if entry is None:
                entry = gpus[gpu] = (labels.get(contract.LABEL_UUID, ""), _row(G_WIDTH, t))
            row = entry[1]
            if gi is not None:
                row[gi] = value
            else:
                bit = _THROTTLE_BIT.get(labels.get(contract.LABEL_REASON, ""))
                if bit is not None:
                    cur = 0 if math.isnan(row[G_THROTTLE]) else int(row[G_THROTTLE])
                    row[G_THROTTLE] = float(cur | bit) if value > 0 else float(cur)
            continue
        if name == contract.GPU_TELEMETRY_AVAILABLE.name:
            reason = labels.get(contract.LABEL_REASON, "")
            if telemetry is None or value > 0:
                telemetry = contract.TELEMETRY_OK if value > 0 else reason or "unknown"
            continue
        rank = _int(labels.get(contract.LABEL_RANK))
        if rank is None:
            continue
        rrow = ranks.get(rank)
        if rrow is None:
            rrow = ranks[rank] = _row(R_WIDTH, t)
            lr = _int(labels.get(contract.LABEL_LOCAL_RANK))
            nr = _int(labels.get(contract.LABEL_NODE_RANK))
            if lr is not None:
                local[rank] = lr
            if nr is not None:
                node[rank] = nr
        ri = _RANK_FIELDS.get(name)
        if ri is not None:
            rrow[ri] = value
            if ri == R_CUDA_RESERVED and contract.LABEL_UUID in labels:
                cuda_uuid[rank] = labels[contract.LABEL_UUID]
        elif name == contract.PHASE_SECONDS.name:
            pi = R_PHASE.get(labels.get(contract.LABEL_PHASE, ""))
            if pi is not None:
                rrow[pi] = value
        elif name == contract.CURRENT_PHASE.name:
            ci = _PHASE_INDEX.get(labels.get(contract.LABEL_PHASE, ""))
            if ci is not None and value > 0:
                rrow[R_CURRENT_PHASE] = ci
        elif name == _BUCKETS:
            le = labels.get("le", "")
            idx = nb - 1 if le == "+Inf" else _BUCKET_INDEX.get(_float(le), -1)
            if idx >= 0:
                b = buckets.get(rank)
                if b is None:
                    b = buckets[rank] = array("d", [NAN]) * nb
                b[idx] = value
    return Frame(ranks, buckets, cuda_uuid, gpus, telemetry, local, node, tuple(steps))


def _int(text: str | None) -> int | None:
    if text is None:
        return None
    try:
        return int(text)
    except ValueError:
        return None


def _float(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return NAN


# ---- the scraper's path: payload text straight to a frame, in one pass ------------------

NEEDED: Final = sample_names(
    m
    for m in contract.ALL_METRICS
    if m
    not in (
        # Exported for dashboards, read by no analysis: left NaN in the GPU rows.
        contract.GPU_POWER,
        contract.GPU_POWER_LIMIT,
        contract.GPU_TEMPERATURE,
        contract.GPU_SM_CLOCK,
    )
)
"""The sample names the analysis reads; `frame_payload` equals `frame(parse(text, NEEDED))`."""

_STEPS: Final = contract.STEPS.name
_PREFIX: Final = re.escape(common_prefix(NEEDED))
_NAME_RE: Final = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
_LVAL_RE: Final = r'"[^"\\\n ]*"'
_LABELS_RE: Final = rf"\{{(?:[a-zA-Z_]\w*={_LVAL_RE}(?:,[a-zA-Z_]\w*={_LVAL_RE})*,?)?\}}"
_VALUE_RE: Final = (
    r"[+-]?(?:[0-9]+(?:\.[0-9]*)?(?:[eE][+-]?[0-9]+)?|\.[0-9]+(?:[eE][+-]?[0-9]+)?|Inf|NaN)"
)
_TYPE_RE: Final = r"(?:counter|gauge|histogram|summary|untyped|info)"
# The common shape of a whole payload, checked in one C-level match: every line is empty, a
# comment (a TYPE line well formed), a line of ours in strict canonical form (ASCII label
# names, no escapes or spaces in label values, single spaces, a plain float value, an optional integer timestamp), or
# another metric's line, which is only checked to start with a name. Everything it accepts,
# `expfmt.parse` accepts too and decodes the same way; anything else (escapes, CRs, indented
# or odd lines, garbage) takes the general parser, which decides and raises ParseError.
_LINE_RE: Final = (
    rf"(?:{_PREFIX}[a-zA-Z0-9_:]*(?:{_LABELS_RE})? {_VALUE_RE}(?: -?[0-9]+)?"
    rf"|(?!{_PREFIX}){_NAME_RE}[{{ \t][^\n]*"
    rf"|#(?! TYPE)[^\n]*|# TYPE {_NAME_RE} {_TYPE_RE})?"
)
_DOC: Final = re.compile(rf"(?>{_LINE_RE})(?:\n(?>{_LINE_RE}))*", re.ASCII)
# In a payload _DOC accepted, every line that starts with the prefix is one of ours, its
# series (name and labels) up to the first space, then the value. Searched in "\n" + text:
# a literal start lets the regex engine skip to candidates at C speed.
_OURS: Final = re.compile(rf"\n({_PREFIX}[^ \n]*) ([^ \n]+)")
_PAIR: Final = re.compile(r'([a-zA-Z_]\w*)="([^"]*)"', re.ASCII)

# What one series (name and label set) contributes to a frame, decoded once and cached.
_IGNORE, _RANK_ROW, _RANK_BUCKET, _GPU, _TELEMETRY, _STEPS_ONLY, _RANK_CURRENT = range(7)
_Action = tuple[int, int, int | None, int | None, int, str | None, str | None]
"""(kind, key, a, node, index, label, steps' local_rank label). Rank kinds: key is the rank,
a its local rank, index the row or bucket position (-1: none), label the CUDA UUID. _GPU: key
is the GPU, a its row position (None for a clock event), index the throttle bit (0: none),
label its UUID. _TELEMETRY: label is the reason. _RANK_CURRENT: index is the phase's position in
`contract.PHASES` (-1: unknown), written to R_CURRENT_PHASE when the value is 1."""
_NO_ACTION: Final[_Action] = (_IGNORE, -1, None, None, -1, None, None)
_ACTIONS: dict[str, _Action] = {}
_ACTIONS_MAX: Final = 65536
_ACTIONS_MAX_CHARS: Final = 8 * 2**20
"""The cache's keys hold at most this many characters in all."""
_ACTIONS_MAX_KEY: Final = 512
"""Longer series (unusual label values) are decoded every time, never kept."""
_actions_chars = 0
_RANK_TEMPLATE: Final = array("d", [NAN]) * R_WIDTH
_GPU_TEMPLATE: Final = array("d", [NAN]) * G_WIDTH
_BUCKET_TEMPLATE: Final = array("d", [NAN]) * (len(contract.STEP_DURATION_BUCKETS) + 1)


class _Fallback(Exception):
    """The fast path met something only the general parser decides (a duplicate label)."""


def _action(series: str) -> _Action:
    brace = series.find("{")
    name = series if brace < 0 else series[:brace]
    if name not in NEEDED:
        return _NO_ACTION
    labels: dict[str, str] = {}
    if brace >= 0:
        pairs = _PAIR.findall(series, brace + 1, len(series) - 1)
        labels = dict(pairs)
        if len(labels) != len(pairs):
            raise _Fallback(series)
    gi = _GPU_FIELDS.get(name)
    if gi is not None or name == contract.GPU_CLOCK_EVENT.name:
        gpu = _int(labels.get(contract.LABEL_GPU))
        if gpu is None:
            return _NO_ACTION
        uuid = labels.get(contract.LABEL_UUID, "")
        if gi is None:
            bit = _THROTTLE_BIT.get(labels.get(contract.LABEL_REASON, ""), 0)
            return (_GPU, gpu, None, None, bit, uuid, None)
        return (_GPU, gpu, gi, None, 0, uuid, None)
    if name == contract.GPU_TELEMETRY_AVAILABLE.name:
        return (_TELEMETRY, -1, None, None, -1, labels.get(contract.LABEL_REASON, ""), None)
    steps = labels.get(contract.LABEL_LOCAL_RANK, "?") if name == _STEPS else None
    rank = _int(labels.get(contract.LABEL_RANK))
    if rank is None:
        return (_STEPS_ONLY, -1, None, None, -1, None, steps) if steps is not None else _NO_ACTION
    local = _int(labels.get(contract.LABEL_LOCAL_RANK))
    node = _int(labels.get(contract.LABEL_NODE_RANK))
    ri = _RANK_FIELDS.get(name)
    if ri is not None:
        cuda = labels.get(contract.LABEL_UUID) if ri == R_CUDA_RESERVED else None
        return (_RANK_ROW, rank, local, node, ri, cuda, steps)
    if name == contract.PHASE_SECONDS.name:
        pi = R_PHASE.get(labels.get(contract.LABEL_PHASE, ""), -1)
        return (_RANK_ROW, rank, local, node, pi, None, None)
    if name == contract.CURRENT_PHASE.name:
        ci = int(_PHASE_INDEX.get(labels.get(contract.LABEL_PHASE, ""), -1))
        return (_RANK_CURRENT, rank, local, node, ci, None, None)
    if name == _BUCKETS:
        le = labels.get("le", "")
        nb = len(_BUCKET_TEMPLATE)
        idx = nb - 1 if le == "+Inf" else _BUCKET_INDEX.get(_float(le), -1)
        if idx >= 0:
            return (_RANK_BUCKET, rank, local, node, idx, None, None)
    return (_RANK_ROW, rank, local, node, -1, None, None)


def _remember(series: str, a: _Action) -> None:
    global _actions_chars
    if len(series) > _ACTIONS_MAX_KEY:
        return
    if len(_ACTIONS) >= _ACTIONS_MAX or _actions_chars > _ACTIONS_MAX_CHARS:
        _ACTIONS.clear()
        _actions_chars = 0
    _ACTIONS[series] = a
    _actions_chars += len(series)


def series_cache_size() -> tuple[int, int]:
    """(entries, characters of keys) the series cache holds (for tests and benches)."""
    return len(_ACTIONS), _actions_chars


def frame_payload(payload: str | bytes | bytearray | memoryview, t: float) -> Frame:
    """`frame(expfmt.parse(payload, NEEDED), t)` without the per-sample objects.

    The scraper's hot path: one C-level check of the payload's shape, one C-level search for
    our lines, and per line a cached decision of where its value goes. Raises ParseError
    exactly when `expfmt.parse` would (unusual payloads go through it).
    """
    if isinstance(payload, str):
        text = payload
    else:
        try:
            text = str(payload, "utf-8")
        except UnicodeDecodeError:
            return frame(parse(bytes(payload), NEEDED), t)
    if "\r" in text or not _canonical(text):
        return frame(parse(text, NEEDED), t)
    try:
        return _scan(text, t)
    except _Fallback:
        return frame(parse(text, NEEDED), t)


_BLOCK: Final = 32768
"""Characters checked per regex call (split at a line end), so no call holds the GIL long."""


def _canonical(text: str) -> bool:
    """`_DOC.fullmatch(text)`, done block by block (lines never straddle two blocks)."""
    n = len(text)
    pos = 0
    while True:
        end = text.find("\n", pos + _BLOCK) if pos + _BLOCK < n else -1
        if end < 0:
            return _DOC.fullmatch(text, pos, n) is not None
        if _DOC.fullmatch(text, pos, end) is None:
            return False
        pos = end + 1


def _scan(text: str, t: float) -> Frame:
    ranks: dict[int, array[float]] = {}
    buckets: dict[int, array[float]] = {}
    cuda_uuid: dict[int, str] = {}
    gpus: dict[int, tuple[str, array[float]]] = {}
    local: dict[int, int] = {}
    node: dict[int, int] = {}
    telemetry: str | None = None
    steps: list[str] = []
    actions = _ACTIONS
    # A large payload (parsed on a worker thread) is searched with finditer, which hands the
    # GIL back between lines instead of holding it for one long C call; findall is faster.
    found: Iterable[tuple[str, str]] = (
        _OURS.findall("\n" + text)
        if len(text) <= _BLOCK
        else ((m[1], m[2]) for m in _OURS.finditer("\n" + text))
    )
    for series, value_text in found:
        a = actions.get(series)
        if a is None:
            a = _action(series)
            _remember(series, a)
        kind, key, lr, nr, idx, text_label, steps_label = a
        if kind in (_RANK_ROW, _RANK_BUCKET, _RANK_CURRENT):
            row = ranks.get(key)
            if row is None:
                row = ranks[key] = _RANK_TEMPLATE[:]
                row[0] = t
                if lr is not None:
                    local[key] = lr
                if nr is not None:
                    node[key] = nr
            if kind == _RANK_ROW:
                if idx >= 0:
                    row[idx] = float(value_text)
                if text_label is not None:
                    cuda_uuid[key] = text_label
                if steps_label is not None:
                    steps.append(steps_label)
            elif kind == _RANK_CURRENT:
                if idx >= 0 and float(value_text) > 0:
                    row[R_CURRENT_PHASE] = float(idx)
            else:
                b = buckets.get(key)
                if b is None:
                    b = buckets[key] = _BUCKET_TEMPLATE[:]
                b[idx] = float(value_text)
        elif kind == _GPU:
            entry = gpus.get(key)
            if entry is None:
                grow = _GPU_TEMPLATE[:]
                grow[0] = t
                entry = gpus[key] = (text_label or "", grow)
            grow = entry[1]
            if lr is not None:
                grow[lr] = float(value_text)
            elif idx:
                cur = grow[G_THROTTLE]
                mask = 0 if cur != cur else int(cur)
                grow[G_THROTTLE] = float(mask | idx) if float(value_text) > 0 else float(mask)
        elif kind == _TELEMETRY:
            value = float(value_text)
            if telemetry is None or value > 0:
                telemetry = contract.TELEMETRY_OK if value > 0 else text_label or "unknown"
        elif kind == _STEPS_ONLY and steps_label is not None:
            steps.append(steps_label)
    return Frame(ranks, buckets, cuda_uuid, gpus, telemetry, local, node, tuple(steps))


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
    beat: float = NAN
    """The rank's latest heartbeat (R_HEARTBEAT) as exported."""
    beat_since: float = NAN
    """When that heartbeat was first seen, in operator time (a changed heartbeat is the rank
    changing phase; the first one seen counts from its own value when that is older)."""


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
            if rank in fr.buckets:
                s.buckets = fr.buckets[rank]
            _append(s.rows, row, self.max_points, t - self.max_age)
            beat = row[R_HEARTBEAT]
            if beat == beat and beat != s.beat:  # a phase change since the last scrape
                s.beat_since = min(t, beat) if math.isnan(s.beat) else t
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
        # first sight, trust the trainers' own last-step time when it is older than now.
        steps = [latest(s.rows, R_STEPS) for s in self.ranks.values()]
        steps = [v for v in steps if not math.isnan(v)]
        if not steps:
            return
        total = float(sum(steps))
        if math.isnan(self.progress_time):
            last = [latest(s.rows, R_LAST_STEP) for s in self.ranks.values()]
            known = [v for v in last if not math.isnan(v) and v > 0]
            self.progress_time = min(t, max(known)) if known else t
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


# ---- counter arithmetic ------------------------------------------------------------------


def increase(rows: Sequence[array[float]], index: int) -> float:
    """Increase of a counter over rows, like Prometheus' increase(): a drop is a reset,
    after which the counter counts from zero. NaN when fewer than two rows carry it."""
    total = 0.0
    prev = NAN
    seen = 0
    for row in rows:
        v = row[index]
        if math.isnan(v):
            continue
        if seen:
            total += v - prev if v >= prev else v
        prev = v
        seen += 1
    return total if seen >= 2 else NAN


def span(rows: Sequence[array[float]], index: int) -> float:
    """Seconds between the first and last rows that carry the field (NaN if < 2)."""
    first = last = NAN
    for row in rows:
        if not math.isnan(row[index]):
            if math.isnan(first):
                first = row[0]
            last = row[0]
    return last - first if not math.isnan(first) and last > first else NAN


def rate(rows: Sequence[array[float]], index: int) -> float:
    """Per-second increase over rows (NaN if not computable)."""
    inc = increase(rows, index)
    dt = span(rows, index)
    return inc / dt if not math.isnan(inc) and not math.isnan(dt) else NAN


def latest(rows: Sequence[array[float]], index: int) -> float:
    """The most recent non-NaN value of a field (NaN if none)."""
    for row in reversed(rows):
        v = row[index]
        if not math.isnan(v):
            return v
    return NAN
