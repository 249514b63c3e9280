"""Render the API reference (docs/api.md) from the CRD the model generates.

Why generated: the pydantic model is the single source of truth, so the reference can
never disagree with what the API server validates. ``python -m gpujob_operator.generate --check`` fails on drift.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from gpujob_operator.api import crd
from gpujob_operator.api.pod.owned import OWNED_FIELDS
from gpujob_operator.api.pod.template import MERGED_FIELDS, TRAINER_FIELDS

DOC_PATH = Path("docs") / "api.md"
HEADER = """# GPUTrainingJob API reference

Generated from the pydantic model (`operator/gpujob_operator/api/`) by
`python -m gpujob_operator.generate`; do not edit by hand. `kubectl explain gputrainingjob.spec`
shows the same descriptions.

"""


def _type(node: dict[str, Any]) -> str:
    t = str(node.get("type", "object" if node.get("x-kubernetes-preserve-unknown-fields") else ""))
    if t == "array":
        return f"[]{_type(node.get('items', {}))}"
    if "enum" in node:
        return " \\| ".join(f"`{v}`" for v in node["enum"])
    if node.get("x-kubernetes-int-or-string"):
        return "int-or-string"
    return t or "any"


def _limits(node: dict[str, Any]) -> str:
    parts = []
    for key, label in (
        ("minimum", "≥"),
        ("maximum", "≤"),
        ("minLength", "len ≥"),
        ("maxLength", "len ≤"),
        ("maxItems", "items ≤"),
        ("maxProperties", "keys ≤"),
        ("pattern", "pattern"),
    ):
        if key in node:
            if key == "minimum" and node.get("exclusiveMinimum") is True:
                label = ">"
            elif key == "maximum" and node.get("exclusiveMaximum") is True:
                label = "<"
            parts.append(f"{label} `{node[key]}`")
    if "default" in node:
        parts.append(f"default `{node['default']}`")
    return ", ".join(parts)


def _rows(node: dict[str, Any], path: str) -> Iterator[tuple[str, str, str, str]]:
    for name, child in (node.get("properties") or {}).items():
        here = f"{path}.{name}" if path else name
        desc = " ".join(str(child.get("description", "")).split())
        yield here, _type(child), _limits(child), desc
        target = child.get("items", {}) if child.get("type") == "array" else child
        if target.get("properties"):
            yield from _rows(target, here + ("[]" if child.get("type") == "array" else ""))


def _rules(node: dict[str, Any], path: str) -> Iterator[tuple[str, str]]:
    """Each rule with where it applies: ``[]`` is every list item, ``[*]`` every map value."""
    for rule in node.get("x-kubernetes-validations") or []:
        yield path or "(root)", str(rule.get("message", rule.get("rule")))
    for name, child in (node.get("properties") or {}).items():
        yield from _rules(child, f"{path}.{name}" if path else name)
    if isinstance(node.get("items"), dict):
        yield from _rules(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        yield from _rules(node["additionalProperties"], f"{path}[*]")


MERGE_ORDER = """## How spec.template becomes a pod

Each pod is built in this order (`lifecycle/builders.py`):

1. Metadata: the template's labels (never `gpujob.dev/*`), then the operator's; the
   template's annotations.
2. The trainer container, `containers[0]`, named `trainer`: `spec.image`; `spec.command`
   (wrapped in torchrun with `launcher: torchrun`) and `spec.args`; env: the operator's
   rendezvous and `GPUJOB_*` variables, its defaults unless `spec.env` sets the same name,
   then `spec.env` in order; ports: `metrics-<i>` per local rank and `rendezvous` (hostPorts
   on the host network), then the template's; resources: `spec.resources` plus
   `gpusPerNode` x `nvidia.com/gpu` unless `spec.resources.claims` is set; volumeMounts: the
   template's, then `/dev/shm` with `shmSize`; `terminationMessagePolicy:
   FallbackToLogsOnError` unless the template sets one; the template's other trainer fields.
3. The pod spec: `hostname`, `subdomain`, `restartPolicy: Never`; `enableServiceLinks:
   false`, `terminationGracePeriodSeconds` and (with `hostNetwork`) `dnsPolicy:
   ClusterFirstWithHostNet` unless the template sets them; every other template field as
   written; `containers`: the trainer, then the template's; `volumes`: the template's, then
   the `/dev/shm` volume.
4. Gang admission: `schedulingGroup` (native gangs) or Kueue's labels.

| template field | lands in the pod at |
|---|---|
"""


def _merge_rules() -> str:
    """Where each template field lands, and the fields the operator owns (from the tables
    the builder and the rules use, so this cannot drift)."""
    out = [MERGE_ORDER]
    for name, where in MERGED_FIELDS.items():
        out.append(f"| `{name}` | `{where}` |\n")
    for name in TRAINER_FIELDS:
        out.append(f"| `{name}` | `spec.containers[0].{name}` |\n")
    out.append("| any other field | `spec.<the same name>` |\n")
    out.append(
        "\nFields the operator owns, refused in `spec.template` with the reason:\n\n"
        "| field | why |\n|---|---|\n"
    )
    for name, reason in OWNED_FIELDS.items():
        out.append(f"| `{name}` | {reason} |\n")
    return "".join(out) + "\n"


def render() -> str:
    """The whole reference as Markdown."""
    version = crd.build_crd()["spec"]["versions"][0]
    schema = version["schema"]["openAPIV3Schema"]["properties"]
    out = [HEADER]
    for section in ("spec", "status"):
        out.append(f"## {section}\n\n| field | type | limits | description |\n|---|---|---|---|\n")
        for path, typ, limits, desc in _rows(schema[section], section):
            out.append(f"| `{path}` | {typ} | {limits} | {desc} |\n")
        out.append("\n")
    out.append(_merge_rules())
    out.append(
        "## Validation rules (CEL) the API server enforces\n\n| where | message |\n|---|---|\n"
    )
    for path, message in _rules(schema["spec"], "spec"):
        out.append(f"| `{path}` | {message} |\n")
    out.append("\n## Printer columns\n\n| column | JSONPath |\n|---|---|\n")
    for col in version.get("additionalPrinterColumns", []):
        out.append(f"| {col['name']} | `{col['jsonPath']}` |\n")
    return "".join(out)


def artefacts() -> dict[Path, str]:
    """The committed API reference."""
    return {DOC_PATH: render()}
