"""One scrape boiled down to rows: a `Frame`, what the window stores of an endpoint's payload.

A payload becomes one rank row per rank it speaks for and one GPU row per GPU (the layout
is `rows`, the step time histogram's buckets included), plus the CUDA UUID, the ranks' local
and node ranks, the GPUs each rank drives and the GPU telemetry reason. What each series (a
sample name and its label set) gives the frame is decided in one place, `decode`, into a
`Series`, and applied in one place, `_build`. Two paths feed them: `frame()` reads parsed
samples (`expfmt.parse`), and `frame_payload()`, the scraper's hot path, goes from payload
text straight to a frame in one pass, without per-sample objects, decoding each distinct
series once and caching the `Series`, falling back to the general parser for anything
unusual.
"""

from __future__ import annotations

import re
from array import array
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Final, TypeVar

from gpujob_operator.monitoring.rows import (
    G_ECC,
    G_MEM_TOTAL,
    G_MEM_USED,
    G_PCIE_RX,
    G_PCIE_TX,
    G_SM_ACTIVE,
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
from gpujob_operator.monitoring.scrape.expfmt import (
    Sample,
    common_prefix,
    label_set,
    parse,
    sample_names,
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


# ---- what a series gives a frame: one decoder, one applier -----------------------------

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
"""The sample names a frame reads (every other series is ignored); `frame_payload` equals
`frame(parse(text, NEEDED))`."""

_STEPS: Final = contract.STEPS.name

# What a series' value feeds (Series.kind), the commonest first; the rank kinds, then the
# GPU kinds, are numbered together (`_build` tells them apart by range).
RANK_VALUE: Final = 0
"""The rank row's `slot`."""
RANK_SEEN: Final = 1
"""Nothing but the rank row itself (a series the row keeps no slot for)."""
RANK_STEPS: Final = 2
"""The rank row's `slot` (the step counter), and the series' `steps_local_rank`."""
RANK_CUDA: Final = 3
"""The rank row's `slot` (CUDA reserved memory), and the CUDA device's `uuid`."""
RANK_PHASE: Final = 4
"""The rank row's current phase: `phase` when the value is 1."""
RANK_PEAK: Final = 5
"""The rank row's peak FLOP/s, its reason and dtype (`peak_code`), and `device_name`."""
RANK_DEVICE: Final = 6
"""The rank drives GPU `uuid` at the position the value gives."""
GPU_VALUE: Final = 7
"""The GPU row's `slot`."""
GPU_CLOCK_EVENT: Final = 8
"""The GPU row's `throttle_bit` in G_THROTTLE, set or cleared by the value (0: the row
itself only, a reason the operator does not know)."""
TELEMETRY: Final = 9
"""Whether the endpoint has GPU telemetry, else its `reason`."""
STEPS_UNRANKED: Final = 10
"""A step counter without a rank label: only its `steps_local_rank` counts."""
IGNORED: Final = 11
"""Nothing: a name the frame does not read, or a series without the label it needs."""


@dataclass(frozen=True, slots=True)
class Series:
    """What one series (a sample name and its label set) gives a frame.

    Each field means one thing whatever the kind; a kind leaves the fields it does not use
    at their defaults. Slotted: the hot loop reads only the fields its kind needs, and a
    slot read is the cheapest attribute read there is (cheaper than a tuple's unpacking).
    """

    kind: int
    """What the value feeds: RANK_VALUE ... IGNORED."""
    rank: int = -1
    """The global rank of a rank series (`rank` label)."""
    local_rank: int | None = None
    """Its `local_rank` label, kept by the rank's first series."""
    node_rank: int | None = None
    """Its `node_rank` label, kept likewise."""
    gpu: int = -1
    """The GPU index of a GPU series (`gpu` label)."""
    slot: int = -1
    """Where the value goes in its rank or GPU row."""
    phase: int = -1
    """A current-phase series' position in `contract.PHASES`."""
    peak_code: int = -1
    """A peak series' reason and dtype in one int (`_peak_code`)."""
    throttle_bit: int = 0
    """A clock event's bit in G_THROTTLE (0: a reason the operator does not know)."""
    uuid: str = ""
    """The `UUID` label where the kind keeps it: the GPU's (GPU kinds), the CUDA device's
    (RANK_CUDA), the driven GPU's (RANK_DEVICE)."""
    device_name: str = ""
    """The GPU product name a peak is for."""
    reason: str = ""
    """The telemetry reason."""
    steps_local_rank: str = ""
    """A step counter's `local_rank` label ("?" when absent): which rank answered."""


_IGNORED: Final = Series(IGNORED)


def decode(name: str, labels: dict[str, str]) -> Series:
    """What a sample of ``name`` with ``labels`` gives a frame: the one decoding both paths
    use (label values the frame keeps are clipped to MAX_LABEL_TEXT)."""
    if name not in NEEDED:
        return _IGNORED
    gi = _GPU_FIELDS.get(name)
    if gi is not None or name == contract.GPU_CLOCK_EVENT.name:
        gpu = _int(labels.get(contract.LABEL_GPU))
        if gpu is None:
            return _IGNORED
        uuid = labels.get(contract.LABEL_UUID, "")[:MAX_LABEL_TEXT]
        if gi is not None:
            return Series(GPU_VALUE, gpu=gpu, slot=gi, uuid=uuid)
        bit = THROTTLE_BIT.get(labels.get(contract.LABEL_REASON, ""), 0)
        return Series(GPU_CLOCK_EVENT, gpu=gpu, throttle_bit=bit, uuid=uuid)
    if name == contract.GPU_TELEMETRY_AVAILABLE.name:
        reason = labels.get(contract.LABEL_REASON, "")[:MAX_LABEL_TEXT]
        return Series(TELEMETRY, reason=reason)
    rank = _int(labels.get(contract.LABEL_RANK))
    steps = labels.get(contract.LABEL_LOCAL_RANK, "?")[:MAX_LABEL_TEXT] if name == _STEPS else None
    if rank is None:
        return _IGNORED if steps is None else Series(STEPS_UNRANKED, steps_local_rank=steps)
    local = _int(labels.get(contract.LABEL_LOCAL_RANK))
    node = _int(labels.get(contract.LABEL_NODE_RANK))
    if steps is not None:
        return Series(RANK_STEPS, rank, local, node, slot=R_STEPS, steps_local_rank=steps)
    ri = _RANK_FIELDS.get(name)
    if ri == R_CUDA_RESERVED and contract.LABEL_UUID in labels:
        cuda = labels[contract.LABEL_UUID][:MAX_LABEL_TEXT]
        return Series(RANK_CUDA, rank, local, node, slot=ri, uuid=cuda)
    if ri is not None:
        return Series(RANK_VALUE, rank, local, node, slot=ri)
    slot = -1
    if name == contract.PHASE_SECONDS.name:
        slot = R_PHASE.get(labels.get(contract.LABEL_PHASE, ""), -1)
    elif name == contract.CURRENT_PHASE.name:
        ci = _PHASE_INDEX.get(labels.get(contract.LABEL_PHASE, ""))
        if ci is not None:
            return Series(RANK_PHASE, rank, local, node, phase=int(ci))
    elif name == contract.PEAK_FLOPS.name:
        device = labels.get(contract.LABEL_DEVICE, "")[:MAX_LABEL_TEXT]
        return Series(
            RANK_PEAK, rank, local, node, peak_code=_peak_code(labels), device_name=device
        )
    elif name == contract.RANK_DEVICE.name:
        return Series(RANK_DEVICE, rank, local, node, uuid=labels.get(contract.LABEL_UUID, ""))
    elif name == _BUCKETS:
        le = labels.get("le", "")
        idx = N_BUCKETS - 1 if le == "+Inf" else _BUCKET_INDEX.get(_float(le), -1)
        slot = R_BUCKET0 + idx if idx >= 0 else -1
    if slot >= 0:
        return Series(RANK_VALUE, rank, local, node, slot=slot)
    return Series(RANK_SEEN, rank, local, node)


_Pairs = tuple[tuple[str, str], ...]
SeriesKey = TypeVar("SeriesKey", str, tuple[str, _Pairs])
"""A series as the cache knows it: its text in a canonical payload (the scraper's path), or
its name and label pairs (parsed samples)."""

_SERIES: dict[str | tuple[str, _Pairs], Series] = {}
"""The series cache: the same series come back scrape after scrape, job after job."""
_SERIES_MAX: Final = 65536
_SERIES_MAX_CHARS: Final = 8 * 2**20
"""The cache's keys hold at most this many characters in all."""
_SERIES_MAX_KEY: Final = 512
"""Longer series (unusual label values) are decoded every time, never kept."""
_series_chars = 0


def _keep(key: str | tuple[str, _Pairs], s: Series, chars: int) -> None:
    global _series_chars
    if chars > _SERIES_MAX_KEY:
        return
    if len(_SERIES) >= _SERIES_MAX or _series_chars > _SERIES_MAX_CHARS:
        _SERIES.clear()
        _series_chars = 0
    _SERIES[key] = s
    _series_chars += chars


def series_cache_size() -> tuple[int, int]:
    """(entries, characters of keys) the series cache holds (for tests and benches)."""
    return len(_SERIES), _series_chars


_RANK_TEMPLATE: Final = array("d", [NAN]) * R_WIDTH
_GPU_TEMPLATE: Final = array("d", [NAN]) * G_WIDTH


def _build(
    found: Iterable[tuple[SeriesKey, float | str]],
    t: float,
    learn: Callable[[SeriesKey], Series],
) -> Frame:
    """The frame of a payload's series in payload order, each with its value (a float, or
    its text, converted only where used): the one place a value lands in a frame. Each
    series is looked up in the cache, and decoded by ``learn`` (which keeps it) when new."""
    known = _SERIES.get
    ranks: dict[int, array[float]] = {}
    cuda_uuid: dict[int, str] = {}
    gpus: dict[int, tuple[str, array[float]]] = {}
    local: dict[int, int] = {}
    node: dict[int, int] = {}
    telemetry: str | None = None
    steps: list[str] = []
    devices: dict[int, dict[int, str]] = {}
    names: dict[int, str] = {}
    for key, value in found:
        s = known(key)
        if s is None:
            s = learn(key)
        kind = s.kind
        if kind <= RANK_DEVICE:
            rank = s.rank
            row = ranks.get(rank)
            if row is None:
                row = ranks[rank] = _RANK_TEMPLATE[:]
                row[0] = t
                if s.local_rank is not None:
                    local[rank] = s.local_rank
                if s.node_rank is not None:
                    node[rank] = s.node_rank
            if kind == RANK_VALUE:
                row[s.slot] = float(value)
            elif kind == RANK_STEPS:
                row[s.slot] = float(value)
                steps.append(s.steps_local_rank)
            elif kind == RANK_CUDA:
                row[s.slot] = float(value)
                cuda_uuid[rank] = s.uuid
            elif kind == RANK_PHASE:
                if float(value) > 0:
                    row[R_CURRENT_PHASE] = float(s.phase)
            elif kind == RANK_PEAK:
                _put_peak(row, s.peak_code, float(value))
                names[rank] = s.device_name
            elif kind == RANK_DEVICE:
                _put_device(devices, rank, s.uuid, float(value))
        elif kind <= GPU_CLOCK_EVENT:
            entry = gpus.get(s.gpu)
            if entry is None:
                grow = _GPU_TEMPLATE[:]
                grow[0] = t
                entry = gpus[s.gpu] = (s.uuid, grow)
            grow = entry[1]
            if kind == GPU_VALUE:
                grow[s.slot] = float(value)
            elif s.throttle_bit:
                cur = grow[G_THROTTLE]
                mask = 0 if cur != cur else int(cur)
                bit = s.throttle_bit
                grow[G_THROTTLE] = float(mask | bit) if float(value) > 0 else float(mask)
        elif kind == TELEMETRY:
            v = float(value)
            if telemetry is None or v > 0:
                telemetry = contract.TELEMETRY_OK if v > 0 else s.reason or "unknown"
        elif kind == STEPS_UNRANKED:
            steps.append(s.steps_local_rank)
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


def frame(samples: Iterable[Sample], t: float) -> Frame:
    """Boil one endpoint's samples down to rows (samples the frame does not read, or without
    the label they need, are skipped)."""
    found = (((name, tuple(labels.items())), value) for name, labels, value, _ in samples)
    return _build(found, t, _learn_sample)


def _learn_sample(key: tuple[str, _Pairs]) -> Series:
    name, pairs = key
    s = decode(name, dict(pairs))
    _keep(key, s, len(name) + sum(len(k) + len(v) for k, v in pairs))
    return s


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


class _Fallback(Exception):
    """The fast path met something only the general parser decides (a duplicate label)."""


def _series(text: str) -> Series:
    """The `Series` of one series' text in a canonical payload (name, then its label
    block), decoded by `decode`, the labels split by `expfmt.label_set`."""
    brace = text.find("{")
    if brace < 0:
        return decode(text, {})
    if text[:brace] not in NEEDED:
        return _IGNORED
    labels = label_set(text[brace + 1 : -1])
    if labels is None:
        raise _Fallback(text)
    return decode(text[:brace], labels)


def _learn_text(text: str) -> Series:
    s = _series(text)
    _keep(text, s, len(text))
    return s


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
    # A large payload (parsed on a worker thread) is searched with finditer, which hands the
    # GIL back between lines instead of holding it for one long C call; findall is faster.
    found: Iterable[tuple[str, str]] = (
        _OURS.findall("\n" + text)
        if len(text) <= _BLOCK
        else ((m[1], m[2]) for m in _OURS.finditer("\n" + text))
    )
    return _build(found, t, _learn_text)
