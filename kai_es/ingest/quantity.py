"""Kubernetes resource quantities to exact integers (no floats at any step).

Contract: `parse_quantity(text)` returns an exact `Fraction`; `to_milli` and `to_units` round up
to an integer like the API server does for sub-unit precision. Malformed text raises
`QuantityError` naming the text.
"""

from __future__ import annotations

import re
from fractions import Fraction

_SUFFIX: dict[str, Fraction] = {
    "": Fraction(1), "n": Fraction(1, 10**9), "u": Fraction(1, 10**6), "m": Fraction(1, 1000),
    "k": Fraction(10**3), "M": Fraction(10**6), "G": Fraction(10**9), "T": Fraction(10**12),
    "P": Fraction(10**15), "E": Fraction(10**18),
    "Ki": Fraction(2**10), "Mi": Fraction(2**20), "Gi": Fraction(2**30), "Ti": Fraction(2**40),
    "Pi": Fraction(2**50), "Ei": Fraction(2**60),
}
_QUANTITY = re.compile(r"^([+-]?)(\d+(?:\.\d*)?|\.\d+)(?:[eE]([+-]?\d+)|(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E))?$")


class QuantityError(ValueError):
    """Text that is not a Kubernetes quantity."""


def parse_quantity(value: object) -> Fraction:
    """Exact value of a quantity given as a string or an int (floats are rejected: inexact)."""
    if isinstance(value, bool):
        raise QuantityError(f"not a quantity: {value!r}")
    if isinstance(value, int):
        return Fraction(value)
    if isinstance(value, float):
        # YAML turns `0.5` into a float; its shortest repr is what the user wrote.
        value = repr(value)
    if not isinstance(value, str):
        raise QuantityError(f"not a quantity: {value!r}")
    m = _QUANTITY.match(value.strip())
    if not m:
        raise QuantityError(f"not a quantity: {value!r}")
    sign, number, exponent, suffix = m.groups()
    result = Fraction(number) * _SUFFIX[suffix or ""]
    if exponent is not None:
        result *= Fraction(10) ** int(exponent)
    return -result if sign == "-" else result


def _ceil(x: Fraction) -> int:
    return -((-x.numerator) // x.denominator)


def to_milli(value: object) -> int:
    """Quantity in thousandths, rounded up (cpu `250m` -> 250, `2` -> 2000)."""
    return _ceil(parse_quantity(value) * 1000)


def to_units(value: object) -> int:
    """Quantity in whole units, rounded up (memory `1Gi` -> 1073741824)."""
    return _ceil(parse_quantity(value))
