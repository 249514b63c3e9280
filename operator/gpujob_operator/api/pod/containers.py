"""Further containers and init containers (native sidecars too) in ``spec.template``.

They are core/v1 Containers copied verbatim into every pod. gpujob checks only what it owns:
the trainer container's name, and the GPUs, which belong to the trainer container
(``spec.gpusPerNode``). Everything else is core/v1's to check, and the admission webhook
has the API server check it on a dry-run pod at ``kubectl apply``.
"""

from __future__ import annotations

from typing import ClassVar, Final

from pydantic import ConfigDict, Field

from gpujob_operator.api import rules as R
from gpujob_operator.api.base import DNSLabel, Model, Passthrough, ResourceQuantity
from gpujob_operator.api.base import Ruled as _Ruled
from gpujob_operator.api.pod.resources import GPU_RESOURCE

TRAINER_CONTAINER: Final = "trainer"
"""The name of the container the operator builds from the spec (image, command, env)."""


class ContainerResources(Model):
    """A further container's resources: requests and limits typed so CEL can read them."""

    model_config = ConfigDict(extra="allow")

    requests: dict[str, ResourceQuantity] | None = Field(
        default=None, max_length=16, description="core/v1 requests."
    )
    limits: dict[str, ResourceQuantity] | None = Field(
        default=None, max_length=16, description="core/v1 limits."
    )
    claims: list[Passthrough] | None = Field(
        default=None, max_length=16, description="core/v1 ResourceClaims this container uses."
    )


class Container(_Ruled):
    """A core/v1 Container other than the trainer's: every field passes through."""

    RULES: ClassVar = (
        R.Rule(
            f"self.name != '{TRAINER_CONTAINER}'",
            f"the container name {TRAINER_CONTAINER!r} is the operator's trainer container",
            lambda m: m.name != TRAINER_CONTAINER,
            field_path=".name",
        ),
        R.Rule(
            "!has(self.resources) || "
            f"((!has(self.resources.requests) || !('{GPU_RESOURCE}' in self.resources.requests))"
            f" && (!has(self.resources.limits) || !('{GPU_RESOURCE}' in self.resources.limits)))",
            f"{GPU_RESOURCE} belongs to the trainer container: set spec.gpusPerNode",
            lambda m: (
                m.resources is None
                or (
                    GPU_RESOURCE not in (m.resources.requests or {})
                    and GPU_RESOURCE not in (m.resources.limits or {})
                )
            ),
            field_path=".resources",
        ),
    )
    model_config = ConfigDict(extra="allow", json_schema_extra=R.validations(*RULES))

    name: DNSLabel = Field(description="Container name, unique in the pod.")
    image: str | None = Field(default=None, max_length=4096, description="core/v1 image.")
    restart_policy: str | None = Field(
        default=None,
        max_length=32,
        description="Always on an init container makes it a native sidecar: it starts before "
        "the trainer, runs beside it, and is stopped once the trainer exits.",
    )
    resources: ContainerResources | None = Field(
        default=None, description="core/v1 ResourceRequirements (no nvidia.com/gpu)."
    )
