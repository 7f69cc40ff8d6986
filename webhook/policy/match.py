"""Does a policy (or a workload class) apply to this object, namespace and pod spec?"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Any

from webhook.kube.patch import as_dict
from webhook.kube.value_text import text
from webhook.policy import schema


def selector_matches(selector: schema.LabelSelector | None, labels: Mapping[str, str]) -> bool:
    """Kubernetes label-selector semantics; a missing selector matches everything."""
    if selector is None:
        return True
    for key, value in selector.matchLabels.items():
        if labels.get(key) != value:
            return False
    for req in selector.matchExpressions:
        present = req.key in labels
        if req.operator == "In" and (not present or labels[req.key] not in req.values):
            return False
        if req.operator == "NotIn" and present and labels[req.key] in req.values:
            return False
        if req.operator == "Exists" and not present:
            return False
        if req.operator == "DoesNotExist" and present:
            return False
    return True


def name_matches(patterns: Sequence[str], name: str) -> bool:
    """Empty patterns match everything; otherwise any shell glob must match."""
    return not patterns or any(fnmatchcase(name, p) for p in patterns)


def kind_matches(patterns: Sequence[str], group: str, kind: str) -> bool:
    """"*", "Kind" (any group) or "group/Kind"."""
    for pattern in patterns:
        if pattern == "*" or pattern == kind or pattern == f"{group}/{kind}":
            return True
    return False


def by_workload_class(policy: schema.GPUPolicy) -> bool:
    """Whether the policy has workload-class conditions (checked per pod spec)."""
    exclude = policy.spec.exclude
    return bool(policy.spec.match.workloadClasses or (exclude is not None and exclude.workloadClasses))


def takes_workload_class(policy: schema.GPUPolicy, workload_class: str) -> bool:
    """Whether the policy runs on a pod spec of this workload class ("" for none)."""
    listed, exclude = policy.spec.match.workloadClasses, policy.spec.exclude
    return (not listed or workload_class in listed) and not (exclude is not None and workload_class in exclude.workloadClasses)


def policy_applies(
    policy: schema.GPUPolicy, group: str, kind: str, namespace: str, ns_labels: Mapping[str, str]
) -> bool:
    """Object-level match: kind and namespace (pod-level parts are checked per pod spec)."""
    match, exclude = policy.spec.match, policy.spec.exclude
    if not kind_matches(match.kinds, group, kind):
        return False
    if not name_matches(match.namespaces, namespace) or not selector_matches(match.namespaceSelector, ns_labels):
        return False
    if exclude is not None:
        if exclude.namespaces and name_matches(exclude.namespaces, namespace):
            return False
        if exclude.namespaceSelector is not None and selector_matches(exclude.namespaceSelector, ns_labels):
            return False
    return True


#: policy name → the rules exceptions lift for one object (None: all of them)
Lifted = dict[str, "frozenset[str] | None"]


def covering(
    exceptions: Sequence[schema.GPUPolicyException], group: str, kind: str, namespace: str, obj: Mapping[str, Any]
) -> list[schema.GPUPolicyException]:
    """The exceptions that name this object."""
    meta = obj.get("metadata")
    name = generated = ""
    if type(meta) is dict:
        name = str(meta.get("name") or "")
        generated = "" if name else str(meta.get("generateName") or "")
    return [
        e for e in exceptions
        if (not e.spec.match.kinds or kind_matches(e.spec.match.kinds, group, kind))
        and name_matches(e.spec.match.namespaces, namespace) and _names_object(e.spec.match.names, name, generated)
    ]


def _names_object(patterns: Sequence[str], name: str, generated: str) -> bool:
    """Do the name patterns name this object? (Empty patterns name every object.)

    kube-apiserver generates a name from ``generateName`` after the mutating webhooks and
    before the validating ones, so the pods a controller creates reach the first with a prefix
    only (``trainer-7d9f4-``). A prefix is named only by a pattern ending in ``*`` that it
    matches: then every name made from it matches too, and both webhooks agree (an exact
    name never names a prefix, which could become any number of objects).
    """
    if not patterns:
        return True
    if name:
        return any(fnmatchcase(name, p) for p in patterns)
    return bool(generated) and any(p.endswith("*") and fnmatchcase(generated, p) for p in patterns)


def lifted(
    exceptions: Sequence[schema.GPUPolicyException], group: str, kind: str, namespace: str, obj: Mapping[str, Any]
) -> Lifted:
    """The rules the exceptions naming this object lift, per policy (empty: none names it)."""
    found: Lifted = {}
    for exception in covering(exceptions, group, kind, namespace, obj):
        for entry in exception.spec.exceptions:
            rules = found.get(entry.policy, frozenset())
            if rules is not None:
                found[entry.policy] = rules | frozenset(entry.rules) if entry.rules else None
    return found


def lifting(
    exceptions: Sequence[schema.GPUPolicyException], group: str, kind: str, namespace: str, obj: Mapping[str, Any],
    removed: Mapping[str, AbstractSet[str]],
) -> tuple[str, ...]:
    """The names of the exceptions naming this object that lift one of the ``removed`` rules (policy → rules)."""
    return tuple(
        e.metadata.name for e in covering(exceptions, group, kind, namespace, obj)
        if any(entry.policy in removed and (not entry.rules or not removed[entry.policy].isdisjoint(entry.rules))
               for entry in e.spec.exceptions)
    )


@dataclass(frozen=True)
class PodFacts:
    """What workload classes are matched on, read once per pod spec."""

    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    owner_kinds: set[str]
    workload_kind: str
    namespace: str
    ns_labels: Mapping[str, str]

    @classmethod
    def of(
        cls, pod_meta: Mapping[str, Any], owner_kinds: set[str], workload_kind: str, namespace: str,
        ns_labels: Mapping[str, str],
    ) -> PodFacts:
        return cls(_str_map(pod_meta.get("labels")), _str_map(pod_meta.get("annotations")),
                   owner_kinds, workload_kind, namespace, ns_labels)


class Classifier:
    """Finds a pod's workload class; the class entries are indexed once, at load.

    Most entries can only match when the pod has one particular owner kind,
    workload kind, label or annotation (their *anchor*). Classifying looks up
    the pod's own kinds, label keys and annotation keys in that index, then
    checks just those candidates (plus entries without an anchor) in order,
    instead of every entry against every pod.
    """

    def __init__(self, entries: Sequence[tuple[schema.ClassMatch, str]]) -> None:
        self.entries = tuple(entries)
        #: the entries as plain data, read at load: a pydantic model's fields cost a generic
        #: attribute lookup each in the compiled core, on every pod
        self._plain = tuple(_PlainEntry(entry, workload_class) for entry, workload_class in self.entries)
        #: anchor → the entries needing it, as a bit set (bit i: entry i): a pod's candidates are the
        #: union of its anchors' sets, checked from the lowest bit up (the entries' order) without a
        #: set made, filled and sorted on every pod
        self._owner: dict[str, int] = {}
        self._kind: dict[str, int] = {}
        self._label: dict[str, int] = {}
        self._annotation: dict[str, int] = {}
        self._always = 0
        for index, (entry, _) in enumerate(self.entries):
            table, keys = self._anchor(entry)
            if table is None:
                self._always |= 1 << index
                continue
            for key in keys:
                table[key] = table.get(key, 0) | 1 << index

    def _anchor(self, m: schema.ClassMatch) -> tuple[dict[str, int] | None, tuple[str, ...]]:
        """One condition the entry cannot match without, as (index table, keys any of which it needs)."""
        if m.ownerKinds:
            return self._owner, tuple(m.ownerKinds)
        if m.workloadKinds:
            return self._kind, tuple(m.workloadKinds)
        if m.labels is not None:
            if m.labels.matchLabels:
                return self._label, (next(iter(m.labels.matchLabels)),)
            for req in m.labels.matchExpressions:
                if req.operator in ("In", "Exists"):
                    return self._label, (req.key,)
        if m.annotations:
            return self._annotation, (next(iter(m.annotations)),)
        return None, ()

    def classify(
        self,
        pod_meta: Mapping[str, Any],
        owner_kinds: set[str],
        workload_kind: str,
        namespace: str,
        ns_labels: Mapping[str, str],
    ) -> str:
        """The class of the first matching entry (classes by order, then name); "" when none does.

        What ``entry_matches`` decides on ``PodFacts.of`` these arguments (a property test holds
        it to that), without building the facts: the pod's labels and annotations are read as
        they are when they hold only strings, as nearly every pod's do."""
        candidates = self._always
        owner = self._owner
        for kind in owner_kinds:
            found = owner.get(kind)
            if found is not None:
                candidates |= found
        found = self._kind.get(workload_kind)
        if found is not None:
            candidates |= found
        meta = as_dict(pod_meta)
        labels, annotations = meta.get("labels"), meta.get("annotations")
        # each of the pod's keys looked up (a pod has a few labels: compiled, a lookup each costs
        # less than one generic call of frozenset.intersection)
        table = self._label
        if isinstance(labels, dict) and table:
            for key in labels:
                found = table.get(key) if type(key) is str else None
                if found is not None:
                    candidates |= found
        table = self._annotation
        if isinstance(annotations, dict) and table:
            for key in annotations:
                found = table.get(key) if type(key) is str else None
                if found is not None:
                    candidates |= found
        if not candidates:
            return ""
        pod_labels, pod_annotations = _strings(labels), _strings(annotations)
        plain = self._plain
        while candidates:
            lowest = candidates & -candidates
            entry = plain[lowest.bit_length() - 1]
            if entry.matches(pod_labels, pod_annotations, owner_kinds, workload_kind, namespace, ns_labels):
                return entry.workload_class
            candidates ^= lowest
        return ""


class _Selector:
    """A label selector as plain data: (key, value) pairs, then (operator, key, values) requirements."""

    def __init__(self, selector: schema.LabelSelector) -> None:
        self.labels: tuple[tuple[str, str], ...] = tuple(selector.matchLabels.items())
        self.expressions: tuple[tuple[str, str, frozenset[str]], ...] = tuple(
            (req.operator, req.key, frozenset(req.values)) for req in selector.matchExpressions
        )

    def matches(self, labels: Mapping[str, str]) -> bool:
        """``selector_matches`` of the selector it was made from."""
        for key, value in self.labels:
            if labels.get(key) != value:
                return False
        for operator, key, values in self.expressions:
            present = key in labels
            if operator == "In":
                if not present or labels[key] not in values:
                    return False
            elif operator == "NotIn":
                if present and labels[key] in values:
                    return False
            elif operator == "Exists":
                if not present:
                    return False
            elif operator == "DoesNotExist" and present:
                return False
        return True


class _PlainEntry:
    """A class entry (``schema.ClassMatch``) and its class, as plain data: what ``entry_matches`` reads."""

    def __init__(self, m: schema.ClassMatch, workload_class: str) -> None:
        self.workload_class = workload_class
        self.owner_kinds: frozenset[str] = frozenset(m.ownerKinds)
        self.workload_kinds: frozenset[str] = frozenset(m.workloadKinds)
        self.labels: _Selector | None = _Selector(m.labels) if m.labels is not None else None
        self.annotations: tuple[tuple[str, str], ...] = tuple(m.annotations.items())
        self.namespaces: tuple[str, ...] = tuple(m.namespaces)
        self.ns_selector: _Selector | None = _Selector(m.namespaceSelector) if m.namespaceSelector is not None else None

    def matches(
        self, labels: Mapping[str, str], annotations: Mapping[str, str], owner_kinds: set[str], workload_kind: str,
        namespace: str, ns_labels: Mapping[str, str],
    ) -> bool:
        """``entry_matches``, in the same order (cheapest first: most entries are decided by the kinds)."""
        if self.owner_kinds and self.owner_kinds.isdisjoint(owner_kinds):
            return False
        if self.workload_kinds and workload_kind not in self.workload_kinds:
            return False
        if self.labels is not None and not self.labels.matches(labels):
            return False
        for key, value in self.annotations:
            found = annotations.get(key)
            if found is None or (value != "*" and found != value):
                return False
        if self.namespaces and not name_matches(self.namespaces, namespace):
            return False
        return self.ns_selector is None or self.ns_selector.matches(ns_labels)


def _strings(value: Any) -> Mapping[str, str]:
    """A pod's labels or annotations as text: the map itself when it holds only strings, else
    ``_str_map`` of it (what ``PodFacts.of`` reads)."""
    if type(value) is not dict:
        return _str_map(value)
    for key, item in value.items():
        if type(key) is not str or type(item) is not str:
            return _str_map(value)
    return value


def entry_matches(m: schema.ClassMatch, pod: PodFacts) -> bool:
    """Does one class entry match the pod? Every given field must (AND)."""
    # cheapest first: most entries are decided by the kinds
    if m.ownerKinds and not pod.owner_kinds.intersection(m.ownerKinds):
        return False
    if m.workloadKinds and pod.workload_kind not in m.workloadKinds:
        return False
    if m.labels is not None and not selector_matches(m.labels, pod.labels):
        return False
    if m.annotations and any(pod.annotations.get(k) is None or (v != "*" and pod.annotations[k] != v) for k, v in m.annotations.items()):
        return False
    return name_matches(m.namespaces, pod.namespace) and selector_matches(m.namespaceSelector, pod.ns_labels)


def _str_map(value: Any) -> dict[str, str]:
    return {text(k): text(v) for k, v in value.items()} if isinstance(value, dict) else {}
