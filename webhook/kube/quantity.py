"""Kubernetes resource quantities ("4", "500m", "1.5Gi") as exact decimals."""

from __future__ import annotations

from decimal import Decimal, InvalidOperation

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
    """The quantity's value, or None when it is not a valid quantity."""
    if type(value) is str and value.isdigit() and value.isascii() and len(value) <= _MAX_MAGNITUDE:
        return Decimal(value)  # the common case: a plain count ("8"), as GPUs are given
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return _bounded(Decimal(str(value)))
    if not isinstance(value, str):
        return None
    text = value
    if not text or text != text.strip():
        return None  # kube-apiserver refuses surrounding spaces ("  1")
    multiplier = Decimal(1)
    for suffix in ("Ki", "Mi", "Gi", "Ti", "Pi", "Ei"):
        if text.endswith(suffix):
            text, multiplier = text[: -len(suffix)], _SUFFIXES[suffix]
            break
    else:
        if text and text[-1] in "numkMGTPE" and not _is_exponent(text):
            text, multiplier = text[:-1], _SUFFIXES[text[-1]]
    if not text or text[0] not in "+-.0123456789":
        return None
    try:
        number = _bounded(Decimal(text))
    except InvalidOperation:
        return None
    return None if number is None else number * multiplier


#: no real quantity has more digits than this either side of the point
#: (Kubernetes keeps int64 × 10^±18); "1e999999999" passes a CRD's pattern but
#: would overflow the decimal context
_MAX_MAGNITUDE = 40


def _bounded(number: Decimal) -> Decimal | None:
    if not number.is_finite() or (number and abs(number.adjusted()) > _MAX_MAGNITUDE):
        return None
    return number


def _is_exponent(text: str) -> bool:
    # "1E" is an exa suffix but "1e3" is decimal exponent notation
    return "e" in text[1:] or "E" in text[1:-1]


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
