"""The status a user can hold in mind: its top-level fields are a contract, pinned here and
in the README's status table, apart from the operator's own bookkeeping.

A field added, removed or retyped in the model fails this test until both PINNED (below)
and the README's table say so in the same change: the table is what users and tools read.
"""

from __future__ import annotations

import re
from typing import Any

from gpujob_operator.api import crd
from gpujob_operator.api.statusupgrade import MOVES
from tests.support.jobs import REPO

PINNED: dict[str, str] = {
    "observedGeneration": "integer",
    "phase": "string",
    "conditions": "array",
    "startTime": "string (date-time)",
    "completionTime": "string (date-time)",
    "progress": "object",
    "bottleneck": "object",
    "gang": "object",
    "failure": "object",
    "hangEvidence": "object",
    "profile": "object",
    "goodput": "object",
    "display": "object",
}
"""The user-facing top-level fields of ``status`` and their types, as the CRD states them."""

INTERNAL = "operatorState"
MAX_FIELDS = 13


def _kind(node: dict[str, Any]) -> str:
    kind = str(node.get("type", "any"))
    return f"{kind} ({node['format']})" if node.get("format") else kind


def _status_schema() -> dict[str, Any]:
    schema: dict[str, Any] = crd.openapi_schema()["properties"]["status"]["properties"]
    return schema


def _deprecated() -> set[str]:
    return {old[0] for old, _ in MOVES if len(old) == 1}


def user_fields() -> dict[str, str]:
    """The CRD's top-level status fields a user reads, with their types."""
    legacy = _deprecated()
    return {
        name: _kind(node)
        for name, node in _status_schema().items()
        if name != INTERNAL and name not in legacy
    }


def readme_table() -> dict[str, str]:
    """The README's status table: each field with its type."""
    text = (REPO / "README.md").read_text()
    section = text.split("\n### status\n", 1)[1].split("\n### ", 1)[0]
    rows = re.findall(r"^\| `([A-Za-z]+)` \| ([a-z ()-]+) \|", section, flags=re.M)
    return dict(rows)


def test_the_user_facing_status_is_pinned_and_small() -> None:
    fields = user_fields()
    assert fields == PINNED, (
        "the status' top-level fields changed: update PINNED and the README's status table "
        f"together. Now: {fields}"
    )
    assert len(fields) <= MAX_FIELDS


def test_the_readme_status_table_lists_each_field_with_its_type() -> None:
    assert readme_table() == PINNED


def test_the_operators_bookkeeping_is_one_object_apart() -> None:
    node = _status_schema()[INTERNAL]
    assert node["type"] == "object"
    assert "internal" in node["description"] and "free to change" in node["description"]
    inside = set(node["properties"])
    assert {"rateSince", "createBackoff", "admissionDenial", "goodput"} <= inside
    # No bookkeeping and no derived twin is left among the user's fields, but as deprecated.
    status = _status_schema()
    for part, keys in (
        ("progress", ("rateSince", "secondsPerSample", "secondsPerToken")),
        ("goodput", ("accountedUntil", "cause", "stage", "attemptSince", "samples")),
    ):
        props = status[part]["properties"]
        for key in keys:
            assert props[key]["description"].startswith("Deprecated"), (part, key)


def test_the_previous_shape_is_kept_only_as_deprecated_fields() -> None:
    status = _status_schema()
    for old, _ in MOVES:
        node = status[old[0]] if len(old) == 1 else status[old[0]]["properties"][old[1]]
        assert node["description"].startswith("Deprecated"), old
        assert node["x-kubernetes-preserve-unknown-fields"] is True
