"""NodeFilter (the pod's side read once) agrees with checking every filter per node, as specified."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from decimal import Decimal
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from webhook.kube.patch import lookup, sublist
from webhook.view import nodegroups, scheduling

# -- the specification: every filter, per node, straight from the pod spec --

def _requirement(expr: Mapping[str, Any], labels: Mapping[str, Any]) -> bool:
    key, op = str(expr.get("key", "")), expr.get("operator")
    raw = expr.get("values")
    values = [str(v) for v in raw] if isinstance(raw, list) else []
    present = key in labels
    if op == "In":
        return present and labels[key] in values
    if op == "NotIn":
        return not present or labels[key] not in values
    if op == "Exists":
        return present
    if op == "DoesNotExist":
        return not present
    if op in ("Gt", "Lt") and present and len(values) == 1:
        try:
            have, bound = int(labels[key]), int(values[0])
        except (TypeError, ValueError):
            return False
        return have > bound if op == "Gt" else have < bound
    return False


def _term(term: Any, node: Mapping[str, Any]) -> bool:
    if not isinstance(term, Mapping):
        return False
    exprs = [e for e in sublist(term, "matchExpressions") if isinstance(e, Mapping)]
    raw = term.get("matchFields")
    fields = [f for f in raw if isinstance(f, Mapping)] if isinstance(raw, list) else []
    if not exprs and not fields:
        return False
    labels = scheduling.node_labels(node)
    return all(_requirement(e, labels) for e in exprs) and all(
        _requirement(f, {"metadata.name": scheduling.node_name(node)}) for f in fields)


def _affinity(spec: Mapping[str, Any], node: Mapping[str, Any]) -> bool:
    selector = spec.get("nodeSelector")
    if isinstance(selector, Mapping) and any(scheduling.node_labels(node).get(str(k)) != str(v) for k, v in selector.items()):
        return False
    required = lookup(spec, ("affinity", "nodeAffinity", "requiredDuringSchedulingIgnoredDuringExecution"))
    if not isinstance(required, Mapping):
        return True
    terms = required.get("nodeSelectorTerms")
    return isinstance(terms, list) and any(_term(t, node) for t in terms)


def _tolerates(toleration: Mapping[str, Any], taint: Mapping[str, Any]) -> bool:
    """Kubernetes' ToleratesTaint: empty effect or key in the toleration match any."""
    effect, key = toleration.get("effect"), toleration.get("key")
    if effect and effect != taint.get("effect"):
        return False
    if key and key != taint.get("key"):
        return False
    operator = toleration.get("operator") or "Equal"
    if operator == "Exists":
        return True
    return operator == "Equal" and (toleration.get("value") or "") == (taint.get("value") or "")


def _taints(tolerations: Iterable[Any], node: Mapping[str, Any]) -> bool:
    spec = node.get("spec")
    spec = spec if isinstance(spec, Mapping) else {}
    taints = [t for t in sublist(spec, "taints")
              if isinstance(t, Mapping) and t.get("key") not in scheduling.CONDITION_TAINTS]
    held = [t for t in tolerations if isinstance(t, Mapping)]
    return all(any(_tolerates(t, taint) for t in held)
               for taint in taints if taint.get("effect") in ("NoSchedule", "NoExecute"))


def reference(spec: Mapping[str, Any], nodes: list[Any], needs: Mapping[str, Decimal], extra: list[Any]) -> list[Any]:
    tolerations = [*sublist(spec, "tolerations"), *extra]
    return [
        node for node in nodes
        if isinstance(node, Mapping)
        and (not spec.get("nodeName") or scheduling.node_name(node) == spec.get("nodeName"))
        and _affinity(spec, node)
        and _taints(tolerations, node)
        and all(nodegroups.amount(node, n) >= max(c, Decimal(1)) for n, c in needs.items())
    ]


# -- generated pods and nodes --

KEYS = st.sampled_from(["nvidia.com/gpu.product", "nvidia.com/mig.capable", "pool", "kubernetes.io/hostname"])
VALUES = st.sampled_from(["A100", "H100", "true", "false", "a", "3", "10"])
ODD: st.SearchStrategy[Any] = st.none() | st.integers(-2, 12) | st.booleans() | st.just({}) | st.just(["a"])
EXPR = st.fixed_dictionaries(
    {"key": KEYS, "operator": st.sampled_from(["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt", "Bogus"])},
    optional={"values": st.lists(VALUES | ODD, max_size=2) | ODD},
)
TERM = st.fixed_dictionaries({}, optional={
    "matchExpressions": st.lists(EXPR, max_size=3) | ODD,
    "matchFields": st.lists(st.fixed_dictionaries({"key": st.just("metadata.name"), "operator": st.sampled_from(["In", "NotIn"]),
                                                   "values": st.lists(st.sampled_from(["n0", "n1", "n2"]), max_size=2)}), max_size=1),
}) | ODD
TAINT = st.fixed_dictionaries({"key": st.sampled_from(["nvidia.com/gpu", "pool", "other"]),
                               "effect": st.sampled_from(["NoSchedule", "NoExecute", "PreferNoSchedule"])},
                              optional={"value": VALUES})
TOLERATION = st.fixed_dictionaries({}, optional={
    "key": st.sampled_from(["nvidia.com/gpu", "pool", "node.kubernetes.io/unschedulable", "node.kubernetes.io/not-ready"]),
    "operator": st.sampled_from(["Exists", "Equal", "Bogus"]), "value": VALUES,
    "effect": st.sampled_from(["NoSchedule", "NoExecute", ""]),
}) | ODD
SPEC = st.fixed_dictionaries({}, optional={
    "nodeName": st.sampled_from(["n0", "n1", "missing", ""]),
    "nodeSelector": st.dictionaries(KEYS, VALUES | ODD, max_size=2) | ODD,
    "affinity": st.fixed_dictionaries({"nodeAffinity": st.fixed_dictionaries({}, optional={
        "requiredDuringSchedulingIgnoredDuringExecution": st.fixed_dictionaries({}, optional={
            "nodeSelectorTerms": st.lists(TERM, max_size=3) | ODD}) | ODD})}),
    "tolerations": st.lists(TOLERATION, max_size=3) | ODD,
})


@st.composite
def nodes(draw: Any) -> list[Any]:
    found: list[Any] = []
    for i in range(draw(st.integers(0, 5))):
        node: dict[str, Any] = {"metadata": {"name": f"n{i}", "labels": draw(st.dictionaries(KEYS, VALUES, max_size=3))}}
        spec = draw(st.fixed_dictionaries({}, optional={"taints": st.lists(TAINT, max_size=2), "unschedulable": st.booleans()}))
        if spec:
            node["spec"] = spec
        node["status"] = {"allocatable": draw(st.dictionaries(
            st.sampled_from(["nvidia.com/gpu", "nvidia.com/mig-1g.10gb"]), st.sampled_from(["0", "1", "4", "8", "x"]), max_size=2))}
        found.append(draw(st.just(node) | ODD) if draw(st.integers(0, 9)) == 0 else node)
    return found


NEEDS = st.dictionaries(st.sampled_from(["nvidia.com/gpu", "nvidia.com/mig-1g.10gb"]),
                        st.sampled_from([Decimal(0), Decimal("0.5"), Decimal(1), Decimal(4), Decimal(9)]), max_size=2)


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=SPEC, node_list=nodes(), needs=NEEDS, tolerate_all=st.booleans())
def test_node_filter_agrees_with_the_per_node_specification(
    spec: dict[str, Any], node_list: list[Any], needs: dict[str, Decimal], tolerate_all: bool
) -> None:
    extra = [{"operator": "Exists"}] if tolerate_all else []
    assert scheduling.eligible_nodes(spec, node_list, needs, extra) == reference(spec, node_list, needs, extra)
