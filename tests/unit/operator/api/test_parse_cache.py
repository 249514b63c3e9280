"""A spec slow to validate is validated once per content, not on every pass."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from gpujob_operator import api
from gpujob_operator.api import spec as specmod


def big_spec(nodes: int = 2, pad: int = 2000) -> dict[str, Any]:
    env = [{"name": f"E{i}", "value": "x" * 100} for i in range(pad)]
    return {
        "nodes": nodes,
        "gpusPerNode": 0,
        "image": "python:3.11",
        "command": ["python", "train.py"],
        "template": {"containers": [{"name": "sidecar", "image": "busybox", "env": env}]},
    }


def test_the_same_content_is_validated_once_and_other_content_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(specmod, "_PARSED", {})
    calls: list[int] = []
    real = api.GPUTrainingJobSpec.model_validate.__func__  # type: ignore[attr-defined]

    def counted(cls: Any, obj: Any, *a: Any, **kw: Any) -> Any:
        calls.append(1)
        return real(cls, obj, *a, **kw)

    monkeypatch.setattr(api.GPUTrainingJobSpec, "model_validate", classmethod(counted))
    monkeypatch.setattr(specmod, "PARSE_KEEP_SECONDS", 0.0)  # every spec counts as slow
    first = api.parse_spec(big_spec())
    again = api.parse_spec(copy.deepcopy(big_spec()))  # a new body, the same spec
    assert again is first and len(calls) == 1
    wider = api.parse_spec(big_spec(nodes=3))
    assert wider.nodes == 3 and len(calls) == 2


def test_quick_specs_are_not_kept_and_the_kept_are_bounded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(specmod, "_PARSED", {})
    api.parse_spec(big_spec(pad=1))  # validates in well under the threshold
    assert specmod._PARSED == {}
    monkeypatch.setattr(specmod, "PARSE_KEEP_SECONDS", 0.0)
    for nodes in range(1, specmod.PARSED_KEPT + 5):
        api.parse_spec(big_spec(nodes=nodes, pad=1))
    assert len(specmod._PARSED) == specmod.PARSED_KEPT


def test_a_spec_that_is_not_json_is_validated_without_memory_and_refused_as_before() -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError):
        api.parse_spec({1: "x", "nodes": 1})  # mixed keys: no digest (sort_keys fails)
    with pytest.raises(ValidationError):
        api.parse_spec({"nodes": float("nan")})  # NaN: no digest either
