"""Quantities as Kubernetes parses them (k8s.io/apimachinery/pkg/api/resource ``ParseQuantity``):
what it refuses is refused, and the value is the one it keeps (#43 item 3). The compiled policies'
``isQuantity`` is that same function, so the webhook and kube-apiserver's CEL judge a quantity alike."""

from __future__ import annotations

from decimal import Decimal

import pytest

from webhook.kube.quantity import is_edge, is_whole, parse_quantity

INT64_MAX = Decimal(2**63 - 1)


@pytest.mark.parametrize("text", [
    "1_0", "1e0Ki", "1e", "1e+", " 1", "1 ", "1KM", "1e3e", "0x1", "１", "", "1.2.3", "1ki", "1K", "NaN",
    "Infinity", "1e9223372036854775808", "1E+-3", "--1", "1i",
])
def test_what_kubernetes_refuses_is_refused(text: str) -> None:
    assert parse_quantity(text) is None


@pytest.mark.parametrize(("text", "value"), [
    ("1", "1"), ("+", "0"), ("-", "0"), (".", "0"), ("+.", "0"), ("000", "0"), ("e3", "0"), ("Ki", "0"), ("m", "0"), ("1.", "1"), (".5", "0.5"),
    ("-.5", "-0.5"), ("500m", "0.5"), ("1Ki", "1024"), ("1.5Gi", "1610612736"), ("1E", "1e18"), ("1e+5", "1e5"),
    ("1E-3", "0.001"), ("2e0", "2"), ("1n", "1e-9"),
    # beyond int64 but exact (int64 × 10^scale): kube-apiserver keeps the value
    ("10E", "1e19"), ("1e41", "1e41"),
    # kube-apiserver's inf.Dec path: rounded up to a nano, capped at int64's maximum when binary
    ("1.5n", "2e-9"), ("1e-10", "1e-9"), ("0.9999999999", "1"), ("-0.0000000001", "-1e-9"), ("1" + "0" * 20, "1e20"),
    ("1" + "0" * 20 + ".5", "100000000000000000000.5"), ("16Ei", str(INT64_MAX)), ("-16Ei", str(-INT64_MAX)),
    ("1.5Ei", "1729382256910270464"),
    # the exponent is parsed as int64 and kept as int32
    ("1e9223372036854775807", "0.1"),
])
def test_the_value_is_the_one_kubernetes_keeps(text: str, value: str) -> None:
    assert parse_quantity(text) == Decimal(value)


def test_whole_quantities_beyond_int64_are_whole() -> None:
    for text in ("10E", "1e41", "16Ei", "0.9999999999"):
        parsed = parse_quantity(text)
        assert parsed is not None and is_whole(parsed), text


def test_huge_inputs_stay_cheap() -> None:
    assert parse_quantity("9" * 100000) == Decimal("1e1000")
    assert parse_quantity("1e999999999") == Decimal("1e1000")
    assert parse_quantity("0." + "0" * 100000 + "1") == Decimal("1e-9")


@pytest.mark.parametrize("value", [
    # kube-apiserver holds these JSON numbers as doubles (beyond int64, or tiny) and writes them back as
    # digits or in exponent form: CEL cannot judge them as the webhook does (1e100 is no quantity to the
    # webhook and was "valid and whole" to CEL; 2**63 was "a fraction"), so the webhook judges them
    1e100, 1e42, 10**50, 2**63, 2**64, -2**63, -(2**63) - 1, 1e20, 10**20, float(2**63), -9.3e18, 1e-300, -1e-41,
    # an int64 a schema of type number makes a double in kube-apiserver's CEL: ±2^63 from 2^63-512 on
    2**63 - 1, -(2**63) + 1, 2**63 - 500,
    float("inf"),
])
def test_json_numbers_cel_cannot_judge_are_edges(value: object) -> None:
    assert is_edge(value)


@pytest.mark.parametrize("value", [
    0, 1, 8, -1, 2**63 - 1024, -(2**63) + 1024, 0.0, 1.5, 2.0, 1500000.0, 1e18, -2.5, 1e-40, 1e-7, 9.2e18, True, False, None,
    "8", "0.5", "2000m", [1], {"a": 1},
])
def test_json_numbers_cel_judges_alike_are_not_edges(value: object) -> None:
    assert not is_edge(value)


def test_the_edge_between_a_judged_double_and_an_edge_is_2_to_the_63() -> None:
    below = 9223372036854774784.0  # the largest double below 2^63
    assert not is_edge(below) and not is_edge(int(below)) and is_edge(float(2**63)) and is_edge(2**63)
