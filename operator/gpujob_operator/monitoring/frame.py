"""One scrape boiled down to rows: a `Frame`, what the window stores of an endpoint's payload.

A payload becomes one rank row per rank it speaks for and one GPU row per GPU (the layout
is `rows`, the step time histogram's buckets included), plus the CUDA UUID, the ranks' local
and node ranks, the GPUs each rank drives and the GPU telemetry reason. Two paths lead there and must agree: `frame()` reads parsed
samples (`expfmt.parse`), and `frame_payload()`, the scraper's hot path, goes from payload
text straight to a frame in one pass, without per-sample objects, falling back to the
general parser for anything unusual.
"""

from __future__ import annotations

import math
import re
from array import array
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

from gpujob_operator.monitoring.expfmt import Sample, common_prefix, parse, sample_names
from gpujob_operator.monitoring.rows import (
    G_ECC,
    G_MEM_TOTAL,
    G_MEM_USED,
    G_PCIE_RX,
    G_PCIE_TX,
    G_POWER,
    G_POWER_LIMIT,
    G_SM_ACTIVE,
    G_SM_CLOCK,
    G_TEMP,
    G_TENSOR_ACTIVE,
    G_THROTTLE,
    G_UTIL,
    G_WIDTH,
    G_XID,
    N_BUCKETS,
    NAN,
    R_BUCKET0,
    R_CLOCK,
    R_COMPUTE,
    R_CUDA_OOMS,
    R_CUDA_RESERVED,
    R_CUDA_RETRIES,
    R_CURRENT_PHASE,
    R_DTYPE,
    R_EPOCH,
    R_FLOPS,
    R_HEARTBEAT,
    R_LAST_STEP,
    R_LOSS,
    R_PEAK,
    R_PEAK_REASON,
    R_PHASE,
    R_SAMPLES,
    R_START_STEP,
    R_STEP_COUNT,
    R_STEP_SUM,
    R_STEPS,
    R_TARGET,
    R_TOKENS,
    R_WIDTH,
    THROTTLE_BIT,
)
from gpujob_trainer import contract

_PHASE_INDEX: Final = {name: float(i) for i, name in enumerate(contract.PHASES)}

_RANK_FIELDS: Final = {
    contract.STEPS.name: R_STEPS,
    contract.START_STEP.name: R_START_STEP,
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
    contract.CLOCK_TIMESTAMP.name: R_CLOCK,
    contract.CUDA_MEMORY_RESERVED.name: R_CUDA_RESERVED,
    contract.CUDA_ALLOC_RETRIES.name: R_CUDA_RETRIES,
    contract.CUDA_OOMS.name: R_CUDA_OOMS,
    contract.MODEL_FLOPS.name: R_FLOPS,
}
_BUCKETS: Final = contract.STEP_DURATION.name + "_bucket"
_BUCKET_INDEX: Final = {float(b): i for i, b in enumerate(contract.STEP_DURATION_BUCKETS)}

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
    contract.GPU_PCIE_RX.name: G_PCIE_RX,
    contract.GPU_PCIE_TX.name: G_PCIE_TX,
    contract.GPU_SM_ACTIVE.name: G_SM_ACTIVE,
    contract.GPU_TENSOR_ACTIVE.name: G_TENSOR_ACTIVE,
}
_DTYPES: Final = {name: i for i, name in enumerate(contract.PEAK_DTYPES)}
_PEAK_REASONS: Final = {name: i for i, name in enumerate(contract.PEAK_REASONS)}
MAX_RANK_DEVICES: Final = 16
"""GPUs one rank may say it drives; an endpoint claiming more is cut there."""
MAX_LABEL_TEXT: Final = 128
"""Characters kept of every endpoint-supplied label value a frame keeps (a GPU product name or
UUID, a telemetry reason, a local_rank label): they reach the job's status and its messages."""


def _peak_code(labels: dict[str, str]) -> int:
    """The peak series' reason and dtype in one int (reason * 8 + dtype; -1 unknown)."""
    reason = _PEAK_REASONS.get(labels.get(contract.LABEL_REASON, ""), -1)
    dtype = _DTYPES.get(labels.get(contract.LABEL_DTYPE, ""), -1)
    if reason < 0:
        return -1
    return reason * 8 + (dtype if dtype >= 0 else 7)


def _put_peak(row: array[float], code: int, value: float) -> None:
    row[R_PEAK] = value
    if code >= 0:
        reason, dtype = divmod(code, 8)
        row[R_PEAK_REASON] = float(reason)
        row[R_DTYPE] = float(dtype) if dtype < len(contract.PEAK_DTYPES) else NAN


def _put_device(devices: dict[int, dict[int, str]], rank: int, uuid: str, value: float) -> None:
    mine = devices.setdefault(rank, {})
    if len(mine) < MAX_RANK_DEVICES and value == value and 0 <= value < MAX_RANK_DEVICES:
        mine[int(value)] = uuid[:MAX_LABEL_TEXT]


def _has_any(values: array[float]) -> bool:
    return any(v == v for v in values)


def _device_tuples(devices: dict[int, dict[int, str]]) -> dict[int, tuple[str, ...]]:
    return {r: tuple(d[i] for i in sorted(d)) for r, d in devices.items() if d}


def _row(width: int, t: float) -> array[float]:
    row = array("d", [NAN]) * width
    row[0] = t
    return row


@dataclass(frozen=True, slots=True)
class Frame:
    """One endpoint's scrape boiled down to rows (what the window stores)."""

    ranks: dict[int, array[float]]
    """Global rank -> rank row."""
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
    devices: dict[int, tuple[str, ...]] | None = None
    """Global rank -> UUIDs of the GPUs it drives, in its order (first: the one that
    gathers under nn.DataParallel)."""
    device_names: dict[int, str] | None = None
    """Global rank -> the GPU product name its peak FLOP/s is for."""

    @property
    def buckets(self) -> dict[int, array[float]]:
        """Global rank -> cumulative step time histogram counts per contract bucket, then
        +Inf: the bucket fields of its row (ranks that exported none are left out)."""
        return {
            r: b
            for r, row in self.ranks.items()
            if _has_any(b := row[R_BUCKET0 : R_BUCKET0 + N_BUCKETS])
        }


def frame(samples: Iterable[Sample], t: float) -> Frame:
    """Boil one endpoint's samples down to rows; samples without a rank label are skipped."""
    ranks: dict[int, array[float]] = {}
    cuda_uuid: dict[int, str] = {}
    gpus: dict[int, tuple[str, array[float]]] = {}
    local: dict[int, int] = {}
    node: dict[int, int] = {}
    telemetry: str | None = None
    steps: list[str] = []
    devices: dict[int, dict[int, str]] = {}
    names: dict[int, str] = {}
    for name, labels, value, _ in samples:
        if name == _STEPS:
            steps.append(labels.get(contract.LABEL_LOCAL_RANK, "?")[:MAX_LABEL_TEXT])
        gi = _GPU_FIELDS.get(name)
        if gi is not None or name == contract.GPU_CLOCK_EVENT.name:
            gpu = _int(labels.get(contract.LABEL_GPU))
            if gpu is None:
                continue
            entry = gpus.get(gpu)
            if entry is None:
                uuid = labels.get(contract.LABEL_UUID, "")[:MAX_LABEL_TEXT]
                entry = gpus[gpu] = (uuid, _row(G_WIDTH, t))
            row = entry[1]
            if gi is not None:
                row[gi] = value
            else:
                bit = THROTTLE_BIT.get(labels.get(contract.LABEL_REASON, ""))
                if bit is not None:
                    cur = 0 if math.isnan(row[G_THROTTLE]) else int(row[G_THROTTLE])
                    row[G_THROTTLE] = float(cur | bit) if value > 0 else float(cur)
            continue
        if name == contract.GPU_TELEMETRY_AVAILABLE.name:
            reason = labels.get(contract.LABEL_REASON, "")[:MAX_LABEL_TEXT]
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
                cuda_uuid[rank] = labels[contract.LABEL_UUID][:MAX_LABEL_TEXT]
        elif name == contract.PHASE_SECONDS.name:
            pi = R_PHASE.get(labels.get(contract.LABEL_PHASE, ""))
            if pi is not None:
                rrow[pi] = value
        elif name == contract.CURRENT_PHASE.name:
            ci = _PHASE_INDEX.get(labels.get(contract.LABEL_PHASE, ""))
            if ci is not None and value > 0:
                rrow[R_CURRENT_PHASE] = ci
        elif name == contract.PEAK_FLOPS.name:
            _put_peak(rrow, _peak_code(labels), value)
            names[rank] = labels.get(contract.LABEL_DEVICE, "")[:MAX_LABEL_TEXT]
        elif name == contract.RANK_DEVICE.name:
            _put_device(devices, rank, labels.get(contract.LABEL_UUID, ""), value)
        elif name == _BUCKETS:
            le = labels.get("le", "")
            idx = N_BUCKETS - 1 if le == "+Inf" else _BUCKET_INDEX.get(_float(le), -1)
            if idx >= 0:
                rrow[R_BUCKET0 + idx] = value
    return Frame(
        ranks,
        cuda_uuid,
        gpus,
        telemetry,
        local,
        node,
        tuple(steps),
        _device_tuples(devices),
        names,
    )


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
        contract.GPU_PROFILING_AVAILABLE,
    )
)
"""The sample names the analysis reads; `frame_payload` equals `frame(parse(text, NEEDED))`."""

_STEPS: Final = contract.STEPS.name
_PREFIX: Final = re.escape(common_prefix(NEEDED))
_NAME_RE: Final = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
_LVAL_RE: Final = r'"[^"\\\n}]*"'
_LABELS_RE: Final = rf"\{{(?:[a-zA-Z_]\w*={_LVAL_RE}(?:,[a-zA-Z_]\w*={_LVAL_RE})*,?)?\}}"
_VALUE_RE: Final = (
    r"[+-]?(?:[0-9]+(?:\.[0-9]*)?(?:[eE][+-]?[0-9]+)?|\.[0-9]+(?:[eE][+-]?[0-9]+)?|Inf|NaN)"
)
_TYPE_RE: Final = r"(?:counter|gauge|histogram|summary|untyped|info)"
# The common shape of a whole payload, checked in one C-level match: every line is empty, a
# comment (a TYPE line well formed), a line of ours in strict canonical form (ASCII label
# names, no escapes or closing braces in label values (spaces are fine: GPU product names),
# single spaces, a plain float value, an optional integer timestamp), or
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
# series (name, then the label block up to its closing brace), a space, then the value. Searched in "\n" + text:
# a literal start lets the regex engine skip to candidates at C speed.
_OURS: Final = re.compile(rf"\n({_PREFIX}[^ \n{{]*(?:\{{[^}}\n]*\}})?) ([^ \n]+)")
_PAIR: Final = re.compile(r'([a-zA-Z_]\w*)="([^"]*)"', re.ASCII)

# What one series (name and label set) contributes to a frame, decoded once and cached.
(
    _IGNORE,
    _RANK_ROW,
    _RANK_BUCKET,
    _GPU,
    _TELEMETRY,
    _STEPS_ONLY,
    _RANK_CURRENT,
    _RANK_PEAK,
    _RANK_DEVICE,
) = range(9)
_RANK_KINDS: Final = frozenset({_RANK_ROW, _RANK_BUCKET, _RANK_CURRENT, _RANK_PEAK, _RANK_DEVICE})
_Action = tuple[int, int, int | None, int | None, int, str | None, str | None]
"""(kind, key, a, node, index, label, steps' local_rank label). Rank kinds: key is the rank,
a its local rank, index the row or bucket position (-1: none), label the CUDA UUID. _GPU: key
is the GPU, a its row position (None for a clock event), index the throttle bit (0: none),
label its UUID. _TELEMETRY: label is the reason. _RANK_CURRENT: index is the phase's position in
`contract.PHASES` (-1: unknown), written to R_CURRENT_PHASE when the value is 1. _RANK_PEAK:
index is `_peak_code`, label the product name. _RANK_DEVICE: label is the GPU's UUID."""
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
        uuid = labels.get(contract.LABEL_UUID, "")[:MAX_LABEL_TEXT]
        if gi is None:
            bit = THROTTLE_BIT.get(labels.get(contract.LABEL_REASON, ""), 0)
            return (_GPU, gpu, None, None, bit, uuid, None)
        return (_GPU, gpu, gi, None, 0, uuid, None)
    if name == contract.GPU_TELEMETRY_AVAILABLE.name:
        reason = labels.get(contract.LABEL_REASON, "")[:MAX_LABEL_TEXT]
        return (_TELEMETRY, -1, None, None, -1, reason, None)
    steps = labels.get(contract.LABEL_LOCAL_RANK, "?")[:MAX_LABEL_TEXT] if name == _STEPS else None
    rank = _int(labels.get(contract.LABEL_RANK))
    if rank is None:
        return (_STEPS_ONLY, -1, None, None, -1, None, steps) if steps is not None else _NO_ACTION
    local = _int(labels.get(contract.LABEL_LOCAL_RANK))
    node = _int(labels.get(contract.LABEL_NODE_RANK))
    ri = _RANK_FIELDS.get(name)
    if ri is not None:
        cuda = labels.get(contract.LABEL_UUID) if ri == R_CUDA_RESERVED else None
        cuda = cuda[:MAX_LABEL_TEXT] if cuda is not None else None
        return (_RANK_ROW, rank, local, node, ri, cuda, steps)
    if name == contract.PHASE_SECONDS.name:
        pi = R_PHASE.get(labels.get(contract.LABEL_PHASE, ""), -1)
        return (_RANK_ROW, rank, local, node, pi, None, None)
    if name == contract.CURRENT_PHASE.name:
        ci = int(_PHASE_INDEX.get(labels.get(contract.LABEL_PHASE, ""), -1))
        return (_RANK_CURRENT, rank, local, node, ci, None, None)
    if name == contract.PEAK_FLOPS.name:
        device = labels.get(contract.LABEL_DEVICE, "")[:MAX_LABEL_TEXT]
        return (_RANK_PEAK, rank, local, node, _peak_code(labels), device, None)
    if name == contract.RANK_DEVICE.name:
        return (_RANK_DEVICE, rank, local, node, -1, labels.get(contract.LABEL_UUID, ""), None)
    if name == _BUCKETS:
        le = labels.get("le", "")
        idx = N_BUCKETS - 1 if le == "+Inf" else _BUCKET_INDEX.get(_float(le), -1)
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
    cuda_uuid: dict[int, str] = {}
    gpus: dict[int, tuple[str, array[float]]] = {}
    local: dict[int, int] = {}
    node: dict[int, int] = {}
    telemetry: str | None = None
    steps: list[str] = []
    devices: dict[int, dict[int, str]] = {}
    names: dict[int, str] = {}
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
        if kind in _RANK_KINDS:
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
            elif kind == _RANK_BUCKET:
                row[R_BUCKET0 + idx] = float(value_text)
            elif kind == _RANK_PEAK:
                _put_peak(row, idx, float(value_text))
                names[key] = text_label or ""
            else:
                _put_device(devices, key, text_label or "", float(value_text))
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
    return Frame(
        ranks,
        cuda_uuid,
        gpus,
        telemetry,
        local,
        node,
        tuple(steps),
        _device_tuples(devices),
        names,
    )
