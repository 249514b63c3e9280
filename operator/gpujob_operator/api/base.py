"""Base models and annotated types shared by the API's modules.

Why a module of its own: the job's spec (:mod:`gpujob_operator.api.spec`,
:mod:`gpujob_operator.api.monitoring_spec`), its status and the pod-facing models
(:mod:`gpujob_operator.api.pod`) all build on these bases and types, and import them from
here rather than from each other.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Annotated, Any, ClassVar, Final, Self

from pydantic import (
    AliasGenerator,
    BaseModel,
    ConfigDict,
    Field,
    WithJsonSchema,
    model_validator,
)
from pydantic.alias_generators import to_camel

from gpujob_operator.api import k8sformats as kf
from gpujob_operator.api import rules as R
from gpujob_operator.api.quantity import crd_quantity


class Model(BaseModel):
    """Base for spec models: camelCase on the wire, unknown fields refused."""

    model_config = ConfigDict(
        alias_generator=AliasGenerator(alias=to_camel),
        validate_by_name=True,
        validate_by_alias=True,
        serialize_by_alias=True,
        extra="forbid",
    )


class Ruled(Model):
    """A spec model with :class:`~gpujob_operator.api.rules.Rule` s: both twins come from ``RULES``.

    Each subclass lists its rules once in ``RULES`` and puts their CEL in its schema with
    ``model_config = ConfigDict(json_schema_extra=R.validations(*RULES))``.
    """

    RULES: ClassVar[tuple[R.Rule, ...]] = ()

    @model_validator(mode="after")
    def _check_rules(self) -> Self:
        R.check(type(self).RULES, self)
        return self


def quantity_value(value: int | str | None) -> Decimal | None:
    """The value of a quantity field (None when unset or unparsable)."""
    return None if value is None else crd_quantity(value)


_NON_NEGATIVE = (
    f"{R.CEL_QUANTITY.format(x='self')} && "
    f"{R.CEL_QUANTITY_OF.format(x='self')}.compareTo(quantity('0')) >= 0"
)
_POSITIVE = (
    f"{R.CEL_QUANTITY.format(x='self')} && "
    f"{R.CEL_QUANTITY_OF.format(x='self')}.compareTo(quantity('0')) > 0"
)

ResourceQuantity = Annotated[
    int | str,
    R.Checked(
        R.Rule(
            _NON_NEGATIVE,
            "must be a non-negative quantity such as 500m, 2, 1.5 or 16Gi",
            lambda v: (q := crd_quantity(v)) is not None and q >= 0,
        ),
        max_length=64,
        int_or_string=True,
    ),
]
"""A resource amount: requests, limits (core/v1 refuses negative or unparsable ones)."""

PositiveQuantity = Annotated[
    int | str,
    R.Checked(
        R.Rule(
            _POSITIVE,
            "must be a positive quantity such as 8Gi",
            lambda v: (q := crd_quantity(v)) is not None and q > 0,
        ),
        max_length=64,
        int_or_string=True,
    ),
]
"""A size or divisor that must be above zero."""

Passthrough = Annotated[
    dict[str, Any],
    WithJsonSchema({"type": "object", "x-kubernetes-preserve-unknown-fields": True}),
]
"""A Kubernetes object copied verbatim into the pod (validated at pod creation)."""


class NamedPassthrough(Model):
    """A Kubernetes object copied verbatim, keyed by its ``name`` (a list-map entry)."""

    model_config = ConfigDict(extra="allow")

    name: str = Field(min_length=1, max_length=253, description="Name, unique in the list.")


# Caps on the maps and lists the template copies into the pods: they bound the CEL cost.
MAX_MAP: Final = 64
MAX_LIST: Final = 64

LabelValue = Annotated[
    str,
    R.Checked(
        R.str_rule(R.CEL_LABEL_VALUE, kf.is_label_value, f"must be {R.LABEL_VALUE}"),
        max_length=63,
    ),
]
DNSSubdomain = Annotated[
    str,
    R.Checked(
        R.str_rule(R.CEL_DNS_SUBDOMAIN, kf.is_dns1123_subdomain, f"must be {R.DNS_SUBDOMAIN}"),
        max_length=253,
    ),
]
DNSLabel = Annotated[
    str,
    R.Checked(
        R.str_rule(R.CEL_DNS_LABEL, kf.is_dns1123_label, f"must be {R.DNS_LABEL}"), max_length=63
    ),
]
