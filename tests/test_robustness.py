"""Whatever JSON arrives, the engine answers: no exception (the server would answer 500)."""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import StartWebhook, Webhook
from tests.support import REPO, corpus_reviews, load_review
from webhook.policy import engine, loader
from webhook.policy.request import Request
from webhook.view.snapshot import EMPTY_VIEW, SnapshotView

POLICIES = loader.load_directory(REPO / "policies")
#: the shipped policies plus settings they leave out: a NoExecute toleration
#: with tolerationSeconds, required and preferred node affinity for every GPU
#: pod, quota caps of every scope, the GPU-access guard, priority classes by default
EXTENDED = loader.load_text("\n---\n".join([*(f.read_text() for f in sorted((REPO / "policies").glob("*.yaml"))), """
apiVersion: gpu-admission.io/v1alpha1
kind: GPUPolicy
metadata: {name: fuzz-extras}
spec:
  match: {kinds: ["*"]}
  rules:
    tolerations:
      tolerations: [{key: nvidia.com/gpu, operator: Exists, effect: NoExecute, tolerationSeconds: 600}]
    nodeAffinity:
      required: [{key: nvidia.com/gpu.product, operator: In, values: [NVIDIA-A100-SXM4-80GB]}]
      preferred: [{weight: 10, matchExpressions: [{key: nvidia.com/mig.capable, operator: NotIn, values: ["true"]}]}]
    priorityClass: {default: gpu-batch, override: true}
    quota:
      mode: enforce
      limits:
        - {scope: namespace, namespaces: ["ml-*"], max: 8}
        - {scope: team, teamLabel: team, max: 32}
        - {scope: namespace, model: NVIDIA-H100-80GB-HBM3, max: 4}
        - {scope: team, teamLabel: team, priorityClasses: [gpu-inference], max: 16}
        - {scope: namespace, resource: "nvidia.com/mig-*", max: 2}
    gpuVisibility: {setVoid: true, denyUnrequestedVisibleDevices: true}
"""]), "extended")
CLUSTER = SnapshotView.from_objects(
    obj for f in sorted((REPO / "examples/cluster").glob("*.yaml")) for obj in yaml.safe_load_all(f.read_text()) if obj
)

SCALARS = st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=True) | st.sampled_from(
    ["", "1", "0.5", "500m", "1e999999999", "NaN", "-1", "64Gi", "Exists", "In", "all", "void", "nvidia", "Always"]
)
ANY = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3), max_leaves=8)
RESOURCES = st.dictionaries(
    st.sampled_from(["nvidia.com/gpu", "nvidia.com/mig-1g.10gb", "nvidia.com/gpumem", "memory", "cpu"]), SCALARS | ANY, max_size=3
)


def shaped(keys: dict[str, Any]) -> Any:
    """Maps with the given keys (each present or not), values from their strategies, or any JSON."""
    return st.fixed_dictionaries({}, optional=keys) | ANY


CONTAINER = shaped({
    "name": st.text(max_size=3) | ANY, "image": st.sampled_from(["nvidia/cuda:12.4.1-base-ubuntu22.04", "x"]) | ANY,
    "resources": shaped({"limits": RESOURCES | ANY, "requests": RESOURCES | ANY}),
    "env": st.lists(shaped({"name": st.just("NVIDIA_VISIBLE_DEVICES") | ANY, "value": ANY}), max_size=2) | ANY,
    "volumeMounts": st.lists(shaped({"name": ANY, "mountPath": st.just("/dev/shm") | ANY}), max_size=2) | ANY,
    "securityContext": shaped({"runAsUser": ANY, "privileged": ANY, "capabilities": shaped({"add": ANY, "drop": ANY})}),
    "restartPolicy": st.just("Always") | ANY,
})
TERM = shaped({
    "matchExpressions": st.lists(shaped({
        "key": st.sampled_from(["nvidia.com/gpu.product", "nvidia.com/mig.capable"]) | ANY,
        "operator": st.sampled_from(["In", "NotIn", "Exists", "DoesNotExist"]) | ANY,
        "values": st.lists(SCALARS | st.just({}) | st.just([]), max_size=2) | ANY}), min_size=1, max_size=2) | ANY,
    "matchFields": ANY,
})
AFFINITY = shaped({
    "nodeAffinity": shaped({"requiredDuringSchedulingIgnoredDuringExecution": shaped({
        "nodeSelectorTerms": st.lists(TERM, max_size=2) | ANY})}),
    "podAntiAffinity": ANY,
    "podAffinity": ANY,
})
TOLERATIONS = st.lists(shaped({
    "key": st.just("nvidia.com/gpu") | ANY, "operator": st.sampled_from(["Exists", "Equal"]) | ANY,
    "effect": st.sampled_from(["NoExecute", "NoSchedule"]) | ANY, "tolerationSeconds": ANY, "value": ANY,
}), max_size=2) | ANY
POD_SPEC = shaped({
    "containers": st.lists(CONTAINER, min_size=1, max_size=2) | ANY,
    "initContainers": st.lists(CONTAINER, max_size=1) | ANY,
    "volumes": ANY, "tolerations": TOLERATIONS, "nodeSelector": ANY, "affinity": AFFINITY, "securityContext": ANY,
    "runtimeClassName": ANY, "priorityClassName": ANY, "overhead": ANY, "os": ANY, "hostIPC": ANY,
    "activeDeadlineSeconds": ANY,
})
META = shaped({"name": ANY, "labels": ANY, "annotations": ANY, "ownerReferences": ANY, "deletionTimestamp": ANY})


@st.composite
def objects(draw: Any) -> dict[str, Any]:
    kind = draw(st.sampled_from(["Pod", "Deployment", "CronJob", "PyTorchJob", "InferenceService"]))
    spec = draw(POD_SPEC)
    template = {"metadata": draw(META), "spec": spec}
    body = {
        "Pod": ("v1", spec),
        "Deployment": ("apps/v1", {"selector": draw(ANY), "template": template}),
        "CronJob": ("batch/v1", {"jobTemplate": {"spec": {"template": template}}}),
        "PyTorchJob": ("kubeflow.org/v1", {"pytorchReplicaSpecs": {"Worker": {"template": template}}}),
        "InferenceService": ("serving.kserve.io/v1beta1", {"predictor": spec}),
    }[kind]
    return {"apiVersion": body[0], "kind": kind, "metadata": draw(META), "spec": body[1]}


LEAF = SCALARS | st.lists(SCALARS, max_size=2) | st.dictionaries(st.sampled_from(["a", "key"]), SCALARS, max_size=2)
STRUCTURED_CONTAINER = st.fixed_dictionaries(
    {"name": st.sampled_from(["a", "b"]), "image": st.sampled_from(["nvidia/cuda:12.4.1-base-ubuntu22.04", "x"]),
     "resources": st.fixed_dictionaries({"limits": st.dictionaries(
         st.sampled_from(["nvidia.com/gpu", "nvidia.com/mig-1g.10gb", "nvidia.com/gpumem", "memory"]), SCALARS,
         min_size=1, max_size=3)}, optional={"requests": RESOURCES})},
    optional={"env": st.lists(st.fixed_dictionaries({"name": st.just("NVIDIA_VISIBLE_DEVICES"), "value": LEAF})),
              "securityContext": st.dictionaries(st.sampled_from(["runAsUser", "privileged", "capabilities", "runAsNonRoot"]), LEAF),
              "volumeMounts": st.lists(st.dictionaries(st.sampled_from(["name", "mountPath"]), LEAF), max_size=2)},
)
STRUCTURED_SPEC = st.fixed_dictionaries(
    {"containers": st.lists(STRUCTURED_CONTAINER, min_size=1, max_size=2)},
    optional={k: LEAF for k in ("tolerations", "nodeSelector", "securityContext", "runtimeClassName", "volumes",
                                 "priorityClassName", "overhead", "os", "hostIPC", "activeDeadlineSeconds")}
    | {"affinity": AFFINITY, "initContainers": st.lists(STRUCTURED_CONTAINER, max_size=1)},
)


@st.composite
def structured_objects(draw: Any) -> dict[str, Any]:
    kind = draw(st.sampled_from(["Pod", "PyTorchJob"]))
    spec = draw(STRUCTURED_SPEC)
    meta = draw(st.fixed_dictionaries({"name": st.just("p")}, optional={"labels": LEAF, "annotations": LEAF}))
    if kind == "Pod":
        return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}
    template = {"metadata": meta, "spec": spec}
    return {"apiVersion": "kubeflow.org/v1", "kind": kind, "metadata": {"name": "j"},
            "spec": {"pytorchReplicaSpecs": {"Worker": {"template": template}}}}


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(obj=objects() | structured_objects(), operation=st.sampled_from(["CREATE", "UPDATE"]))
def test_engine_never_raises(obj: dict[str, Any], operation: str) -> None:
    meta = obj["metadata"] if isinstance(obj["metadata"], dict) else {}
    obj["metadata"] = meta
    request = Request.for_object(obj, operation=operation, namespace="ml-a")
    if operation == "UPDATE":
        request = Request(**{**request.__dict__, "old_object": obj})
    for policies in (POLICIES, EXTENDED):
        for view in (EMPTY_VIEW, CLUSTER):
            for phase in ("mutate", "validate"):
                decision = engine.evaluate(policies, request, view, phase)  # type: ignore[arg-type]
                assert decision.allowed or decision.message()


NODE_KEYS = st.sampled_from(["nvidia.com/gpu.product", "nvidia.com/mig.capable", "nvidia.com/cuda.driver-version.full"])
EXPRESSION = st.fixed_dictionaries(
    {"key": NODE_KEYS | LEAF, "operator": st.sampled_from(["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"]) | LEAF},
    optional={"values": st.lists(LEAF, max_size=2) | LEAF},
)
SCHEDULING_SPEC = st.fixed_dictionaries(
    {"containers": st.lists(st.fixed_dictionaries({
        "name": st.just("c"), "image": st.sampled_from(["nvidia/cuda:12.4.1-base-ubuntu22.04", "x"]),
        "resources": st.fixed_dictionaries({"limits": st.dictionaries(
            st.sampled_from(["nvidia.com/gpu", "nvidia.com/mig-1g.10gb"]), st.sampled_from(["1", "2"]), min_size=1)}),
     }), min_size=1, max_size=2),
     # the whole chain down to the expressions is there, so the merge logic sees the odd leaves
     "affinity": st.fixed_dictionaries({"nodeAffinity": st.fixed_dictionaries({
         "requiredDuringSchedulingIgnoredDuringExecution": st.fixed_dictionaries({"nodeSelectorTerms": st.lists(
             st.fixed_dictionaries({"matchExpressions": st.lists(EXPRESSION, min_size=1, max_size=3)}),
             min_size=1, max_size=2)}),
         "preferredDuringSchedulingIgnoredDuringExecution": st.lists(st.fixed_dictionaries(
             {"weight": LEAF, "preference": st.fixed_dictionaries({"matchExpressions": st.lists(EXPRESSION, max_size=2)})}
         ), max_size=2),
     })}),
     "tolerations": st.lists(st.fixed_dictionaries({}, optional={
         "key": st.just("nvidia.com/gpu") | LEAF, "operator": st.sampled_from(["Exists", "Equal"]) | LEAF,
         "effect": st.sampled_from(["NoExecute", "NoSchedule"]) | LEAF, "tolerationSeconds": LEAF, "value": LEAF,
     }), min_size=1, max_size=3)},
    optional={"nodeSelector": st.dictionaries(NODE_KEYS, LEAF, max_size=2) | LEAF},
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=SCHEDULING_SPEC)
def test_odd_scheduling_fields_never_raise(spec: dict[str, Any]) -> None:
    """Affinity, nodeSelector and tolerations of odd shapes, deep enough to reach the merge logic."""
    obj = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": spec}
    for policies in (POLICIES, EXTENDED):
        for view in (EMPTY_VIEW, CLUSTER):
            for phase in ("mutate", "validate"):
                decision = engine.evaluate(policies, Request.for_object(obj, namespace="ml-a"), view, phase)  # type: ignore[arg-type]
                assert decision.allowed or decision.message()


def _gpu_pod(**spec: Any) -> dict[str, Any]:
    container = {"name": "c", "image": "x", "resources": {"limits": {"nvidia.com/mig-1g.10gb": "1"}}}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": {"containers": [container], **spec}}


@pytest.mark.parametrize("obj", [
    # a map among an expression's values (a custom-resource template can carry one)
    _gpu_pod(affinity={"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "nvidia.com/mig.capable", "operator": "In", "values": [{}]}]}]}}}),
    _gpu_pod(affinity={"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "nvidia.com/gpu.product", "operator": "In", "values": [["A100"]]}]}]}}}),
    # tolerationSeconds as a string, where the policy wants a bounded NoExecute toleration
    _gpu_pod(tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": "30"}]),
], ids=["map-among-values", "list-among-values", "string-toleration-seconds"])
def test_malformed_scheduling_fields_found_by_review_are_answered(obj: dict[str, Any]) -> None:
    for phase in ("mutate", "validate"):
        decision = engine.evaluate(EXTENDED, Request.for_object(obj), EMPTY_VIEW, phase)  # type: ignore[arg-type]
        assert decision.allowed or decision.message()


async def test_huge_exponent_quantity_in_a_custom_resource_is_answered(webhook: Webhook) -> None:
    sent = load_review(next(p for p in corpus_reviews() if "pytorchjobs" in p.name))
    worker = sent["request"]["object"]["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]
    worker["resources"]["limits"]["nvidia.com/gpu"] = "1e999999999"
    answer = await webhook.review("/validate", sent)
    assert answer["response"]["uid"] == sent["request"]["uid"]


async def test_deeply_nested_json_is_a_400(webhook: Webhook) -> None:
    body = '{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": ' + "[" * 100000 + "]" * 100000 + "}"
    async with await webhook.post("/validate", body) as resp:
        assert resp.status == 400


class _BrokenView(SnapshotView):
    def namespace(self, name: str) -> Any:
        raise RuntimeError("a bug")


@pytest.mark.parametrize(("endpoint", "allowed"), [("/mutate", True), ("/validate", False)])
async def test_an_engine_bug_gets_a_well_formed_answer(start_webhook: StartWebhook, endpoint: str, allowed: bool) -> None:
    # a bug in the engine, the one thing no real input may cause, is simulated: the engine asks the
    # view for the pod's namespace, and this view raises (the engine is compiled in the image, so its
    # own functions cannot be replaced from here)
    webhook = await start_webhook(view=_BrokenView())
    sent = load_review(corpus_reviews()[0])
    assert sent["request"]["namespace"]  # (so the engine asks the view for it)
    response = (await webhook.review(endpoint, sent))["response"]
    assert response["uid"] == sent["request"]["uid"] and response["allowed"] is allowed and "patch" not in response
    if allowed:
        assert "nothing was changed" in response["warnings"][0]
    else:
        assert response["status"]["code"] == 403 and "internal error" in response["status"]["message"]
    async with webhook.session.get(webhook.base + "/metrics") as resp:
        assert f'decision="error",endpoint="{endpoint}"' in await resp.text()


