"""Per-pod compute resources besides GPUs: core/v1 requests and limits, and their rules.

Resource names, whole-number extended resources, hugepages sizes, requests <= limits, and
requests == limits where core/v1 cannot overcommit. GPUs are the spec's own field
(``spec.gpusPerNode``), so :data:`GPU_RESOURCE` is refused here.
"""

from __future__ import annotations

from decimal import Decimal
from typing import ClassVar, Final

from pydantic import ConfigDict, Field

from gpujob_operator.api import k8sformats as kf
from gpujob_operator.api import rules as R
from gpujob_operator.api.base import NamedPassthrough, ResourceQuantity
from gpujob_operator.api.base import Ruled as _Ruled
from gpujob_operator.api.base import quantity_value as _q
from gpujob_operator.api.quantity import crd_quantity, parse_quantity

GPU_RESOURCE: Final = "nvidia.com/gpu"

_STANDARD_RESOURCES: Final = ("cpu", "memory", "ephemeral-storage")


def _extended(name: str) -> bool:
    """Not in the kubernetes.io namespace: an extended resource (device plugins)."""
    return "/" in name and "kubernetes.io/" not in name


def _exact(name: str) -> bool:
    """Resources that cannot be overcommitted: requests must equal limits."""
    return _extended(name) or name.startswith("hugepages-")


# core/v1 wants a whole number (MilliValue % 1000 == 0, so "1000m" is fine). CEL's
# quantity.isInteger() refuses any negative scale ("1000m"), so compare the value with its
# truncation as a float instead (exact far beyond any device count; capped below 2^63).
_CEL_WHOLE: Final = "({f} < 9.0e18 && {f} == double(int({f})))"


def _whole(q: Decimal) -> bool:
    """Python twin of ``_CEL_WHOLE``."""
    f = float(q)
    return f < 9.0e18 and f == float(int(f))


def _resource_name_ok(name: str) -> bool:
    if not kf.is_qualified_name(name):
        return False
    if "/" not in name:
        return name in _STANDARD_RESOURCES or name.startswith("hugepages-")
    return not _extended(name) or kf.is_qualified_name("requests." + name)


_CEL_RESOURCE_NAME: Final = (
    f"{R.CEL_QUALIFIED.format(x='k')} && "
    "(k.contains('/') ? (k.contains('kubernetes.io/') || "
    f"{R.CEL_QUALIFIED.format(x=chr(39) + 'requests.' + chr(39) + ' + k')}) : "
    "(k in ['cpu', 'memory', 'ephemeral-storage'] || k.startsWith('hugepages-')))"
)


def _resource_list_rules(part: str) -> tuple[R.Rule, ...]:
    path = f"spec.resources.{part}"
    return (
        R.Rule(
            f"!has(self.{part}) || self.{part}.all(k, {_CEL_RESOURCE_NAME})",
            f"{path} names must be cpu, memory, ephemeral-storage, hugepages-SIZE or a "
            "domain-prefixed extended resource such as example.com/foo",
            lambda m: all(_resource_name_ok(k) for k in getattr(m, part) or {}),
            field_path=f".{part}",
        ),
        R.Rule(
            f"!has(self.{part}) || self.{part}.all(k, !k.contains('/') || "
            "k.contains('kubernetes.io/') || "
            f"!{R.CEL_QUANTITY.format(x=f'self.{part}[k]')} || "
            + _CEL_WHOLE.format(
                f=f"{R.CEL_QUANTITY_OF.format(x=f'self.{part}[k]')}.asApproximateFloat()"
            )
            + ")",
            f"{path}: extended resources (such as example.com/foo) must be whole numbers",
            lambda m: all(
                not _extended(k) or (q := crd_quantity(v)) is None or _whole(q)
                for k, v in (getattr(m, part) or {}).items()
            ),
            field_path=f".{part}",
        ),
        R.Rule(
            f"!has(self.{part}) || self.{part}.all(k, !k.startsWith('hugepages-') || "
            f"!{R.CEL_QUANTITY.format(x=f'self.{part}[k]')} || "
            # The SIZE in the key is not guarded against a long exponent as the amounts
            # are: a regular expression over a map key (no maxLength) exceeds the CRD's
            # CEL cost budget.
            "(isQuantity(k.substring(10)) && "
            "quantity(k.substring(10)).compareTo(quantity('0')) > 0 && "
            + _CEL_WHOLE.format(
                f=f"({R.CEL_QUANTITY_OF.format(x=f'self.{part}[k]')}.asApproximateFloat() / "
                "quantity(k.substring(10)).asApproximateFloat())"
            )
            + "))",
            f"{path}: hugepages-SIZE amounts must be whole multiples of SIZE "
            "(e.g. hugepages-2Mi: 64Mi)",
            lambda m: all(_hugepages_ok(k, v) for k, v in (getattr(m, part) or {}).items()),
            field_path=f".{part}",
        ),
    )


def _hugepages_ok(name: str, value: int | str) -> bool:
    """core/v1: a hugepages-SIZE amount is a whole number of pages of a positive SIZE."""
    if not name.startswith("hugepages-") or (q := crd_quantity(value)) is None:
        return True
    size = parse_quantity(name.removeprefix("hugepages-"))  # unguarded, as in the CEL rule
    return size is not None and size > 0 and _whole(Decimal(float(q) / float(size)))


def _req_lim(m: ResourceRequirements, name: str) -> tuple[Decimal | None, Decimal | None]:
    return _q((m.requests or {}).get(name)), _q((m.limits or {}).get(name))


_CEL_REQ: Final = "quantity(string(self.requests[k]))"
_CEL_LIM: Final = "quantity(string(self.limits[k]))"
_CEL_BOTH_QUANTITIES: Final = (
    f"{R.CEL_QUANTITY.format(x='self.requests[k]')} && {R.CEL_QUANTITY.format(x='self.limits[k]')}"
)
_CEL_EXACT: Final = (
    "(k.startsWith('hugepages-') || (k.contains('/') && !k.contains('kubernetes.io/')))"
)


class ResourceRequirements(_Ruled):
    """Per-node (per-pod) compute resources besides GPUs, as in core/v1."""

    RULES: ClassVar = (
        R.Rule(
            "(!has(self.requests) || !('nvidia.com/gpu' in self.requests)) && "
            "(!has(self.limits) || !('nvidia.com/gpu' in self.limits))",
            "spec.resources must not set nvidia.com/gpu: use spec.gpusPerNode",
            lambda m: (
                GPU_RESOURCE not in (m.requests or {}) and GPU_RESOURCE not in (m.limits or {})
            ),
        ),
        *_resource_list_rules("requests"),
        *_resource_list_rules("limits"),
        R.Rule(
            "!has(self.requests) || !has(self.limits) || self.requests.all(k, "
            f"!(k in self.limits) || !({_CEL_BOTH_QUANTITIES}) || "
            f"{_CEL_REQ}.compareTo({_CEL_LIM}) <= 0)",
            "spec.resources.requests must be <= spec.resources.limits for every resource",
            lambda m: all(
                r is None or lim is None or r <= lim
                for r, lim in (_req_lim(m, k) for k in m.requests or {})
            ),
        ),
        R.Rule(
            f"!has(self.requests) || self.requests.all(k, !{_CEL_EXACT} || "
            f"(has(self.limits) && k in self.limits && (!({_CEL_BOTH_QUANTITIES}) || "
            f"{_CEL_REQ}.compareTo({_CEL_LIM}) == 0)))",
            "spec.resources: hugepages and extended resources need limits equal to requests",
            lambda m: all(
                not _exact(k)
                or (k in (m.limits or {}) and (None in (rl := _req_lim(m, k)) or rl[0] == rl[1]))
                for k in m.requests or {}
            ),
        ),
        R.Rule(
            "!([has(self.requests) ? self.requests : {}, has(self.limits) ? self.limits : {}]"
            ".exists(l, l.exists(k, k.startsWith('hugepages-')))) || "
            "[has(self.requests) ? self.requests : {}, has(self.limits) ? self.limits : {}]"
            ".exists(l, 'cpu' in l || 'memory' in l)",
            "spec.resources: hugepages need a cpu or memory request or limit",
            lambda m: (
                not any(
                    k.startswith("hugepages-")
                    for part in (m.requests, m.limits)
                    for k in part or {}
                )
                or any(
                    k in (part or {}) for part in (m.requests, m.limits) for k in ("cpu", "memory")
                )
            ),
        ),
    )
    model_config = ConfigDict(json_schema_extra=R.validations(*RULES))

    requests: dict[str, ResourceQuantity] | None = Field(
        default=None,
        max_length=16,
        description='Minimum resources per pod, e.g. {cpu: "8", memory: 64Gi}. Quote fractions '
        '("0.5").',
    )
    limits: dict[str, ResourceQuantity] | None = Field(
        default=None, max_length=16, description="Maximum resources per pod, e.g. {memory: 64Gi}."
    )
    claims: list[NamedPassthrough] | None = Field(
        default=None,
        max_length=16,
        description="core/v1 ResourceClaims of the trainer container, each naming an entry of "
        "spec.template.resourceClaims (Dynamic Resource Allocation); with spec.gpusFrom "
        "ResourceClaims they bring the trainer's GPUs.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
    )
