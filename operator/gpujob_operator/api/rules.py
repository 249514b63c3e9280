"""Validation rules with two twins: CEL for the API server, a predicate for pydantic.

Every rule of the GPUTrainingJob API is written once here or next to its model
(:mod:`gpujob_operator.api.spec`, :mod:`gpujob_operator.api.pod`, ...) as a :class:`Rule`:
its CEL text goes into the CRD's ``x-kubernetes-validations`` (so ``kubectl apply``
refuses), its Python predicate runs in the model's validator, and both refuse with the same
message, which names the field as the user wrote it under ``spec.``. A rule whose twin is a
hand-written validator, or that has none (a transition rule such as immutability), is a
plain entry made with :func:`cel`.

The CEL uses the libraries Kubernetes gives CRD rules (``format.*()``, ``isQuantity()``,
``quantity()``); :mod:`gpujob_operator.api.k8sformats` and :mod:`gpujob_operator.api.quantity`
hold the matching Python predicates.
Strings and maps a rule reads carry ``maxLength``/``maxProperties``/``maxItems`` so the
API server's cost estimate of each rule stays inside its budget.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from pydantic import GetCoreSchemaHandler, GetJsonSchemaHandler
from pydantic.alias_generators import to_snake
from pydantic_core import core_schema

from gpujob_operator.api import k8sformats as kf
from gpujob_operator.api.quantity import LONG_EXPONENT

# How each format is explained in messages (the user sees these from kubectl apply).
QUALIFIED_NAME: Final = (
    "a qualified name (an optional DNS subdomain prefix and '/', then at most 63 "
    "alphanumerics, '-', '_' or '.', starting and ending with an alphanumeric)"
)
LABEL_VALUE: Final = (
    "a label value (empty, or at most 63 alphanumerics, '-', '_' or '.', starting and ending "
    "with an alphanumeric)"
)
DNS_LABEL: Final = (
    "a DNS-1123 label (at most 63 lowercase alphanumerics or '-', starting and ending with "
    "an alphanumeric)"
)
DNS_SUBDOMAIN: Final = (
    "a DNS-1123 subdomain (at most 253 lowercase alphanumerics, '-' or '.', starting and "
    "ending with an alphanumeric)"
)

# CEL snippets (``x`` is the string checked).
CEL_QUALIFIED: Final = "!format.qualifiedName().validate({x}).hasValue()"
CEL_LABEL_VALUE: Final = "!format.labelValue().validate({x}).hasValue()"
CEL_DNS_LABEL: Final = "!format.dns1123Label().validate({x}).hasValue()"
CEL_DNS_SUBDOMAIN: Final = "!format.dns1123Subdomain().validate({x}).hasValue()"
# A quantity field is int-or-string (dyn in CEL): string() turns both into text.
# A long exponent (quantity.LONG_EXPONENT) is refused by a regular expression (linear)
# before isQuantity() or quantity() reads it: CEL's && stops at the first false.
CEL_QUANTITY: Final = (
    "(!string({x}).matches('" + LONG_EXPONENT.replace("{", "{{").replace("}", "}}") + "') && "
    "isQuantity(string({x})))"
)
CEL_QUANTITY_OF: Final = "quantity(string({x}))"


@dataclass(frozen=True)
class Rule:
    """One rule: CEL for the API server, ``holds`` for the model, one message for both."""

    cel: str
    message: str
    holds: Callable[[Any], bool]
    field_path: str | None = None

    def schema(self) -> dict[str, str]:
        """The ``x-kubernetes-validations`` entry."""
        out = {"rule": self.cel, "message": self.message}
        if self.field_path:
            out["fieldPath"] = self.field_path
        return out


def validations(*rules: Rule) -> dict[str, Any]:
    """JSON Schema extra holding the rules' CEL."""
    return {"x-kubernetes-validations": [r.schema() for r in rules]}


def cel(rule: str, message: str, field_path: str | None = None) -> dict[str, str]:
    """One ``x-kubernetes-validations`` entry with no model twin (or a twin written by hand)."""
    out = {"rule": rule, "message": message}
    if field_path:
        out["fieldPath"] = field_path
    return out


def cel_rules(*rules: dict[str, str]) -> dict[str, Any]:
    """JSON Schema extra holding :func:`cel` entries."""
    return {"x-kubernetes-validations": list(rules)}


def immutable(path: str) -> dict[str, Any]:
    """JSON Schema extra refusing any change of the field at ``path`` (a transition rule)."""
    return cel_rules(
        cel(
            "self == oldSelf",
            f"{path} is immutable: delete the job and create a new one to change it",
        )
    )


def check(rules: tuple[Rule, ...], value: Any) -> None:
    """Raise the first broken rule's message (pydantic reports it as a validation error)."""
    for rule in rules:
        if not rule.holds(value):
            raise ValueError(rule.message)


@dataclass(frozen=True)
class Checked:
    """``Annotated`` metadata: a string (or int-or-string quantity) checked by ``rule``.

    ``rule.cel`` reads ``self``; ``rule.holds`` gets the value. ``server_only`` adds rules
    with no model twin (transition rules such as immutability, which need the old object);
    they go here because a field's own ``x-kubernetes-validations`` would replace the
    type's. Length limits bound the CEL cost estimate and are enforced by both twins.
    """

    rule: Rule
    max_length: int
    min_length: int | None = None
    int_or_string: bool = False
    server_only: tuple[dict[str, str], ...] = ()

    def _validate(self, value: Any) -> Any:
        if isinstance(value, str) and not ((self.min_length or 0) <= len(value) <= self.max_length):
            raise ValueError(f"must be {self.min_length or 0} to {self.max_length} characters long")
        check((self.rule,), value)
        return value

    def __get_pydantic_core_schema__(
        self, source: Any, handler: GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        return core_schema.no_info_after_validator_function(self._validate, handler(source))

    def __get_pydantic_json_schema__(
        self, schema: core_schema.CoreSchema, handler: GetJsonSchemaHandler
    ) -> dict[str, Any]:
        out: dict[str, Any] = (
            {"x-kubernetes-int-or-string": True} if self.int_or_string else {"type": "string"}
        )
        out["maxLength"] = self.max_length
        if self.min_length is not None:
            out["minLength"] = self.min_length
        out["x-kubernetes-validations"] = [self.rule.schema(), *self.server_only]
        return out


def str_rule(cel_template: str, predicate: Callable[[str], bool], message: str) -> Rule:
    """A rule on one string, ``self`` in CEL."""
    return Rule(cel_template.format(x="self"), message, predicate)


def qualified_keys(field: str, where: str) -> Rule:
    """Every key of the map ``field`` (wire name) of the model is a qualified name."""
    attr = to_snake(field)
    return Rule(
        f"!has(self.{field}) || self.{field}.all(k, {CEL_QUALIFIED.format(x='k')})",
        f"{where} keys must be {QUALIFIED_NAME}",
        lambda m: all(kf.is_qualified_name(k) for k in getattr(m, attr) or {}),
        field_path=f".{field}",
    )
