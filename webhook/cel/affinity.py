"""Required node affinity in CEL: ``webhook.kube.affinity``'s relations between a pod's node
requirements and a policy's, for the compiled ``nodeAffinity`` rule.

A requirement the policy asks for is known when compiling; the pod's are read: so each relation
("implies", "conflicts" or "independent") is a CEL expression over one of the pod's expressions
``h`` (or its nodeSelector's value), written for that requirement.
"""

from __future__ import annotations

from typing import Any

from webhook.cel import syntax as cel
from webhook.kube import affinity

REQUIRED = affinity.REQUIRED
PREFERRED = affinity.PREFERRED


def _values(expr: str) -> str:
    """``affinity._values``: an expression's values as strings."""
    return f"({cel.sub_list(expr, 'values')}.map(v, string(v)))"


def relation(have: str, wanted: dict[str, Any]) -> str:
    """``affinity.relation`` of the pod's expression ``have`` (a CEL map) to ``wanted``: a CEL string."""
    op = f"({cel.has(have, 'operator')} ? string({have}.operator) : '')"
    values = _values(have)
    w_op = str(wanted.get("operator"))
    w_values = sorted({str(v) for v in wanted.get("values") or []})
    w = cel.strings(w_values)
    subset = f"{values}.all(v, v in {w})"  # have's values within wanted's
    superset = f"{w}.all(v, v in {values})"  # wanted's within have's
    disjoint = f"!{values}.exists(v, v in {w})"
    same = f"{op} == {cel.quote(w_op)} && {subset} && {superset}"
    if w_op == "In":
        rest = (f"{op} == 'In' ? ({subset} ? 'implies' : ({disjoint} ? 'conflicts' : 'independent')) : "
                f"({op} == 'NotIn' ? ({superset} ? 'conflicts' : 'independent') : ({op} == 'DoesNotExist' ? 'conflicts' : 'independent'))")
    elif w_op == "Exists":
        rest = f"{op} in ['In', 'Gt', 'Lt'] ? 'implies' : ({op} == 'DoesNotExist' ? 'conflicts' : 'independent')"
    elif w_op == "NotIn":
        rest = (f"{op} == 'In' ? ({disjoint} ? 'implies' : ({subset} ? 'conflicts' : 'independent')) : "
                f"({op} == 'NotIn' ? ({superset} ? 'implies' : 'independent') : ({op} == 'DoesNotExist' ? 'implies' : 'independent'))")
    elif w_op == "DoesNotExist":
        rest = f"{op} in ['In', 'Exists', 'Gt', 'Lt'] ? 'conflicts' : 'independent'"
    else:
        rest = "'independent'"
    return f"({same} ? 'implies' : ({rest}))"


def pinned(selector: str, wanted: dict[str, Any]) -> str:
    """The relation of the nodeSelector's value for the wanted key (``{key, In, [value]}``), or ''."""
    key = cel.quote(str(wanted.get("key")))
    pin = f"{{'operator': dyn('In'), 'values': dyn([string({selector}[{key}])])}}"
    return f"({key} in {selector} ? [{pin}].map(h, {relation('h', wanted)})[0] : '')"


def term_relation(term: str, wanted: dict[str, Any]) -> str:
    """``affinity._term_relation``: implies when an expression of the term for the key implies it,
    else conflicts when one conflicts, else independent."""
    key = cel.quote(str(wanted.get("key")))
    exprs = f"{cel.sub_list(term, 'matchExpressions')}.filter(h, type(h) == map && has(h.key) && h.key == {key})"
    found = f"{exprs}.map(h, {relation('h', wanted)})"
    return (f"(type({term}) != map ? 'independent' : [{found}].map(R, 'implies' in R ? 'implies' : "
            f"('conflicts' in R ? 'conflicts' : 'independent'))[0])")


def describe(wanted: dict[str, Any]) -> str:
    return affinity.describe(wanted)
