"""The pods' volumes and the trainer's mounts: core/v1 Volume and VolumeMount.

A volume is a name and exactly one of :data:`VOLUME_SOURCES`, whose own fields are copied
verbatim (checked by the pod dry run); mounts are typed and checked as core/v1 checks them.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Final, Literal

from pydantic import ConfigDict, Field, create_model
from pydantic.alias_generators import to_snake

from gpujob_operator.api import rules as R
from gpujob_operator.api.base import DNSLabel, Passthrough
from gpujob_operator.api.base import Ruled as _Ruled

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
