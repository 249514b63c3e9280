"""The GPUTrainingJob kind: its group, version and names, the job-name rule, and the object.

The pydantic models are the single source of truth: :mod:`gpujob_operator.api.crd` turns them
into the CRD's OpenAPI schema (descriptions feed ``kubectl explain``). The object composes
the spec (:mod:`gpujob_operator.api.spec`) and the status
(:mod:`gpujob_operator.api.status`); :mod:`gpujob_operator.api` re-exports them all.

Wire format is camelCase; Python attributes are snake_case. Dump with
``model_dump(mode="json", exclude_none=True)`` (aliases are the default).
"""

from __future__ import annotations

import re
from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from gpujob_operator.api import rules as R
from gpujob_operator.api.spec import GPUTrainingJobSpec
from gpujob_operator.api.status import GPUTrainingJobStatus

GROUP: Final = "gpujob.dev"
VERSION: Final = "v1alpha1"
API_VERSION: Final = f"{GROUP}/{VERSION}"
KIND: Final = "GPUTrainingJob"
PLURAL: Final = "gputrainingjobs"
SINGULAR: Final = "gputrainingjob"
SHORT_NAMES: Final = ("gtj", "gpujob")
CRD_NAME: Final = f"{PLURAL}.{GROUP}"

# `<job>-node-<rank>` is a pod hostname (a DNS label, <= 63 chars): 53 + len("-node-9998").
MAX_JOB_NAME_LENGTH: Final = 53
JOB_NAME_PATTERN: Final = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"


class GPUTrainingJob(BaseModel):
    """A multi-node, multi-GPU PyTorch training job run as a gang of torchrun pods."""

    model_config = ConfigDict(extra="forbid", validate_by_name=True, serialize_by_alias=True)

    api_version: Literal["gpujob.dev/v1alpha1"] = Field(
        default="gpujob.dev/v1alpha1", alias="apiVersion", description="gpujob.dev/v1alpha1"
    )
    kind: Literal["GPUTrainingJob"] = Field(default=KIND, description="GPUTrainingJob")
    metadata: dict[str, Any] = Field(default_factory=dict, description="Standard object metadata.")
    spec: GPUTrainingJobSpec = Field(description="Desired state.")
    status: GPUTrainingJobStatus | None = Field(default=None, description="Observed state.")

    @model_validator(mode="after")
    def _name(self) -> GPUTrainingJob:

        name = self.metadata.get("name")
        if isinstance(name, str) and not (
            len(name) <= MAX_JOB_NAME_LENGTH and re.match(JOB_NAME_PATTERN, name)
        ):
            raise ValueError(NAME_RULE_MESSAGE)
        return self


NAME_RULE_MESSAGE: Final = (
    f"metadata.name must be a DNS-1035 label of at most {MAX_JOB_NAME_LENGTH} characters "
    "(it names the headless Service and the pods' hostnames)"
)
NAME_RULE: Final = R.cel(
    f"size(self.metadata.name) <= {MAX_JOB_NAME_LENGTH} && "
    f"self.metadata.name.matches('{JOB_NAME_PATTERN}')",
    NAME_RULE_MESSAGE,
)


def dump(model: BaseModel) -> dict[str, Any]:
    """Wire-format dict: camelCase, JSON types, unset optionals omitted."""
    return model.model_dump(mode="json", by_alias=True, exclude_none=True)
