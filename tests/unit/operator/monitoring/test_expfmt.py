"""The exposition parser: equal to prometheus_client's on real payloads, strict on garbage,
and fuzzed: on any input it returns samples or raises ParseError, nothing else."""

from __future__ import annotations

import contextlib
import math
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from gpujob_operator.monitoring.scrape.expfmt import WANTED, ParseError, Sample, parse

PAYLOADS = Path(__file__).resolve().parents[3] / "data" / "payloads"
RECORDED = sorted(PAYLOADS.glob("*.prom"))


def reference(text: str, wanted: frozenset[str] | None) -> list[tuple[object, ...]]:
    return sorted(
        (s.name, tuple(sorted(s.labels.items())), repr(float(s.value)), s.timestamp)
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
        if wanted is None or s.name in wanted
    )


def ours(text: str | bytes, wanted: frozenset[str] | None) -> list[tuple[object, ...]]:
    return sorted(
        (s.name, tuple(sorted(s.labels.items())), repr(float(s.value)), s.timestamp)
        for s in parse(text, wanted)
    )


@pytest.mark.parametrize("path", RECORDED, ids=lambda p: p.name)
def test_recorded_payloads_match_prometheus_client(path: Path) -> None:
    text = path.read_text()
    assert ours(text, WANTED) == reference(text, WANTED)
    assert ours(text, None) == reference(text, None)
    assert len(parse(text)) > 30


def test_escapes_special_values_timestamps_and_histograms() -> None:
    text = (
        "# HELP gpujob_train_loss a \\\\ help\n"
        "# TYPE gpujob_train_loss gauge\n"
        'gpujob_train_loss{rank="0",note="a\\"b\\\\c\\nd\\q"} NaN\n'
        'gpujob_train_loss{rank="1"} +Inf 1700000000123\n'
        'gpujob_train_loss{rank="2"} -Inf\n'
        'gpujob_train_loss{ rank = "3" , } 1e-3\n'
        'gpujob_train_step_duration_seconds_bucket{le="+Inf",rank="0"} 4\n'
        'gpujob_train_step_duration_seconds_sum{rank="0"} 1.5\n'
        "gpujob_train_step_duration_seconds_count 4\n"
        'other_metric{x="}{"} 1\n'
    )
    got = parse(text)
    assert got[0].labels == {"rank": "0", "note": 'a"b\\c\nd\\q'} and math.isnan(got[0].value)
    assert got[1] == Sample("gpujob_train_loss", {"rank": "1"}, math.inf, 1700000000.123)
    assert got[2].value == -math.inf and got[3].labels == {"rank": "3"}
    assert [s.name for s in got[4:]] == [
        "gpujob_train_step_duration_seconds_bucket",
        "gpujob_train_step_duration_seconds_sum",
        "gpujob_train_step_duration_seconds_count",
    ]
    assert ours(text, None) == reference(text, None)


def test_skips_unwanted_families() -> None:
    text = 'python_gc_objects_collected_total{generation="0"} 1.0\ngpujob_train_epoch 3\n'
    assert parse(text) == [Sample("gpujob_train_epoch", {}, 3.0)]


@pytest.mark.parametrize(
    "text",
    [
        "<html><body>502 Bad Gateway</body></html>",
        b"\xff\xfe\x00garbage",
        'gpujob_train_epoch{rank="0"} abc',
        'gpujob_train_epoch{rank="0"} 1 2 3',
        'gpujob_train_epoch{rank="0" 1',
        'gpujob_train_epoch{rank="0",rank="1"} 1',
        "gpujob_train_epoch{rank=0} 1",
        "gpujob_train_epoch 1_000",
        "gpujob_train_epoch 1 12.5",
        "gpujob_train_epoch",
        "# TYPE gpujob_train_epoch bogus",
        "some_other_metric!{} 1",
    ],
)
def test_garbage_raises_parse_error_with_a_message(text: str | bytes) -> None:
    with pytest.raises(ParseError) as err:
        parse(text)
    assert str(err.value)


def test_empty_payload_is_no_samples() -> None:
    assert parse("") == [] and parse("\n# just a comment\n") == []


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(st.text(alphabet=st.characters(codec="utf-8"), max_size=300))
def test_fuzz_arbitrary_text(text: str) -> None:
    try:
        out = parse(text, None)
    except ParseError:
        return
    assert all(isinstance(s, Sample) for s in out)


_LINE_PARTS = st.sampled_from(
    [
        "gpujob_train_loss",
        "gpujob_train_steps_total",
        "x",
        "{",
        "}",
        '"',
        "\\",
        "=",
        ",",
        " ",
        "rank",
        '"0"',
        "1.5",
        "NaN",
        "+Inf",
        "\n",
        "#",
        " TYPE ",
        "counter",
        "\t",
        "e",
        "-",
        "le",
    ]
)


@settings(max_examples=600, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(st.lists(_LINE_PARTS, max_size=40))
def test_fuzz_exposition_shaped_text(parts: list[str]) -> None:
    text = "".join(parts)
    try:
        out = parse(text)
    except ParseError:
        return
    assert all(s.name in WANTED for s in out)


@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(st.data())
def test_fuzz_mutated_real_payload(data: st.DataObject) -> None:
    raw = bytearray(RECORDED[0].read_bytes())
    for _ in range(data.draw(st.integers(1, 8))):
        i = data.draw(st.integers(0, len(raw) - 1))
        raw[i] = data.draw(st.integers(0, 255))
    with contextlib.suppress(ParseError):
        parse(bytes(raw))


_LABEL_VALUE = st.text(alphabet=st.characters(codec="utf-8", exclude_characters="\r"), max_size=8)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(sorted(WANTED)),
            st.dictionaries(
                st.from_regex(r"[a-z][a-z0-9_]{0,5}", fullmatch=True), _LABEL_VALUE, max_size=3
            ),
            st.floats(allow_nan=False),
        ),
        max_size=10,
    )
)
def test_valid_expositions_agree_with_prometheus_client(
    samples: list[tuple[str, dict[str, str], float]],
) -> None:
    def esc(v: str) -> str:
        return v.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')

    lines = []
    for name, labels, value in samples:
        body = ",".join(f'{k}="{esc(v)}"' for k, v in labels.items())
        lines.append(f"{name}{{{body}}} {value!r}")
    text = "\n".join(lines) + "\n"
    assert ours(text, None) == reference(text, None)
