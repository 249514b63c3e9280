"""``spec.template``: the pod settings copied into every pod of the job.

Labels, annotations, node selector, tolerations and affinity, volumes and mounts, security
contexts, ServiceAccount, priority, scheduler, image pulls, grace period and /dev/shm: the
model composes the core/v1 areas of :mod:`gpujob_operator.api.pod` and checks what ties them
together (mounts name volumes, the /dev/shm volume is the operator's).
"""

from __future__ import annotations

from typing import Annotated, ClassVar, Final, Literal, Self

from pydantic import ConfigDict, Field, model_validator

from gpujob_operator.api import k8sformats as kf
from gpujob_operator.api import rules as R
from gpujob_operator.api.base import MAX_LIST, MAX_MAP, DNSSubdomain, LabelValue, PositiveQuantity
from gpujob_operator.api.base import Model as _Model
from gpujob_operator.api.base import Ruled as _Ruled
from gpujob_operator.api.pod.placement import Affinity, Toleration
from gpujob_operator.api.pod.security import PodSecurityContext, SecurityContext
from gpujob_operator.api.pod.volumes import Volume, VolumeMount

_SHM_VOLUME: Final = "gpujob-shm"
_SHM_PATH: Final = "/dev/shm"


class LocalObjectReference(_Model):
    """A reference to an object in the job's namespace, by name."""

    name: str = Field(min_length=1, max_length=253, description="Name of the referenced object.")


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
        max_length=MAX_MAP,
        description="Extra pod labels (gpujob.dev/* labels are the operator's).",
    )
    annotations: dict[str, Annotated[str, Field(max_length=262144)]] | None = Field(
        default=None, max_length=MAX_MAP, description="Extra pod annotations."
    )
    node_selector: dict[str, LabelValue] | None = Field(
        default=None, max_length=MAX_MAP, description="core/v1 PodSpec nodeSelector."
    )
    tolerations: list[Toleration] | None = Field(
        default=None, max_length=MAX_LIST, description="core/v1 PodSpec tolerations."
    )
    affinity: Affinity | None = Field(
        default=None, description="core/v1 Affinity: nodeAffinity, podAffinity, podAntiAffinity."
    )
    volumes: list[Volume] | None = Field(
        default=None,
        max_length=MAX_LIST,
        description="core/v1 Volumes: a name and one source each (source fields verbatim).",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
    )
    volume_mounts: list[VolumeMount] | None = Field(
        default=None,
        max_length=MAX_LIST,
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
        default=None, max_length=MAX_LIST, description="Secrets used to pull the image."
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
