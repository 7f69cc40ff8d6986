"""Merging node-affinity requirements into a pod spec without widening it.

``nodeSelectorTerms`` are ORed and the expressions inside one term ANDed
(FACTS.md §7), so a requirement is ANDed into every term (or becomes the
first term). A term or nodeSelector that already implies it is left alone;
one that contradicts it can never match, and when nothing is left that can,
the pod could never be scheduled: the caller is told why.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from webhook.kube.patch import PatchBuilder, slashed, sublist, submap
from webhook.kube.value_text import text

REQUIRED = ("affinity", "nodeAffinity", "requiredDuringSchedulingIgnoredDuringExecution", "nodeSelectorTerms")
PREFERRED = ("affinity", "nodeAffinity", "preferredDuringSchedulingIgnoredDuringExecution")

Expression = Mapping[str, Any]


@dataclass(frozen=True)
class Merge:
    added: bool = False
    conflict: str = ""  # why no node could match, when that is so


def relation(have: Expression, wanted: Expression) -> str:
    """"implies", "conflicts" or "independent": what ``have`` says about ``wanted`` (same key)."""
    op, values = have.get("operator"), _values(have)
    w_op, w_values = wanted.get("operator"), _values(wanted)
    if op == w_op and values == w_values:
        return "implies"
    if w_op == "In":
        if op == "In":
            return "implies" if values <= w_values else ("conflicts" if not values & w_values else "independent")
        if op == "NotIn":  # excluding every wanted value leaves none
            return "conflicts" if w_values <= values else "independent"
        return "conflicts" if op == "DoesNotExist" else "independent"
    if w_op == "Exists":
        return "implies" if op in ("In", "Gt", "Lt") else ("conflicts" if op == "DoesNotExist" else "independent")
    if w_op == "NotIn":
        if op == "In":
            return "implies" if not values & w_values else ("conflicts" if values <= w_values else "independent")
        if op == "NotIn":  # excluding more excludes what is wanted
            return "implies" if w_values <= values else "independent"
        return "implies" if op == "DoesNotExist" else "independent"
    if w_op == "DoesNotExist":
        return "conflicts" if op in ("In", "Exists", "Gt", "Lt") else "independent"
    return "independent"


def _values(expr: Expression) -> set[str]:
    """The expression's values as label values are compared: as strings (a malformed
    custom-resource template may hold anything there)."""
    return {text(v) for v in sublist(expr, "values")}


def describe(expr: Expression) -> str:
    values = sublist(expr, "values")
    suffix = f" [{', '.join(map(text, values))}]" if values else ""
    return f"{text(expr.get('key'))} {text(expr.get('operator'))}{suffix}"


def _selector_as_expression(key: str, value: Any) -> Expression:
    return {"key": key, "operator": "In", "values": [text(value)]}


def _term_relation(term: Mapping[str, Any], wanted: Expression) -> str:
    exprs = sublist(term, "matchExpressions")
    relations = [relation(e, wanted) for e in exprs if isinstance(e, dict) and e.get("key") == wanted.get("key")]
    # a term that already carries the requirement satisfies it, even if it
    # also contradicts it (then it matches no node, which is the point)
    if "implies" in relations:
        return "implies"
    return "conflicts" if "conflicts" in relations else "independent"


def require(builder: PatchBuilder, spec_path: Sequence[str | int], wanted: Expression) -> Merge:
    """AND ``wanted`` into the pod's required node affinity."""
    selector = submap(builder.get(spec_path), "nodeSelector")
    key = str(wanted.get("key"))
    if key in selector:
        pinned = relation(_selector_as_expression(key, selector[key]), wanted)
        if pinned == "conflicts":
            return Merge(conflict=f"nodeSelector pins {key}={text(selector[key])}, which is not {describe(wanted)}")
        if pinned == "implies":
            return Merge()
    terms_path = (*spec_path, *REQUIRED)
    terms = builder.get(terms_path)
    if not isinstance(terms, list) or not terms:
        builder.set(terms_path, [{"matchExpressions": [dict(wanted)]}])
        return Merge(added=True)
    relations = [_term_relation(t, wanted) if isinstance(t, dict) else "independent" for t in terms]
    if all(r == "conflicts" for r in relations):
        return Merge(conflict=f"every required node-affinity term contradicts {describe(wanted)}")
    added = False
    for index, rel in enumerate(relations):
        # a contradicting term gets it too: left alone it would let the pod
        # onto nodes the policy rules out; ANDed, it simply matches nothing
        if rel != "implies":
            builder.append((*terms_path, index, "matchExpressions"), dict(wanted))
            added = True
    return Merge(added=added)


def require_any(builder: PatchBuilder, spec_path: Sequence[str | int], alternatives: Sequence[Sequence[Expression]]) -> Merge:
    """AND the OR of ``alternatives`` (each a list of expressions, ANDed) into the required node affinity.

    Terms are ORed, so each of the pod's terms (the nodeSelector ANDed in) that satisfies no
    alternative yet becomes one term per alternative it does not contradict. A term that
    already carries one (this merge's own output, on a second pass) is left alone.
    """
    pinned = [_selector_as_expression(k, v) for k, v in submap(builder.get(spec_path), "nodeSelector").items()]
    terms_path = (*spec_path, *REQUIRED)
    terms = builder.get(terms_path)
    theirs: list[Any] = list(terms) if isinstance(terms, list) and terms else [{}]
    merged: list[Any] = []
    for term in theirs:
        if not isinstance(term, dict):
            merged.append(term)  # matches no node (the scheduler's view): nothing to narrow
            continue
        have = [e for e in sublist(term, "matchExpressions") if isinstance(e, dict)] + pinned
        fits = [_alternative_relation(have, alt) for alt in alternatives]
        if "implies" in fits:
            merged.append(term)
            continue
        # a term contradicting every alternative gets the first: left alone it would let the
        # pod onto nodes the policy rules out; ANDed, it simply matches nothing
        usable = [alt for alt, fit in zip(alternatives, fits) if fit != "conflicts"] or list(alternatives[:1])
        own = sublist(term, "matchExpressions")
        merged.extend({**term, "matchExpressions": [*own, *map(dict, alt)]} for alt in usable)
    if merged == theirs:
        return Merge()
    # a copy: a term kept as it is may be one the builder owns (an earlier require appended to it),
    # which a later write would change in place, and with it the value recorded in this operation
    builder.set(terms_path, copy.deepcopy(merged))
    return Merge(added=True)


def _alternative_relation(have: Sequence[Expression], alternative: Sequence[Expression]) -> str:
    """"implies" when ``have`` (ANDed) implies every expression of ``alternative``; "conflicts"
    when it contradicts one; "independent" otherwise."""
    relations = [_term_relation({"matchExpressions": list(have)}, wanted) for wanted in alternative]
    if all(r == "implies" for r in relations):
        return "implies"
    return "conflicts" if "conflicts" in relations else "independent"


def prefer(builder: PatchBuilder, spec_path: Sequence[str | int], weight: int, expressions: Sequence[Expression]) -> bool:
    """Add a preferred scheduling term unless an identical one is there."""
    path = (*spec_path, *PREFERRED)
    term = {"weight": weight, "preference": {"matchExpressions": [dict(e) for e in expressions]}}
    current = builder.get(path)
    if isinstance(current, list) and term in current:
        return False
    builder.append(path, term)
    return True


POD_AFFINITY = ("affinity", "podAffinity")
POD_ANTI_AFFINITY = ("affinity", "podAntiAffinity")


def add_pod_term(
    builder: PatchBuilder,
    spec: dict[str, Any],
    spec_at: str,
    kind: tuple[str, str],
    *,
    required: bool,
    weight: int,
    selector: Mapping[str, str],
    topology_key: str,
) -> bool:
    """Add a pod (anti-)affinity term selecting ``selector`` on ``topology_key`` to ``spec``, a pod spec
    the builder owns whose JSON pointer is ``spec_at`` (written below it, as container writes are:
    no path walked from the document's root).

    Nothing is added when a term with the same selector and topology key is
    there already, required or preferred: the user's own choice stands.
    """
    term = {"labelSelector": {"matchLabels": dict(selector)}, "topologyKey": topology_key}
    outer, inner = kind
    affinity = spec.get(outer)
    terms = affinity.get(inner) if type(affinity) is dict else None
    if type(terms) is dict:
        for t in _as_list(terms.get(_REQUIRED)):
            if type(t) is dict and _same_pod_term(t, term):
                return False
        for t in _as_list(terms.get(_PREFERRED)):
            have = t.get("podAffinityTerm") if type(t) is dict else None
            if type(have) is dict and _same_pod_term(have, term):
                return False
    key, item = (_REQUIRED, term) if required else (_PREFERRED, {"weight": weight, "podAffinityTerm": term})
    # what builder.append of the list's path does: the missing (or null, or not a map) part written whole
    if type(affinity) is not dict:
        builder.put(spec, spec_at, outer, {inner: {key: [item]}})
        return True
    at = spec_at + slashed(outer)
    if type(terms) is not dict:
        builder.put(builder.own(spec, outer), at, inner, {key: [item]})
        return True
    builder.append_to(builder.own(builder.own(spec, outer), inner), at + slashed(inner), key, item)
    return True


_REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"
_PREFERRED = "preferredDuringSchedulingIgnoredDuringExecution"


def _same_pod_term(have: Mapping[str, Any], wanted: Mapping[str, Any]) -> bool:
    if have.get("topologyKey") != wanted.get("topologyKey"):
        return False
    selector = have.get("labelSelector")
    return isinstance(selector, dict) and selector.get("matchLabels") == wanted["labelSelector"]["matchLabels"] \
        and not selector.get("matchExpressions")


def _as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []
