"""Kubernetes resource quantities to exact integers (no floats at any step).

Contract: `parse_quantity(text)` returns an exact `Fraction`; `to_milli` and `to_units` round up
to an integer like the API server does for sub-unit precision. Malformed text raises
`QuantityError` naming the text.

Bounds, checked on the text before any big number is built (so `1e999999999` is refused at
once instead of computing a billion-digit integer): at most `MAX_DIGITS` digits, and a value
that is zero or whose leading digit stands between 10**-`MAX_MAGNITUDE` and 10**`MAX_MAGNITUDE`
(so it is below 10**(MAX_MAGNITUDE + 1): far above any int64 resource amount, even in
thousandths). Too many digits, or a value out of those bounds, raises `QuantityError`.
"""

from __future__ import annotations

import re
from fractions import Fraction
from functools import lru_cache

_SUFFIX: dict[str, Fraction] = {
    "": Fraction(1), "n": Fraction(1, 10**9), "u": Fraction(1, 10**6), "m": Fraction(1, 1000),
    "k": Fraction(10**3), "M": Fraction(10**6), "G": Fraction(10**9), "T": Fraction(10**12),
    "P": Fraction(10**15), "E": Fraction(10**18),
    "Ki": Fraction(2**10), "Mi": Fraction(2**20), "Gi": Fraction(2**30), "Ti": Fraction(2**40),
    "Pi": Fraction(2**50), "Ei": Fraction(2**60),
}
_QUANTITY = re.compile(r"^([+-]?)(\d+(?:\.\d*)?|\.\d+)(?:[eE]([+-]?\d+)|(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E))?$")


#: the most digits a quantity's number may have (Kubernetes allows far fewer in practice)
MAX_DIGITS = 64
#: |decimal exponent of the value| allowed: 10**30 exceeds 2**63 milli-units of anything
MAX_MAGNITUDE = 30
_SUFFIX_EXP10 = {"": 0, "n": -9, "u": -6, "m": -3, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18,
                 "Ki": 3, "Mi": 6, "Gi": 9, "Ti": 12, "Pi": 15, "Ei": 18}  # within one of log10(suffix)


class QuantityError(ValueError):
    """Text that is not a Kubernetes quantity, or one outside the bounds (see module docstring)."""


def _check_magnitude(value: str, number: str, exponent: str | None, suffix: str) -> bool:
    """Refuse, from the text alone, numbers whose value is out of bounds (before building them);
    True when the value is zero (whatever its exponent: it must not be computed)."""
    digits = number.replace(".", "")
    if len(digits) > MAX_DIGITS:
        raise QuantityError(f"quantity {_shown(value)} has more than {MAX_DIGITS} digits")
    significant = digits.lstrip("0")
    if not significant:
        return True
    if exponent is not None and len(exponent.lstrip("+-").lstrip("0")) > 6:
        raise QuantityError(f"quantity {_shown(value)} has an exponent out of range "
                            f"(the value must be within 10^-{MAX_MAGNITUDE}..10^{MAX_MAGNITUDE})")
    integer = number.split(".")[0].lstrip("0")
    # the power of ten of the leading significant digit of the number (0 for 1..9, -1 for 0.1..0.9)
    if integer:
        lead = len(integer) - 1
    else:
        fraction = number.split(".")[1]
        lead = -1 - (len(fraction) - len(fraction.lstrip("0")))
    magnitude = lead + (int(exponent) if exponent is not None else 0) + _SUFFIX_EXP10[suffix]
    if magnitude > MAX_MAGNITUDE or magnitude < -MAX_MAGNITUDE:
        raise QuantityError(f"quantity {_shown(value)} is out of range "
                            f"(the value must be within 10^-{MAX_MAGNITUDE}..10^{MAX_MAGNITUDE})")
    return False


def _shown(value: str) -> str:
    return repr(value) if len(value) <= 40 else f"{value[:40]!r}... ({len(value)} characters)"


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
    return _parse_text(value)


#: a cluster's pods repeat a few quantity texts ("100m", "1Gi") in every watch event: parsed
#: once each (a Fraction is immutable; an error is not cached, so it is raised every time)
@lru_cache(maxsize=4096)
def _parse_text(value: str) -> Fraction:
    m = _QUANTITY.match(value.strip())
    if not m:
        raise QuantityError(f"not a quantity: {value!r}")
    sign, number, exponent, suffix = m.groups()
    if _check_magnitude(value, number, exponent, suffix or ""):
        return Fraction(0)
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
