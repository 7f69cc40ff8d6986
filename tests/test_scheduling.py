"""Node eligibility (selectors, every affinity operator, taints, allocatable) and MIG profiles."""

from __future__ import annotations

import re
from decimal import Decimal
from typing import Any

import pytest

from tests.facts import section, table_rows
from webhook.gpu import mig
from webhook.view import scheduling


def node(name: str, labels: dict[str, str] | None = None, taints: list[dict[str, str]] | None = None,
         gpus: str | None = "8", unschedulable: bool = False) -> dict[str, Any]:
    spec: dict[str, Any] = {"taints": taints or []}
    if unschedulable:
        spec["unschedulable"] = True
    return {
        "kind": "Node",
        "metadata": {"name": name, "labels": labels or {}},
        "spec": spec,
        "status": {"allocatable": {"nvidia.com/gpu": gpus} if gpus is not None else {}},
    }


A100 = node("a100", {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB", "nvidia.com/gpu.count": "8", "pool": "train"})
T4 = node("t4", {"nvidia.com/gpu.product": "Tesla-T4", "nvidia.com/gpu.count": "1", "pool": "infer"}, gpus="1")
CPU = node("cpu", {"pool": "general"}, gpus=None)
NODES = [A100, T4, CPU]
ONE_GPU = {"nvidia.com/gpu": Decimal(1)}


def names(spec: dict[str, Any], needs: dict[str, Decimal] = ONE_GPU, **kw: Any) -> list[str]:
    return [scheduling.node_name(n) for n in scheduling.eligible_nodes(spec, NODES, needs, **kw)]


def required(*terms: list[dict[str, Any]]) -> dict[str, Any]:
    return {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": t} for t in terms]}}}}


def test_gpu_nodes_only_and_enough_of_them() -> None:
    assert names({}) == ["a100", "t4"]
    assert names({}, {"nvidia.com/gpu": Decimal(4)}) == ["a100"]
    assert names({}, {"nvidia.com/mig-1g.10gb": Decimal(1)}) == []


def test_node_selector_and_node_name() -> None:
    assert names({"nodeSelector": {"pool": "infer"}}) == ["t4"]
    assert names({"nodeSelector": {"pool": "infer", "nvidia.com/gpu.count": "8"}}) == []
    assert names({"nodeName": "a100"}) == ["a100"]


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ({"key": "pool", "operator": "In", "values": ["train", "general"]}, ["a100"]),
        ({"key": "pool", "operator": "NotIn", "values": ["train"]}, ["t4"]),
        ({"key": "missing", "operator": "NotIn", "values": ["x"]}, ["a100", "t4"]),
        ({"key": "nvidia.com/gpu.product", "operator": "Exists"}, ["a100", "t4"]),
        ({"key": "nvidia.com/gpu.product", "operator": "DoesNotExist"}, []),
        ({"key": "nvidia.com/gpu.count", "operator": "Gt", "values": ["4"]}, ["a100"]),
        ({"key": "nvidia.com/gpu.count", "operator": "Lt", "values": ["4"]}, ["t4"]),
        ({"key": "pool", "operator": "Gt", "values": ["1"]}, []),  # not an integer label
        ({"key": "pool", "operator": "Bogus", "values": ["train"]}, []),
    ],
    ids=["In", "NotIn", "NotIn-absent", "Exists", "DoesNotExist", "Gt", "Lt", "Gt-non-integer", "unknown-op"],
)
def test_affinity_operators(expression: dict[str, Any], expected: list[str]) -> None:
    assert names(required([expression])) == expected


def test_terms_are_ored_and_expressions_anded() -> None:
    train = {"key": "pool", "operator": "In", "values": ["train"]}
    t4 = {"key": "nvidia.com/gpu.product", "operator": "In", "values": ["Tesla-T4"]}
    assert names(required([train], [t4])) == ["a100", "t4"]
    assert names(required([train, t4])) == []
    # nodeSelector AND affinity
    assert names({**required([train], [t4]), "nodeSelector": {"pool": "infer"}}) == ["t4"]


def test_match_fields_and_empty_terms() -> None:
    spec = {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["t4"]}]}]}}}}
    assert names(spec) == ["t4"]
    assert names(required([])) == []  # an empty term matches no node
    empty: dict[str, Any] = {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": []}}}}
    assert names(empty) == []


TAINTED = node("tainted", taints=[{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}])


@pytest.mark.parametrize(
    ("tolerations", "eligible"),
    [
        ([], False),
        ([{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}], True),
        ([{"key": "nvidia.com/gpu", "operator": "Exists"}], True),
        ([{"operator": "Exists"}], True),
        ([{"key": "nvidia.com/gpu", "operator": "Equal", "value": "present"}], True),
        ([{"key": "nvidia.com/gpu", "value": "present"}], True),  # operator defaults to Equal
        ([{"key": "nvidia.com/gpu", "operator": "Equal", "value": "other"}], False),
        ([{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoExecute"}], False),
        ([{"key": "other", "operator": "Exists"}], False),
    ],
)
def test_taints_against_tolerations(tolerations: list[dict[str, str]], eligible: bool) -> None:
    found = scheduling.eligible_nodes({"tolerations": tolerations}, [TAINTED], ONE_GPU)
    assert bool(found) == eligible


def test_prefer_no_schedule_is_ignored_and_no_execute_counts() -> None:
    soft = node("soft", taints=[{"key": "k", "effect": "PreferNoSchedule"}])
    hard = node("hard", taints=[{"key": "k", "effect": "NoExecute"}])
    assert [scheduling.node_name(n) for n in scheduling.eligible_nodes({}, [soft, hard], ONE_GPU)] == ["soft"]


@pytest.mark.parametrize("key", sorted(scheduling.CONDITION_TAINTS))
@pytest.mark.parametrize("effect", ["NoSchedule", "NoExecute"])
def test_condition_taints_do_not_make_a_node_ineligible(key: str, effect: str) -> None:
    # kube-apiserver's TaintNodesByCondition puts not-ready:NoSchedule on every new node
    coming_up = node("coming-up", taints=[{"key": key, "effect": effect}])
    assert scheduling.eligible_nodes({}, [coming_up], ONE_GPU) == [coming_up]


def test_cordoned_nodes_stay_eligible() -> None:
    cordoned = node("cordoned", unschedulable=True)
    assert scheduling.eligible_nodes({}, [cordoned], ONE_GPU) == [cordoned]


def test_condition_taint_beside_a_real_taint_still_needs_the_real_toleration() -> None:
    both = node("both", taints=[{"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"},
                                {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}])
    assert scheduling.eligible_nodes({}, [both], ONE_GPU) == []


@pytest.mark.parametrize(
    ("spec", "values"),
    [
        ({}, None),
        ({"nodeSelector": {"m": "a"}}, {"a"}),
        (required([{"key": "m", "operator": "In", "values": ["a", "b"]}]), {"a", "b"}),
        (required([{"key": "m", "operator": "In", "values": ["a"]}], [{"key": "m", "operator": "In", "values": ["c"]}]),
         {"a", "c"}),
        (required([{"key": "m", "operator": "In", "values": ["a"]}], [{"key": "x", "operator": "Exists"}]), None),
        (required([{"key": "m", "operator": "In", "values": ["a", "b"]}, {"key": "m", "operator": "In", "values": ["b"]}]),
         {"b"}),
        ({"nodeSelector": {"m": "a"}, **required([{"key": "m", "operator": "In", "values": ["a", "b"]}])}, {"a"}),
        (required([{"key": "m", "operator": "NotIn", "values": ["a"]}]), None),
    ],
)
def test_label_values_a_pod_targets(spec: dict[str, Any], values: set[str] | None) -> None:
    found = scheduling.label_values(spec, "m")
    assert (set(found) if found is not None else None) == values


def test_mig_profiles_match_facts() -> None:
    text = section(3)
    facts: dict[str, dict[str, int]] = {}
    for cells in table_rows(text):
        facts[cells[0]] = {p: int(n) for p, n in re.findall(r"([\w.+]+)×(\d+)", cells[1])}
    # every FACTS.md row as written; the table may add GPUs FACTS.md lacks (A30, B200 …, from NVIDIA's guide)
    assert facts == {gpu: mig.PROFILES[gpu] for gpu in facts}
    assert {"A30-24GB", "B200-180GB"} <= set(mig.PROFILES) - set(facts)
    assert "1g.10gb.me" in mig.valid_profiles() and "1g.10gb+me" not in mig.valid_profiles()
    assert mig.profile_of("nvidia.com/mig-3g.40gb") == "3g.40gb" and mig.profile_of("nvidia.com/gpu") is None
