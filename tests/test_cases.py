"""Golden YAML cases: policy + object (+ cluster) → expected verdict, patch and messages.

Every case also proves, whatever it expects: the patch applies (as
kube-apiserver applies it) and gives the engine's patched object; the
patched object is schema-valid; and evaluating it again yields no patch.
See tests/cases/README.md for the format.
"""

from __future__ import annotations

import copy
from dataclasses import replace
from pathlib import Path
from typing import Any, NamedTuple

import pytest
import yaml

from tests.support import POLICIES, apply_patch, assert_same_in_place, assert_schema_valid, shipped_policies
from webhook.policy import engine, loader
from webhook.policy.decision import Decision
from webhook.policy.request import Request
from webhook.view.snapshot import SnapshotView

CASES = Path(__file__).parent / "cases"


def _load_cases() -> list[Any]:
    found = []
    for file in sorted(CASES.rglob("*.yaml")):
        suite = yaml.safe_load(file.read_text())
        for case in suite["cases"]:
            found.append(pytest.param(suite, case, id=f"{file.stem}: {case['name']}"))
    return found


def _policies(suite: dict[str, Any], case: dict[str, Any]) -> loader.PolicySet:
    text = case.get("policies", suite.get("policies", "shipped"))
    if text == "shipped":
        return shipped_policies()
    # inline policies come with the shipped workload kinds and classes, as in a deployment
    shared = [(POLICIES / name).read_text() for name in ("workload-kinds.yaml", "workload-classes.yaml")]
    return loader.load_text("\n---\n".join([*shared, text]), "case")


class Evaluated(NamedTuple):
    policies: loader.PolicySet
    view: SnapshotView
    request: Request
    phase: Any
    decision: Decision


def evaluate_case(suite: dict[str, Any], case: dict[str, Any]) -> Evaluated:
    """The case's policies, cluster and request, and the engine's decision."""
    policies = _policies(suite, case)
    view = SnapshotView.from_objects(case.get("cluster", suite.get("cluster", [])), known=case.get("known", ()))
    phase = case.get("phase", suite.get("phase", "mutate"))
    request = Request.for_object(case["object"], operation=case.get("operation", "CREATE"), namespace=case.get("namespace"))
    if "oldObject" in case:
        request = replace(request, old_object=case["oldObject"])
    if "user" in case:  # userInfo.username: who sends it (the resourceclaim controller's claims)
        request = replace(request, user=case["user"])
    if "subResource" in case:  # pods/ephemeralcontainers: the whole pod, as kube-apiserver sends it
        request = replace(request, sub_resource=case["subResource"])
    return Evaluated(policies, view, request, phase, engine.evaluate(policies, request, view, phase))


def run_case(suite: dict[str, Any], case: dict[str, Any]) -> None:
    obj = case["object"]
    before = copy.deepcopy(obj)
    policies, view, request, phase, decision = evaluate_case(suite, case)
    assert obj == before, "the engine changed the request's object"
    assert_same_in_place(policies, request, view, phase, decision)
    expect = case.get("expect", {})
    assert decision.allowed == expect.get("allowed", True), decision.message()
    if "patch" in expect:
        assert list(decision.patch) == expect["patch"]
    for text in expect.get("messages", []):
        assert text in decision.message(), decision.message()
    for text in expect.get("warnings", []):
        assert any(text in w for w in decision.warnings), decision.warnings
    if "changes" in expect:
        assert sorted({what for _, _, what in decision.changes}) == sorted(expect["changes"])
    if "findings" in expect:
        assert sorted(f"{f.rule}:{f.label}" for f in decision.findings) == sorted(expect["findings"])
    patched = apply_patch(obj, decision.patch)
    assert patched == (decision.patched if decision.patch else obj)
    for path, value in expect.get("values", {}).items():
        assert _at(patched, path) == value, f"{path}: {_at(patched, path)!r}"
    assert_schema_valid(patched)
    if phase == "mutate" and decision.allowed:
        second = Request.for_object(patched, operation=request.operation, namespace=case.get("namespace"))
        again = engine.evaluate(policies, second, view, phase)
        assert again.patch == (), f"second pass patched again: {again.patch}"


def _at(obj: Any, dotted: str) -> Any:
    node = obj
    for part in dotted.split("."):
        if isinstance(node, list):
            node = node[int(part)] if int(part) < len(node) else None
        else:
            node = node.get(part)
        if node is None:
            return None
    return node


@pytest.mark.parametrize(("suite", "case"), _load_cases())
def test_case(suite: dict[str, Any], case: dict[str, Any]) -> None:
    run_case(suite, case)
