"""Base models and annotated types shared by the API's modules (api.py, podspec.py).

Why a module of its own: the pod-facing models (:mod:`gpujob_operator.api.podtemplate`) and the job
models (:mod:`gpujob_operator.api`) share these bases, and api.py imports podspec.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Annotated, Any, ClassVar, Self

from pydantic import AliasGenerator, BaseModel, ConfigDict, WithJsonSchema, model_validator
from pydantic.alias_generators import to_camel

from gpujob_operator.api import k8sformats as kf
from gpujob_operator.api import rules as R


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
    return None if value is None else kf.parse_quantity(value)


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
            lambda v: (q := kf.parse_quantity(v)) is not None and q >= 0,
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
            lambda v: (q := kf.parse_quantity(v)) is not None and q > 0,
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
