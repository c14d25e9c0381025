"""Quantity parsing: exact values, and bounds checked on the text before big numbers are built."""

from __future__ import annotations

import subprocess
import sys
from fractions import Fraction

import pytest

from kai_es.ingest.quantity import QuantityError, parse_quantity, to_milli, to_units


@pytest.mark.parametrize(("text", "value"), [
    ("250m", Fraction(1, 4)), ("1Gi", Fraction(2**30)), ("1e30", Fraction(10**30)),
    ("1e-30", Fraction(1, 10**30)), ("0.000001e-24", Fraction(1, 10**30)), ("0e99999999999", Fraction(0)),
    ("64Ei", Fraction(64 * 2**60)), ("9223372036854775807", Fraction(2**63 - 1)), (".5", Fraction(1, 2)),
])
def test_values_within_the_bounds_are_exact(text: str, value: Fraction) -> None:
    assert parse_quantity(text) == value


@pytest.mark.parametrize(("text", "needle"), [
    ("1e1000000", "exponent out of range"), ("1e999999999", "exponent out of range"),
    ("-1e1000000", "exponent out of range"), ("1e-1000000", "exponent out of range"),
    ("1e31", "out of range"), ("1e100", "out of range"), ("10000000000000E", "out of range"),
    ("1e-31", "out of range"), ("1" * 65, "more than 64 digits"),
    ("1e" + "9" * 100_000, "exponent out of range"),
])
def test_out_of_bounds_quantities_are_refused_with_a_reason(text: str, needle: str) -> None:
    with pytest.raises(QuantityError, match=needle) as info:
        parse_quantity(text)
    assert len(str(info.value)) < 200  # the message does not echo a huge input back


def test_huge_exponents_are_refused_without_building_the_number() -> None:
    # Without the bound, 10**999999999 is computed (minutes of CPU and gigabytes): a child process
    # that does not answer within a generous time fails this test instead of hanging the suite.
    code = ("from kai_es.ingest.quantity import to_milli, QuantityError\n"
            "for t in ('1e999999999', '1e-999999999', '5e1000000'):\n"
            "    try:\n        to_milli(t)\n    except QuantityError as e:\n        print(e)\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert run.stdout.count("out of range") == 3


def test_rounding_up_to_integers() -> None:
    assert to_milli("0.0001") == 1 and to_milli("2") == 2000 and to_units("1.5") == 2


def test_a_cached_resource_list_never_stands_for_an_equal_but_wrong_typed_one() -> None:
    """Resource lists are converted once each (an LRU): `true` equals 1 in Python, yet a pod
    asking `cpu: true` is refused even after one asked `cpu: 1`."""
    from kai_es.ingest import translate as tr
    from tests.builders import MakePod

    good, bad = MakePod("good").obj(), MakePod("bad").obj()
    good["spec"]["containers"][0]["resources"]["requests"] = {"cpu": 1}
    bad["spec"]["containers"][0]["resources"]["requests"] = {"cpu": True}
    assert tr.translate(good).requests.milli_cpu == 1000  # type: ignore[attr-defined]
    with pytest.raises(tr.IngestError, match="not a quantity: True"):
        tr.translate(bad)
