"""``spec.template``: the pod settings copied into every pod of the job.

Every core/v1 PodSpec field but the operator's own (refused by name, :mod:`.owned`), the
trainer container's fields other than those the spec sets, further containers and init
containers (:mod:`.containers`), pod labels and annotations, and /dev/shm. The typed areas
(tolerations, affinity, volumes, security contexts) are checked here; the rest passes
through verbatim and is checked by the API server on a dry-run pod (the admission webhook)
and at pod creation.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Final, Literal, Self

from pydantic import ConfigDict, Field, model_validator

from gpujob_operator.api import k8sformats as kf
from gpujob_operator.api import rules as R
from gpujob_operator.api.base import (
    MAX_LIST,
    MAX_MAP,
    DNSSubdomain,
    LabelValue,
    NamedPassthrough,
    Passthrough,
    PositiveQuantity,
)
from gpujob_operator.api.base import Model as _Model
from gpujob_operator.api.names import PROFILE_VOLUME
from gpujob_operator.api.pod.containers import Container
from gpujob_operator.api.pod.owned import OWNED_RULES, OwnedFields
from gpujob_operator.api.pod.placement import Affinity, Toleration
from gpujob_operator.api.pod.security import PodSecurityContext, SecurityContext
from gpujob_operator.api.pod.volumes import Volume, VolumeMount

_SHM_VOLUME: Final = "gpujob-shm"
_SHM_PATH: Final = "/dev/shm"
_PROFILE_VOLUME: Final = PROFILE_VOLUME


class LocalObjectReference(_Model):
    """A reference to an object in the job's namespace, by name."""

    name: str = Field(min_length=1, max_length=253, description="Name of the referenced object.")


TRAINER_FIELDS: Final = (
    "imagePullPolicy",
    "workingDir",
    "envFrom",
    "lifecycle",
    "livenessProbe",
    "readinessProbe",
    "startupProbe",
    "stdin",
    "stdinOnce",
    "tty",
    "terminationMessagePath",
    "terminationMessagePolicy",
    "volumeDevices",
    "resizePolicy",
)
"""Template fields copied verbatim onto the trainer container."""
MERGED_FIELDS: Final = {
    "labels": "metadata.labels",
    "annotations": "metadata.annotations",
    "volumeMounts": "spec.containers[0].volumeMounts",
    "ports": "spec.containers[0].ports",
    "containerSecurityContext": "spec.containers[0].securityContext",
    "containers": "spec.containers",
    "shmSize": "spec.volumes",
}
"""Template fields the operator merges with its own (where they land in the pod). Every
other template field is a PodSpec field of the same name, copied verbatim."""

_BY_NAME: Final[dict[str, Any]] = {
    "x-kubernetes-list-type": "map",
    "x-kubernetes-list-map-keys": ["name"],
}


def _pod_field(description: str) -> Any:
    return Field(default=None, description=f"core/v1 PodSpec {description}")


def _trainer_field(description: str) -> Any:
    return Field(default=None, description=f"core/v1 Container {description} of the trainer.")


class PodTemplate(OwnedFields):
    """Every core/v1 pod field but the operator's, copied into every pod of the job.

    Pod fields keep their core/v1 names; the trainer container's own fields sit beside them
    (``volumeMounts``, ``ports``, probes ...), since the trainer is built from the spec's
    ``image``, ``command``, ``args``, ``env`` and ``resources``.
    """

    RULES: ClassVar = (
        *OWNED_RULES,
        R.Rule(
            "!has(self.hostNetwork) || !self.hostNetwork || !has(self.dnsPolicy) || "
            "self.dnsPolicy in ['ClusterFirstWithHostNet', 'None']",
            "spec.template.dnsPolicy with hostNetwork must be ClusterFirstWithHostNet (the "
            "default) or None: ranks find rank 0 through the cluster's DNS, which ClusterFirst "
            "and Default skip on the host network",
            lambda m: (
                not m.host_network or m.dns_policy in (None, "ClusterFirstWithHostNet", "None")
            ),
            field_path=".dnsPolicy",
        ),
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
        R.Rule(
            f"!has(self.volumes) || !self.volumes.exists(v, v.name == '{_PROFILE_VOLUME}')",
            f"spec.template.volumes must not use the name {_PROFILE_VOLUME}: the operator "
            "mounts an emptyDir of that name for profile traces",
            lambda m: all(v.name != _PROFILE_VOLUME for v in m.volumes or ()),
            field_path=".volumes",
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

    # The rest of core/v1's PodSpec, verbatim (checked by the API server).
    init_containers: list[Container] | None = Field(
        default=None,
        max_length=MAX_LIST,
        description="core/v1 init containers, run in order before the trainer; with "
        "restartPolicy Always a native sidecar that runs beside it.",
        json_schema_extra=_BY_NAME,
    )
    containers: list[Container] | None = Field(
        default=None,
        max_length=MAX_LIST,
        description="Further core/v1 containers beside the trainer (which comes first).",
        json_schema_extra=_BY_NAME,
    )
    runtime_class_name: DNSSubdomain | None = _pod_field("runtimeClassName (e.g. nvidia).")
    host_network: bool | None = _pod_field(
        "hostNetwork: the ranks use the node's network; see training.hostNetworkPorts."
    )
    host_ipc: bool | None = Field(
        default=None,
        alias="hostIPC",
        description="core/v1 PodSpec hostIPC (NCCL's shared-memory transport).",
    )
    host_pid: bool | None = Field(
        default=None, alias="hostPID", description="core/v1 PodSpec hostPID."
    )
    host_users: bool | None = _pod_field("hostUsers (false: a user namespace).")
    share_process_namespace: bool | None = _pod_field("shareProcessNamespace.")
    dns_policy: Literal["ClusterFirst", "ClusterFirstWithHostNet", "Default", "None"] | None = (
        _pod_field("dnsPolicy (with hostNetwork the operator defaults ClusterFirstWithHostNet).")
    )
    dns_config: Passthrough | None = _pod_field("dnsConfig.")
    host_aliases: list[Passthrough] | None = Field(
        default=None, max_length=MAX_LIST, description="core/v1 PodSpec hostAliases."
    )
    topology_spread_constraints: list[Passthrough] | None = Field(
        default=None, max_length=MAX_LIST, description="core/v1 PodSpec topologySpreadConstraints."
    )
    enable_service_links: bool | None = _pod_field(
        "enableServiceLinks (the operator's default is false)."
    )
    automount_service_account_token: bool | None = _pod_field("automountServiceAccountToken.")
    preemption_policy: Literal["PreemptLowerPriority", "Never"] | None = _pod_field(
        "preemptionPolicy."
    )
    set_hostname_as_fqdn: bool | None = Field(
        default=None, alias="setHostnameAsFQDN", description="core/v1 PodSpec setHostnameAsFQDN."
    )
    resource_claims: list[NamedPassthrough] | None = Field(
        default=None,
        max_length=MAX_LIST,
        description="core/v1 PodResourceClaims (Dynamic Resource Allocation): "
        "resourceClaimTemplateName gives each pod its own claim.",
        json_schema_extra=_BY_NAME,
    )
    readiness_gates: list[Passthrough] | None = Field(
        default=None, max_length=MAX_LIST, description="core/v1 PodSpec readinessGates."
    )
    scheduling_gates: list[Passthrough] | None = Field(
        default=None, max_length=MAX_LIST, description="core/v1 PodSpec schedulingGates."
    )
    os: Passthrough | None = _pod_field("os.")
    resources: Passthrough | None = _pod_field(
        "resources: pod-level requests and limits (cpu, memory, hugepages)."
    )
    # The trainer container's own fields (its image, command, args, env and resources are
    # the spec's).
    working_dir: str | None = Field(
        default=None, max_length=4096, description="core/v1 Container workingDir of the trainer."
    )
    ports: list[Passthrough] | None = Field(
        default=None,
        max_length=MAX_LIST,
        description="core/v1 ContainerPorts of the trainer, after the operator's own "
        "(metrics-<i>, rendezvous).",
    )
    env_from: list[Passthrough] | None = Field(
        default=None, max_length=MAX_LIST, description="core/v1 envFrom of the trainer."
    )
    lifecycle: Passthrough | None = _trainer_field("lifecycle (postStart, preStop)")
    liveness_probe: Passthrough | None = _trainer_field("livenessProbe")
    readiness_probe: Passthrough | None = _trainer_field("readinessProbe")
    startup_probe: Passthrough | None = _trainer_field("startupProbe")
    stdin: bool | None = _trainer_field("stdin")
    stdin_once: bool | None = _trainer_field("stdinOnce")
    tty: bool | None = _trainer_field("tty")
    termination_message_path: str | None = _trainer_field("terminationMessagePath")
    termination_message_policy: Literal["File", "FallbackToLogsOnError"] | None = _trainer_field(
        "terminationMessagePolicy (the operator's default is FallbackToLogsOnError)"
    )
    volume_devices: list[Passthrough] | None = Field(
        default=None, max_length=MAX_LIST, description="core/v1 volumeDevices of the trainer."
    )
    resize_policy: list[Passthrough] | None = Field(
        default=None, max_length=MAX_LIST, description="core/v1 resizePolicy of the trainer."
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
