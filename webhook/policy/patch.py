"""The patch builder: the only way rules change an object.

Rules read the object as earlier rules left it (``builder.doc``) and change it
through ``set``/``append``/``remove``. The builder copies only the containers
on the changed path (copy-on-write; the request's object is never modified)
and records RFC 6902 operations as it goes, so the patch is exactly what the
rules did: no deep copy, no diff of two whole objects.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

Path = Sequence[str | int]

_MISSING = object()


def pointer(path: Path) -> str:
    """RFC 6901 JSON pointer of a path (``~`` → ``~0``, ``/`` → ``~1``)."""
    return "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in path)


def lookup(doc: Any, path: Path, default: Any = None) -> Any:
    """The value at ``path`` in plain JSON data, or ``default``."""
    node = doc
    for key in path:
        if isinstance(node, dict) and isinstance(key, str):
            if key not in node:
                return default
            node = node[key]
        elif isinstance(node, list) and isinstance(key, int) and 0 <= key < len(node):
            node = node[key]
        else:
            return default
    return node


class PatchBuilder:
    """Records add/replace/remove operations against a copy-on-write document."""

    def __init__(self, doc: Any) -> None:
        self.doc = doc
        self.ops: list[dict[str, Any]] = []
        # containers this builder already copied, safe to change in place; kept
        # by reference so an id is never reused by another object meanwhile
        self._owned: dict[int, Any] = {}

    def get(self, path: Path, default: Any = None) -> Any:
        """The current value at ``path`` (after the changes made so far)."""
        return lookup(self.doc, path, default)

    def set(self, path: Path, value: Any) -> bool:
        """Make ``path`` hold ``value``, creating missing parents; False if it already did."""
        current = lookup(self.doc, path, _MISSING)
        if current is not _MISSING:
            if current == value:
                return False
            self._write(path, value, "replace")
            return True
        # add the whole missing subtree at its first missing (or null) ancestor
        for depth in range(1, len(path)):
            ancestor = lookup(self.doc, path[:depth], _MISSING)
            if ancestor is _MISSING or ancestor is None:
                nested: Any = value
                for key in reversed(path[depth:]):
                    nested = {key: nested}
                self._write(path[:depth], nested, "add" if ancestor is _MISSING else "replace")
                return True
        self._write(path, value, "add")
        return True

    def set_default(self, path: Path, value: Any) -> bool:
        """Set ``path`` only when it is absent (or null)."""
        if lookup(self.doc, path) is not None:
            return False
        return self.set(path, value)

    def append(self, list_path: Path, item: Any) -> None:
        """Append to the list at ``list_path``; create the list when it is missing."""
        current = lookup(self.doc, list_path)
        if not isinstance(current, list):
            self.set(list_path, [item])
            return
        self._write([*list_path, len(current)], item, "add")

    def remove(self, path: Path) -> bool:
        """Remove ``path`` if present; False when there was nothing to remove."""
        if lookup(self.doc, path, _MISSING) is _MISSING:
            return False
        self._write(path, _MISSING, "remove")
        return True

    def _write(self, path: Path, value: Any, op: str) -> None:
        parent = self._owned_parent(path[:-1])
        key = path[-1]
        if op == "remove":
            del parent[key]
            self.ops.append({"op": "remove", "path": pointer(path)})
            return
        if op == "add" and isinstance(parent, list):
            parent.insert(int(key), value)
        else:
            parent[key] = value
        self.ops.append({"op": op, "path": pointer(path), "value": value})

    def _owned_parent(self, path: Path) -> Any:
        """The container at ``path``, copying every container on the way that we do not own."""
        if id(self.doc) not in self._owned:
            self.doc = _shallow(self.doc)
            self._owned[id(self.doc)] = self.doc
        node = self.doc
        for key in path:
            child = node[key]
            if id(child) not in self._owned:
                child = _shallow(child)
                node[key] = child
                self._owned[id(child)] = child
            node = child
        return node


def _shallow(node: Any) -> Any:
    if isinstance(node, dict):
        return dict(node)
    if isinstance(node, list):
        return list(node)
    raise TypeError(f"cannot patch inside a {type(node).__name__}")
