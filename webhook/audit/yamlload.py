"""The YAML loader of manifests: PyYAML's safe loader (libyaml's parser), with less Python per node.

libyaml parses in C, but PyYAML then calls back into Python for every node:
the tag resolver tries its regular expressions on every plain scalar, and the
safe constructor builds every mapping and sequence through a generator, so
that aliases and recursive structures can refer to an object before it is
filled. Manifests repeat the same few hundred scalars and use neither, so:

- the resolver remembers the tag of each plain scalar it has resolved (a
  tag depends on nothing else while no path resolver is registered);
- a document is built in one recursive pass: str, int, float, bool, null,
  timestamps and binary through SafeConstructor's own methods, mappings and
  sequences as dicts and lists;
- anything else (an alias, a merge key ``<<``, a ``!!set``, a tag the safe
  constructor does not know, a key that is a collection, an error of any
  kind) builds that document again with SafeConstructor, untouched, which
  gives its answer or raises its error.

The result is what ``yaml.load_all(text, Loader=yaml.CSafeLoader)`` returns,
value for value and error for error (tests/audit/test_yamlload.py holds it to
that): YAML 1.1 as Kubernetes reads it (``yes``/``on`` are booleans, ``0755``
is octal, ``1:20`` is sexagesimal).
"""

from __future__ import annotations

from typing import Any

import yaml
from yaml.constructor import SafeConstructor
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

#: libyaml's parser when PyYAML was built with it (the wheels are)
SAFE_LOADER: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

_STR = "tag:yaml.org,2002:str"
_MAP = "tag:yaml.org,2002:map"
_SEQ = "tag:yaml.org,2002:seq"
#: the scalar constructors of the safe loader: each value depends on the tag and text only
_SCALARS = {
    tag: constructor
    for tag, constructor in SafeConstructor.yaml_constructors.items()
    if tag in {f"tag:yaml.org,2002:{name}" for name in ("null", "bool", "int", "float", "binary", "timestamp")}
}
#: past this many distinct scalars the memo starts again (a fleet of unique names must not grow it forever)
_MEMO_LIMIT = 100_000


#: the nodes a document may expand to through its aliases ("billion laughs"): kube-apiserver stores an
#: object of at most 1.5 MiB, some 100,000 nodes
MAX_EXPANDED_NODES = 1_000_000


def _expanded(root: Node) -> int:
    """How many nodes ``root`` stands for with every alias expanded (each node counted once per
    reference); linear in the nodes composed, a recursive alias counted once. A loop, not recursion:
    libyaml nests a document 1,000 levels deep, past Python's recursion limit."""
    sizes: dict[int, int] = {}
    stack: list[tuple[Node, bool]] = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        if children_done:
            size = 1
            if node.__class__ is MappingNode:
                size += sum(sizes[id(k)] + sizes[id(v)] for k, v in node.value)
            elif node.__class__ is SequenceNode:
                size += sum(sizes[id(child)] for child in node.value)
            sizes[id(node)] = size
            continue
        if id(node) in sizes:
            continue
        sizes[id(node)] = 1  # (until its children are counted: a recursive reference back counts as one node)
        stack.append((node, True))
        if node.__class__ is MappingNode:
            stack.extend((n, False) for pair in node.value for n in pair)
        elif node.__class__ is SequenceNode:
            stack.extend((child, False) for child in node.value)
    return sizes[id(root)]


class _Unusual(Exception):
    """A document the one-pass build leaves to SafeConstructor."""


class ManifestLoader(SAFE_LOADER):  # type: ignore[misc,valid-type]
    """SAFE_LOADER, same answers, fewer Python calls per node; ``starts`` records each document's root node."""

    _tags: dict[str, str] = {}
    _scalars: dict[tuple[str, str], Any] = {}

    def __init__(self, stream: str | bytes) -> None:
        super().__init__(stream)
        #: per document: the 0-based line of its root node, and whether the document is empty
        self.starts: list[tuple[int, bool]] = []
        if not self.yaml_path_resolvers:
            # the composer calls these around every node, and without path resolvers PyYAML's do
            # nothing: C callables that do nothing either spare two Python calls per node
            self.descend_resolver = slice
            self.ascend_resolver = tuple

    def resolve(self, kind: type[Node], value: Any, implicit: tuple[bool, bool]) -> str:
        if self.yaml_path_resolvers:
            return super().resolve(kind, value, implicit)  # type: ignore[no-any-return]
        if kind is not ScalarNode:
            return _SEQ if kind is SequenceNode else _MAP
        if not implicit[0]:
            return _STR  # quoted
        tag = self._tags.get(value)
        if tag is None:
            tag = super().resolve(kind, value, implicit)
            if len(self._tags) >= _MEMO_LIMIT:
                self._tags.clear()
            self._tags[value] = tag
        return tag

    def construct_document(self, node: Node) -> Any:
        empty = node.__class__ is ScalarNode and node.value == ""
        self.starts.append((node.start_mark.line, empty))
        try:
            return self._build(node, set())
        except Exception:  # noqa: BLE001 - SafeConstructor gives the answer, or its own error
            expanded = _expanded(node)
            if expanded > MAX_EXPANDED_NODES:
                # aliases share one object, which a diff, a written manifest or a copy expands whole
                raise yaml.constructor.ConstructorError(
                    None, None, f"excessive aliasing: the document's aliases expand it to {expanded:,} nodes "
                    f"(at most {MAX_EXPANDED_NODES:,} are read; kubectl refuses such documents too)", node.start_mark,
                ) from None
            return super().construct_document(node)

    def _build(self, node: Node, seen: set[int]) -> Any:
        cls = node.__class__
        if cls is ScalarNode:
            return node.value if node.tag == _STR else self._scalar(node)
        if id(node) in seen:
            raise _Unusual("an alias")  # SafeConstructor shares the object (or builds a recursive one)
        seen.add(id(node))
        if cls is MappingNode and node.tag == _MAP:
            mapping = {}
            for key_node, value_node in node.value:
                if key_node.__class__ is not ScalarNode:
                    raise _Unusual("a collection as a key")
                key = key_node.value if key_node.tag == _STR else self._scalar(key_node)
                if value_node.__class__ is ScalarNode and value_node.tag == _STR:
                    mapping[key] = value_node.value  # most values: no call
                else:
                    mapping[key] = self._build(value_node, seen)
            return mapping
        if cls is SequenceNode and node.tag == _SEQ:
            return [self._build(child, seen) for child in node.value]
        raise _Unusual(node.tag)

    def _scalar(self, node: Node) -> Any:
        key = (node.tag, node.value)
        try:
            return self._scalars[key]
        except KeyError:
            pass
        value = _SCALARS[node.tag](self, node)  # KeyError for another tag: SafeConstructor's path
        if len(self._scalars) >= _MEMO_LIMIT:
            self._scalars.clear()
        self._scalars[key] = value
        return value
