"""Kubernetes resource quantities ("4", "500m", "1.5Gi") as exact decimals."""

from __future__ import annotations

import re
from decimal import MAX_EMAX, MAX_PREC, MIN_EMIN, ROUND_CEILING, Context, Decimal

_SUFFIXES = {
    "Ki": Decimal(2) ** 10,
    "Mi": Decimal(2) ** 20,
    "Gi": Decimal(2) ** 30,
    "Ti": Decimal(2) ** 40,
    "Pi": Decimal(2) ** 50,
    "Ei": Decimal(2) ** 60,
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "k": Decimal("1e3"),
    "M": Decimal("1e6"),
    "G": Decimal("1e9"),
    "T": Decimal("1e12"),
    "P": Decimal("1e15"),
    "E": Decimal("1e18"),
}


def parse_quantity(value: object) -> Decimal | None:
    """The quantity's value, or None when it is not a valid quantity.

    Strings follow Kubernetes' grammar (k8s.io/apimachinery/pkg/api/resource
    ``ParseQuantity``) exactly: ``<signedNumber><suffix>``, a number of ASCII
    digits with one optional ``.`` (either side may be empty: ``"+"``, ``"."``
    and ``"5."`` are quantities), a suffix ``Ki``..``Ei``, ``n u m k M G T P
    E`` or none, or a decimal exponent ``e``/``E`` and a signed integer within
    int64 (kube-apiserver keeps its low 32 bits). What Kubernetes refuses is
    refused (``"1_0"``, ``" 1"``, ``"1e0Ki"``, ``"1e"``). The value is
    Kubernetes' too: exact where it fits int64 × 10^scale (``scale`` from -9 up),
    else rounded up to a nano, and capped at the int64 maximum as kube-apiserver
    does for ``Ki``..``Ei`` (``"10E"`` is 10^19, ``"16Ei"`` is 2^63-1). Values beyond
    10^1000 count as 10^1000 (no GPU count or size comes near; the arithmetic
    stays bounded).
    """
    if type(value) is str and value.isdigit() and value.isascii() and len(value) <= 18:
        return Decimal(value)  # the common case: a plain count ("8"), as GPUs are given
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return _bounded(Decimal(str(value)))
    if not isinstance(value, str):
        return None
    return _parse(value)


_GRAMMAR = re.compile(r"([+-]?)(0*)([0-9]*)(?:\.([0-9]*))?([eEinumkKMGTP]*)([+-]?[0-9]*)", re.ASCII)
_DECIMAL = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_BINARY = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
_INT64_MAX = 2**63 - 1
_NANO = -9
#: the largest decimal exponent a value keeps (see parse_quantity)
_MAX_EXPONENT = 1000


def _parse(text: str) -> Decimal | None:
    found = _GRAMMAR.fullmatch(text)
    if not text or found is None:
        return None
    sign, zeros, digits, denom, letters, tail = found.groups()
    if not digits and denom is None and not letters and not tail:
        return Decimal(0)  # sign and zeros only: kube-apiserver stops there ("+", "-", "000")
    suffix = letters + tail
    if suffix in _DECIMAL:
        base, exponent = 10, _DECIMAL[suffix]
    elif suffix in _BINARY:
        base, exponent = 2, _BINARY[suffix]
    elif len(suffix) > 1 and suffix[0] in "eE" and re.fullmatch(r"[+-]?[0-9]+", suffix[1:], re.ASCII):
        parsed = int(suffix[1:])
        if not -(2**63) <= parsed <= _INT64_MAX:
            return None
        base, exponent = 10, (parsed + 2**31) % 2**32 - 2**31  # int32(parsed)
    else:
        return None
    num, denom = digits or "0", denom or ""
    negative = sign == "-"
    if base == 10:
        fast = 18 - len(num) - len(denom) >= 0 and exponent - len(denom) >= _NANO
    else:
        fast = not denom and 15 - len(num) - (exponent * 3) // 10 - 1 >= 0 and int(num) << exponent <= _INT64_MAX
    magnitude = _magnitude(num + denom, len(denom), base, exponent)
    if not fast:  # kube-apiserver's inf.Dec path: rounded up to a nano; a binary one capped at int64's maximum
        magnitude = _round_up_nano(magnitude)
        if base == 2:
            magnitude = min(magnitude, Decimal(_INT64_MAX))
    return -magnitude if negative and magnitude else magnitude


#: exact arithmetic on the digits a request holds (no rounding, no exponent limit)
_EXACT = Context(prec=MAX_PREC, Emax=MAX_EMAX, Emin=MIN_EMIN)


def _magnitude(digits: str, decimals: int, base: int, exponent: int) -> Decimal:
    """digits × 10^-decimals × base^exponent, within 10^±_MAX_EXPONENT (beyond: 10^1000, or,
    below a nano, 10^-10, which rounds up to one)."""
    digits = digits.lstrip("0")
    if not digits:
        return Decimal(0)
    if base == 2:
        return _EXACT.multiply(Decimal((0, tuple(int(d) for d in digits), -decimals)), Decimal(2**exponent))
    scale = exponent - decimals
    adjusted = scale + len(digits) - 1
    if adjusted > _MAX_EXPONENT:
        return Decimal(f"1e{_MAX_EXPONENT}")
    if adjusted < _NANO - 1:
        return Decimal("1e-10")
    return Decimal((0, tuple(int(d) for d in digits), scale))


def _round_up_nano(value: Decimal) -> Decimal:
    if value == 0 or int(value.as_tuple().exponent) >= _NANO:
        return value
    nanos = _EXACT.scaleb(value, Decimal(-_NANO)).to_integral_value(rounding=ROUND_CEILING, context=_EXACT)
    return _EXACT.scaleb(nanos, Decimal(_NANO))


#: JSON numbers (not Kubernetes quantities): no real one has more digits than
#: this either side of the point; "1e999999999" would overflow the decimal context
_MAX_MAGNITUDE = 40


def _bounded(number: Decimal) -> Decimal | None:
    if not number.is_finite() or (number and abs(number.adjusted()) > _MAX_MAGNITUDE):
        return None
    return number


#: quantity strings kube-apiserver keeps exactly as an int64 × 10^scale (at most nine digits either
#: side of the point, a scale from -9 up; with a point or m, u, n, below 10^9): there CEL's
#: ``quantity`` (``isInteger``, ``compareTo``) and parse_quantity agree on every value. Other valid quantities ("1.5Gi", "0.9999999999",
#: twenty digits) are edges the compiled policies leave to the webhook (``is_edge``).
PLAIN = (r"[+-]?[0-9]{0,9}(\.[0-9]{0,9})?|[+-]?[0-9]{0,9}([kMGTPE]|[eE]\+?[0-9]{1,2})|[+-]?[0-9]{0,9}(\.[0-9]{0,6})?m"
         r"|[+-]?[0-9]{0,9}(\.[0-9]{0,3})?u|[+-]?[0-9]{0,9}n")
_PLAIN = re.compile(PLAIN, re.ASCII)


#: the magnitudes of a JSON number the compiled policies judge (``is_edge``): an int64 (beyond it,
#: kube-apiserver holds the number as a double, and CEL cannot tell a whole one from a fraction by
#: its text) and, as a double, from 10^-40 (the webhook's bound) up to 2^63
_NUMBER_LOW, _NUMBER_HIGH = 1e-40, 2**63


def is_edge(value: object) -> bool:
    """A valid quantity string outside ``PLAIN``, or a JSON number outside what the compiled policies
    judge as the webhook does: an integer that is no int64 or that a double holds as ±2^63 (from
    2^63-512 in magnitude), a non-zero number of magnitude below 10^-40 or from 2^63 up.
    (``webhook.cel.podspecs`` has these edges in CEL; on each side they are told by the value, however
    kube-apiserver writes the number: every one CEL calls an edge is one here, so the webhook judges
    what CEL leaves.)"""
    if isinstance(value, str):
        return not _PLAIN.fullmatch(value) and parse_quantity(value) is not None
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        # as a double too: under a schema of type number, kube-apiserver's CEL reads an int64 as one, and
        # those within 512 of ±2^63 round to ±2^63 (float() rounds as Go's conversion does)
        return not -_NUMBER_HIGH < value < _NUMBER_HIGH or abs(float(value)) >= _NUMBER_HIGH
    if isinstance(value, float):
        return value != 0 and not _NUMBER_LOW <= abs(value) < _NUMBER_HIGH
    return False


def is_whole(value: Decimal) -> bool:
    """True for integral quantities (a whole number of devices)."""
    return value == value.to_integral_value()


def format_bytes(value: Decimal | int) -> str:
    """A byte quantity in the largest binary unit that keeps it whole."""
    amount = int(value)
    for suffix in ("Ei", "Pi", "Ti", "Gi", "Mi", "Ki"):
        unit = int(_SUFFIXES[suffix])
        if amount and amount % unit == 0:
            return f"{amount // unit}{suffix}"
    return str(amount)
