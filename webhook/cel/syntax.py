"""CEL expression text: literals, conditions and the idioms the compiled policies are built from.

Everything here returns CEL source as a Python string. The expressions must
compile on the oldest Kubernetes gpu-admission compiles for (1.33: the
strings, lists, quantity and optional libraries and two-variable
comprehensions, but no ``sort`` and no ``flatten``) and keep to what
kube-apiserver accepts: map literals are homogeneous, so values of mixed
types are wrapped in ``dyn()``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Sequence
from typing import Any

#: between the findings kept in one CEL string: lists of lists cannot be flattened in
#: Kubernetes 1.33's CEL, so nested results are joined with it and split once at the end
SEP = "\x1e"
SEP_LITERAL = "'\\x1e'"

_ESCAPES = {"\\": "\\\\", "'": "\\'", "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def quote(text: str) -> str:
    """A CEL string literal."""
    out = []
    for char in text:
        if char in _ESCAPES:
            out.append(_ESCAPES[char])
        elif ord(char) < 0x20 or ord(char) == 0x7F:
            out.append(f"\\x{ord(char):02x}")
        else:
            out.append(char)
    return "'" + "".join(out) + "'"


def literal(value: Any) -> str:
    """A CEL literal of JSON data; a map's values are ``dyn()`` unless all are strings (homogeneous literals)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return quote(value)
    if isinstance(value, (list, tuple)):
        items = [literal(v) for v in value]
        if len({_kind(v) for v in value}) > 1:
            items = [f"dyn({i})" for i in items]
        return "[" + ", ".join(items) + "]"
    if isinstance(value, dict):
        uniform = all(isinstance(v, str) for v in value.values())
        entries = [f"{quote(str(k))}: {literal(v) if uniform else dyn(literal(v))}" for k, v in value.items()]
        return "{" + ", ".join(entries) + "}"
    raise TypeError(f"no CEL literal for {value!r}")


def _kind(value: Any) -> str:
    return type(value).__name__


def dyn(expr: str) -> str:
    return f"dyn({expr})"


def record(**fields: str) -> str:
    """A map literal of expressions, each ``dyn()`` (a record of mixed types)."""
    return "{" + ", ".join(f"{quote(k)}: dyn({v})" for k, v in fields.items()) + "}"


def strings(items: Iterable[str]) -> str:
    return "[" + ", ".join(quote(i) for i in items) + "]"


def every(*conditions: str) -> str:
    """Conditions ANDed ("true" when none)."""
    return _combine(conditions, "&&", neutral="true", absorbing="false")


def some(*conditions: str) -> str:
    """Conditions ORed ("false" when none)."""
    return _combine(conditions, "||", neutral="false", absorbing="true")


def _combine(conditions: Iterable[str], operator: str, *, neutral: str, absorbing: str) -> str:
    kept = [c for c in conditions if c != neutral]
    if absorbing in kept:
        return absorbing
    if len(kept) > 1:
        return "(" + f" {operator} ".join(f"({c})" for c in kept) + ")"
    return kept[0] if kept else neutral


def negate(condition: str) -> str:
    return {"true": "false", "false": "true"}.get(condition, f"!({condition})")


def when(condition: str, then: str, otherwise: str) -> str:
    if condition == "true":
        return then
    if condition == "false":
        return otherwise
    return f"({condition} ? {then} : {otherwise})"


def is_map(expr: str) -> str:
    return f"type({expr}) == map"


def is_list(expr: str) -> str:
    return f"type({expr}) == list"


def field(expr: str, key: str) -> str:
    """``expr.key``, or ``expr['key']`` where the key is no CEL identifier (or a reserved word)."""
    if re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", key) and key not in _RESERVED:
        return f"{expr}.{key}"
    return f"{expr}[{quote(key)}]"


_RESERVED = frozenset({
    "true", "false", "null", "in", "as", "break", "const", "continue", "else", "for", "function", "if", "import",
    "let", "loop", "package", "namespace", "return", "var", "void", "while",
})


def has(expr: str, key: str) -> str:
    """Whether a map holds ``key`` (``has()`` takes identifiers only)."""
    if re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", key) and key not in _RESERVED:
        return f"has({expr}.{key})"
    return f"{quote(key)} in {expr}"


def map_at(expr: str, keys: Sequence[str]) -> tuple[str, str]:
    """(condition, value): the map reached from ``expr`` through ``keys``, each step a map that holds the next."""
    conditions = [is_map(expr)]
    current = expr
    for key in keys:
        conditions.append(has(current, key))
        current = field(current, key)
        conditions.append(is_map(current))
    return every(*conditions), current


#: a variable, or a field path from one: what costs one attribute resolution to read again
_PATH = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*|\['(?:[^'\\]|\\.)*'\])*$")
#: the comprehension variable :func:`once` binds an expression to
_BOUND = "bound"


def bind(expr: str, name: str, body: str) -> str:
    """``body`` with the comprehension variable ``name`` bound to ``expr``, evaluated once:
    ``[expr].map(name, body)[0]`` (kube-apiserver's CEL has no ``cel.bind``, 1.33.3 and 1.36.2)."""
    return f"[{expr}].map({name}, {body})[0]"


def once(expr: str, build: Callable[[str], str]) -> str:
    """``build(expr)`` with ``expr`` evaluated once: a path as it is (reading it again is one lookup);
    anything else bound to a comprehension variable, ``[expr].map(bound, build(bound))[0]``. The guards
    of :func:`value_at`, :func:`sub_map` and :func:`sub_list` name their map three times or more: nested
    as the expression of another's map (an affinity's node affinity's required terms), each level
    multiplied the evaluations of the levels inside it (4^depth), in kube-apiserver's every admission."""
    if _PATH.match(expr):
        return build(expr)
    return bind(expr, _BOUND, build(_BOUND))


def value_at(expr: str, keys: Sequence[str], default: str) -> str:
    """The value reached from the map ``expr`` through ``keys``, or ``default`` when a step is missing."""
    if not keys:
        return expr

    def build(root: str) -> str:
        condition, parent = map_at(root, keys[:-1])
        return when(every(condition, has(parent, keys[-1])), field(parent, keys[-1]), default)

    return once(expr, build)


def sub_map(expr: str, key: str) -> str:
    """``expr[key]`` when ``expr`` is a map holding a map there, else ``{}``."""

    def build(root: str) -> str:
        condition, value = map_at(root, [key])
        return when(condition, value, "{}")

    return once(expr, build)


def sub_list(expr: str, key: str) -> str:
    """``expr[key]`` when ``expr`` is a map holding a list there, else ``[]``."""

    def build(root: str) -> str:
        value = field(root, key)
        return when(every(is_map(root), has(root, key), is_list(value)), value, "[]")

    return once(expr, build)


def glob(subject: str, pattern: str) -> str:
    """``fnmatch.fnmatchcase(subject, pattern)`` (shell globs: *, ?, [seq], [!seq])."""
    if not any(c in pattern for c in "*?["):
        return f"{subject} == {quote(pattern)}"
    if pattern.endswith("*") and not any(c in pattern[:-1] for c in "*?["):
        return f"{subject}.startsWith({quote(pattern[:-1])})"
    return f"{subject}.matches({quote(glob_regex(pattern))})"


def glob_regex(pattern: str) -> str:
    """An RE2 regular expression matching what the shell glob matches, whole."""
    out, i = [], 0
    while i < len(pattern):
        char = pattern[i]
        i += 1
        if char == "*":
            out.append(".*")
        elif char == "?":
            out.append(".")
        elif char == "[":
            end = i
            if end < len(pattern) and pattern[end] == "!":
                end += 1
            if end < len(pattern) and pattern[end] == "]":
                end += 1
            end = pattern.find("]", end)
            if end < 0:
                out.append("\\[")
                continue
            inner = pattern[i:end].replace("\\", "\\\\")
            i = end + 1
            if inner.startswith("!"):
                inner = "^" + inner[1:]
            elif inner.startswith("^"):
                inner = "\\" + inner
            out.append(f"[{inner}]")
        else:
            out.append(re.escape(char))
    return "^(?s:" + "".join(out) + ")$"


def globs(subject: str, patterns: Sequence[str]) -> str:
    """Any pattern matches; no patterns match everything (``match.name_matches``)."""
    if not patterns:
        return "true"
    return some(*(glob(subject, p) for p in patterns))


def selector(labels: str, matchers: Any) -> str:
    """A Kubernetes label selector (``schema.LabelSelector``) over the map ``labels``; None matches all."""
    if matchers is None:
        return "true"
    conditions = [f"{quote(k)} in {labels} && {labels}[{quote(k)}] == {quote(v)}" for k, v in matchers.matchLabels.items()]
    for req in matchers.matchExpressions:
        key = quote(req.key)
        if req.operator == "In":
            conditions.append(f"{key} in {labels} && {labels}[{key}] in {strings(req.values)}")
        elif req.operator == "NotIn":
            conditions.append(f"!({key} in {labels}) || !({labels}[{key}] in {strings(req.values)})")
        elif req.operator == "Exists":
            conditions.append(f"{key} in {labels}")
        else:
            conditions.append(f"!({key} in {labels})")
    return every(*conditions)


def matcher(name: str, patterns: Iterable[str]) -> str:
    """A ``ResourceMatcher``: exact names and ``prefix*`` patterns."""
    patterns = list(patterns)
    exact = [p for p in patterns if not p.endswith("*")]
    prefixes = [p[:-1] for p in patterns if p.endswith("*")]
    conditions = []
    if exact:
        conditions.append(f"{name} == {quote(exact[0])}" if len(exact) == 1 else f"{name} in {strings(exact)}")
    conditions.extend("true" if not p else f"{name}.startsWith({quote(p)})" for p in prefixes)
    return some(*conditions)


def joined(lists: Sequence[str]) -> str:
    """Lists of finding strings (each may hold several, SEP-joined) as one SEP-joined string."""
    parts = [l for l in lists if l != "[]"]
    if not parts:
        return "''"
    return f"({' + '.join(parts)}).filter(s, s != '').join({SEP_LITERAL})"


def json_pointer_token(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")


def as_json(value: Any) -> str:
    """JSON text (for annotations and the coverage record)."""
    return json.dumps(value, sort_keys=True)


#: kube-apiserver's CEL parser refuses an expression longer than this many code points (its policy
#: with it: measured through 1.33.3 and 1.36.2)
MAX_EXPRESSION = 100_000
#: a string literal (either quote, escapes kept), or a reference to a policy variable
_LITERAL_OR_VARIABLE = re.compile(r"""'(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*"|\bvariables\.([A-Za-z_][A-Za-z0-9_]*)""")
#: the prefix of the comprehension variable :func:`inline` binds a policy variable to
INLINED = "v_"


def _variable_refs(expr: str) -> list[str]:
    return [m.group(1) for m in _LITERAL_OR_VARIABLE.finditer(expr) if m.group(1)]


def inline(variables: Sequence[tuple[str, str]], expr: str, known: dict[str, str] | None = None) -> str:
    """``expr`` with no policy variable read: where a matchCondition must say what variables compute
    (a matchCondition reads none). ``variables``: (name, expression) in definition order, each reading
    only those before it, as kube-apiserver's composition does; ``known``: variables given as an
    expression instead. Every variable ``expr`` needs and reads more than once (counting the reads of
    the others it needs) is computed once, bound to a comprehension variable around the rest
    (``[e].map(v_name, ...)[0]``, in definition order); one read once is written where it is read, so
    that it is computed only where that read is reached, as a policy's lazy variables are. A
    variable's evaluation errors as the expression it is written into does."""
    known = known or {}
    defined = dict(variables)
    needed: set[str] = set()
    todo = [expr]
    while todo:
        for name in _variable_refs(todo.pop()):
            if name in known or name in needed:
                continue
            if name not in defined:
                raise ValueError(f"variables.{name} is not defined")
            needed.add(name)
            todo.append(defined[name])
    reads = {name: 0 for name in needed}
    for text in [expr, *(defined[n] for n in needed)]:
        for name in _variable_refs(text):
            if name in reads:
                reads[name] += 1
    bound = [name for name, _ in variables if name in needed and reads[name] > 1]

    def written(text: str) -> str:
        def one(match: re.Match[str]) -> str:
            name = match.group(1)
            if not name:
                return match.group(0)
            if name in known:
                return f"({known[name]})"
            return INLINED + name if name in bound else f"({written(defined[name])})"
        return _LITERAL_OR_VARIABLE.sub(one, text)

    body = written(expr)
    for name in reversed(bound):
        body = bind(written(defined[name]), INLINED + name, body)
    return body
