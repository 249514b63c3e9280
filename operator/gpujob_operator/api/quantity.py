"""Kubernetes resource quantities ("500m", "2Gi", "1e3"): the one reader, as core/v1 reads them.

The CRD's rules (CEL ``quantity()``), the pod rules' Python twins, the start forecast and the
gang probe all read quantities; they must agree with the API server and with each other, so
they all call :func:`parse_quantity`. It follows apimachinery's ``resource.ParseQuantity``:
an optional sign, digits with an optional fraction (either part may be empty), then a decimal
SI suffix (n u m k M G T P E), a binary SI one (Ki Mi Gi Ti Pi Ei) or an exponent
(``e3``, ``E-3``); then, as the server does, a non-zero value is rounded up to a whole
number of nanos, and one with an SI suffix is capped at 2^63-1. Pure, no Kubernetes client.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from decimal import (
    MAX_EMAX,
    MAX_PREC,
    MIN_EMIN,
    ROUND_CEILING,
    ROUND_UP,
    Context,
    Decimal,
    InvalidOperation,
)
from typing import Final

_DECIMAL_SI: Final = {
    "n": -9,
    "u": -6,
    "m": -3,
    "": 0,
    "k": 3,
    "M": 6,
    "G": 9,
    "T": 12,
    "P": 15,
    "E": 18,
}
_BINARY_SI: Final = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
_SUFFIX_CHARS: Final = frozenset("eEinumkKMGTP")
_EXPONENT: Final = re.compile(r"[eE][+-]?[0-9]+")
MAX_EXPONENT_DIGITS: Final = 3
"""Digits an exponent (1e3, 2E-9) may have here and in the CRD's rules. The API server's
quantity parser spends time and memory that grow with the exponent's value: on one dry-run
create, "1e10000000" took 5 s of its CPU and 900 MB, "1e99999999999" 35 s until the request
timed out (a Pod's resources as much). No resource needs more than e999."""
LONG_EXPONENT: Final = f"[eE][+-]?[0-9]{{{MAX_EXPONENT_DIGITS + 1}}}"
"""A longer exponent than that, as a regular expression both Python and CEL (RE2) read."""
_LONG_EXPONENT: Final = re.compile(LONG_EXPONENT)
_NANO: Final = Decimal("1e-9")
MAX_VALUE: Final = Decimal(2**63 - 1)
"""The server caps a quantity with an SI suffix (or none) here; an exponent is not capped."""

# Parsing is exact (the digits it keeps are bounded by the text's length). Sums keep 64
# digits: exact for any real request (19 digits and 9 decimals), and bounded for a
# nonsense one ("1e999999999" plus "1m" would need a billion digits exactly).
_EXACT: Final = Context(prec=MAX_PREC, Emax=MAX_EMAX, Emin=MIN_EMIN)
_SUMS: Final = Context(prec=64, Emax=MAX_EMAX, Emin=MIN_EMIN)


def _digits(s: str, pos: int) -> int:
    while pos < len(s) and "0" <= s[pos] <= "9":
        pos += 1
    return pos


def parse_quantity(value: object) -> Decimal | None:
    """The value of a quantity (text, or a JSON number), or None where core/v1 refuses it.

    A bool, any other type, surrounding spaces or a bad suffix ("1ki", "1Mb", "1e") are
    refused; a bare sign or suffix ("-", "Mi") reads as zero, as the server reads it.
    """
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        return None
    s = value if isinstance(value, str) else str(value)
    if not s:
        return None
    negative = s[0] == "-"
    pos = 1 if s[0] in "+-" else 0
    start = pos
    pos = _digits(s, pos)
    whole = s[start:pos]
    frac = ""
    if pos < len(s) and s[pos] == ".":
        fstart = pos + 1
        pos = _digits(s, fstart)
        frac = s[fstart:pos]
    suffix_start = pos
    while pos < len(s) and s[pos] in _SUFFIX_CHARS:
        pos += 1
    if pos < len(s) and s[pos] in "+-":
        pos += 1
    if _digits(s, pos) != len(s):
        return None
    suffix = s[suffix_start:]
    try:
        number = Decimal(f"{whole or '0'}.{frac}" if frac else whole or "0")
    except InvalidOperation:
        return None
    capped = True
    if suffix in _BINARY_SI:
        q = _EXACT.multiply(number, Decimal(1 << _BINARY_SI[suffix]))
    elif suffix in _DECIMAL_SI:
        q = number.scaleb(_DECIMAL_SI[suffix], _EXACT)
    elif _EXPONENT.fullmatch(suffix):
        exponent = int(suffix[1:])
        if not -(2**31) <= exponent < 2**31:
            return None
        q = number.scaleb(exponent, _EXACT)
        capped = False
    else:
        return None
    if capped and q > MAX_VALUE:
        q = MAX_VALUE
    elif q and isinstance(exp := q.as_tuple().exponent, int) and exp < -9:
        q = q.quantize(_NANO, rounding=ROUND_UP, context=_EXACT)
    return -q if negative else q


def crd_quantity(value: object) -> Decimal | None:
    """A quantity as the CRD's rules read a job's field: :func:`parse_quantity`, and None
    for an exponent longer than :data:`MAX_EXPONENT_DIGITS` digits, which they refuse before
    the API server's parser sees it (a pod's own quantity, read back, may have one)."""
    if isinstance(value, str) and _LONG_EXPONENT.search(value):
        return None
    return parse_quantity(value)


def is_quantity(value: object) -> bool:
    """Whether the API server reads ``value`` as a resource.Quantity."""
    return parse_quantity(value) is not None


def add(a: Decimal, b: Decimal) -> Decimal:
    """``a + b``, exact for any quantity a pod may ask for (see ``_SUMS``)."""
    return _SUMS.add(a, b)


def total(values: Iterable[Decimal]) -> Decimal:
    """The sum of ``values`` (0 for none), as :func:`add` adds."""
    out = Decimal(0)
    for v in values:
        out = _SUMS.add(out, v)
    return out


def format_quantity(value: Decimal) -> str:
    """The shortest exact text the server reads back as ``value``: "4", "1500m", "250n"
    (rounded up past nanos, as the server rounds), or "1.5e+40" for a huge one."""
    if value.adjusted() >= 30:
        return f"{value.normalize(_EXACT):e}"
    for shift, suffix in ((0, ""), (3, "m"), (9, "n")):
        scaled = value.scaleb(shift, _EXACT)
        if scaled == scaled.to_integral_value():
            return f"{int(scaled)}{suffix}"
    return f"{int(value.scaleb(9, _EXACT).to_integral_value(rounding=ROUND_CEILING))}n"
