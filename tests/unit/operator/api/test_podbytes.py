"""The bytes of pods a job asks for, and the refusal over the operator's bound."""

from __future__ import annotations

from gpujob_operator.api import podbytes


def test_a_pods_bytes_are_its_template_as_json_plus_the_operators_part() -> None:
    spec = {
        "nodes": 3,
        "template": {"containers": [{"name": "t", "env": [{"name": "A", "value": "é" * 10}]}]},
    }
    each, nodes = podbytes.pod_bytes(spec)
    assert nodes == 3
    wire = '{"containers":[{"name":"t","env":[{"name":"A","value":"' + "é" * 10 + '"}]}]}'
    assert each == podbytes.POD_OVERHEAD_BYTES + len(wire.encode())
    assert podbytes.pod_bytes({}) == (podbytes.POD_OVERHEAD_BYTES + 2, 1)


def test_over_the_bound_the_refusal_names_the_fields_the_numbers_and_the_setting() -> None:
    spec = {"nodes": 2048, "template": {"containers": [{"name": "t", "args": ["x" * 400_000]}]}}
    words = podbytes.refusal(spec, podbytes.DEFAULT_MAX_JOB_POD_BYTES)
    assert words is not None
    assert words.startswith("spec.template makes pods of 395 KiB each, x spec.nodes 2048 = ")
    assert "over the operator's bound of 64 MiB (GPUJOB_MAX_JOB_POD_BYTES)" in words
    assert podbytes.refusal(spec, 0) is None
    assert podbytes.refusal({**spec, "nodes": 128}, podbytes.DEFAULT_MAX_JOB_POD_BYTES) is None
