"""Python twins of the Kubernetes string formats and quantities the API's CEL rules use.

The CRD's rules call the API server's CEL libraries (``format.qualifiedName()``,
``format.labelValue()``, ``format.dns1123Label()``, ``format.dns1123Subdomain()``,
``isQuantity()``/``quantity()``); the pydantic model must refuse exactly what they refuse,
so these predicates follow apimachinery's definitions (``util/validation`` and
``api/resource.ParseQuantity``). Pure functions, no Kubernetes client.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from typing import Final

_DNS1123_LABEL: Final = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_DNS1123_SUBDOMAIN: Final = re.compile(
    r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
)
_QUALIFIED_NAME_PART: Final = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
_CONFIG_KEY: Final = re.compile(r"[-._a-zA-Z0-9]+")

# Suffixes of resource.Quantity: decimal SI (power of 10) and binary SI (power of 2).
_DECIMAL_SI: Final = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12}
_DECIMAL_SI_BIG: Final = {"P": 15, "E": 18}
_BINARY_SI: Final = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
_SUFFIX_CHARS: Final = frozenset("eEinumkKMGTP")


def is_dns1123_label(value: str) -> bool:
    """A DNS-1123 label: <= 63 lowercase alphanumerics or '-', alphanumeric at both ends."""
    return len(value) <= 63 and _DNS1123_LABEL.fullmatch(value) is not None


def is_dns1123_subdomain(value: str) -> bool:
    """A DNS-1123 subdomain: dot-separated labels, <= 253 characters in all."""
    return len(value) <= 253 and _DNS1123_SUBDOMAIN.fullmatch(value) is not None


def is_qualified_name(value: str) -> bool:
    """A label/annotation key: ``[prefix/]name``, prefix a DNS subdomain, name <= 63 chars."""
    parts = value.split("/")
    if len(parts) == 1:
        name = parts[0]
    elif len(parts) == 2:
        prefix, name = parts
        if not prefix or not is_dns1123_subdomain(prefix):
            return False
    else:
        return False
    return 0 < len(name) <= 63 and _QUALIFIED_NAME_PART.fullmatch(name) is not None


def is_label_value(value: str) -> bool:
    """A label value: empty, or <= 63 alphanumerics, '-', '_' or '.', alphanumeric at both ends."""
    return value == "" or (len(value) <= 63 and _QUALIFIED_NAME_PART.fullmatch(value) is not None)


def is_config_key(value: str) -> bool:
    """A ConfigMap/Secret key: <= 253 alphanumerics, '-', '_' or '.'."""
    return len(value) <= 253 and _CONFIG_KEY.fullmatch(value) is not None


def is_env_name(value: str) -> bool:
    """An env var name (relaxed rule, GA since 1.34): printable ASCII other than '='."""
    return bool(value) and all(" " <= c <= "~" and c != "=" for c in value)


def _digits(s: str, pos: int) -> int:
    while pos < len(s) and s[pos].isdigit() and s[pos].isascii():
        pos += 1
    return pos


def parse_quantity(text: str | int) -> Decimal | None:
    """The value of a resource.Quantity string (or integer), or None where the server refuses it.

    Follows ``resource.ParseQuantity``: an optional sign, digits with an optional fraction
    (either part may be empty), then a decimal SI, binary SI or ``e<exponent>`` suffix.
    """
    if isinstance(text, bool):
        return None
    if isinstance(text, int):
        return Decimal(text)
    s = text
    if not s:
        return None
    pos = 1 if s[0] in "+-" else 0
    negative = s[:1] == "-"
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
    pos = _digits(s, pos)
    if pos != len(s):
        return None
    suffix = s[suffix_start:]
    try:
        number = Decimal(f"{whole or '0'}.{frac or '0'}")
    except InvalidOperation:
        return None
    if suffix in _BINARY_SI:
        value = number * (Decimal(2) ** _BINARY_SI[suffix])
    elif suffix in _DECIMAL_SI or suffix in _DECIMAL_SI_BIG:
        value = number.scaleb(_DECIMAL_SI.get(suffix, _DECIMAL_SI_BIG.get(suffix, 0)))
    elif len(suffix) > 1 and suffix[0] in "eE" and re.fullmatch(r"[+-]?[0-9]+", suffix[1:]):
        exponent = int(suffix[1:])
        if not -(2**31) <= exponent < 2**31:
            return None
        value = number.scaleb(exponent)
    else:
        return None
    return -value if negative else value


def is_quantity(text: str | int) -> bool:
    """Whether the API server parses ``text`` as a resource.Quantity."""
    return parse_quantity(text) is not None
