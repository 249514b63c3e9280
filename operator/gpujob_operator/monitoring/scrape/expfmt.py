"""A lean parser of the Prometheus text exposition format (0.0.4).

The operator scrapes thousands of ranks, and each payload carries many series it never
reads (process and Python runtime metrics, a user's own, `_created` twins). So this parser
fully decodes only the sample names it is asked for (by default every series of the metrics
contract) and skips any other line after a cheap check that it starts with a metric name,
which still tells an HTML error page or binary junk apart from an exposition.

Anything malformed raises :class:`ParseError` and nothing else, so the scraper can report
"garbage" for one endpoint without guarding against a zoo of exceptions.
"""

from __future__ import annotations

import math
import re
from collections.abc import Collection, Iterable
from typing import Final, NamedTuple

from gpujob_trainer import contract


class ParseError(ValueError):
    """The payload is not a valid text exposition; the message says where and why."""


class Sample(NamedTuple):
    """One sample line: name (as exposed, e.g. with `_total` or `_bucket`), labels, value."""

    name: str
    labels: dict[str, str]
    value: float
    timestamp: float | None = None
    """Seconds since the epoch when the line carried a timestamp (exposed in ms)."""


def sample_names(specs: Iterable[contract.MetricSpec]) -> frozenset[str]:
    """The sample names the given families expose (histograms: `_bucket/_sum/_count`)."""
    out: set[str] = set()
    for spec in specs:
        if spec.type == "histogram":
            out.update(spec.name + s for s in ("_bucket", "_sum", "_count"))
        else:
            out.add(spec.name)
    return frozenset(out)


WANTED: Final = sample_names(contract.ALL_METRICS)
"""Every sample name of the contract: what the analysis reads."""

_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL_NAME = re.compile(r"[ \t]*([a-zA-Z_][a-zA-Z0-9_]*)[ \t]*=[ \t]*\"")
# The common line, labels without escapes, in one match: name, label body, value, timestamp.
_FAST_LINE = re.compile(
    r'([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{([^"\\{}]*(?:"[^"\\]*"[^"\\{}]*)*)\})?'
    r"[ \t]+(\S+)(?:[ \t]+(\S+))?[ \t]*"
)
_FAST_PAIR = re.compile(r'[ \t]*([a-zA-Z_][a-zA-Z0-9_]*)[ \t]*=[ \t]*"([^"\\]*)"[ \t]*(?:,|$)')
_ESCAPES: Final = {"\\": "\\", "n": "\n", '"': '"'}
_TYPES: Final = frozenset({"counter", "gauge", "histogram", "summary", "untyped", "info"})
_MAX_ERROR_LINE = 120


def _error(lineno: int, line: str, why: str) -> ParseError:
    shown = line if len(line) <= _MAX_ERROR_LINE else line[:_MAX_ERROR_LINE] + "..."
    return ParseError(f"line {lineno}: {why}: {shown!r}")


def common_prefix(names: Collection[str]) -> str:
    """The longest prefix every name shares (lines without it are none of the wanted)."""
    if not names:
        return ""
    lo, hi = min(names), max(names)
    i = 0
    while i < len(lo) and i < len(hi) and lo[i] == hi[i]:
        i += 1
    return lo[:i]


def parse(text: str | bytes, wanted: Collection[str] | None = WANTED) -> list[Sample]:
    """Samples whose name is in `wanted` (None: all), in payload order.

    Raises ParseError on a malformed payload (including lines it would skip whose start
    is not a metric name). Comments other than a `# TYPE` with an unknown type are ignored.
    """
    if isinstance(text, bytes | bytearray | memoryview):
        try:
            text = bytes(text).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ParseError(f"not UTF-8 text: {exc}") from None
    if wanted is None:
        prefix = ""
    elif wanted is WANTED:
        prefix = _WANTED_PREFIX
    else:
        prefix = common_prefix(wanted)
    out: list[Sample] = []
    for lineno, raw in enumerate(text.split("\n"), 1):
        line = raw[:-1] if raw.endswith("\r") else raw
        if not line:
            continue
        first = line[0]
        if first == "#":
            _check_comment(lineno, line)
            continue
        if first in " \t":
            line = line.lstrip(" \t")
            if not line:
                continue
        if wanted is not None and not line.startswith(prefix):
            _check_skipped(lineno, line)
            continue
        fast = _FAST_LINE.fullmatch(line)
        if fast is not None:
            name = fast.group(1)
            if wanted is not None and name not in wanted:
                continue
            sample = _fast_sample(lineno, line, fast)
            if sample is not None:
                out.append(sample)
                continue
        m = _NAME.match(line)
        if m is None:
            raise _error(lineno, line, "expected a metric name")
        name = m.group()
        pos = m.end()
        if wanted is not None and name not in wanted:
            if pos < len(line) and line[pos] not in "{ \t":
                raise _error(lineno, line, "invalid character after the metric name")
            continue
        out.append(_sample(lineno, line, name, pos))
    return out


_WANTED_PREFIX: Final = common_prefix(WANTED)


def _check_comment(lineno: int, line: str) -> None:
    if line.startswith("# TYPE"):
        parts = line.split()
        if len(parts) != 4 or _NAME.fullmatch(parts[2]) is None or parts[3] not in _TYPES:
            raise _error(lineno, line, "malformed TYPE line")


def _check_skipped(lineno: int, line: str) -> None:
    m = _NAME.match(line)
    if m is None:
        raise _error(lineno, line, "expected a metric name")
    end = m.end()
    if end >= len(line) or line[end] not in "{ \t":
        raise _error(lineno, line, "expected labels or a value after the metric name")


_LABEL_CACHE: dict[str, dict[str, str] | None] = {}
_LABEL_CACHE_MAX: Final = 65536
_LABEL_CACHE_MAX_BYTES: Final = 8 * 2**20
"""Label bodies are cached up to this many characters in all (keys and values, ~3x)."""
_LABEL_CACHE_MAX_KEY: Final = 512
"""Longer label bodies are decoded every time, never kept (they are not a trainer's)."""
_label_cache_bytes = 0


def label_set(body: str) -> dict[str, str] | None:
    """The labels of an escape-free label body (the text between the braces); None when it
    needs the full parser (an escape, a duplicate name, anything odd).

    The one splitter of label bodies: this parser's fast lines and the scraper's one-pass
    path (`frame.frame_payload`) both use it, so they cannot read a label set differently.
    """
    labels: dict[str, str] = {}
    end = 0
    for pair in _FAST_PAIR.finditer(body):
        key = pair.group(1)
        if pair.start() != end or key in labels:
            return None
        labels[key] = pair.group(2)
        end = pair.end()
    if end != len(body) and body[end:].strip(" \t"):
        return None
    return labels


def _fast_labels(body: str) -> dict[str, str] | None:
    """`label_set(body)`, cached.

    Scrape after scrape the same label sets come back (rank labels do not vary between
    jobs either), so decoded sets are cached: the returned dict is shared, never mutate it.
    """
    try:
        return _LABEL_CACHE[body]
    except KeyError:
        pass
    labels = label_set(body)
    if len(body) <= _LABEL_CACHE_MAX_KEY:
        global _label_cache_bytes
        if len(_LABEL_CACHE) >= _LABEL_CACHE_MAX or _label_cache_bytes > _LABEL_CACHE_MAX_BYTES:
            _LABEL_CACHE.clear()
            _label_cache_bytes = 0
        _LABEL_CACHE[body] = labels
        _label_cache_bytes += 3 * len(body)
    return labels


def label_cache_size() -> tuple[int, int]:
    """(entries, approximate characters) the label cache holds (for tests and benches)."""
    return len(_LABEL_CACHE), _label_cache_bytes


def _fast_sample(lineno: int, line: str, m: re.Match[str]) -> Sample | None:
    """The sample of a line the fast pattern matched; None defers to the full parser."""
    name, body, value_text, ts_text = m.groups()
    if body:
        labels = _fast_labels(body)
        if labels is None:
            return None
    else:
        labels = {}
    value = _float(lineno, line, value_text)
    ts: float | None = None
    if ts_text is not None:
        try:
            ts = int(ts_text) / 1000.0
        except ValueError:
            raise _error(lineno, line, "timestamp is not an integer (milliseconds)") from None
    return Sample(name, labels, value, ts)


def _sample(lineno: int, line: str, name: str, pos: int) -> Sample:
    labels: dict[str, str] = {}
    n = len(line)
    if pos < n and line[pos] == "{":
        pos = _labels(lineno, line, pos + 1, labels)
    elif pos < n and line[pos] not in " \t":
        raise _error(lineno, line, "invalid character after the metric name")
    rest = line[pos:].split()
    if not rest or len(rest) > 2:
        raise _error(lineno, line, "expected a value and an optional timestamp")
    value = _float(lineno, line, rest[0])
    ts: float | None = None
    if len(rest) == 2:
        try:
            ts = int(rest[1]) / 1000.0
        except ValueError:
            raise _error(lineno, line, "timestamp is not an integer (milliseconds)") from None
    return Sample(name, labels, value, ts)


def _labels(lineno: int, line: str, i: int, labels: dict[str, str]) -> int:
    """Parse `name="value",...}` from index i into labels; returns the index after `}`."""
    n = len(line)
    while True:
        while i < n and line[i] in " \t":
            i += 1
        if i < n and line[i] == "}":
            return i + 1
        m = _LABEL_NAME.match(line, i)
        if m is None:
            raise _error(lineno, line, 'expected label="value"')
        key = m.group(1)
        i = m.end()
        j = line.find('"', i)
        if j < 0:
            raise _error(lineno, line, "unterminated label value")
        if line.find("\\", i, j) < 0:
            value = line[i:j]
            i = j + 1
        else:
            value, i = _unescape(lineno, line, i)
        if key in labels:
            raise _error(lineno, line, f"duplicate label {key!r}")
        labels[key] = value
        while i < n and line[i] in " \t":
            i += 1
        if i >= n:
            raise _error(lineno, line, "unterminated label set")
        if line[i] == ",":
            i += 1
        elif line[i] != "}":
            raise _error(lineno, line, "expected ',' or '}' after a label value")


def _unescape(lineno: int, line: str, i: int) -> tuple[str, int]:
    """Decode a quoted value starting at i (after the opening quote), as Prometheus does:
    `\\\\`, `\\"` and `\\n` are escapes, any other backslash is kept verbatim."""
    out: list[str] = []
    n = len(line)
    while i < n:
        c = line[i]
        if c == '"':
            return "".join(out), i + 1
        if c == "\\" and i + 1 < n:
            nxt = line[i + 1]
            if nxt in _ESCAPES:
                out.append(_ESCAPES[nxt])
                i += 2
                continue
        out.append(c)
        i += 1
    raise _error(lineno, line, "unterminated label value")


def _float(lineno: int, line: str, token: str) -> float:
    if "_" in token:
        raise _error(lineno, line, f"invalid value {token!r}")
    try:
        return float(token)
    except ValueError:
        raise _error(lineno, line, f"invalid value {token!r}") from None


def is_finite(value: float) -> bool:
    """True for a real number (neither NaN nor an infinity)."""
    return not (math.isnan(value) or math.isinf(value))
