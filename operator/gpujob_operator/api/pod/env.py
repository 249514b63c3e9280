"""The trainer's environment: core/v1 EnvVar and the sources of its value.

A literal value or one source (downward API field or resource, ConfigMap or Secret key, env
file key), each checked as core/v1 checks it. The variables the operator owns are refused by
the spec (:data:`gpujob_operator.api.names.RESERVED_ENV`), not here.
"""

from __future__ import annotations

import re
from typing import Annotated, ClassVar, Final

from pydantic import ConfigDict, Field
from pydantic.alias_generators import to_snake

from gpujob_operator.api import k8sformats as kf
from gpujob_operator.api import rules as R
from gpujob_operator.api.base import DNSLabel, DNSSubdomain, PositiveQuantity
from gpujob_operator.api.base import Model as _Model
from gpujob_operator.api.base import Ruled as _Ruled

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
