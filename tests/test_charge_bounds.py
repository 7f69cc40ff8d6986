"""A charge line of bounded size whatever the pod (issue #42), judged never more leniently than the pod's
own models, and no charge for a pod whose names Kubernetes would not allow (a forged review)."""

from __future__ import annotations

import string
from dataclasses import replace
from decimal import Decimal
from fnmatch import fnmatchcase
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support import POLICIES
from webhook.ledger import document
from webhook.ledger.document import Entry
from webhook.policy import caps, charge_bounds, engine, loader
from webhook.policy.charges import CapCheck, Charge, Holding, LedgerKey, Tally
from webhook.policy.request import Request
from webhook.view.snapshot import SnapshotView

MODEL = "nvidia.com/gpu.product"
A100 = "NVIDIA-A100-SXM4-80GB"
KEY = LedgerKey("namespace", "ml-a", "", MODEL)
POLICY = (POLICIES / "workload-kinds.yaml").read_text() + """
---
apiVersion: gpu-admission.io/v1alpha1
kind: GPUPolicy
metadata: {name: caps}
spec:
  rules: {quota: {clusterUnavailable: fail-open, resourceQuotas: false, limits: [
    {scope: namespace, max: 1000000}, {scope: namespace, model: 'NVIDIA-A100*', max: 1000000},
    {scope: namespace, model: any, max: 1000000}]}}
"""
POLICIES_SET = loader.load_text(POLICY)
VIEW = SnapshotView.from_objects([{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ml-a"}}],
                                 known=("namespaces", "pods"))


def _pod(name: str = "p", namespace: str = "ml-a", uid: str = "0d6c5f0e-1111-2222-3333-444455556666",
         models: list[str] | None = None, limits: dict[str, Any] | None = None, priority: str = "") -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "c", "image": "x",
                                            "resources": {"limits": limits or {"nvidia.com/gpu": 1}}}]}
    if models is not None:
        term = {"matchExpressions": [{"key": MODEL, "operator": "In", "values": models}]}
        spec["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}}
    if priority:
        spec["priorityClassName"] = priority
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace, "uid": uid}, "spec": spec}


def _decide(pod: dict[str, Any]) -> Any:
    meta = pod["metadata"]
    request = replace(Request.for_object(pod), name=meta["name"], namespace=meta["namespace"])
    return engine.evaluate(POLICIES_SET, request, VIEW, "validate")


def _line(charge: Charge) -> str:
    return document.text_of({charge.uid: Entry(charge.holding, 1767225600.123)})


def test_a_pod_naming_thousands_of_models_is_charged_a_short_line_that_every_model_cap_counts() -> None:
    fakes = [f"FAKE-MODEL-{i:05d}-{'x' * 30}" for i in range(9000)]
    decision = _decide(_pod(models=[A100, *fakes]))
    assert decision.allowed and decision.charges
    (charge,) = decision.charges
    assert charge.holding.models == caps.MANY
    line = _line(charge)
    assert len(line) < 200, line  # (the line was ~400 KB: 16 such pods took the ledger past etcd's limit)
    assert line.endswith(" models=*\n")
    # read back, by this version and as any model: counted by every cap, the A100 cap included
    (entry,) = document.entries({"status": {"charges": line}}).values()
    assert entry.holding.models == caps.MANY
    for model in ("*", "NVIDIA-A100*", "NVIDIA-H100*", "any"):
        assert caps.counts(model, (), "", entry.holding.models), model


def test_a_burst_of_such_pods_fills_a_model_cap_exactly() -> None:
    check = CapCheck("caps", "Pod ml-a/p", "/spec/containers", "nvidia.com/gpu", "NVIDIA-A100*", (), 4, False)
    tally = Tally(KEY, {})
    fakes = [A100, *(f"FAKE-{i}" for i in range(9000))]
    admitted = 0
    for i in range(16):
        (charge,) = _decide(_pod(name=f"p{i}", uid=f"uid-{i}", models=fakes)).charges
        charge = replace(charge, caps=(check,))
        if not tally.judge(charge):
            tally.admit(charge)
            admitted += 1
    assert admitted == 4


def test_an_older_replicas_unbounded_line_is_read_bounded() -> None:
    old = "u1 ml-a/p nvidia.com/gpu=1 at=2026-01-01T00:00:00.000Z models=" + ",".join(
        [A100, *(f"FAKE-{i}" for i in range(5000))]) + "\nu2 ml-a/q nvidia.com/gpu=1 at=2026-01-01T00:00:00.000Z models=" + A100 + "\n"
    found = document.entries({"status": {"charges": old}})
    assert found["u1"].holding.models == caps.MANY
    assert found["u2"].holding.models == frozenset({A100})  # what is within the bounds reads as it did
    assert len(document.text_of(found)) < 300


def test_a_pod_within_the_bounds_is_charged_as_it_names_its_models() -> None:
    models = [f"NVIDIA-MODEL-{i}" for i in range(charge_bounds.MODELS_MAX)]
    (charge,) = _decide(_pod(models=models)).charges
    assert charge.holding.models == frozenset(models)


FORGED: dict[str, tuple[dict[str, Any], str]] = {
    "namespace": ({"namespace": "ML_A"}, "its namespace 'ML_A' is not a DNS-1123 label"),
    "long namespace": ({"namespace": "a" * 64}, "is not a DNS-1123 label of at most 63 characters"),
    "name": ({"name": "ghost%zz-1"}, "its name 'ghost%zz-1' is not a DNS-1123 subdomain"),
    "name with a newline": ({"name": "p\nuid2 ml-a/q nvidia.com/gpu=-9"}, "is not a DNS-1123 subdomain"),
    "long name": ({"name": "a" * 254}, "is not a DNS-1123 subdomain of at most 253 characters"),
    "uid": ({"uid": "u 1"}, "its uid 'u 1' is not a uid"),
    "long uid": ({"uid": "u" * 65}, "is not a uid of at most 64"),
    "uid with a colon": ({"uid": "reserved:x:1"}, "is not a uid"),
    "priority": ({"priority": "high priority=x"}, "its priority class 'high priority=x' is not a DNS-1123 subdomain"),
    "resource": ({"limits": {"nvidia.com/gpu": 1, "nvidia.com/mig-1g x=1": 1}}, "its resource name 'nvidia.com/mig-1g x=1' is not a qualified name"),
    "many resources": ({"limits": {"nvidia.com/gpu": 1, **{f"nvidia.com/mig-{i}g.{'x' * 40}": 1 for i in range(8)}}},
                       "it asks for 9 different GPU resources, more than a charge can name"),
}


def test_a_forged_review_is_refused_with_a_clear_message_and_charges_nothing() -> None:
    for what, (changes, expected) in FORGED.items():
        decision = _decide(_pod(**changes))
        assert not decision.charges, what
        assert not decision.allowed, what
        texts = [f.text() for f in decision.findings if f.mode == "enforce"]
        assert any("cannot be charged to the GPU quota ledger: " in t and expected in t for t in texts), (what, texts)


def test_a_count_no_pod_can_hold_is_not_charged() -> None:
    # (past every cap below 10^18, which refuses such a pod first: the bound holds for any cap)
    for count in (Decimal(10) ** 18, Decimal(-1), Decimal(0), Decimal("1e-10")):
        why = charge_bounds.refusal("ml-a", "p", "u-1", "", (("nvidia.com/gpu", count),))
        assert "is not a positive quantity" in why, (count, why)
    assert charge_bounds.refusal("ml-a", "p", "u-1", "", (("nvidia.com/gpu", Decimal("0.000000001")),)) == ""


# ---------------------------------------------------------------- properties

_CHARS = string.ascii_letters + string.digits + "-_.,= \n*/:%"
_value = st.one_of(st.text(_CHARS, min_size=1, max_size=80), st.sampled_from([A100, "NVIDIA-H100-80GB-HBM3", "Tesla-T4"]),
                   st.text(string.ascii_letters + string.digits + "-", min_size=1, max_size=300))
_models = st.lists(_value, min_size=1, max_size=3000)
_name = st.one_of(st.text("abcdefghijklmnopqrstuvwxyz0123456789-.", min_size=1, max_size=300), st.text(_CHARS, max_size=300))
_resource = st.one_of(st.sampled_from(["nvidia.com/gpu", "nvidia.com/gpu.shared", "nvidia.com/mig-1g.10gb"]),
                      st.text(_CHARS, min_size=1, max_size=300).map(lambda s: "nvidia.com/mig-" + s))
_count = st.one_of(st.integers(-3, 10**20), st.decimals(allow_nan=False, allow_infinity=False, places=12))
_limits = st.dictionaries(_resource, _count, min_size=1, max_size=40)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(name=_name, namespace=_name, uid=_name, priority=_name, models=st.none() | _models, limits=_limits)
def test_no_charge_line_exceeds_its_bound_whatever_the_pod(name: str, namespace: str, uid: str, priority: str,
                                                           models: list[str] | None, limits: dict[str, Any]) -> None:
    pod = _pod(name, namespace or "ml-a", uid, models, {k: str(v) for k, v in limits.items()}, priority)
    decision = _decide(pod)
    for charge in decision.charges:
        line = _line(charge)
        assert len(line) <= document.LINE_MAX, (len(line), line[:200])
        # one line, read back as written: nothing in it can be misread as another charge
        assert document.entries({"status": {"charges": line}}) == {charge.uid: Entry(charge.holding, 1767225600.123)}
    if not decision.charges and decision.allowed is False:
        assert decision.findings


_glob = st.one_of(st.sampled_from(["*", "any", "NVIDIA-A100*", "NVIDIA-*", "*80GB*", "Tesla-T4", "FAKE-?"]), _value)


@settings(max_examples=300, deadline=None)
@given(models=st.none() | st.frozensets(_value, max_size=200), cap_models=st.lists(_glob, min_size=1, max_size=6))
def test_the_models_a_charge_keeps_are_never_counted_by_fewer_caps(models: frozenset[str] | None,
                                                                   cap_models: list[str]) -> None:
    kept = charge_bounds.models_kept(models)
    if kept is not None and kept != caps.MANY:
        assert kept == models and len(kept) <= charge_bounds.MODELS_MAX
        assert len(",".join(kept)) <= charge_bounds.MODELS_TEXT_MAX
    for model in cap_models:
        if caps.counts(model, (), "", models):
            assert caps.counts(model, (), "", kept), (model, kept)
        # a model the pod names that the cap's glob matches: counted, whatever was kept
        if models and model not in ("any",) and any(fnmatchcase(m, model) for m in models):
            assert caps.counts(model, (), "", kept)


@settings(max_examples=100, deadline=None)
@given(counts=st.lists(st.integers(1, 64), min_size=1, max_size=12), models=st.frozensets(_value, max_size=100))
def test_a_tally_of_kept_models_never_undercounts_a_model_cap(counts: list[int], models: frozenset[str]) -> None:
    for glob in ("NVIDIA-A100*", "Tesla-T4", "*", "any"):
        check = CapCheck("caps", "", "", "nvidia.com/gpu", glob, (), 10**6, False)
        real = Tally(KEY, {f"u{i}": Holding("ml-a", f"p{i}", "", models, (("nvidia.com/gpu", Decimal(n)),))
                           for i, n in enumerate(counts)})
        bounded = Tally(KEY, {f"u{i}": Holding("ml-a", f"p{i}", "", charge_bounds.models_kept(models),
                                               (("nvidia.com/gpu", Decimal(n)),)) for i, n in enumerate(counts)})
        assert bounded.used(check) >= real.used(check)


_label = st.from_regex(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?", fullmatch=True)
#: a ResourceClaim name kube-apiserver accepts: a DNS-1123 subdomain of at most 253 characters
_claim_name = st.one_of(
    st.lists(_label, min_size=1, max_size=6).map(".".join).filter(lambda n: len(n) <= 253),
    # (the longest: 253 characters)
    st.tuples(_label, st.integers(180, 253)).map(lambda t: (t[0] + "." + ("c" * 62 + ".") * 5)[:t[1]].rstrip(".-")))
_DRA_CLASS = {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": "gpu.nvidia.com"},
              "spec": {"selectors": [{"cel": {"expression": "device.driver == 'gpu.nvidia.com'"}}]}}


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(claims=st.lists(st.tuples(_claim_name, st.lists(st.integers(1, 10**6), min_size=1, max_size=4)),
                       min_size=1, max_size=40),
       shared=st.lists(st.integers(0, 39), max_size=40), gpus=st.integers(0, 8))
def test_no_charge_line_exceeds_its_bound_whatever_claims_the_pod_names(
        claims: list[tuple[str, list[int]]], shared: list[int], gpus: int) -> None:
    # a pod naming any number of ResourceClaims of any names kube-apiserver accepts (some twice), each of
    # any requests: its line stays within the bound, and counts no fewer GPUs than the pod holds
    objects: list[dict[str, Any]] = [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ml-a"}}, _DRA_CLASS]
    for name, counts in dict(claims).items():
        requests = [{"name": f"r{i}", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": n}}
                    for i, n in enumerate(counts)]
        objects.append({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                        "metadata": {"name": name, "namespace": "ml-a"}, "spec": {"devices": {"requests": requests}}})
    names = [name for name, _ in claims] + [claims[i % len(claims)][0] for i in shared]
    pod = _pod(limits={"nvidia.com/gpu": gpus} if gpus else {"example.com/other": 1})
    pod["spec"]["resourceClaims"] = [{"name": f"c{i}", "resourceClaimName": n} for i, n in enumerate(names)]
    pod["spec"]["containers"][0]["resources"]["claims"] = [{"name": f"c{i}"} for i in range(len(names))]
    view = SnapshotView.from_objects(objects)
    decision = engine.evaluate(POLICIES_SET, Request.for_object(pod), view, "validate")
    for charge in decision.charges:
        line = _line(charge)
        assert len(line) <= document.LINE_MAX, (len(line), line[:200])
        assert document.entries({"status": {"charges": line}}) == {charge.uid: Entry(charge.holding, 1767225600.123)}
        # alone in a ledger, the pod counts every GPU it holds (its claims' devices once each)
        held = gpus + sum(sum(counts) for counts in dict(claims).values())
        check = CapCheck("caps", "", "", "nvidia.com/gpu", "*", (), 10**9, False)
        assert Tally(KEY, {charge.uid: charge.holding}).used(check) >= held
