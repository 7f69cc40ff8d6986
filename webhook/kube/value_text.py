"""A value read from an object, as text: ``str()`` and ``repr()`` that never recurse.

Objects come from JSON, and valid JSON may nest lists or maps about a
thousand levels deep (orjson reads up to 1,024). ``str()`` and ``repr()`` of
such a value recurse once per level and raise RecursionError past Python's
limit, which made a malformed field (a list where a quantity, a name or an
annotation belongs) an internal error instead of the finding it is. Here a
list or map is written without recursion and cut at ``MAX_CHARS``: where a
string belongs it is malformed, and a message needs only its start.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Final

#: characters of a list or map written out, at most (then "…")
MAX_CHARS: Final = 80


def text(value: object) -> str:
    """``str(value)``, except that a list or map is written without recursion and cut at MAX_CHARS."""
    if type(value) is str:
        return value
    if isinstance(value, (list, dict)):
        return _written(value)
    return str(value)


def shown(value: object) -> str:
    """``repr(value)``, except that a list or map is written without recursion and cut at MAX_CHARS."""
    if isinstance(value, (list, dict)):
        return _written(value)
    return repr(value)


class _Open:
    """A list or map being written: its items still to write, and whether one was written."""

    __slots__ = ("items", "closing", "is_map", "started")

    def __init__(self, items: Iterator[Any], closing: str, is_map: bool) -> None:
        self.items, self.closing, self.is_map, self.started = items, closing, is_map, False


_DONE: Final = object()


def _written(value: list[Any] | dict[Any, Any]) -> str:
    """The repr() of a list or map (of what JSON holds), its first MAX_CHARS characters, in a loop."""
    parts: list[str] = []
    size = 0
    stack: list[_Open] = []  # the lists and maps opened and not yet closed, innermost last
    pending: Any = value  # the next value to write, or _DONE when the innermost open one comes next
    while size <= MAX_CHARS:
        if pending is not _DONE:
            item, pending = pending, _DONE
            if isinstance(item, list):
                piece = "["
                stack.append(_Open(iter(item), "]", False))
            elif isinstance(item, dict):
                piece = "{"
                stack.append(_Open(iter(item.items()), "}", True))
            else:
                piece = repr(item)
        elif stack:
            current = stack[-1]
            following: Any = next(current.items, _DONE)
            if following is _DONE:
                piece = current.closing
                stack.pop()
            else:
                piece = ", " if current.started else ""
                current.started = True
                if current.is_map:
                    key, pending = following
                    piece += repr(key) + ": "
                else:
                    pending = following
        else:
            break
        parts.append(piece)
        size += len(piece)
    written = "".join(parts)
    return written if size <= MAX_CHARS else written[:MAX_CHARS] + "…"
