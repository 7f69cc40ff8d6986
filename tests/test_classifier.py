"""The indexed workload classifier agrees with checking every class entry in order."""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypedDict

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from webhook.policy import loader, match, schema

REPO = Path(__file__).resolve().parents[1]
SHIPPED = loader.load_directory(REPO / "policies")

KEYS = ["gpu-admission.io/workload-class", "notebook-name", "component", "app", "training.kubeflow.org/job-name",
        "serving.kserve.io/inferenceservice", "team", "example.com/a"]
VALUES = ["training", "inference", "notebook", "batch", "singleuser-server", "x", ""]
KINDS = ["Pod", "Job", "CronJob", "Deployment", "StatefulSet", "ReplicaSet", "PyTorchJob", "Notebook", "RayJob", "JobSet"]
OPERATORS = ["In", "NotIn", "Exists", "DoesNotExist"]

label_maps = st.dictionaries(st.sampled_from(KEYS), st.sampled_from(VALUES), max_size=4)


@st.composite
def selectors(draw: Any) -> dict[str, Any]:
    selector: dict[str, Any] = {}
    if draw(st.booleans()):
        selector["matchLabels"] = draw(label_maps)
    if draw(st.booleans()):
        selector["matchExpressions"] = [
            {"key": draw(st.sampled_from(KEYS)), "operator": op,
             **({"values": draw(st.lists(st.sampled_from(VALUES), min_size=1, max_size=2))} if op in ("In", "NotIn") else {})}
            for op in draw(st.lists(st.sampled_from(OPERATORS), max_size=2))
        ]
    return selector


@st.composite
def class_entries(draw: Any) -> dict[str, Any]:
    entry: dict[str, Any] = {}
    if draw(st.booleans()):
        entry["labels"] = draw(selectors())
    if draw(st.integers(0, 3)) == 0:
        entry["annotations"] = draw(st.dictionaries(st.sampled_from(KEYS), st.sampled_from([*VALUES, "*"]), max_size=2))
    if draw(st.booleans()):
        entry["ownerKinds"] = draw(st.lists(st.sampled_from(KINDS), max_size=3))
    if draw(st.booleans()):
        entry["workloadKinds"] = draw(st.lists(st.sampled_from(KINDS), max_size=3))
    if draw(st.integers(0, 4)) == 0:
        entry["namespaces"] = draw(st.lists(st.sampled_from(["ml", "ml-*", "prod"]), min_size=1, max_size=2))
    return entry


@st.composite
def pods(draw: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {}
    if draw(st.booleans()):
        meta["labels"] = draw(label_maps)
    if draw(st.booleans()):
        meta["annotations"] = draw(label_maps)
    owners = draw(st.lists(st.sampled_from(KINDS), max_size=2))
    if owners:
        meta["ownerReferences"] = [{"kind": k, "name": "o", "apiVersion": "v1", "uid": "u"} for k in owners]
    return {
        "meta": meta,
        "owner_kinds": set(owners),
        "workload_kind": draw(st.sampled_from(KINDS)),
        "namespace": draw(st.sampled_from(["ml", "ml-a", "prod", "default"])),
        "ns_labels": draw(label_maps),
    }


def _linear(entries: list[tuple[schema.ClassMatch, str]], facts: match.PodFacts) -> str:
    """The specification: every entry in order, the first match wins."""
    return next((workload_class for entry, workload_class in entries if match.entry_matches(entry, facts)), "")


def _both(entries: list[tuple[schema.ClassMatch, str]], pod: dict[str, Any]) -> tuple[str, str]:
    args = (pod["meta"], pod["owner_kinds"], pod["workload_kind"], pod["namespace"], pod["ns_labels"])
    return match.Classifier(entries).classify(*args), _linear(entries, match.PodFacts.of(*args))


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(raw=st.lists(st.tuples(class_entries(), st.sampled_from(VALUES[:4])), max_size=8), pod=pods())
def test_indexed_classifier_agrees_with_the_linear_scan(raw: list[tuple[dict[str, Any], str]], pod: dict[str, Any]) -> None:
    entries = [(schema.ClassMatch.model_validate(entry), name) for entry, name in raw]
    indexed, linear = _both(entries, pod)
    assert indexed == linear


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(raw=st.lists(st.tuples(class_entries(), st.sampled_from(VALUES[:4])), min_size=60, max_size=140), pod=pods())
def test_many_entries_agree_with_the_linear_scan(raw: list[tuple[dict[str, Any], str]], pod: dict[str, Any]) -> None:
    """Past 63 entries the candidates' bit set is no machine word (the compiled core's ints are then boxed)."""
    entries = [(schema.ClassMatch.model_validate(entry), name) for entry, name in raw]
    indexed, linear = _both(entries, pod)
    assert indexed == linear


def test_the_first_matching_entry_wins_past_the_sixty_fourth() -> None:
    """130 entries on one label, each wanting its own value: the pod's value picks the entry, past bit 63
    too, and an entry without an anchor listed before it wins over it."""
    entries = [(schema.ClassMatch.model_validate({"labels": {"matchLabels": {"team": f"t{i}"}}}), f"class-{i}")
               for i in range(130)]
    pod: dict[str, Any] = {"meta": {"labels": {"team": "t100"}}, "owner_kinds": set(), "workload_kind": "Pod",
                           "namespace": "ml", "ns_labels": {}}
    assert _both(entries, pod) == ("class-100", "class-100")
    unanchored = (schema.ClassMatch.model_validate({"namespaces": ["ml"]}), "anywhere-in-ml")
    assert _both([*entries[:70], unanchored, *entries[70:]], pod) == ("anywhere-in-ml", "anywhere-in-ml")
    assert _both([*entries[:101], unanchored], pod) == ("class-100", "class-100")


@settings(max_examples=300, deadline=None)
@given(pod=pods())
def test_shipped_classes_agree_with_the_linear_scan(pod: dict[str, Any]) -> None:
    indexed, linear = _both(list(SHIPPED.class_entries), pod)
    assert indexed == linear


class _Common(TypedDict):
    owner_kinds: set[str]
    namespace: str
    ns_labels: dict[str, str]


def test_a_pod_matching_no_anchor_has_no_class_and_an_anchored_one_does() -> None:
    classifier = SHIPPED.classifier
    common: _Common = {"owner_kinds": set(), "namespace": "ml", "ns_labels": {}}
    owned_by_job: _Common = {**common, "owner_kinds": {"Job"}}
    assert classifier.classify(pod_meta={"labels": {"app": "x"}}, workload_kind="Pod", **common) == ""
    assert classifier.classify(pod_meta={"labels": {"notebook-name": "nb"}}, workload_kind="Pod", **common) == "notebook"
    assert classifier.classify(pod_meta={}, workload_kind="Pod", **owned_by_job) == "batch"
    # an explicit label outranks the owner heuristics (lower order is tried first) where the
    # namespace is allowed that class, and counts for nothing elsewhere (issue #42 row 7)
    allowed: _Common = {**owned_by_job, "ns_labels": {"workload-classes.gpu-admission.io/inference": "true"}}
    labelled = {"labels": {"gpu-admission.io/workload-class": "inference"}}
    assert classifier.classify(pod_meta=labelled, workload_kind="Pod", **allowed) == "inference"
    assert classifier.classify(pod_meta=labelled, workload_kind="Pod", **owned_by_job) == "batch"
