"""A ResourceClaim several pods name counts once under a GPU cap (issues #41, #42): in the cluster view's
check, in the ledger's charge lines and their tally, and in the recount, which states the lines admission wrote.

Each pod's charge line says which part of its GPUs comes from ResourceClaims it names
(``Holding.claims``); the tally counts every pod's own GPUs and each claim once. A line
an older version wrote, without that part, counts its claims as the pod's own: more than
is held, never less.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from tests.test_dra_held import CLASS, NAMESPACE, _claim, _policies
from webhook.ledger import document, recount
from webhook.ledger.document import Entry
from webhook.policy import charge_bounds, engine
from webhook.policy.charges import CapCheck, Charge, Holding, LedgerKey, Tally
from webhook.policy.request import Request
from webhook.view.snapshot import SnapshotView

GPU = "nvidia.com/gpu"
KEY = LedgerKey("namespace", "ml", "", "nvidia.com/gpu.product")
TEAM = LedgerKey("team", "vision", "team", "nvidia.com/gpu.product")


def _check(maximum: int = 4, classes: tuple[str, ...] = ()) -> CapCheck:
    return CapCheck("caps", "Pod ml/new", "/spec/containers", GPU, "*", classes, maximum, False, "namespace", "ml")


def _holding(name: str, own: int = 0, claims: dict[str, int] | None = None, priority: str = "",
             namespace: str = "ml") -> Holding:
    named = tuple(sorted((c, ((GPU, Decimal(n)),)) for c, n in (claims or {}).items()))
    total = own + sum((claims or {}).values())
    return Holding(namespace, name, priority, None, ((GPU, Decimal(total)),), named)


def _charge(name: str, own: int = 0, claims: dict[str, int] | None = None, check: CapCheck | None = None,
            priority: str = "") -> Charge:
    return Charge(KEY, f"uid-{name}", _holding(name, own, claims, priority), (check or _check(),))


def _admitted(tally: Tally, charge: Charge) -> bool:
    if tally.judge(charge):
        return False
    tally.admit(charge)
    return True


# ---------------------------------------------------------------- the tally


def test_two_pods_sharing_a_claim_fill_a_cap_once_and_a_third_pod_is_refused() -> None:
    tally = Tally(KEY, {})
    assert _admitted(tally, _charge("a", claims={"shared": 4}))
    assert _admitted(tally, _charge("b", claims={"shared": 4}))  # (refused before: "uses 4 of 4; asks for 4")
    assert tally.used(_check()) == 4
    (denial,) = tally.judge(_charge("c", claims={"mine": 1}))
    assert "namespace ml uses 4 of 4 nvidia.com/gpu; this pod asks for 1" in denial.message


def test_pods_with_claims_of_their_own_still_fill_the_cap_each() -> None:
    tally = Tally(KEY, {})
    assert _admitted(tally, _charge("a", claims={"a-gpus": 4}))
    (denial,) = tally.judge(_charge("b", claims={"b-gpus": 4}))
    assert "uses 4 of 4 nvidia.com/gpu; this pod asks for 4" in denial.message


def test_a_claim_is_held_while_any_pod_naming_it_holds_its_line_and_released_with_the_last() -> None:
    tally = Tally(KEY, {"uid-a": _holding("a", claims={"shared": 3}), "uid-b": _holding("b", 1, {"shared": 3})})
    assert tally.used(_check()) == 4
    tally.release("uid-a")
    assert tally.used(_check()) == 4  # b still names it
    assert tally.judge(_charge("c", 1))
    tally.release("uid-b")
    assert tally.used(_check()) == 0


def test_a_claim_counts_once_for_a_cap_when_any_pod_the_cap_counts_names_it() -> None:
    high = _check(8, ("high",))
    tally = Tally(KEY, {"uid-a": _holding("a", claims={"shared": 4}, priority="low")})
    assert tally.used(high) == 0  # the pod naming it is not one the cap counts
    # a pod of the cap's class naming it adds its devices there, once
    assert tally.ask(high, _holding("b", claims={"shared": 4}, priority="high")) == 4
    assert _admitted(tally, _charge("b", claims={"shared": 4}, check=high, priority="high"))
    assert _admitted(tally, _charge("c", claims={"shared": 4}, check=high, priority="high"))
    assert tally.used(high) == 4 and tally.used(_check(100)) == 4


def test_a_claim_made_again_bigger_counts_the_most_any_line_says() -> None:
    tally = Tally(KEY, {"uid-a": _holding("a", claims={"shared": 2}), "uid-b": _holding("b", claims={"shared": 3})})
    assert tally.used(_check()) == 3
    assert tally.ask(_check(), _holding("c", claims={"shared": 4})) == 1


def test_claims_are_told_apart_by_namespace_in_a_teams_ledger() -> None:
    team = CapCheck("caps", "Pod ml-a/new", "/spec/containers", GPU, "*", (), 8, False, "team", "vision", "team")
    tally = Tally(TEAM, {"uid-a": _holding("a", claims={"shared": 3}, namespace="ml-a"),
                         "uid-b": _holding("b", claims={"shared": 3}, namespace="ml-b"),
                         "uid-c": _holding("c", claims={"shared": 3}, namespace="ml-b")})
    assert tally.used(team) == 6
    denial, = tally.judge(Charge(TEAM, "uid-d", _holding("d", 3, namespace="ml-a"), (team,)))
    assert "uses 6 of 8 nvidia.com/gpu; this pod asks for 3; held in ml-a 3, ml-b 3" in denial.message


def test_a_line_without_claims_counts_its_claims_devices_as_its_own() -> None:
    # a line a replica of the previous version wrote for a pod sharing the claim: over-counted, never under
    old = Holding("ml", "old", "", None, ((GPU, Decimal(4)),))
    tally = Tally(KEY, {"uid-old": old, "uid-a": _holding("a", claims={"shared": 4})})
    assert tally.used(_check(100)) == 8


def test_a_pod_adding_nothing_to_a_full_cap_is_admitted() -> None:
    # (the cap was lowered since, or older lines over-count: the pod takes no more than is counted)
    tally = Tally(KEY, {"uid-a": _holding("a", 2, {"shared": 4})})
    assert _admitted(tally, _charge("b", claims={"shared": 4}))
    assert tally.judge(_charge("c", 1))


# ---------------------------------------------------------------- the line


def test_a_line_states_every_gpu_and_which_come_from_claims_and_reads_back_as_written() -> None:
    entry = Entry(_holding("a", 1, {"shared": 4, "other": 2}), 1767225600.123)
    text = document.text_of({"uid-a": entry})
    assert text == ("uid-a ml/a nvidia.com/gpu=7 at=2026-01-01T00:00:00.123Z "
                    "claims=other:nvidia.com/gpu=2;shared:nvidia.com/gpu=4\n")
    assert document.entries({"status": {"charges": text}}) == {"uid-a": entry}
    # what a replica of the previous version reads: every GPU, its claims as its own (never fewer)
    (old,) = document.entries({"status": {"charges": text.replace(" claims=", " ignored=")}}).values()
    assert old.holding.gpus == ((GPU, Decimal(7)),) and old.holding.claims == ()


def test_claims_a_line_cannot_hold_are_read_as_the_pods_own() -> None:
    base = "uid-a ml/a nvidia.com/gpu=4 at=2026-01-01T00:00:00.000Z claims="
    for claims in ("shared:nvidia.com/gpu=5", "shared:nvidia.com/gpu=2;shared:nvidia.com/gpu=2",
                   "Bad_Name:nvidia.com/gpu=1", "shared:", "shared:nvidia.com/gpu=x", "shared:nvidia.com/gpu=NaN",
                   "shared:nvidia.com/gpu=-1"):
        (held,) = document.entries({"status": {"charges": base + claims + "\n"}}).values()
        assert held.holding.claims == () and held.holding.gpus == ((GPU, Decimal(4)),), claims
        assert Tally(KEY, {"uid-a": held.holding}).used(_check(100)) == 4, claims


def test_claims_past_their_bound_are_charged_as_the_pods_own() -> None:
    many = {f"claim-{i:03d}-{'x' * 40}": 1 for i in range(20)}
    holding = _holding("a", 0, many)
    assert charge_bounds.claims_kept(holding.claims, holding.gpus) == ()
    few = _holding("b", 0, {"a": 1, "b": 2})
    assert charge_bounds.claims_kept(few.claims, few.gpus) == few.claims


# ---------------------------------------------------------------- the engine: view, admission, recount


def _template(name: str, gpus: int) -> dict[str, Any]:
    claim = _claim(name, gpus)
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate", "metadata": claim["metadata"],
            "spec": {"spec": claim["spec"]}}


def _pod(name: str, pod_claim: dict[str, str], gpus: int = 0, made: str | None = None) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "c", "image": "x", "resources": {"claims": [{"name": "gpu"}]}}
    if gpus:
        container["resources"]["limits"] = {GPU: gpus}
    pod: dict[str, Any] = {"apiVersion": "v1", "kind": "Pod",
                           "metadata": {"name": name, "namespace": "ml", "uid": f"uid-{name}"},
                           "spec": {"resourceClaims": [{"name": "gpu", **pod_claim}], "containers": [container]},
                           "status": {"phase": "Running"}}
    if made:
        pod["status"]["resourceClaimStatuses"] = [{"name": "gpu", "resourceClaimName": made}]
    return pod


def test_the_views_check_admits_a_second_pod_naming_a_claim_the_view_counts_already() -> None:
    objects = [NAMESPACE, CLASS, _claim("shared", 4), _claim("mine", 1), _pod("a", {"resourceClaimName": "shared"})]
    view = SnapshotView.from_objects(objects)
    second = engine.evaluate(_policies(), Request.for_object(_pod("b", {"resourceClaimName": "shared"})), view, "validate")
    assert second.allowed, second.message()  # (refused before: "uses 4 of 4 nvidia.com/gpu; this pod asks for 4")
    (charge,) = second.charges
    assert charge.holding.gpus == ((GPU, Decimal(4)),)
    assert charge.holding.claims == (("shared", ((GPU, Decimal(4)),)),)
    third = engine.evaluate(_policies(), Request.for_object(_pod("c", {"resourceClaimName": "mine"})), view, "validate")
    assert "namespace ml uses 4 of 4 nvidia.com/gpu; this pod asks for 1" in third.message()
    # a pod's own GPUs beside the shared claim still count
    fourth = engine.evaluate(_policies(), Request.for_object(_pod("d", {"resourceClaimName": "shared"}, gpus=1)),
                             view, "validate")
    assert "this pod asks for 1" in fourth.message()


def test_a_template_claim_is_the_pods_own_and_the_recount_states_the_line_admission_wrote() -> None:
    objects = [NAMESPACE, CLASS, _claim("shared", 2), _template("per-pod", 1)]
    new_shared = _pod("a", {"resourceClaimName": "shared"}, gpus=1)
    new_template = _pod("b", {"resourceClaimTemplateName": "per-pod"})
    admitted = {}
    for pod in (new_shared, new_template):
        (charge,) = engine.evaluate(_policies(), Request.for_object(pod), SnapshotView.from_objects(objects),
                                    "validate").charges
        admitted[charge.uid] = charge.holding
    assert admitted["uid-a"].claims == (("shared", ((GPU, Decimal(2)),)),)
    assert admitted["uid-a"].gpus == ((GPU, Decimal(3)),)
    assert admitted["uid-b"].claims == () and admitted["uid-b"].gpus == ((GPU, Decimal(1)),)
    # stored: b holds the claim made from its template (the template may be gone since)
    stored = [NAMESPACE, CLASS, _claim("shared", 2), _claim("b-gpu-x7", 1), new_shared,
              _pod("b", {"resourceClaimTemplateName": "per-pod"}, made="b-gpu-x7")]
    assert recount.holdings(_policies(), SnapshotView.from_objects(stored), KEY, ["ml"], None) == admitted


#: a pod without GPUs: the view knows the namespace's pods (none of them holding GPUs)
CPU_POD = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "cpu", "namespace": "ml", "uid": "uid-cpu"},
           "spec": {"containers": [{"name": "c", "image": "x"}]}, "status": {"phase": "Running"}}


def test_a_pod_naming_one_claim_twice_counts_it_once() -> None:
    """Two entries of a pod's resourceClaims may name the same ResourceClaim (Kubernetes checks the
    entries' names only); the scheduler allocates it once, and the cap counts it once."""
    pod = _pod("twice", {"resourceClaimName": "shared"})
    pod["spec"]["resourceClaims"].append({"name": "again", "resourceClaimName": "shared"})
    pod["spec"]["containers"].append({"name": "d", "image": "x", "resources": {"claims": [{"name": "again"}]}})
    view = SnapshotView.from_objects([NAMESPACE, CLASS, CPU_POD, _claim("shared", 3)])
    decision = engine.evaluate(_policies(), Request.for_object(pod), view, "validate")
    assert decision.allowed and not decision.warnings, (decision.message(), decision.warnings)
    (charge,) = decision.charges
    assert charge.holding.gpus == ((GPU, Decimal(3)),)
    assert charge.holding.claims == (("shared", ((GPU, Decimal(3)),)),)
    # control: two claims of their own, 3 GPUs each, are 6 of a cap of 4
    other = _pod("two", {"resourceClaimName": "shared"})
    other["spec"]["resourceClaims"].append({"name": "again", "resourceClaimName": "more"})
    other["spec"]["containers"].append({"name": "d", "image": "x", "resources": {"claims": [{"name": "again"}]}})
    view = SnapshotView.from_objects([NAMESPACE, CLASS, CPU_POD, _claim("shared", 3), _claim("more", 3)])
    refused = engine.evaluate(_policies(), Request.for_object(other), view, "validate")
    assert "this pod asks for 6" in refused.message(), refused.message()
    # and the recount states the line admission wrote
    stored = {**pod, "status": {"phase": "Running"}}
    held = recount.holdings(_policies(), SnapshotView.from_objects([NAMESPACE, CLASS, _claim("shared", 3), stored]),
                            KEY, ["ml"], None)
    assert held == {"uid-twice": charge.holding}
