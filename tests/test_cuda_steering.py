"""CUDA steering survives a rolling driver upgrade: a pod steered onto the capable drivers of today
still matches the nodes once they carry a newer driver (drivers are backward compatible)."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from tests.support import POLICIES, apply_patch, assert_schema_valid, shipped_policies
from webhook.kube import affinity
from webhook.kube.patch import PatchBuilder
from webhook.policy import engine, loader
from webhook.policy.request import Request
from webhook.view import scheduling
from webhook.view.snapshot import SnapshotView

CUDA_1263 = "nvidia/cuda:12.6.3-runtime-ubuntu22.04"  # native minimum 560.35.05 (FACTS.md §1)


def _node(name: str, driver: str) -> dict[str, Any]:
    major, minor, rev = driver.split(".")
    labels = {"nvidia.com/gpu.present": "true", "nvidia.com/gpu.product": "NVIDIA-GeForce-RTX-4090",
              "nvidia.com/cuda.driver-version.full": driver, "nvidia.com/cuda.driver-version.major": major,
              "nvidia.com/cuda.driver-version.minor": minor, "nvidia.com/cuda.driver-version.revision": rev}
    return {"kind": "Node", "metadata": {"name": name, "labels": labels},
            "spec": {"taints": [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]},
            "status": {"allocatable": {"nvidia.com/gpu": "8"}}}


def _pod() -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "ml"},
            "spec": {"containers": [{"name": "c", "image": CUDA_1263,
                                     "resources": {"limits": {"nvidia.com/gpu": 1, "memory": "8Gi"}}}]}}


def _steer(pod: dict[str, Any], nodes: list[dict[str, Any]]) -> tuple[Any, ...]:
    return engine.evaluate(shipped_policies(), Request.for_object(pod), SnapshotView.from_objects(nodes), "mutate").patch


def test_a_steered_pending_pod_still_matches_its_nodes_after_a_driver_upgrade() -> None:
    pod = _pod()
    steered = apply_patch(pod, _steer(pod, [_node("old", "550.54.15"), _node("a", "570.124.06")]))
    assert_schema_valid(steered)
    upgraded = [_node("old", "550.54.15"), _node("a", "575.57.08"), _node("b", "570.133.20"),
                _node("same-branch-older", "560.35.03"), _node("same-branch-newer", "560.94.02")]
    eligible = scheduling.NodeFilter(steered["spec"], {"nvidia.com/gpu": Decimal(1)}).select(upgraded)
    assert sorted(scheduling.node_name(n) for n in eligible) == ["a", "b", "same-branch-newer"]
    view = SnapshotView.from_objects(upgraded)
    judged = engine.evaluate(shipped_policies(), Request.for_object(steered), view, "validate")
    assert judged.allowed and not [f for f in judged.findings if f.rule == "cudaDriver"], judged.findings
    # the reinvocation (or any later pass) against the upgraded fleet adds nothing
    assert _steer(steered, upgraded) == ()


def _merged(spec: dict[str, Any], alternatives: list[list[dict[str, Any]]]) -> tuple[affinity.Merge, Any]:
    builder = PatchBuilder({"spec": spec})
    merge = affinity.require_any(builder, ("spec",), alternatives)
    return merge, builder.get(("spec", *affinity.REQUIRED))


GT_550 = [{"key": "d.major", "operator": "Gt", "values": ["550"]}]
IN_A = [{"key": "d.full", "operator": "In", "values": ["550.54.15"]}]


def test_a_nodeselector_that_already_satisfies_an_alternative_is_left_alone() -> None:
    merge, terms = _merged({"nodeSelector": {"d.full": "550.54.15"}}, [IN_A, GT_550])
    assert not merge.added and terms is None


def test_a_term_gets_only_the_alternatives_it_does_not_contradict() -> None:
    term = {"matchExpressions": [{"key": "d.full", "operator": "In", "values": ["535.104.05"]}]}
    merge, terms = _merged({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [term]}}}}, [IN_A, GT_550])
    assert merge.added
    assert terms == [{"matchExpressions": [*term["matchExpressions"], *GT_550]}]


def _gfd_node(name: str, driver: str, product: str) -> dict[str, Any]:
    node = _node(name, driver)
    node["metadata"]["labels"]["nvidia.com/gpu.product"] = product
    return node


#: a fleet of one driver on two kinds of GPU (issue #40): forward compatibility runs CUDA 12.4 at 535
#: on the A100s (data-center GPUs) and not on the GeForce, whose driver string is the same
A100, H100, GEFORCE = "NVIDIA-A100-SXM4-80GB", "NVIDIA-H100-80GB-HBM3", "NVIDIA-GeForce-RTX-4090"
MIXED = [_gfd_node("a100-1", "535.104.05", A100), _gfd_node("a100-2", "535.104.05", A100),
         _gfd_node("h100", "560.35.03", H100), _gfd_node("geforce", "535.104.05", GEFORCE)]


def _landing(pod: dict[str, Any], nodes: list[dict[str, Any]]) -> list[str]:
    """Where the steered pod may land, as the scheduler's node affinity filter decides."""
    steered = apply_patch(pod, _steer(pod, nodes))
    assert_schema_valid(steered)
    eligible = scheduling.NodeFilter(steered["spec"], {"nvidia.com/gpu": Decimal(1)}).select(nodes)
    return sorted(scheduling.node_name(n) for n in eligible)


def _image_pod(image: str) -> dict[str, Any]:
    pod = _pod()
    pod["spec"]["containers"][0]["image"] = image
    return pod


def test_forward_compatibility_steers_by_driver_and_product_not_by_driver_alone() -> None:
    pod = _image_pod("nvidia/cuda:12.4.1-runtime-ubuntu22.04")
    assert _landing(pod, MIXED) == ["a100-1", "a100-2", "h100"]
    steered = apply_patch(pod, _steer(pod, MIXED))
    assert _steer(steered, MIXED) == ()  # idempotent
    judged = engine.evaluate(shipped_policies(), Request.for_object(steered), SnapshotView.from_objects(MIXED),
                             "validate")
    assert judged.allowed and not [f for f in judged.findings if f.rule == "cudaDriver"], judged.findings


def test_a_native_driver_admits_every_product_with_it() -> None:
    # CUDA 12.2 runs natively at 535.104.05: the GeForce of that driver runs it too, nothing is steered
    pod = _image_pod("nvidia/cuda:12.2.0-base-ubuntu22.04")
    assert not [op for op in _steer(pod, MIXED) if op["path"].startswith("/spec/affinity")]
    assert _landing(pod, MIXED) == ["a100-1", "a100-2", "geforce", "h100"]
    # CUDA 12.3 runs natively at 545.23.06: the H100 natively, the A100s by forward compatibility
    pod = _image_pod("nvcr.io/nvidia/tritonserver:24.01-py3")
    assert _landing(pod, MIXED) == ["a100-1", "a100-2", "h100"]


def _with_validations(old: str, new: str) -> Any:
    """The shipped policies with one edit to gpu-validations.yaml."""
    text = (POLICIES / "gpu-validations.yaml").read_text()
    assert old in text
    others = [(POLICIES / name).read_text() for name in sorted(p.name for p in POLICIES.glob("*.yaml"))
              if name != "gpu-validations.yaml"]
    return loader.load_text("\n---\n".join([*others, text.replace(old, new, 1)]), "edited")


def test_a_policy_node_selector_for_forward_compatibility_is_what_steers() -> None:
    # the policy says which nodes run forward compatibility by its own label: the pool, not the product
    policies = _with_validations("        mode: auto ", '        nodes: {matchLabels: {pool: dc}}\n        mode: auto ')
    nodes = [*MIXED[:3], _gfd_node("dc-geforce", "535.104.05", GEFORCE), MIXED[3]]
    for node in nodes[:2] + nodes[3:4]:
        node["metadata"]["labels"] = {**node["metadata"]["labels"], "pool": "dc"}
    pod = _image_pod("nvidia/cuda:12.4.1-runtime-ubuntu22.04")
    patch = engine.evaluate(policies, Request.for_object(pod), SnapshotView.from_objects(nodes), "mutate").patch
    steered = apply_patch(pod, patch)
    eligible = scheduling.NodeFilter(steered["spec"], {"nvidia.com/gpu": Decimal(1)}).select(nodes)
    assert sorted(scheduling.node_name(n) for n in eligible) == ["a100-1", "a100-2", "dc-geforce", "h100"]


def _unlabelled_capable() -> list[dict[str, Any]]:
    """The A100s known by their driver's major and minor labels only: no full driver label to steer by."""
    nodes = [dict(n, metadata=dict(n["metadata"], labels=dict(n["metadata"]["labels"]))) for n in MIXED]
    for node in nodes[:2]:
        del node["metadata"]["labels"]["nvidia.com/cuda.driver-version.full"]
    return [nodes[0], nodes[1], nodes[3]]


def test_a_pod_no_affinity_can_steer_is_refused_with_why() -> None:
    nodes = _unlabelled_capable()
    pod = _image_pod("nvidia/cuda:12.4.1-runtime-ubuntu22.04")
    view = SnapshotView.from_objects(nodes)
    mutated = apply_patch(pod, _steer(pod, nodes))
    assert "affinity" not in mutated["spec"]
    judged = engine.evaluate(shipped_policies(), Request.for_object(mutated), view, "validate")
    assert not judged.allowed
    assert "no node affinity could steer it onto them" in judged.message(), judged.message()
    # a policy that prefers to admit it anyway says so with a warning
    policies = _with_validations("unsteerable: deny ", "unsteerable: warn ")
    judged = engine.evaluate(policies, Request.for_object(mutated), view, "validate")
    assert judged.allowed and any("could steer" in w for w in judged.warnings), judged.warnings


def _template(kind: str, image: str, tolerations: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "c", "image": image,
                                            "resources": {"limits": {"nvidia.com/gpu": 1, "memory": "8Gi"}}}]}
    if tolerations is not None:
        spec["tolerations"] = tolerations
    return {"apiVersion": "apps/v1", "kind": kind, "metadata": {"name": "t", "namespace": "ml"},
            "spec": {"selector": {"matchLabels": {"app": "t"}},
                     "template": {"metadata": {"labels": {"app": "t"}}, "spec": spec}}}


GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}


def _cuda_findings(obj: dict[str, Any], nodes: list[dict[str, Any]]) -> tuple[bool, list[Any]]:
    judged = engine.evaluate(shipped_policies(), Request.for_object(obj), SnapshotView.from_objects(nodes), "validate")
    return judged.allowed, [f for f in judged.findings if f.rule == "cudaDriver"]


def test_a_daemon_set_whose_pods_cannot_be_steered_is_refused_where_a_deployment_is_not() -> None:
    # CUDA 12.4 runs on the A100s and the H100, not on the GeForce (one driver, two products: #40)
    image = "nvidia/cuda:12.4.1-runtime-ubuntu22.04"
    # control: a Deployment's pods are steered onto the capable nodes when they are created
    allowed, [note] = _cuda_findings(_template("Deployment", image), MIXED)
    assert allowed and "its pods will be steered onto them" in note.message, note
    # a DaemonSet that tolerates the GPU nodes gets a pod bound to each, the GeForce too: refused, with why
    allowed, [finding] = _cuda_findings(_template("DaemonSet", image, [GPU_TOLERATION]), MIXED)
    assert not allowed and "only 3 of 4 node(s)" in finding.message, finding
    assert "; a DaemonSet puts a pod on each: select only the capable ones in its template" in finding.message, finding
    # one that selects only the capable nodes is admitted
    pinned = _template("DaemonSet", image, [GPU_TOLERATION])
    pinned["spec"]["template"]["spec"]["nodeSelector"] = {"nvidia.com/gpu.product": A100}
    assert _cuda_findings(pinned, MIXED) == (True, [])


def test_a_daemon_set_without_the_gpu_toleration_is_not_taken_for_one_with_it() -> None:
    # its controller puts pods only on nodes its template tolerates: every GPU node here is tainted, so
    # none gets a pod (not "3 of 4 will be steered", as if the pods got the toleration)
    allowed, [note] = _cuda_findings(_template("DaemonSet", "nvidia/cuda:12.4.1-runtime-ubuntu22.04"), MIXED)
    assert allowed and "no known node matches" in note.message, note
