"""The pod fields the operator owns: declared in ``spec.template`` only to refuse them by name.

A field left out of the schema would be refused too, but as "field not declared in schema",
which tells a user migrating a PodTemplateSpec nothing. Declared here, each is refused with
why the operator owns it and what to set instead (the CEL rule and its twin come from one
table, :data:`OWNED_FIELDS`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from pydantic import Field, create_model
from pydantic.alias_generators import to_snake

from gpujob_operator.api import rules as R
from gpujob_operator.api.base import Passthrough
from gpujob_operator.api.base import Ruled as _Ruled

OWNED_FIELDS: Final[dict[str, str]] = {
    "restartPolicy": "the pods run with Never and the operator restarts the whole gang "
    "(runPolicy.backoffLimit)",
    "hostname": "each pod is named <job>-node-<rank> so ranks resolve rank 0",
    "hostnameOverride": "each pod is named <job>-node-<rank> so ranks resolve rank 0",
    "subdomain": "the job's headless Service gives the ranks their DNS names",
    "nodeName": "it bypasses the scheduler and gang admission: use nodeSelector or affinity",
    "activeDeadlineSeconds": "a pod's deadline fails one rank and restarts the gang: use "
    "runPolicy.activeDeadlineSeconds",
    "priority": "the API server sets it from priorityClassName",
    "overhead": "the RuntimeClass admission sets it from runtimeClassName",
    "ephemeralContainers": "they are added to a running pod (kubectl debug), never at creation",
    "serviceAccount": "a deprecated alias: use serviceAccountName",
    "schedulingGroup": "the operator sets it for native gang scheduling (spec.gang)",
    "workloadRef": "the operator sets it for native gang scheduling (spec.gang)",
    "name": f"the trainer container is named {'trainer'!r}; further containers go in "
    "spec.template.containers",
    "image": "the trainer's image is spec.image",
    "command": "the trainer's command is spec.command",
    "args": "the trainer's arguments are spec.args",
    "env": "the trainer's env is spec.env",
}


_TYPES: Final[dict[str, Any]] = {
    "activeDeadlineSeconds": int,
    "priority": int,
    "overhead": Passthrough,
    "ephemeralContainers": list[Passthrough],
    "schedulingGroup": Passthrough,
    "workloadRef": Passthrough,
    "command": list[str],
    "args": list[str],
    "env": list[Passthrough],
}
"""core/v1's type of each owned field that is not a string: CEL sees only typed fields."""


def _fields() -> dict[str, Any]:
    return {
        to_snake(name): (
            _TYPES.get(name, str) | None,
            Field(default=None, alias=name, description=f"Refused: {reason}."),
        )
        for name, reason in OWNED_FIELDS.items()
    }


def _unset(attr: str) -> Callable[[Any], bool]:
    return lambda m: getattr(m, attr) is None


def _rules() -> tuple[R.Rule, ...]:
    return tuple(
        R.Rule(
            f"!has(self.{name})",
            f"spec.template.{name} is set by the operator: {reason}",
            _unset(to_snake(name)),
            field_path=f".{name}",
        )
        for name, reason in OWNED_FIELDS.items()
    )


OWNED_RULES: Final = _rules()

OwnedFields: Any = create_model("OwnedFields", __base__=_Ruled, **_fields())
"""A base for ``PodTemplate``: the owned fields, each declared and refused by its rule."""
