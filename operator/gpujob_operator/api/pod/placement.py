"""Where the pods may run: core/v1 tolerations and affinity (node, pod and anti-affinity).

Typed to the depth core/v1 checks them (operators, value counts, weights, topology keys).
The template's plain scheduling fields (nodeSelector, priorityClassName, schedulerName) are
in :mod:`gpujob_operator.api.pod.template`.
"""

from __future__ import annotations

from typing import Annotated, ClassVar, Final, Literal

from pydantic import ConfigDict, Field

from gpujob_operator.api import k8sformats as kf
from gpujob_operator.api import rules as R
from gpujob_operator.api.base import MAX_MAP, DNSLabel, LabelValue
from gpujob_operator.api.base import Model as _Model
from gpujob_operator.api.base import Ruled as _Ruled

# ---- tolerations -------------------------------------------------------------------------


TolerationKey = Annotated[
    str,
    R.Checked(
        R.str_rule(
            f"size(self) == 0 || {R.CEL_QUALIFIED.format(x='self')}",
            lambda v: v == "" or kf.is_qualified_name(v),
            f"must be empty or {R.QUALIFIED_NAME}",
        ),
        max_length=316,
    ),
]


class Toleration(_Ruled):
    """A core/v1 Toleration, so pods can land on tainted GPU nodes."""

    RULES: ClassVar = (
        R.Rule(
            "(has(self.key) && size(self.key) > 0) || "
            "(has(self.operator) && self.operator == 'Exists')",
            "spec.template.tolerations[]: operator must be Exists when key is empty",
            lambda m: bool(m.key) or m.operator == "Exists",
        ),
        R.Rule(
            "!has(self.operator) || self.operator != 'Exists' || !has(self.value) || "
            "size(self.value) == 0",
            "spec.template.tolerations[]: value must be empty when operator is Exists",
            lambda m: m.operator != "Exists" or not m.value,
        ),
        R.Rule(
            "(has(self.operator) && self.operator == 'Exists') || !has(self.value) || "
            + R.CEL_LABEL_VALUE.format(x="self.value"),
            f"spec.template.tolerations[].value must be {R.LABEL_VALUE}",
            lambda m: m.operator == "Exists" or m.value is None or kf.is_label_value(m.value),
        ),
        R.Rule(
            "!has(self.tolerationSeconds) || (has(self.effect) && self.effect == 'NoExecute')",
            "spec.template.tolerations[]: tolerationSeconds needs effect NoExecute",
            lambda m: m.toleration_seconds is None or m.effect == "NoExecute",
        ),
    )
    model_config = ConfigDict(json_schema_extra=R.validations(*RULES))

    key: TolerationKey | None = Field(
        default=None, description="Taint key to match; empty matches all (with operator Exists)."
    )
    operator: Literal["Exists", "Equal"] | None = Field(
        default=None, description="Exists or Equal (default Equal)."
    )
    value: str | None = Field(
        default=None, max_length=63, description="Taint value to match with Equal."
    )
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = Field(
        default=None, description="Taint effect to match; empty matches all."
    )
    toleration_seconds: int | None = Field(
        default=None, description="How long a NoExecute taint is tolerated."
    )


# ---- affinity ---------------------------------------------------------------------------


# Affinity is typed to the depth core/v1 checks it (operators, value counts, weights,
# topology keys): these are the mistakes users make, and the lists are small.
_MAX_TERMS: Final = 16

AffinityKey = Annotated[
    str,
    R.Checked(
        R.str_rule(R.CEL_QUALIFIED, kf.is_qualified_name, f"must be {R.QUALIFIED_NAME}"),
        max_length=316,
        min_length=1,
    ),
]


def _values_rule(ops: str) -> R.Rule:
    return R.Rule(
        "self.operator in ['In', 'NotIn'] ? (has(self.values) && size(self.values) > 0) : "
        "self.operator in ['Exists', 'DoesNotExist'] ? (!has(self.values) || "
        "size(self.values) == 0) : (has(self.values) && size(self.values) == 1)",
        f"values are required for operator In or NotIn, forbidden for Exists or DoesNotExist{ops}",
        lambda m: (
            bool(m.values)
            if m.operator in ("In", "NotIn")
            else not m.values
            if m.operator in ("Exists", "DoesNotExist")
            else len(m.values or ()) == 1
        ),
    )


class NodeSelectorRequirement(_Ruled):
    """A node label requirement of node affinity."""

    RULES: ClassVar = (_values_rule(", and a single value for Gt or Lt"),)
    model_config = ConfigDict(json_schema_extra=R.validations(*RULES))

    key: AffinityKey = Field(description="Node label key.")
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"] = Field(
        description="In, NotIn, Exists, DoesNotExist, Gt or Lt."
    )
    values: list[Annotated[str, Field(max_length=253)]] | None = Field(
        default=None, max_length=64, description="Values to match."
    )


class NodeFieldRequirement(_Model):
    """A node field requirement of node affinity (only metadata.name exists)."""

    key: Literal["metadata.name"] = Field(description="metadata.name.")
    operator: Literal["In", "NotIn"] = Field(description="In or NotIn.")
    values: list[Annotated[str, Field(max_length=253)]] = Field(
        min_length=1, max_length=1, description="The one node name."
    )


class NodeSelectorTerm(_Model):
    """Requirements a node must all meet."""

    match_expressions: list[NodeSelectorRequirement] | None = Field(
        default=None, max_length=_MAX_TERMS, description="Node label requirements."
    )
    match_fields: list[NodeFieldRequirement] | None = Field(
        default=None, max_length=_MAX_TERMS, description="Node field requirements."
    )


class NodeSelector(_Model):
    """Terms of required node affinity: a node must meet one of them."""

    node_selector_terms: list[NodeSelectorTerm] = Field(
        min_length=1, max_length=_MAX_TERMS, description="At least one term."
    )


class PreferredSchedulingTerm(_Model):
    """A weighted node preference."""

    weight: int = Field(ge=1, le=100, description="1-100, added to a node's score.")
    preference: NodeSelectorTerm = Field(description="The node requirements.")


class NodeAffinity(_Model):
    """core/v1 NodeAffinity."""

    required_during_scheduling_ignored_during_execution: NodeSelector | None = Field(
        default=None, description="Nodes the pods must run on."
    )
    preferred_during_scheduling_ignored_during_execution: list[PreferredSchedulingTerm] | None = (
        Field(default=None, max_length=_MAX_TERMS, description="Nodes the pods prefer.")
    )


class LabelSelectorRequirement(_Ruled):
    """A label requirement of a label selector."""

    RULES: ClassVar = (_values_rule(""),)
    model_config = ConfigDict(json_schema_extra=R.validations(*RULES))

    key: AffinityKey = Field(description="Label key.")
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"] = Field(
        description="In, NotIn, Exists or DoesNotExist."
    )
    # Not checked as label values here: that would multiply the CRD's CEL cost past its
    # budget (4 term lists x 2 selectors x expressions x values); the pod dry run does it.
    values: list[Annotated[str, Field(max_length=63)]] | None = Field(
        default=None, max_length=64, description="Values to match."
    )


class LabelSelector(_Ruled):
    """A metav1.LabelSelector over pods or namespaces."""

    RULES: ClassVar = (R.qualified_keys("matchLabels", "matchLabels"),)
    model_config = ConfigDict(json_schema_extra=R.validations(*RULES))

    match_labels: dict[str, LabelValue] | None = Field(
        default=None, max_length=MAX_MAP, description="Labels to match exactly."
    )
    match_expressions: list[LabelSelectorRequirement] | None = Field(
        default=None, max_length=_MAX_TERMS, description="Label requirements."
    )


class PodAffinityTerm(_Model):
    """Pods (by label, in some namespaces) to be near or away from, per topology domain."""

    label_selector: LabelSelector | None = Field(default=None, description="Pods to match.")
    namespace_selector: LabelSelector | None = Field(
        default=None, description="Namespaces to look in, by label."
    )
    namespaces: list[DNSLabel] | None = Field(
        default=None, max_length=_MAX_TERMS, description="Namespaces to look in, by name."
    )
    topology_key: AffinityKey = Field(
        description="Node label whose value is the domain, e.g. kubernetes.io/hostname."
    )
    match_label_keys: list[AffinityKey] | None = Field(
        default=None, max_length=_MAX_TERMS, description="Own label keys to match too."
    )
    mismatch_label_keys: list[AffinityKey] | None = Field(
        default=None, max_length=_MAX_TERMS, description="Own label keys to differ in."
    )


class WeightedPodAffinityTerm(_Model):
    """A weighted pod (anti-)affinity preference."""

    weight: int = Field(ge=1, le=100, description="1-100, added to a node's score.")
    pod_affinity_term: PodAffinityTerm = Field(description="The term.")


class PodAffinity(_Model):
    """core/v1 PodAffinity or PodAntiAffinity."""

    required_during_scheduling_ignored_during_execution: list[PodAffinityTerm] | None = Field(
        default=None, max_length=_MAX_TERMS, description="Terms every pod must meet."
    )
    preferred_during_scheduling_ignored_during_execution: list[WeightedPodAffinityTerm] | None = (
        Field(default=None, max_length=_MAX_TERMS, description="Weighted preferences.")
    )


class Affinity(_Model):
    """core/v1 Affinity of the pods."""

    node_affinity: NodeAffinity | None = Field(default=None, description="core/v1 NodeAffinity.")
    pod_affinity: PodAffinity | None = Field(default=None, description="core/v1 PodAffinity.")
    pod_anti_affinity: PodAffinity | None = Field(
        default=None, description="core/v1 PodAntiAffinity."
    )
