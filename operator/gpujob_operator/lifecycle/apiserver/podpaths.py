"""A field path of a built pod, mapped back to the job's field the user wrote (pure).

The API server words a refused pod in the pod's terms (``spec.containers[0].env[14]...``);
the user wrote a GPUTrainingJob. :func:`user_path` turns one into the other, given the
job's raw spec and the pod built from it (``builders.build_pod``):

* ``metadata.labels`` / ``annotations`` -> ``spec.template.labels`` / ``annotations``;
* the trainer, ``spec.containers[0]``: ``image``, ``command``, ``args``, ``resources`` ->
  ``spec.<same>``; ``securityContext`` -> ``spec.template.containerSecurityContext``;
  ``env[j]`` -> ``spec.env[i]`` by name (the operator's entries come first);
  ``volumeMounts[j]`` by mountPath and ``ports[j]`` by equality -> ``spec.template.<same>[i]``;
  any other field X -> ``spec.template.X``;
* another container ``spec.containers[k]`` -> ``spec.template.containers[k-1]``;
* ``spec.volumes[j]`` -> ``spec.template.volumes[i]`` by name; the shared-memory volume's
  size -> ``spec.template.shmSize``; any other pod field X (index kept) -> ``spec.template.X``.

Generic on purpose: a pod field the template gains later maps without a change here, because
the rule is "the same name under ``spec.template``". A path is the user's only where the
user's spec has that field; anything else the operator set, and keeps the pod's path.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from gpujob_operator import api
from gpujob_operator.lifecycle.builders import SHM_VOLUME

Segment = str | int
"""One step of a field path: a field name, a list index, or a map key (``[cpu]``)."""

_STEP: Final = re.compile(r"\[(?P<index>[^\]]*)\]|(?P<name>[^.\[\]]+)")


@dataclass(frozen=True)
class Mapped:
    """Where a pod's field came from."""

    path: str
    """The user's path (``spec.env[0].valueFrom``), or the pod's own when ``operator``."""
    operator: bool = False
    """True when the operator set the value: no field of the user's spec holds it."""

    def __str__(self) -> str:
        return f"{self.path} (set by the operator)" if self.operator else self.path


class _Keys:
    """Map keys (``[cpu]``, ``['a b']``) in a parsed path, kept apart from field names."""

    def __init__(self, key: str) -> None:
        self.key = key

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Keys) and other.key == self.key

    def __hash__(self) -> int:
        return hash(self.key)

    def __repr__(self) -> str:
        return f"[{self.key}]"


def parse(path: str) -> list[Segment | _Keys]:
    """``a.b[2].c[cpu]`` -> ``['a', 'b', 2, 'c', [cpu]]``."""
    out: list[Segment | _Keys] = []
    for m in _STEP.finditer(path):
        if m["name"] is not None:
            out.append(m["name"])
        elif m["index"].isdigit():
            out.append(int(m["index"]))
        else:
            out.append(_Keys(m["index"]))
    return out


def render(steps: Sequence[Segment | _Keys]) -> str:
    """The inverse of :func:`parse`."""
    text = ""
    for step in steps:
        if isinstance(step, int):
            text += f"[{step}]"
        elif isinstance(step, _Keys):
            text += repr(step)
        else:
            text += f".{step}" if text else step
    return text


def _index_of(items: Any, match: Callable[[Any], bool]) -> int | None:
    for i, item in enumerate(items if isinstance(items, list) else ()):
        if match(item):
            return i
    return None


def _keyed(key: str, value: Any) -> Callable[[Any], bool]:
    """Matches a list entry (a mapping) whose ``key`` is ``value``."""
    return lambda item: isinstance(item, Mapping) and item.get(key) == value


def _at(items: Any, j: int) -> Any:
    return items[j] if isinstance(items, list) and 0 <= j < len(items) else None


def _has(spec: Mapping[str, Any], steps: Sequence[Segment | _Keys]) -> bool:
    """Whether the user's spec sets the field a mapped path starts from (``spec.X`` or
    ``spec.template.X``); what lies below it may well be missing (``Required value``)."""
    node: Any = spec
    rest = list(steps[1:])
    if len(rest) > 1 and rest[0] == "template":
        node, rest = spec.get("template"), rest[1:]
    root = rest[0] if rest else None
    return isinstance(root, str) and isinstance(node, Mapping) and node.get(root) is not None


def user_path(pod_path: str, spec: Mapping[str, Any], pod: Mapping[str, Any]) -> Mapped:
    """The user's field behind ``pod_path`` of ``pod`` (built from the raw ``spec``)."""
    steps = parse(pod_path)
    mapped = _map(steps, spec, pod)
    if mapped is None or not _has(spec, mapped):
        return Mapped(pod_path, operator=True)
    return Mapped(render(mapped))


def _map(
    steps: list[Segment | _Keys], spec: Mapping[str, Any], pod: Mapping[str, Any]
) -> list[Segment | _Keys] | None:
    if len(steps) >= 2 and steps[0] == "metadata" and steps[1] in ("labels", "annotations"):
        return ["spec", "template", *steps[1:]]
    if len(steps) < 2 or steps[0] != "spec":
        return None
    field, rest = steps[1], steps[2:]
    pod_spec = pod.get("spec") or {}
    template = spec.get("template") or {}
    if field == "containers" and rest and isinstance(rest[0], int):
        if rest[0] == 0:
            container = _at(pod_spec.get("containers"), 0) or {}
            return _trainer(rest[1:], spec, template, container)
        return ["spec", "template", "containers", rest[0] - 1, *rest[1:]]
    if field == "volumes" and rest and isinstance(rest[0], int):
        name = (_at(pod_spec.get("volumes"), rest[0]) or {}).get("name")
        if name == SHM_VOLUME and rest[1:3] == ["emptyDir", "sizeLimit"]:
            return ["spec", "template", "shmSize"]
        i = _index_of(template.get("volumes"), _keyed("name", name))
        return None if i is None else ["spec", "template", "volumes", i, *rest[1:]]
    if not isinstance(field, str):
        return None
    return ["spec", "template", field, *rest]


def _trainer(
    rest: list[Segment | _Keys],
    spec: Mapping[str, Any],
    template: Mapping[str, Any],
    container: Mapping[str, Any],
) -> list[Segment | _Keys] | None:
    """A path inside the trainer container (``spec.containers[0]`` stripped)."""
    if not rest or not isinstance(rest[0], str):
        return None
    field, tail = rest[0], rest[1:]
    if field in ("command", "args"):
        return _argv(field, tail, spec, container)
    if field == "image":
        return ["spec", "image", *tail]
    if field == "resources":
        if len(tail) >= 2 and tail[1] == _Keys(api.GPU_RESOURCE):
            return ["spec", "gpusPerNode"]
        return ["spec", "resources", *tail]
    if field == "env" and tail and isinstance(tail[0], int):
        # The user's entry of that name: the operator drops its own default of a name the
        # user sets, and the API refuses user entries for the names it owns.
        name = (_at(container.get("env"), tail[0]) or {}).get("name")
        i = _index_of(spec.get("env"), _keyed("name", name))
        return None if i is None else ["spec", "env", i, *tail[1:]]
    if field == "securityContext":
        return ["spec", "template", "containerSecurityContext", *tail]
    if field == "volumeMounts" and tail and isinstance(tail[0], int):
        path = (_at(container.get("volumeMounts"), tail[0]) or {}).get("mountPath")
        i = _index_of(template.get("volumeMounts"), _keyed("mountPath", path))
        return None if i is None else ["spec", "template", "volumeMounts", i, *tail[1:]]
    if field == "ports" and tail and isinstance(tail[0], int):
        port = _at(container.get("ports"), tail[0])
        i = _index_of(template.get("ports"), lambda p: p == port)
        return None if i is None else ["spec", "template", "ports", i, *tail[1:]]
    return ["spec", "template", *rest]


def _argv(
    field: str,
    tail: list[Segment | _Keys],
    spec: Mapping[str, Any],
    container: Mapping[str, Any],
) -> list[Segment | _Keys] | None:
    """``command[j]`` / ``args[j]``: the user's list is the pod's tail (torchrun wraps the
    command: its flags come first, and ``python`` itself may be dropped)."""
    if not tail or not isinstance(tail[0], int):
        return ["spec", field, *tail]
    pod_argv = list(container.get(field) or [])
    user = list(spec.get(field) or [])
    for dropped in (0, 1):  # the user's argv as is, or without its interpreter
        kept = user[dropped:]
        start = len(pod_argv) - len(kept)
        if kept and start >= 0 and pod_argv[start:] == kept:
            j = tail[0] - start
            return ["spec", field, j + dropped, *tail[1:]] if j >= 0 else None
    return None
