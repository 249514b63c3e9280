"""Python twins of the Kubernetes string formats the API's CEL rules use.

The CRD's rules call the API server's CEL libraries (``format.qualifiedName()``,
``format.labelValue()``, ``format.dns1123Label()``, ``format.dns1123Subdomain()``); the
pydantic model must refuse exactly what they refuse, so these predicates follow
apimachinery's definitions (``util/validation``). Quantities (``isQuantity()``,
``quantity()``) have their own module, :mod:`gpujob_operator.api.quantity`, which every
reader of a quantity shares. Pure functions, no Kubernetes client.
"""

from __future__ import annotations

import re
from typing import Final

_DNS1123_LABEL: Final = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_DNS1123_SUBDOMAIN: Final = re.compile(
    r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
)
_QUALIFIED_NAME_PART: Final = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
_CONFIG_KEY: Final = re.compile(r"[-._a-zA-Z0-9]+")


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
