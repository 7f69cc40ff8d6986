"""The patch builder: the only way rules change an object.

Rules read the object as earlier rules left it (``builder.doc``) and change it
through ``set``/``append``/``remove``. The builder copies only the containers
on the changed path (copy-on-write; the request's object is not modified)
and records RFC 6902 operations as it goes, so the patch is exactly what the
rules did: no deep copy, no diff of two whole objects.

A caller that gives the object up (the server's /mutate: it answers and drops
the request) builds ``in_place``: the builder then writes into the object
itself, and copies (whole) only a recorded operation's value that a later
write goes below (a value written once and changed later would change the
patch with it). Rules never put a map or list of the object itself inside
a value they write (the copying builder asks the same of its copies), and
the object is a tree, as parsed JSON is (one map or list at two places of
it would take a write at either place to both). The
operations and the document are the same either way; what is spared is a
copy of every container a rule writes into, and its bookkeeping.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

Path = Sequence[str | int]

_MISSING: Final = object()

#: an add and a replace operation, which each recorded operation copies and fills in (compiled,
#: copying a map of three keys costs about half of building one)
_ADD: Final[dict[str, Any]] = {"op": "add", "path": "", "value": None}
_REPLACE: Final[dict[str, Any]] = {"op": "replace", "path": "", "value": None}
_REMOVE: Final[dict[str, Any]] = {"op": "remove", "path": ""}


def pointer(path: Path) -> str:
    """RFC 6901 JSON pointer of a path (``~`` → ``~0``, ``/`` → ``~1``)."""
    return "".join(["/" + str(p).replace("~", "~0").replace("/", "~1") for p in path])


def slashed(key: str) -> str:
    """``/`` and one key as a JSON pointer token: what a write below a map adds to the map's
    pointer. Remembered per key (rules write a few keys, over and over), within a bound."""
    found = _SLASHED.get(key)
    if found is None:
        found = "/" + key.replace("~", "~0").replace("/", "~1")
        if len(_SLASHED) < POINTER_CACHE_SIZE:
            _SLASHED[key] = found
    return found


_SLASHED: Final[dict[str, str]] = {}


#: how many pointers a shared pointer cache keeps (paths can hold user-chosen keys)
POINTER_CACHE_SIZE: Final = 4096


def lookup(doc: Any, path: Path, default: Any = None) -> Any:
    """The value at ``path`` in plain JSON data, or ``default``."""
    node = doc
    for key in path:
        kind = type(node)
        if kind is dict:
            node = node.get(key, _MISSING) if type(key) is str else _MISSING
            if node is _MISSING:
                return default
        elif kind is list and type(key) is int and -len(node) <= key < len(node):  # type: ignore[operator]
            node = node[key]
        else:  # a scalar (a string is not a list of characters here), or a key of the wrong type
            return default
    return node


def as_dict(obj: Mapping[str, Any]) -> dict[str, Any]:
    """A map as a dict: itself, or a copy of another Mapping (compiled, a dict's ``.get`` is a direct
    call where a ``Mapping``'s is a generic method lookup; pod specs and containers are dicts)."""
    return obj if type(obj) is dict else dict(obj)


def submap(obj: Any, key: str) -> dict[str, Any]:
    """The map under ``key`` of a map, {} when it is absent or not a map."""
    value = obj.get(key) if isinstance(obj, dict) else None
    return value if isinstance(value, dict) else {}


def sublist(obj: Any, key: str) -> list[Any]:
    """The list under ``key`` of a map, [] when it is absent or not a list."""
    value = obj.get(key) if isinstance(obj, dict) else None
    return value if isinstance(value, list) else []


class PatchBuilder:
    """Records add/replace/remove operations against a copy-on-write document (or, ``in_place``,
    against the document itself)."""

    def __init__(
        self, doc: Any, pointers: dict[tuple[str | int, ...], str] | None = None, in_place: bool = False,
    ) -> None:
        self.doc = doc
        self.ops: list[dict[str, Any]] = []
        # JSON pointers of paths written before, shared across builders by the
        # caller (the engine keeps one per policy set); at most POINTER_CACHE_SIZE
        self._pointers = pointers if pointers is not None else {}
        #: writing into ``doc`` itself (its owner gave it up), not into copies
        self.in_place = in_place
        # Copying: the maps and lists this builder copied, the only ones it changes in place.
        # In place: the recorded values (maps and lists), the only ones it does not; what is inside
        # one is reached only through it, and copied with it (``_deep``) before a write below it.
        # So a map or list is the builder's to change when ``(id(node) in marks) != in_place``
        # (written out at each use: a method call there would cost the interpreted core ~5%);
        # one that is not is replaced by ``_taken``.
        # Kept by reference, so an id is never reused by another object meanwhile.
        self._marks: dict[int, Any] = {}
        # the list own_item last made sure of (kept here, so its id is never another's)
        self._last_list: Any = None
        # the value _hold last held
        self._last_held: Any = None

    def _hold(self, value: Any) -> None:
        """In place: keep a recorded value (a map or list) from being changed. What is inside it is
        reached only through it, and a write below it copies it whole first (``_deep``), as a
        copying builder copies the request's maps and lists."""
        if value is self._last_held:  # (one value written to every container, one after another)
            return
        if isinstance(value, dict) or isinstance(value, list):
            self._marks[id(value)] = self._last_held = value
            self._last_list = None  # (own_item's memory of a list it may change: it may be inside)

    def _taken(self, node: Any) -> Any:
        """A copy of a map or list that is not the builder's to change, which is (see ``__init__``)."""
        if self.in_place:
            return _deep(node)
        node = _copy(node)
        self._marks[id(node)] = node
        return node

    def get(self, path: Path, default: Any = None) -> Any:
        """The current value at ``path`` (after the changes made so far)."""
        return lookup(self.doc, path, default)

    def set(self, path: Path, value: Any) -> bool:
        """Make ``path`` hold ``value``, creating missing parents; False if it already did."""
        if not path:
            raise ValueError("set needs a non-empty path")
        marks, in_place = self._marks, self.in_place
        node = self.doc
        if (id(node) in marks) == in_place:  # (not ours to change: see __init__)
            node = self.doc = self._taken(node)
        # one walk down, copying what we do not own yet (an unneeded copy changes only identity)
        last = len(path) - 1
        child: Any = _MISSING
        for depth, key in enumerate(path):
            kind = type(node)
            if kind is dict:  # (JSON maps have only string keys: an index finds nothing)
                child = node.get(key, _MISSING)
            elif kind is list and type(key) is int and 0 <= key < len(node):  # type: ignore[operator]
                child = node[key]
            else:
                child = _MISSING
            if depth == last:
                if child is not _MISSING and child is not None and child == value:
                    return False
                break
            after = path[depth + 1]
            kind = type(child)
            if type(after) is str:
                holds = kind is dict
            else:
                holds = kind is list and type(after) is int and 0 <= after < len(child)  # type: ignore[operator]
            if not holds:  # missing, null, or of the wrong type
                # add the whole missing subtree at its first missing (or null) ancestor;
                # a parent of the wrong type (a string where a map belongs, in an
                # object no API server would accept) is replaced the same way
                if in_place:  # (the value itself too: it may be a map or list reached by another path)
                    self._hold(value)
                for inner in reversed(path[depth + 1 :]):
                    value = {inner: value}
                path = path[: depth + 1]
                break
            if (id(child) in marks) == in_place:
                child = node[key] = self._taken(child)
            node = child
        added = child is _MISSING
        if added and type(node) is list:
            node.insert(key, value)  # type: ignore[arg-type]
        else:
            node[key] = value
        if in_place:
            self._hold(value)
        op = (_ADD if added else _REPLACE).copy()
        op["path"], op["value"] = self.pointer(path), value
        self.ops.append(op)
        return True

    def set_default(self, path: Path, value: Any) -> bool:
        """Set ``path`` only when it is absent (or null)."""
        if lookup(self.doc, path) is not None:
            return False
        return self.set(path, value)

    def fill(self, path: Path, defaults: dict[str, Any]) -> bool:
        """Set every key of ``defaults`` that is absent (or null) in the map at ``path``.

        When the map is missing or empty it is written whole, as one operation.
        """
        current = lookup(self.doc, path)
        if type(current) is not dict or not current:
            return self.set(path, dict(defaults)) if defaults else False
        changed = False
        for key, value in defaults.items():
            if current.get(key) is None:
                changed |= self.set((*path, key), value)
        return changed

    def append(self, list_path: Path, item: Any) -> None:
        """Append to the list at ``list_path``; create the list when it is missing."""
        items = self.owned(list_path)
        if type(items) is not list:
            self.set(list_path, [item])
            return
        op = _ADD.copy()
        op["path"], op["value"] = self.pointer((*list_path, len(items))), item
        self.ops.append(op)
        items.append(item)
        if self.in_place:
            self._hold(item)

    def remove(self, path: Path) -> bool:
        """Remove ``path`` if present; False when there was nothing to remove."""
        if not path or lookup(self.doc, path, _MISSING) is _MISSING:
            return False
        parent = self.owned(path[:-1])
        del parent[path[-1]]
        self.ops.append({"op": "remove", "path": self.pointer(path)})
        return True

    # Writes below a container this builder already owns (the pod spec a rule
    # sees, one of its containers): no walk from the document's root, which
    # costs ~0.2 µs a level on every write. ``at`` is the JSON pointer of
    # ``parent``, for the recorded operation's path (a string built per write:
    # a path tuple costs more to build, hash and compare in a cache).

    def own(self, parent: dict[str, Any], key: str) -> Any:
        """The map or list under ``key`` of a map ``parent`` (owned), made the builder's own; None when neither."""
        child = parent.get(key)
        kind = type(child)
        if kind is dict or kind is list:
            if (id(child) in self._marks) == self.in_place:
                child = parent[key] = self._taken(child)
            return child
        return None

    def own_item(self, parent: dict[str, Any], key: str, index: int) -> Any:
        """The item at ``parent[key][index]`` made the builder's own, with its list (one call, not two).

        ``parent`` is owned, ``parent[key]`` is known to be a list and the item a map or list.
        """
        marks, in_place = self._marks, self.in_place
        items = parent[key]
        if items is not self._last_list:  # (rules own a list's items one after another)
            if (id(items) in marks) == in_place:
                items = parent[key] = self._taken(items)
            self._last_list = items
        child = items[index]
        if (id(child) in marks) == in_place:
            child = items[index] = self._taken(child)
        return child

    def put(self, parent: dict[str, Any], at: str, key: str, value: Any) -> bool:
        """``set`` of ``key`` in a map ``parent`` this builder owns, whose JSON pointer is ``at``."""
        current = parent.get(key, _MISSING)
        if current is not _MISSING and current is not None and current == value:
            return False
        parent[key] = value
        if self.in_place:
            self._hold(value)
        op = (_ADD if current is _MISSING else _REPLACE).copy()
        op["path"], op["value"] = at + slashed(key), value
        self.ops.append(op)
        return True

    def drop(self, parent: dict[str, Any], at: str, key: str) -> bool:
        """``remove`` of ``key`` from a map ``parent`` this builder owns, whose JSON pointer is ``at``;
        False when it was absent."""
        if key not in parent:
            return False
        del parent[key]
        op = _REMOVE.copy()
        op["path"] = at + slashed(key)
        self.ops.append(op)
        return True

    def append_to(self, parent: dict[str, Any], at: str, key: str, item: Any) -> None:
        """``append`` to the list under ``key`` of a map ``parent`` this builder owns, whose JSON pointer is ``at``."""
        items = parent.get(key)
        if type(items) is not list:
            self.put(parent, at, key, [item])
            return
        index = len(items)
        in_place = self.in_place
        if (id(items) in self._marks) != in_place:  # ours
            items.append(item)
        else:  # copied with the item, in one step
            items = parent[key] = [*_deep(items), item] if in_place else [*items, item]
            if not in_place:
                self._marks[id(items)] = items
        if in_place:
            self._hold(item)
        op = _ADD.copy()
        op["path"], op["value"] = f"{at}{slashed(key)}/{index}", item
        self.ops.append(op)

    def pointer(self, path: Path) -> str:
        """The JSON pointer of ``path`` (remembered in the shared cache)."""
        key = path if type(path) is tuple else tuple(path)
        text = self._pointers.get(key)
        if text is None:
            text = pointer(key)
            if len(self._pointers) < POINTER_CACHE_SIZE:
                self._pointers[key] = text
        return text

    def owned(self, path: Path) -> Any:
        """The map or list at ``path``, copied on the way down where we do not own it yet.

        None when the path does not lead to a map or list. The container is
        the builder's own: it keeps its identity through later writes below
        it (only a write to ``path`` itself or above could replace it).
        """
        marks, in_place = self._marks, self.in_place
        node = self.doc
        if (id(node) in marks) == in_place:
            node = self.doc = self._taken(node)
        child: Any
        for key in path:
            kind = type(node)
            if kind is dict:
                child = node.get(key) if type(key) is str else None
            elif kind is list and type(key) is int and -len(node) <= key < len(node):  # type: ignore[operator]
                child = node[key]
            else:
                return None
            kind = type(child)
            if kind is not dict and kind is not list:
                return None
            if (id(child) in marks) == in_place:
                child = node[key] = self._taken(child)
            node = child
        return node


def _deep(node: Any) -> Any:
    """A copy of a map or list and of every map and list inside it (in place, of a recorded value
    a write goes below: rare, and small)."""
    if isinstance(node, dict):
        return {key: _deep(value) if isinstance(value, (dict, list)) else value for key, value in node.items()}
    if isinstance(node, list):
        return [_deep(value) if isinstance(value, (dict, list)) else value for value in node]
    raise TypeError(f"cannot patch inside a {type(node).__name__}")


def _copy(node: Any) -> Any:
    """A shallow copy of a JSON map or list (read as one: compiled, ``node.copy()`` on an
    unknown type is a generic method call)."""
    if type(node) is dict:
        return node.copy()
    if type(node) is list:
        return node.copy()
    return _shallow(node)


def _shallow(node: Any) -> Any:
    kind = type(node)
    if kind is dict or kind is list:
        return node.copy()
    if isinstance(node, (dict, list)):
        return kind(node)
    raise TypeError(f"cannot patch inside a {type(node).__name__}")
