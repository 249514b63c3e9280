"""The one reader of resource quantities, against what core/v1's ParseQuantity accepts."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from gpujob_operator.api.quantity import (
    MAX_VALUE,
    crd_quantity,
    format_quantity,
    is_quantity,
    parse_quantity,
    total,
)
from tests.support.format_cases import CASES

KI = 2**10


@pytest.mark.parametrize(
    ("text", "value"),
    [
        # plain numbers, signs, empty parts
        ("0", 0),
        (7, 7),
        ("1.5", "1.5"),
        (".5", "0.5"),
        ("1.", 1),
        ("+1", 1),
        ("-1", -1),
        ("-", 0),  # the server reads a bare sign or suffix as 0
        ("Mi", 0),
        # decimal SI suffixes
        ("100n", "1e-7"),
        ("3u", "0.000003"),
        ("500m", "0.5"),
        ("2k", 2000),
        ("1M", 10**6),
        ("1G", 10**9),
        ("1T", 10**12),
        ("1P", 10**15),
        ("1E", 10**18),
        ("-250M", -250 * 10**6),
        ("1.G", 10**9),
        # binary SI suffixes
        ("1Ki", KI),
        ("100Mi", 100 * KI**2),
        ("1.5Gi", 3 * 2**29),
        ("2Ti", 2 * KI**4),
        ("1Pi", KI**5),
        ("7Ei", 7 * KI**6),
        # exponents
        ("1e3", 1000),
        ("1E-3", "0.001"),
        ("1e+3", 1000),
        ("2.5e2", 250),
        ("1e30", 10**30),  # an exponent is not capped
        # JSON numbers as YAML gives them
        (0.5, "0.5"),
        (1e20, 10**20),
        # rounded up to a whole nano, as the server rounds
        ("0.1n", "1e-9"),
        ("1.0000000001", "1.000000001"),
        ("-0.1n", "-1e-9"),
        ("1.00000000000000000000000000001Ei", 2**60 + Decimal("1e-9")),
        # capped at 2^63-1 with an SI suffix or none
        ("10E", 2**63 - 1),
        ("99999999999999999999", 2**63 - 1),
        ("16Ei", 2**63 - 1),
        ("-10E", -(2**63 - 1)),
    ],
)
def test_values_as_core_v1_reads_them(text: Any, value: Any) -> None:
    assert parse_quantity(text) == Decimal(value)


@pytest.mark.parametrize(
    "bad",
    [
        "",
        " 1",
        "1 ",
        "1 Gi",
        "1ki",
        "1Mb",
        "1KiB",
        "1.1.1",
        "0x10",
        "1e",
        "1ee3",
        "1e2.5",
        "1e99999999999",  # exponent beyond int32
        "two",
        "\uff15",  # a digit, but not an ASCII one
        "nan",
        "inf",
        True,
        None,
        {"x": 1},
        ["1"],
        float("inf"),
    ],
)
def test_refusals(bad: Any) -> None:
    assert parse_quantity(bad) is None and not is_quantity(bad)


def test_the_table_core_v1_and_the_crd_agree_on() -> None:
    """tests/support/format_cases.py: a resource quantity field takes what parses and is not
    negative (the integration tests run the same table through the API server); the CRD
    refuses an exponent of four digits or more, which core/v1 reads only after seconds."""
    for value, valid in CASES["quantity"].items():
        q = crd_quantity(value)
        assert (q is not None and q >= 0) == valid, value


def test_an_exponent_the_crd_refuses_is_still_read_from_a_pod() -> None:
    assert crd_quantity("1e1000") is None and crd_quantity("2E+0999") is None
    assert crd_quantity("1e999") == parse_quantity("1e999") == Decimal("1e999")
    assert parse_quantity("1e1000") == Decimal("1e1000")  # a pod's own request, read back


def test_huge_exponents_neither_crash_nor_blow_up() -> None:
    huge = parse_quantity("1e999999999")
    assert huge is not None and huge > MAX_VALUE
    tiny = parse_quantity("1e-999999999")
    assert tiny == Decimal("1e-9")
    assert total([huge, Decimal("0.001")]) >= huge  # bounded precision, not a billion digits
    assert format_quantity(huge) == "1e+999999999"


def test_sums_are_exact_for_any_real_request() -> None:
    many = [parse_quantity("9223372036854775807"), parse_quantity("1n")] * 3
    assert total(x for x in many if x is not None) == Decimal("27670116110564327421.000000003")
    assert total([]) == 0


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (Decimal(4), "4"),
        (Decimal("1.5"), "1500m"),
        (Decimal("2.5e-7"), "250n"),
        (Decimal(1) / 3, "333333334n"),  # past nanos: rounded up, as the server rounds
        (Decimal(3 * 2**30), "3221225472"),
        (Decimal("2E+3"), "2000"),
        (Decimal("1.5e40"), "1.5e+40"),
    ],
)
def test_format_is_short_and_reads_back(value: Decimal, text: str) -> None:
    assert format_quantity(value) == text
    back = parse_quantity(text)
    assert back is not None and back >= value and back - value < Decimal("1e-9")
