"""What a pod charges to the GPU caps the quota rule enforces, and how a ledger judges charges."""

from __future__ import annotations

from dataclasses import replace
from decimal import Decimal
from typing import Any

import pytest

from tests.support import POLICIES
from webhook.policy import charges, engine, loader
from webhook.policy.charges import CapCheck, Charge, Holding, LedgerKey, Tally
from webhook.policy.request import Request
from webhook.view.snapshot import SnapshotView

MODEL = "nvidia.com/gpu.product"


def _policies(*limits: str, mode: str = "enforce", unavailable: str = "fail-open", name: str = "caps") -> str:
    return f"""\
apiVersion: gpu-admission.io/v1alpha1
kind: GPUPolicy
metadata: {{name: {name}}}
spec:
  rules: {{quota: {{mode: {mode}, clusterUnavailable: {unavailable}, resourceQuotas: false, limits: [{", ".join(limits)}]}}}}
"""


def _load(*documents: str) -> loader.PolicySet:
    return loader.load_text("\n---\n".join([(POLICIES / "workload-kinds.yaml").read_text(), *documents]))


def _pod(name: str, ns: str, gpus: int, uid: str | None = "uid-1", **spec: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": ns}
    if uid:
        meta["uid"] = uid
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta,
            "spec": {"containers": [{"name": "c", "image": "x", "resources": {"limits": {"nvidia.com/gpu": gpus}}}],
                     **spec}}


CLUSTER = [
    {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ml-a", "labels": {"team": "vision"}}},
    {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ml-b", "labels": {"team": "vision"}}},
]


def _charges(policies: loader.PolicySet, pod: dict[str, Any], operation: str = "CREATE") -> tuple[Charge, ...]:
    request = replace(Request.for_object(pod), operation=operation,
                      old_object=pod if operation == "UPDATE" else None)
    return engine.evaluate(policies, request, SnapshotView.from_objects(CLUSTER), "validate").charges


def test_a_new_pod_charges_the_ledger_of_its_team_once_for_every_enforced_cap() -> None:
    policies = _load(_policies("{scope: namespace, max: 5}", "{scope: team, max: 8}",
                               "{scope: team, model: 'NVIDIA-A100*', max: 4}"))
    (team,) = _charges(policies, _pod("p", "ml-a", 2, nodeSelector={MODEL: "NVIDIA-A100-SXM4-80GB"}))
    # one ledger, one write: the team's, where the namespace cap counts the namespace's pods only
    assert team.key == LedgerKey("team", "vision", "team", MODEL)
    assert [(c.scope, c.group, c.namespace, c.model, c.maximum) for c in team.caps] == [
        ("namespace", "ml-a", "ml-a", "*", 5), ("team", "vision", "", "*", 8), ("team", "vision", "", "NVIDIA-A100*", 4)]
    assert team.uid == "uid-1"
    assert team.holding == Holding("ml-a", "p", "", frozenset({"NVIDIA-A100-SXM4-80GB"}), (("nvidia.com/gpu", Decimal(2)),))


def test_a_namespace_no_team_cap_covers_has_a_ledger_of_its_own() -> None:
    policies = _load(_policies("{scope: namespace, max: 5}", "{scope: team, teams: [other], max: 8}"))
    (charge,) = _charges(policies, _pod("p", "ml-a", 1))
    assert charge.key == LedgerKey("namespace", "ml-a", "", MODEL)
    assert [(c.scope, c.namespace) for c in charge.caps] == [("namespace", "")]


def test_several_policies_charging_one_ledger_are_merged() -> None:
    policies = _load(_policies("{scope: namespace, max: 5}", name="one"), _policies("{scope: namespace, max: 3}", name="two"))
    (charge,) = _charges(policies, _pod("p", "ml-a", 1))
    assert sorted((c.policy, c.maximum) for c in charge.caps) == [("one", 5), ("two", 3)]


@pytest.mark.parametrize(("mode", "operation", "uid"), [
    ("warn", "CREATE", "u"),  # a warning needs no exact count
    ("audit", "CREATE", "u"),
    ("enforce", "UPDATE", "u"),  # the pod exists: it was charged when it was created
    ("enforce", "CREATE", None),  # a manifest: no uid, nothing to key a charge by
])
def test_nothing_is_charged_but_new_pods_under_enforced_caps(mode: str, operation: str, uid: str | None) -> None:
    policies = _load(_policies("{scope: namespace, max: 5}", mode=mode))
    assert _charges(policies, _pod("p", "ml-a", 1, uid=uid), operation) == ()


def test_a_pod_no_cap_counts_charges_nothing() -> None:
    policies = _load(_policies("{scope: namespace, namespaces: [other], max: 5}",
                               "{scope: team, priorityClasses: [high], max: 5}"))
    assert _charges(policies, _pod("p", "ml-a", 1, priorityClassName="low")) == ()


def _check(maximum: int, model: str = "*", resource: str = "nvidia.com/gpu", classes: tuple[str, ...] = (),
           policy: str = "caps", namespace: str = "") -> CapCheck:
    if namespace:  # a namespace cap, judged in its team's ledger
        return CapCheck(policy, "Pod ml-a/new", "/spec/containers", resource, model, classes, maximum, False,
                        "namespace", namespace, "", namespace)
    return CapCheck(policy, "Pod ml-a/new", "/spec/containers", resource, model, classes, maximum, False,
                    "team", "vision", "team")


def _holding(ns: str, gpus: int, name: str = "p", priority: str = "", models: frozenset[str] | None = None) -> Holding:
    return Holding(ns, name, priority, models, (("nvidia.com/gpu", Decimal(gpus)),))


TEAM = LedgerKey("team", "vision", "team", MODEL)


def test_a_tally_admits_charges_up_to_each_cap_and_denies_the_next_with_where_gpus_are() -> None:
    tally = Tally(TEAM, {"a": _holding("ml-a", 3), "b": _holding("ml-b", 4)})
    cap = _check(8)
    first = Charge(TEAM, "new-1", _holding("ml-a", 1, "new-1"), (cap,))
    assert tally.judge(first) == ()
    tally.admit(first)
    second = Charge(TEAM, "new-2", _holding("ml-b", 1, "new-2"), (cap,))
    (denial,) = tally.judge(second)
    assert denial.mode == "enforce" and denial.policy == "caps" and denial.rule == "quota"
    assert denial.message == ("Pod ml-a/new: team vision (team=vision) uses 8 of 8 nvidia.com/gpu; this pod asks for 1; "
                              "held in ml-a 4, ml-b 4 (stop GPU pods you no longer need, or ask for a larger cap)")
    tally.release("b")
    assert tally.judge(second) == ()


def test_a_namespace_cap_in_its_teams_ledger_counts_its_namespace_only() -> None:
    tally = Tally(TEAM, {"a": _holding("ml-a", 3), "b": _holding("ml-b", 4)})
    cap = _check(4, namespace="ml-a")
    assert tally.used(cap) == 3
    first = Charge(TEAM, "new-1", _holding("ml-a", 1, "new-1"), (cap,))
    assert tally.judge(first) == ()
    tally.admit(first)
    (denial,) = tally.judge(Charge(TEAM, "new-2", _holding("ml-a", 1, "new-2"), (cap, _check(10))))
    assert denial.message.startswith("Pod ml-a/new: namespace ml-a uses 4 of 4 nvidia.com/gpu; this pod asks for 1 (stop")
    assert tally.judge(Charge(TEAM, "new-3", _holding("ml-b", 1, "new-3"), (_check(5, namespace="ml-b"),))) == ()


def test_a_tally_counts_only_what_a_cap_counts() -> None:
    tally = Tally(TEAM, {
        "a100": _holding("ml-a", 4, models=frozenset({"NVIDIA-A100-SXM4-80GB"})),
        "free": _holding("ml-a", 4),  # may land on any model: not on a model cap
        "low": _holding("ml-a", 4, priority="low", models=frozenset({"NVIDIA-A100-SXM4-80GB"})),
        "mig": Holding("ml-a", "m", "", None, (("nvidia.com/mig-1g.10gb", Decimal(7)),)),
    })
    assert tally.used(_check(0, model="NVIDIA-A100*")) == 8
    assert tally.used(_check(0, model="NVIDIA-A100*", classes=("low",))) == 4
    assert tally.used(_check(0, model="any")) == 4
    assert tally.used(_check(0)) == 12
    assert tally.used(_check(0, resource="nvidia.com/mig-*")) == 7
    # kept current as charges are admitted, for every cap asked about so far
    tally.admit(Charge(TEAM, "more", _holding("ml-b", 2, models=frozenset({"NVIDIA-A100-PCIE-40GB"})), ()))
    assert tally.used(_check(0, model="NVIDIA-A100*")) == 10 and tally.used(_check(0, model="any")) == 4


def test_a_charge_already_in_the_ledger_fits_whatever_the_count() -> None:
    # an answer lost after the write: the retry finds its own charge, and the pod is not refused for it
    tally = Tally(TEAM, {"mine": _holding("ml-a", 8, "mine")})
    assert tally.judge(Charge(TEAM, "mine", _holding("ml-a", 8, "mine"), (_check(8),))) == ()


def test_an_unreachable_ledger_fails_open_or_closed_as_each_rule_says() -> None:
    open_cap, closed_cap = _check(8, policy="open"), replace(_check(8, policy="closed"), fail_closed=True)
    found = charges.unavailable([Charge(TEAM, "u", _holding("ml-a", 1), (open_cap, closed_cap)),
                                 Charge(LedgerKey("namespace", "ml-a", "", MODEL), "u", _holding("ml-a", 1), (open_cap,))],
                                "HTTP 503")
    assert sorted((f.policy, f.mode) for f in found) == [("closed", "enforce"), ("open", "warn")]
    assert all(f.message == "Pod ml-a/new: GPU quota ledger unavailable: HTTP 503 (GPU caps not checked exactly)"
               for f in found)
