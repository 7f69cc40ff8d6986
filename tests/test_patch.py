"""The patch builder: recorded operations reproduce the document; the input is never touched
(or, in place, only the input is, and the operations are the same)."""

from __future__ import annotations

import copy
import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support import apply_patch
from webhook.kube import affinity
from webhook.kube.patch import PatchBuilder, pointer


def test_pointer_escapes_rfc6901() -> None:
    assert pointer(["metadata", "annotations", "gpu-admission.io/mutated"]) == "/metadata/annotations/gpu-admission.io~1mutated"
    assert pointer(["a~b", 0]) == "/a~0b/0"


def test_missing_parents_are_added_as_one_subtree() -> None:
    doc: dict[str, Any] = {"spec": {}}
    b = PatchBuilder(doc)
    b.set(["spec", "securityContext", "runAsNonRoot"], True)
    assert b.ops == [{"op": "add", "path": "/spec/securityContext", "value": {"runAsNonRoot": True}}]
    assert doc == {"spec": {}}


def test_append_creates_the_list_when_missing_and_indexes_after() -> None:
    b = PatchBuilder({"spec": {}})
    b.append(["spec", "tolerations"], {"key": "a"})
    b.append(["spec", "tolerations"], {"key": "b"})
    assert b.ops == [
        {"op": "add", "path": "/spec/tolerations", "value": [{"key": "a"}]},
        {"op": "add", "path": "/spec/tolerations/1", "value": {"key": "b"}},
    ]
    assert b.ops[0]["value"] == [{"key": "a"}], "recorded values must not change afterwards"


def test_null_parents_are_replaced() -> None:
    b = PatchBuilder({"spec": {"securityContext": None}})
    b.set(["spec", "securityContext", "runAsNonRoot"], True)
    assert b.ops == [{"op": "replace", "path": "/spec/securityContext", "value": {"runAsNonRoot": True}}]


def test_unchanged_values_record_nothing() -> None:
    b = PatchBuilder({"a": {"b": 1}})
    assert not b.set(["a", "b"], 1)
    assert not b.remove(["a", "c"])
    assert not b.set_default(["a", "b"], 2)
    assert b.ops == []


KEYS = st.sampled_from(["a", "b", "c", "x/y", "t~"])
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=3),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(KEYS, inner, max_size=3),
    max_leaves=12,
)


@st.composite
def edits(draw: Any) -> list[tuple[str, list[str], Any]]:
    return draw(st.lists(st.tuples(st.sampled_from(["set", "append", "remove", "default"]),
                                   st.lists(KEYS, min_size=1, max_size=3), JSON), max_size=8))


def _apply_edit(b: PatchBuilder, op: str, path: list[str], value: Any) -> None:
    # only edit where the path runs through mappings, as rules do
    node = b.doc
    for key in path[:-1]:
        node = node.get(key)
        if node is None:  # missing or null parents are created
            break
        if not isinstance(node, dict):
            return
    if op == "set":
        b.set(path, value)
    elif op == "default":
        b.set_default(path, value)
    elif op == "append":
        current = b.get(path)
        if current is None or isinstance(current, list):
            b.append(path, value)
    else:
        b.remove(path)


@settings(max_examples=300, deadline=None)
@given(doc=st.dictionaries(KEYS, JSON, max_size=4), steps=edits())
def test_recorded_patch_reproduces_the_document(doc: dict[str, Any], steps: list[Any]) -> None:
    original = copy.deepcopy(doc)
    b = PatchBuilder(doc)
    for op, path, value in steps:
        _apply_edit(b, op, path, value)
    assert doc == original, "the input object must never be modified"
    assert apply_patch(original, b.ops) == b.doc


def _anchored(b: PatchBuilder, parent_path: list[str]) -> Any:
    """The map at ``parent_path`` reached through ``own`` from the builder's own root, as rules reach a container."""
    node = b.owned(())
    for key in parent_path:
        node = b.own(node, key)
    return node


@settings(max_examples=300, deadline=None)
@given(doc=st.dictionaries(KEYS, JSON, max_size=4), steps=edits())
def test_writes_below_an_owned_map_record_what_walks_from_the_root_do(doc: dict[str, Any], steps: list[Any]) -> None:
    original = copy.deepcopy(doc)
    walked, anchored = PatchBuilder(doc), PatchBuilder(doc)
    for op, path, value in steps:
        parent_path, key = path[:-1], path[-1]
        if not isinstance(walked.get(parent_path), dict) or op not in ("set", "append", "remove"):
            continue  # put/append_to/drop write below an existing map
        parent = _anchored(anchored, parent_path)
        assert isinstance(parent, dict)
        if op == "set":
            assert anchored.put(parent, pointer(parent_path), key, value) == walked.set(path, value)
        elif op == "remove":
            assert anchored.drop(parent, pointer(parent_path), key) == walked.remove(path)
        else:
            anchored.append_to(parent, pointer(parent_path), key, value)
            walked.append(path, value)
    assert doc == original, "the input object must never be modified"
    assert anchored.ops == walked.ops
    assert anchored.doc == walked.doc


def test_node_affinity_merges_record_what_they_leave_in_the_document() -> None:
    """require, then require_any keeping the term require extended, then require again: the patch,
    applied as JSON text, gives the builder's document (the kept term is not changed in place
    inside the value an earlier operation recorded)."""
    def exists(key: str) -> dict[str, Any]:
        return {"key": key, "operator": "Exists"}

    terms = {"nodeSelectorTerms": [{"matchExpressions": [exists("a")]}, {"matchExpressions": [exists("x")]}]}
    doc = {"spec": {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": terms}}}}
    original = copy.deepcopy(doc)
    b = PatchBuilder(doc)
    affinity.require(b, ("spec",), exists("b"))  # appended to both terms: the builder owns them
    merge = affinity.require_any(b, ("spec",), [[exists("a"), exists("b")]])  # keeps the first, extends the second
    assert merge.added
    affinity.require(b, ("spec",), exists("d"))  # appended to every term again
    assert doc == original
    assert apply_patch(original, b.ops) == b.doc


def _recorded(b: PatchBuilder) -> list[str]:
    """Each recorded operation as JSON text now (a later change inside a recorded value shows)."""
    return [json.dumps(op, sort_keys=True) for op in b.ops]


@settings(max_examples=300, deadline=None)
@given(doc=st.dictionaries(KEYS, JSON, max_size=4), steps=edits())
def test_in_place_records_what_copying_records_and_never_changes_a_recorded_value(
    doc: dict[str, Any], steps: list[Any]
) -> None:
    original = copy.deepcopy(doc)
    copying, in_place = PatchBuilder(doc), PatchBuilder(copy.deepcopy(doc), in_place=True)
    texts: list[str] = []
    for op, path, value in steps:
        _apply_edit(copying, op, path, value)
        _apply_edit(in_place, op, path, value)
        texts = [*texts, *_recorded(in_place)[len(texts):]]
        assert _recorded(in_place) == texts, "a recorded value changed after it was recorded"
    assert in_place.ops == copying.ops
    assert in_place.doc == copying.doc
    assert apply_patch(original, in_place.ops) == in_place.doc


@settings(max_examples=300, deadline=None)
@given(doc=st.dictionaries(KEYS, JSON, max_size=4), steps=edits())
def test_in_place_writes_below_an_owned_map_record_what_copying_ones_do(doc: dict[str, Any], steps: list[Any]) -> None:
    original = copy.deepcopy(doc)
    copying, in_place = PatchBuilder(doc), PatchBuilder(copy.deepcopy(doc), in_place=True)
    for op, path, value in steps:
        parent_path, key = path[:-1], path[-1]
        if not isinstance(copying.get(parent_path), dict) or op not in ("set", "append", "remove"):
            continue
        for b in (copying, in_place):
            parent = _anchored(b, parent_path)
            if op == "set":
                b.put(parent, pointer(parent_path), key, value)
            elif op == "remove":
                b.drop(parent, pointer(parent_path), key)
            else:
                b.append_to(parent, pointer(parent_path), key, value)
    assert doc == original
    assert in_place.ops == copying.ops
    assert in_place.doc == copying.doc
    assert apply_patch(original, in_place.ops) == in_place.doc


POD_AFFINITY_VALUES: st.SearchStrategy[Any] = st.sampled_from([
    None, "x", [], {}, {"podAffinity": None}, {"podAffinity": "x"}, {"podAffinity": {}},
    {"podAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": "x"}},
    {"podAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 1, "podAffinityTerm": {"labelSelector": {"matchLabels": {"job": "other"}}, "topologyKey": "zone"}}]}},
    {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"labelSelector": {"matchLabels": {"job": "a"}}, "topologyKey": "zone"}]}},
    {"podAntiAffinity": {}, "nodeAffinity": {"x": 1}},
])


@settings(max_examples=200, deadline=None)
@given(current=POD_AFFINITY_VALUES, absent=st.booleans(), required=st.booleans(), in_place=st.booleans())
def test_pod_terms_written_below_the_spec_record_what_an_append_by_path_does(
    current: Any, absent: bool, required: bool, in_place: bool
) -> None:
    """add_pod_term writes below the pod spec the builder owns: the same operations and document as
    ``append`` of the term list's whole path (the missing or malformed part written whole), and nothing
    when a term with the same selector and topology key is there."""
    doc: dict[str, Any] = {"spec": {"containers": []} if absent else {"containers": [], "affinity": copy.deepcopy(current)}}
    original = copy.deepcopy(doc)
    b = PatchBuilder(copy.deepcopy(doc) if in_place else doc, in_place=in_place)
    spec = b.owned(("spec",))
    added = affinity.add_pod_term(b, spec, "/spec", affinity.POD_AFFINITY, required=required, weight=100,
                                  selector={"job": "a"}, topology_key="zone")
    term = {"labelSelector": {"matchLabels": {"job": "a"}}, "topologyKey": "zone"}
    by_path = PatchBuilder(copy.deepcopy(original))
    present = not absent and isinstance(current, dict) and isinstance(current.get("podAffinity"), dict) and term in (
        current["podAffinity"].get("requiredDuringSchedulingIgnoredDuringExecution") or [])
    if not present:
        key = "requiredDuringSchedulingIgnoredDuringExecution" if required else "preferredDuringSchedulingIgnoredDuringExecution"
        by_path.append(("spec", "affinity", "podAffinity", key), term if required else {"weight": 100, "podAffinityTerm": term})
    assert added is not present
    assert b.ops == by_path.ops
    assert b.doc == by_path.doc
    assert apply_patch(original, b.ops) == b.doc


def test_in_place_writes_into_the_document_and_copies_what_an_operation_holds() -> None:
    """One value written at two places (as securityContext is for every container), then a write
    below one of them: that one is copied first, so neither the recorded value nor the other
    place changes; the document's own maps and lists are written into, not copied."""
    containers: list[dict[str, Any]] = [{"name": "a", "volumeMounts": [{"name": "data", "mountPath": "/data"}]}, {"name": "b"}]
    doc: dict[str, Any] = {"spec": {"containers": containers}}
    b = PatchBuilder(doc, in_place=True)
    spec = b.owned(("spec",))
    assert spec is doc["spec"]
    shared = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
    for index in (0, 1):
        container = b.own_item(spec, "containers", index)
        assert container is containers[index]
        b.put(container, f"/spec/containers/{index}", "securityContext", shared)
    b.append_to(containers[0], "/spec/containers/0", "volumeMounts", {"name": "shm", "mountPath": "/dev/shm"})
    assert len(containers[0]["volumeMounts"]) == 2, "the document's list is appended to in place"
    b.set(("spec", "containers", 1, "securityContext", "capabilities", "drop"), ["NET_RAW"])
    assert shared == {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
    assert containers[0]["securityContext"] is shared
    assert containers[1]["securityContext"]["capabilities"]["drop"] == ["NET_RAW"]
    assert [op["value"] for op in b.ops[:2]] == [shared, shared]
    original = {"spec": {"containers": [{"name": "a", "volumeMounts": [{"name": "data", "mountPath": "/data"}]}, {"name": "b"}]}}
    assert apply_patch(original, b.ops) == doc


def test_in_place_holds_a_value_set_below_missing_parents_as_well_as_the_map_around_it() -> None:
    """A value set below missing parents is recorded inside the map built around it; held itself
    too, a later write at a place where the same map is reached another way copies it first."""
    for in_place in (False, True):
        node = {"k": 1}
        b = PatchBuilder({"a": node}, in_place=in_place)
        b.set(("x", "y"), node)  # "x" is missing: the operation adds {"y": node}
        b.set(("a", "k"), 2)
        assert b.ops[0] == {"op": "add", "path": "/x", "value": {"y": {"k": 1}}}, in_place
        assert b.doc == {"a": {"k": 2}, "x": {"y": {"k": 1}}}, in_place
