"""Label and field selectors of list and watch requests.

Only equality-based requirements (``a=b``, ``a==b``, ``a!=b``, ``a``,
``!a``); a set-based one (``a in (b)``) is refused with 400.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tests.fakeapi.status import ApiError


@dataclass(frozen=True)
class Selector:
    """Equality-based label and field selectors (``a=b,c!=d,e,!f``)."""

    labels: tuple[tuple[str, str, str | None], ...] = ()
    fields: tuple[tuple[str, str, str | None], ...] = ()

    @classmethod
    def parse(cls, labels: str, fields: str) -> Selector:
        return cls(_requirements(labels), _requirements(fields))

    def matches(self, obj: Mapping[str, Any]) -> bool:
        meta = obj.get("metadata", {})
        values = meta.get("labels") or {}
        own = {"metadata.name": meta.get("name"), "metadata.namespace": meta.get("namespace", "")}
        return all(_holds(r, values) for r in self.labels) and all(_holds(r, own) for r in self.fields)


def _requirements(text: str) -> tuple[tuple[str, str, str | None], ...]:
    out: list[tuple[str, str, str | None]] = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        if "(" in part:
            raise ApiError(400, f"set-based selector not supported by the fake: {part}")
        for op in ("!=", "==", "="):
            if op in part:
                key, value = part.split(op, 1)
                out.append((key.strip(), "!=" if op == "!=" else "=", value.strip()))
                break
        else:
            out.append((part.lstrip("!"), "!" if part.startswith("!") else "exists", None))
    return tuple(out)


def _holds(req: tuple[str, str, str | None], values: Mapping[str, Any]) -> bool:
    key, op, value = req
    if op == "exists":
        return key in values
    if op == "!":
        return key not in values
    return (values.get(key) == value) == (op == "=")
