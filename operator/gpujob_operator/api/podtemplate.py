"""The pod-facing part of the GPUTrainingJob spec: what the operator copies into the pods.

Env, resources and ``spec.template`` (labels, tolerations, affinity, volumes, security
contexts, ...), typed after core/v1 and checked as strictly as core/v1 checks a pod, by CEL
rules in the CRD (so ``kubectl apply`` refuses, naming the field) and by their pydantic twins
(:mod:`gpujob_operator.api.rules`). :mod:`gpujob_operator.api` holds the job around them and
re-exports these models.
"""

from __future__ import annotations

import re
from decimal import Decimal
from typing import Annotated, Any, ClassVar, Final, Literal, Self

from pydantic import ConfigDict, Field, create_model, model_validator
from pydantic.alias_generators import to_snake

from gpujob_operator.api import k8sformats as kf
from gpujob_operator.api import rules as R
from gpujob_operator.api.base import Model as _Model
from gpujob_operator.api.base import Passthrough, PositiveQuantity, ResourceQuantity
from gpujob_operator.api.base import Ruled as _Ruled
from gpujob_operator.api.base import quantity_value as _q

GPU_RESOURCE: Final = "nvidia.com/gpu"

# Where each core/v1 field the operator copies into the pods is checked, and why:
# * At admission, by CEL in the CRD and the twin predicates here (so `kubectl apply` refuses
#   with a message naming the field): everything whose core/v1 rules are closed and small —
#   names, label keys and values, quantities, tolerations, env and its sources, volume and
#   mount names and paths, affinity operators, value counts, weights and topology keys, the
#   security contexts' fields and profiles. Typed models make the schema structural, so a
#   misspelt key is refused too.
# * At pod creation (the operator's server-side dry run of the built pods, at run time): the
#   inside of each volume source (30 kinds, each with its own rules that change with the
#   release), SELinux and Windows options, label values inside affinity selectors, and
#   whatever depends on other objects or on cluster policy (ServiceAccounts, PriorityClasses,
#   quotas, LimitRanges, Pod Security). Copying those into CEL would drift from the server
#   and exceed the CRD's CEL cost budget (the API server refuses a CRD whose estimated rule
#   cost is too high: each rule's cost times how many list items and map values it runs on).
# * A ValidatingAdmissionPolicy shipped by the chart would add nothing: it runs the same CEL
#   over the same object, but only where the chart is installed, while the CRD's rules hold
#   wherever the CRD is.

_SHM_VOLUME: Final = "gpujob-shm"
_SHM_PATH: Final = "/dev/shm"
_MAX_MAP: Final = 64
_MAX_LIST: Final = 64

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
ConfigKey = Annotated[
    str,
    R.Checked(
        R.str_rule(
            "self.matches('^[-._a-zA-Z0-9]+$')",
            kf.is_config_key,
            "must be a ConfigMap/Secret key (alphanumerics, '-', '_' or '.')",
        ),
        max_length=253,
    ),
]


# ---- env --------------------------------------------------------------------------------

_ENV_FIELD_PATHS: Final = (
    "metadata.name",
    "metadata.namespace",
    "metadata.uid",
    "spec.nodeName",
    "spec.serviceAccountName",
    "status.hostIP",
    "status.hostIPs",
    "status.podIP",
    "status.podIPs",
)
_ENV_RESOURCE_PATHS: Final = tuple(
    f"{part}.{r}" for part in ("limits", "requests") for r in ("cpu", "memory", "ephemeral-storage")
)
_SUBSCRIPTED_FIELD: Final = r"^metadata\.(labels|annotations)\['[^']+'\]$"


EnvName = Annotated[
    str,
    R.Checked(
        R.str_rule(
            "self.matches('^[ -<>-~]+$')",
            kf.is_env_name,
            "must consist of printable ASCII characters other than '='",
        ),
        max_length=256,
        min_length=1,
    ),
]


NoBacksteps = Annotated[
    str,
    R.Checked(
        R.str_rule(
            "!self.matches('(^|/)[.][.](/|$)')",
            lambda v: ".." not in v.split("/"),
            "must not contain '..'",
        ),
        max_length=1024,
        min_length=1,
    ),
]
FieldPath = Annotated[
    str,
    R.Checked(
        R.str_rule(
            "self in [" + ", ".join(f"'{p}'" for p in _ENV_FIELD_PATHS) + "] || "
            f'self.matches(r"{_SUBSCRIPTED_FIELD}")',
            lambda v: v in _ENV_FIELD_PATHS or re.match(_SUBSCRIPTED_FIELD, v) is not None,
            "must be one of " + ", ".join(_ENV_FIELD_PATHS) + ", metadata.labels['KEY'] or "
            "metadata.annotations['KEY']",
        ),
        max_length=1024,
    ),
]


class ObjectFieldSelector(_Model):
    """core/v1 ObjectFieldSelector: a field of the pod (downward API)."""

    api_version: str | None = Field(default=None, description="Schema version; default v1.")
    field_path: FieldPath = Field(
        description="Pod field: metadata.name, metadata.namespace, metadata.uid, "
        "metadata.labels['KEY'], metadata.annotations['KEY'], spec.nodeName, "
        "spec.serviceAccountName, status.hostIP(s), status.podIP(s).",
    )


_RESOURCE_FIELD_RULE: Final = R.Rule(
    "self.resource in ["
    + ", ".join(f"'{p}'" for p in _ENV_RESOURCE_PATHS)
    + "] || self.resource.startsWith('limits.hugepages-') || "
    "self.resource.startsWith('requests.hugepages-')",
    "spec.env[].valueFrom.resourceFieldRef.resource must be one of "
    + ", ".join(_ENV_RESOURCE_PATHS)
    + ", limits.hugepages-SIZE or requests.hugepages-SIZE",
    lambda m: (
        m.resource in _ENV_RESOURCE_PATHS
        or m.resource.startswith(("limits.hugepages-", "requests.hugepages-"))
    ),
)


class ResourceFieldSelector(_Ruled):
    """core/v1 ResourceFieldSelector: a resource of the trainer container (downward API)."""

    RULES: ClassVar = (_RESOURCE_FIELD_RULE,)
    model_config = ConfigDict(json_schema_extra=R.validations(*RULES))

    container_name: str | None = Field(
        default=None, max_length=63, description="Container; default the trainer."
    )
    resource: str = Field(max_length=256, description="e.g. limits.cpu or requests.memory.")
    divisor: PositiveQuantity | None = Field(
        default=None, description='Unit of the value, e.g. "1Mi" (default 1).'
    )


class KeySelector(_Model):
    """A key of a ConfigMap or Secret in the job's namespace."""

    name: DNSSubdomain = Field(description="Name of the ConfigMap or Secret.")
    key: ConfigKey = Field(description="Key to read.")
    optional: bool | None = Field(default=None, description="Whether it may be missing.")


class FileKeySelector(_Model):
    """core/v1 FileKeySelector: a key of an env file in a volume (EnvFiles feature)."""

    volume_name: DNSLabel = Field(description="The emptyDir volume holding the file.")
    path: NoBacksteps = Field(description="Path of the env file in the volume.")
    key: EnvName = Field(description="Variable to read from the file.")
    optional: bool | None = Field(default=None, description="Whether it may be missing.")


_ENV_SOURCES: Final = (
    "fieldRef",
    "resourceFieldRef",
    "configMapKeyRef",
    "secretKeyRef",
    "fileKeyRef",
)


class EnvVarSource(_Ruled):
    """core/v1 EnvVarSource: where a variable's value comes from (exactly one source)."""

    RULES: ClassVar = (
        R.Rule(
            "[" + ", ".join(f"has(self.{s})" for s in _ENV_SOURCES) + "].filter(b, b).size() == 1",
            "spec.env[].valueFrom must set exactly one of " + ", ".join(_ENV_SOURCES),
            lambda m: sum(getattr(m, to_snake(s)) is not None for s in _ENV_SOURCES) == 1,
        ),
    )
    model_config = ConfigDict(json_schema_extra=R.validations(*RULES))

    field_ref: ObjectFieldSelector | None = Field(default=None, description="A pod field.")
    resource_field_ref: ResourceFieldSelector | None = Field(
        default=None, description="A resource limit or request of the trainer container."
    )
    config_map_key_ref: KeySelector | None = Field(
        default=None, description="A key of a ConfigMap."
    )
    secret_key_ref: KeySelector | None = Field(default=None, description="A key of a Secret.")
    file_key_ref: FileKeySelector | None = Field(
        default=None, description="A key of an env file in a volume."
    )


class EnvVar(_Ruled):
    """An environment variable for the trainer container (core/v1 EnvVar)."""

    RULES: ClassVar = (
        R.Rule(
            "!(has(self.value) && has(self.valueFrom))",
            "spec.env: set either value or valueFrom, not both",
            lambda m: m.value is None or m.value_from is None,
        ),
    )
    model_config = ConfigDict(json_schema_extra=R.validations(*RULES))

    name: EnvName = Field(description="Name of the variable.")
    value: str | None = Field(
        default=None, description="Literal value; $(VAR) references are expanded by the kubelet."
    )
    value_from: EnvVarSource | None = Field(
        default=None,
        description="Source for the value (core/v1 EnvVarSource: fieldRef, resourceFieldRef, "
        "configMapKeyRef, secretKeyRef or fileKeyRef).",
    )


# ---- resources ----------------------------------------------------------------------------

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
                not _extended(k) or (q := kf.parse_quantity(v)) is None or _whole(q)
                for k, v in (getattr(m, part) or {}).items()
            ),
            field_path=f".{part}",
        ),
        R.Rule(
            f"!has(self.{part}) || self.{part}.all(k, !k.startsWith('hugepages-') || "
            f"!{R.CEL_QUANTITY.format(x=f'self.{part}[k]')} || "
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
    if not name.startswith("hugepages-") or (q := kf.parse_quantity(value)) is None:
        return True
    size = kf.parse_quantity(name.removeprefix("hugepages-"))
    return size is not None and size > 0 and _whole(Decimal(float(q) / float(size)))


def _req_lim(m: ResourceRequirements, name: str) -> tuple[Decimal | None, Decimal | None]:
    return _q((m.requests or {}).get(name)), _q((m.limits or {}).get(name))


_CEL_REQ: Final = "quantity(string(self.requests[k]))"
_CEL_LIM: Final = "quantity(string(self.limits[k]))"
_CEL_BOTH_QUANTITIES: Final = (
    "isQuantity(string(self.requests[k])) && isQuantity(string(self.limits[k]))"
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


class LocalObjectReference(_Model):
    """A reference to an object in the job's namespace, by name."""

    name: str = Field(min_length=1, max_length=253, description="Name of the referenced object.")


# ---- volumes -----------------------------------------------------------------------------

VOLUME_SOURCES: Final = (
    "emptyDir",
    "persistentVolumeClaim",
    "configMap",
    "secret",
    "hostPath",
    "nfs",
    "csi",
    "ephemeral",
    "projected",
    "downwardAPI",
    "image",
    "iscsi",
    "fc",
    "rbd",
    "cephfs",
    "cinder",
    "flexVolume",
    "azureDisk",
    "azureFile",
    "gcePersistentDisk",
    "awsElasticBlockStore",
    "gitRepo",
    "glusterfs",
    "flocker",
    "vsphereVolume",
    "quobyte",
    "photonPersistentDisk",
    "portworxVolume",
    "scaleIO",
    "storageos",
)


def _source_fields() -> dict[str, Any]:
    fields: dict[str, Any] = {}
    for name in VOLUME_SOURCES:
        fields[to_snake(name)] = (
            Passthrough | None,
            Field(default=None, alias=name, description=f"core/v1 {name} volume source, verbatim."),
        )
    return fields


# One optional, verbatim field per volume source: a misspelt source is refused at admission
# and CEL can count the sources, while each source's own fields stay core/v1's to check.
_VolumeSources: Any = create_model("_VolumeSources", __base__=_Ruled, **_source_fields())


class Volume(_VolumeSources):
    """A core/v1 Volume: a name and exactly one source (whose fields are copied verbatim)."""

    RULES: ClassVar = (
        R.Rule(
            "[" + ", ".join(f"has(self.{s})" for s in VOLUME_SOURCES) + "]"
            ".filter(b, b).size() == 1",
            "spec.template.volumes[] must set exactly one volume source (emptyDir, "
            "persistentVolumeClaim, configMap, secret, hostPath, nfs, csi, ephemeral, "
            "projected, ...)",
            lambda m: sum(getattr(m, to_snake(s)) is not None for s in VOLUME_SOURCES) == 1,
        ),
    )
    model_config = ConfigDict(json_schema_extra=R.validations(*RULES))

    name: DNSLabel = Field(description="Volume name (a DNS-1123 label), used by volumeMounts.")


RelativePath = Annotated[
    str,
    R.Checked(
        R.str_rule(
            "!self.startsWith('/') && !self.split('/').exists(p, p == '..')",
            lambda v: not v.startswith("/") and ".." not in v.split("/"),
            "must be a relative path without '..'",
        ),
        max_length=4096,
    ),
]


class VolumeMount(_Ruled):
    """A core/v1 VolumeMount of the trainer container."""

    RULES: ClassVar = (
        R.Rule(
            "!has(self.subPath) || !has(self.subPathExpr) || size(self.subPath) == 0 || "
            "size(self.subPathExpr) == 0",
            "spec.template.volumeMounts[]: subPath and subPathExpr are mutually exclusive",
            lambda m: not (m.sub_path and m.sub_path_expr),
        ),
        R.Rule(
            "!has(self.recursiveReadOnly) || self.recursiveReadOnly == 'Disabled' || "
            "(has(self.readOnly) && self.readOnly && "
            "(!has(self.mountPropagation) || self.mountPropagation == 'None'))",
            "spec.template.volumeMounts[]: recursiveReadOnly needs readOnly true and "
            "mountPropagation None",
            lambda m: (
                m.recursive_read_only in (None, "Disabled")
                or (m.read_only is True and m.mount_propagation in (None, "None"))
            ),
        ),
    )
    model_config = ConfigDict(json_schema_extra=R.validations(*RULES))

    name: str = Field(min_length=1, max_length=63, description="Name of a volume of the pod.")
    mount_path: str = Field(
        min_length=1, max_length=4096, description="Path in the container to mount it at."
    )
    sub_path: RelativePath | None = Field(
        default=None, description="Path within the volume to mount instead of its root."
    )
    sub_path_expr: RelativePath | None = Field(
        default=None, description="Like subPath, with $(VAR) references to the env expanded."
    )
    read_only: bool | None = Field(default=None, description="Mount read-only.")
    recursive_read_only: Literal["Disabled", "IfPossible", "Enabled"] | None = Field(
        default=None, description="Make submounts read-only too (needs readOnly)."
    )
    mount_propagation: Literal["None", "HostToContainer", "Bidirectional"] | None = Field(
        default=None, description="Mount propagation (Bidirectional needs a privileged container)."
    )
    bind_mount_options: list[Literal["noexec", "nodev", "nosuid"]] | None = Field(
        default=None,
        max_length=3,
        description="Bind mount options.",
        json_schema_extra={"x-kubernetes-list-type": "set"},
    )


# ---- affinity and security contexts ------------------------------------------------------


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
        default=None, max_length=_MAX_MAP, description="Labels to match exactly."
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


_ID_MAX: Final = 2147483647
UserID = Annotated[int, Field(ge=0, le=_ID_MAX)]


class Profile(_Ruled):
    """A seccomp or AppArmor profile: Localhost needs localhostProfile, others forbid it."""

    RULES: ClassVar = (
        R.Rule(
            "self.type == 'Localhost' ? (has(self.localhostProfile) && "
            "size(self.localhostProfile) > 0) : !has(self.localhostProfile)",
            "localhostProfile is required for type Localhost and forbidden otherwise",
            lambda m: (
                bool(m.localhost_profile) if m.type == "Localhost" else m.localhost_profile is None
            ),
        ),
    )
    model_config = ConfigDict(json_schema_extra=R.validations(*RULES))

    type: Literal["Unconfined", "RuntimeDefault", "Localhost"] = Field(
        description="Unconfined, RuntimeDefault or Localhost."
    )
    localhost_profile: str | None = Field(
        default=None, max_length=4096, description="Profile on the node, for Localhost."
    )


_SYSCTL_SEGMENT: Final = "[a-z0-9]([-_a-z0-9]*[a-z0-9])?"
_SYSCTL_NAME: Final = f"^({_SYSCTL_SEGMENT}[./])*{_SYSCTL_SEGMENT}$"
SysctlName = Annotated[
    str,
    R.Checked(
        R.str_rule(
            f"self.matches('{_SYSCTL_NAME}')",
            lambda v: re.match(_SYSCTL_NAME, v) is not None,
            "must be a sysctl name such as net.core.somaxconn (lowercase segments separated "
            "by '.' or '/')",
        ),
        max_length=253,
        min_length=1,
    ),
]


class Sysctl(_Model):
    """A namespaced kernel parameter of the pod."""

    name: SysctlName = Field(description="e.g. net.core.somaxconn.")
    value: str = Field(description="Its value.")


class PodSecurityContext(_Model):
    """core/v1 PodSecurityContext: scalar fields typed, nested options verbatim."""

    run_as_user: UserID | None = Field(default=None, description="UID of every container.")
    run_as_group: UserID | None = Field(default=None, description="GID of every container.")
    run_as_non_root: bool | None = Field(default=None, description="Refuse to run as UID 0.")
    fs_group: UserID | None = Field(default=None, description="Group owning the volumes.")
    fs_group_change_policy: Literal["OnRootMismatch", "Always"] | None = Field(
        default=None, description="When to change volume ownership."
    )
    supplemental_groups: list[UserID] | None = Field(
        default=None, max_length=64, description="Extra GIDs of every container."
    )
    supplemental_groups_policy: Literal["Merge", "Strict"] | None = Field(
        default=None, description="Merge with the image's groups, or Strict."
    )
    sysctls: list[Sysctl] | None = Field(
        default=None,
        max_length=64,
        description="Namespaced sysctls of the pod.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
    )

    @model_validator(mode="after")
    def _unique_sysctls(self) -> Self:
        names = [x.name for x in self.sysctls or ()]
        if len(names) != len(set(names)):
            raise ValueError("spec.template.securityContext.sysctls: duplicate names")
        return self

    seccomp_profile: Profile | None = Field(default=None, description="Seccomp profile.")
    app_armor_profile: Profile | None = Field(default=None, description="AppArmor profile.")
    se_linux_options: Passthrough | None = Field(
        default=None, description="core/v1 SELinuxOptions, verbatim."
    )
    se_linux_change_policy: Literal["MountOption", "Recursive"] | None = Field(
        default=None, description="How SELinux labels are applied to volumes."
    )
    windows_options: Passthrough | None = Field(
        default=None, description="core/v1 WindowsSecurityContextOptions, verbatim."
    )


class Capabilities(_Model):
    """Linux capabilities added to or dropped from the trainer container."""

    add: list[str] | None = Field(default=None, max_length=64, description="e.g. [SYS_PTRACE].")
    drop: list[str] | None = Field(default=None, max_length=64, description="e.g. [ALL].")


def _sys_admin(m: SecurityContext) -> bool:
    return bool(m.capabilities and {"SYS_ADMIN", "CAP_SYS_ADMIN"} & set(m.capabilities.add or ()))


class SecurityContext(_Ruled):
    """core/v1 SecurityContext of the trainer container: scalar fields typed."""

    RULES: ClassVar = (
        R.Rule(
            "!has(self.allowPrivilegeEscalation) || self.allowPrivilegeEscalation || "
            "!((has(self.privileged) && self.privileged) || (has(self.capabilities) && "
            "has(self.capabilities.add) && self.capabilities.add.exists(c, c == 'SYS_ADMIN' "
            "|| c == 'CAP_SYS_ADMIN')))",
            "spec.template.containerSecurityContext: allowPrivilegeEscalation false "
            "contradicts privileged true or capability SYS_ADMIN",
            lambda m: (
                m.allow_privilege_escalation is not False or not (m.privileged or _sys_admin(m))
            ),
        ),
    )
    model_config = ConfigDict(json_schema_extra=R.validations(*RULES))

    privileged: bool | None = Field(default=None, description="Run privileged.")
    allow_privilege_escalation: bool | None = Field(
        default=None, description="Whether a process may gain more privileges (no_new_privs)."
    )
    capabilities: Capabilities | None = Field(default=None, description="Capabilities.")
    run_as_user: UserID | None = Field(default=None, description="UID of the trainer.")
    run_as_group: UserID | None = Field(default=None, description="GID of the trainer.")
    run_as_non_root: bool | None = Field(default=None, description="Refuse to run as UID 0.")
    read_only_root_filesystem: bool | None = Field(
        default=None, description="Mount the image read-only."
    )
    proc_mount: Literal["Default", "Unmasked"] | None = Field(
        default=None, description="/proc masking (Unmasked needs hostUsers false)."
    )
    seccomp_profile: Profile | None = Field(default=None, description="Seccomp profile.")
    app_armor_profile: Profile | None = Field(default=None, description="AppArmor profile.")
    se_linux_options: Passthrough | None = Field(
        default=None, description="core/v1 SELinuxOptions, verbatim."
    )
    windows_options: Passthrough | None = Field(
        default=None, description="core/v1 WindowsSecurityContextOptions, verbatim."
    )


# ---- the pod template --------------------------------------------------------------------


class PodTemplate(_Ruled):
    """Pod settings copied into every pod of the job (a k8s passthrough subset)."""

    RULES: ClassVar = (
        R.qualified_keys("labels", "spec.template.labels"),
        R.Rule(
            "!has(self.labels) || self.labels.all(k, !k.startsWith('gpujob.dev/'))",
            "spec.template.labels must not set gpujob.dev/ labels: the operator sets them",
            lambda m: not any(k.startswith("gpujob.dev/") for k in m.labels or {}),
            field_path=".labels",
        ),
        R.Rule(
            "!has(self.annotations) || self.annotations.all(k, "
            f"{R.CEL_QUALIFIED.format(x='k.lowerAscii()')})",
            f"spec.template.annotations keys must be {R.QUALIFIED_NAME}",
            lambda m: all(kf.is_qualified_name(k.lower()) for k in m.annotations or {}),
            field_path=".annotations",
        ),
        R.Rule(
            "!has(self.annotations) || "
            "self.annotations.map(k, size(k) + size(self.annotations[k])).sum() <= 262144",
            "spec.template.annotations must total at most 256 KiB (keys and values)",
            lambda m: (
                sum(len(k.encode()) + len(v.encode()) for k, v in (m.annotations or {}).items())
                <= 262144
            ),
            field_path=".annotations",
        ),
        R.qualified_keys("nodeSelector", "spec.template.nodeSelector"),
        R.Rule(
            "!has(self.volumeMounts) || self.volumeMounts.all(m, "
            "(has(self.volumes) && self.volumes.exists(v, v.name == m.name)) || "
            f"(has(self.shmSize) && m.name == '{_SHM_VOLUME}'))",
            "spec.template.volumeMounts[].name must name a volume of spec.template.volumes",
            lambda m: all(
                any(v.name == mt.name for v in m.volumes or ())
                or (m.shm_size is not None and mt.name == _SHM_VOLUME)
                for mt in m.volume_mounts or ()
            ),
            field_path=".volumeMounts",
        ),
        R.Rule(
            "!has(self.shmSize) || ((!has(self.volumes) || "
            f"!self.volumes.exists(v, v.name == '{_SHM_VOLUME}')) && "
            f"(!has(self.volumeMounts) || !self.volumeMounts.exists(m, m.mountPath == '{_SHM_PATH}')))",
            f"spec.template.shmSize adds the volume {_SHM_VOLUME} mounted at {_SHM_PATH}: "
            "volumes and volumeMounts must not use that name or path",
            lambda m: (
                m.shm_size is None
                or (
                    all(v.name != _SHM_VOLUME for v in m.volumes or ())
                    and all(mt.mount_path != _SHM_PATH for mt in m.volume_mounts or ())
                )
            ),
        ),
    )
    model_config = ConfigDict(json_schema_extra=R.validations(*RULES))

    labels: dict[str, LabelValue] | None = Field(
        default=None,
        max_length=_MAX_MAP,
        description="Extra pod labels (gpujob.dev/* labels are the operator's).",
    )
    annotations: dict[str, Annotated[str, Field(max_length=262144)]] | None = Field(
        default=None, max_length=_MAX_MAP, description="Extra pod annotations."
    )
    node_selector: dict[str, LabelValue] | None = Field(
        default=None, max_length=_MAX_MAP, description="core/v1 PodSpec nodeSelector."
    )
    tolerations: list[Toleration] | None = Field(
        default=None, max_length=_MAX_LIST, description="core/v1 PodSpec tolerations."
    )
    affinity: Affinity | None = Field(
        default=None, description="core/v1 Affinity: nodeAffinity, podAffinity, podAntiAffinity."
    )
    volumes: list[Volume] | None = Field(
        default=None,
        max_length=_MAX_LIST,
        description="core/v1 Volumes: a name and one source each (source fields verbatim).",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
    )
    volume_mounts: list[VolumeMount] | None = Field(
        default=None,
        max_length=_MAX_LIST,
        description="core/v1 VolumeMounts of the trainer container.",
        # Keyed by mountPath like core/v1's own merge key: the server refuses a duplicate path
        # at no CEL cost (a CEL uniqueness check was the CRD's most expensive rule).
        json_schema_extra={
            "x-kubernetes-list-type": "map",
            "x-kubernetes-list-map-keys": ["mountPath"],
        },
    )
    security_context: PodSecurityContext | None = Field(
        default=None, description="core/v1 PodSecurityContext."
    )
    container_security_context: SecurityContext | None = Field(
        default=None, description="core/v1 SecurityContext of the trainer container."
    )
    service_account_name: DNSSubdomain | None = Field(
        default=None, description="ServiceAccount the pods run as."
    )
    priority_class_name: DNSSubdomain | None = Field(
        default=None, description="PriorityClass of the pods."
    )
    scheduler_name: str | None = Field(
        default=None, max_length=253, description="Scheduler for the pods (e.g. a gang scheduler)."
    )
    image_pull_secrets: list[LocalObjectReference] | None = Field(
        default=None, max_length=_MAX_LIST, description="Secrets used to pull the image."
    )
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] | None = Field(
        default=None, description="core/v1 imagePullPolicy of the trainer container."
    )
    termination_grace_period_seconds: int = Field(
        default=30,
        ge=0,
        le=3600,
        description="Seconds a rank gets after SIGTERM (e.g. to checkpoint) before SIGKILL.",
    )
    shm_size: PositiveQuantity | None = Field(
        default=None,
        description='Size of a memory-backed /dev/shm (e.g. "8Gi"); DataLoader workers need more '
        "than the runtime's 64Mi default.",
    )

    @model_validator(mode="after")
    def _unique_volumes(self) -> Self:
        names = [v.name for v in self.volumes or ()]
        if len(names) != len(set(names)):
            raise ValueError("spec.template.volumes: duplicate volume names")
        paths = [m.mount_path for m in self.volume_mounts or ()]
        if len(paths) != len(set(paths)):
            raise ValueError("spec.template.volumeMounts: duplicate mountPath")
        return self
