"""The semantic difference of two Kubernetes objects: the fields that differ, each named by its path.

Maps are compared key by key whatever their order; lists of items that all
carry a distinct ``name`` (containers, volumes, env, ports) item by item on
that name, as a strategic merge matches them, other lists position by
position. Numbers compare by value (``1`` and ``1.0``), never with strings
or booleans: ``"1"`` is not ``1`` in a manifest either.
"""

from __future__ import annotations

import json
import re
from typing import Any

_PLAIN_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]*$")
_SHOWN = 100  # characters of a value shown before it is cut


def differences(expected: Any, actual: Any, path: str = "") -> list[str]:
    """One line per difference, ``path: expected X, got Y``; none when the two are the same."""
    if isinstance(expected, dict) and isinstance(actual, dict):
        return _maps(expected, actual, path)
    if isinstance(expected, list) and isinstance(actual, list):
        named_expected, named_actual = _by_name(expected), _by_name(actual)
        if named_expected is not None and named_actual is not None:
            return _maps(named_expected, named_actual, path, named=True)
        return _lists(expected, actual, path)
    if _same(expected, actual):
        return []
    return [f"{path or '(the object)'}: expected {show(expected)}, got {show(actual)}"]


def _maps(expected: dict[Any, Any], actual: dict[Any, Any], path: str, named: bool = False) -> list[str]:
    lines: list[str] = []
    for key, value in expected.items():
        where = _item(path, key) if named else _key(path, key)
        if key in actual:
            lines.extend(differences(value, actual[key], where))
        else:
            lines.append(f"{where}: expected {show(value)}, missing")
    for key, value in actual.items():
        if key not in expected:
            lines.append(f"{_item(path, key) if named else _key(path, key)}: not expected, got {show(value)}")
    return lines


def _lists(expected: list[Any], actual: list[Any], path: str) -> list[str]:
    lines: list[str] = []
    for index, value in enumerate(expected):
        where = f"{path}[{index}]"
        if index < len(actual):
            lines.extend(differences(value, actual[index], where))
        else:
            lines.append(f"{where}: expected {show(value)}, missing")
    lines.extend(f"{path}[{index}]: not expected, got {show(actual[index])}" for index in range(len(expected), len(actual)))
    return lines


def _by_name(items: list[Any]) -> dict[str, Any] | None:
    """The items keyed by their name, when every item is a map with a name of its own."""
    if not items or not all(isinstance(i, dict) and isinstance(i.get("name"), str) for i in items):
        return None
    named = {i["name"]: i for i in items}
    return named if len(named) == len(items) else None


def _same(expected: Any, actual: Any) -> bool:
    if isinstance(expected, bool) or isinstance(actual, bool):
        return expected is actual
    if isinstance(expected, (int, float)) and isinstance(actual, (int, float)):
        return expected == actual
    return type(expected) is type(actual) and bool(expected == actual)


def _key(path: str, key: Any) -> str:
    if isinstance(key, str) and _PLAIN_KEY.match(key):
        return f"{path}.{key}" if path else key
    return f"{path}[{json.dumps(key, default=str)}]"


def _item(path: str, name: str) -> str:
    return f"{path}[name={name}]"


def show(value: Any) -> str:
    """A value on one line, as JSON, cut to a readable length."""
    text = json.dumps(value, default=str, sort_keys=False)
    return text if len(text) <= _SHOWN else text[: _SHOWN - 3] + "..."
