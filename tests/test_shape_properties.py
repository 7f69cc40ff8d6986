"""Properties: a fractional or requests-only GPU anywhere in any pod spec of any kind is found.

Pod specs from tests/generators.py (well-formed GPU requests) get one bad
container, placed anywhere, and go into objects of every kind gpu-admission
knows (Pod, the built-in templates, custom resources from
policies/workload-kinds.yaml); validation must deny and name that container
and resource. Without the bad container the same object raises no
resourceShape finding.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests import generators
from tests.support import POLICIES
from webhook.policy import engine, loader
from webhook.policy.request import Request
from webhook.view.snapshot import EMPTY_VIEW

POLICY = """\
apiVersion: gpu-admission.io/v1alpha1
kind: GPUPolicy
metadata: {name: shape}
spec:
  match: {kinds: ["*"]}
  rules: {resourceShape: {mode: enforce, initOnly: allow}}
"""
POLICY_SET = loader.load_text((POLICIES / "workload-kinds.yaml").read_text() + "\n---\n" + POLICY)

Spec = dict[str, Any]
Wrap = Callable[[Spec, Spec], dict[str, Any]]  # (spec with the bad container, a good spec) -> object


def _tmpl(spec: Spec) -> dict[str, Any]:
    return {"metadata": {"labels": {"app": "x"}}, "spec": spec}


def _obj(api: str, kind: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": api, "kind": kind, "metadata": {"name": "x", "namespace": "ml"}, "spec": spec}


WRAPPERS: dict[str, Wrap] = {
    "Pod": lambda bad, good: {**_obj("v1", "Pod", bad)},
    "Deployment": lambda bad, good: _obj("apps/v1", "Deployment", {"selector": {}, "template": _tmpl(bad)}),
    "StatefulSet": lambda bad, good: _obj("apps/v1", "StatefulSet", {"serviceName": "x", "template": _tmpl(bad)}),
    "DaemonSet": lambda bad, good: _obj("apps/v1", "DaemonSet", {"template": _tmpl(bad)}),
    "ReplicaSet": lambda bad, good: _obj("apps/v1", "ReplicaSet", {"template": _tmpl(bad)}),
    "Job": lambda bad, good: _obj("batch/v1", "Job", {"template": _tmpl(bad)}),
    "CronJob": lambda bad, good: _obj("batch/v1", "CronJob", {"jobTemplate": {"spec": {"template": _tmpl(bad)}}}),
    "PyTorchJob": lambda bad, good: _obj("kubeflow.org/v1", "PyTorchJob", {
        "pytorchReplicaSpecs": {"Master": {"template": _tmpl(good)}, "Worker": {"replicas": 4, "template": _tmpl(bad)}}}),
    "MPIJob": lambda bad, good: _obj("kubeflow.org/v2beta1", "MPIJob", {
        "mpiReplicaSpecs": {"Launcher": {"template": _tmpl(bad)}, "Worker": {"template": _tmpl(good)}}}),
    "RayCluster": lambda bad, good: _obj("ray.io/v1", "RayCluster", {
        "headGroupSpec": {"template": _tmpl(good)},
        "workerGroupSpecs": [{"template": _tmpl(good)}, {"template": _tmpl(bad)}]}),
    "RayJob": lambda bad, good: _obj("ray.io/v1", "RayJob", {
        "rayClusterSpec": {"headGroupSpec": {"template": _tmpl(bad)}, "workerGroupSpecs": [{"template": _tmpl(good)}]}}),
    "JobSet": lambda bad, good: _obj("jobset.x-k8s.io/v1alpha2", "JobSet", {
        "replicatedJobs": [{"name": "a", "template": {"spec": {"template": _tmpl(good)}}},
                           {"name": "b", "template": {"spec": {"template": _tmpl(bad)}}}]}),
    "LeaderWorkerSet": lambda bad, good: _obj("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet", {
        "leaderWorkerTemplate": {"leaderTemplate": _tmpl(good), "workerTemplate": _tmpl(bad)}}),
    "InferenceService": lambda bad, good: _obj("serving.kserve.io/v1beta1", "InferenceService", {
        "predictor": good, "transformer": bad}),
}

# (zero is no request at all: a chart's "nvidia.com/gpu: 0" is a CPU container, with nothing to find)
whole = st.integers(min_value=1, max_value=8).map(str) | st.integers(min_value=1, max_value=8)
fraction = (
    st.tuples(st.integers(0, 7), st.integers(1, 99)).map(lambda t: f"{t[0]}.{t[1]}")
    | st.integers(1, 7999).filter(lambda m: m % 1000).map(lambda m: f"{m}m")
)


@st.composite
def bad_container(draw: st.DrawFn) -> tuple[dict[str, Any], str]:
    resource = draw(st.sampled_from(generators.GPU_RESOURCES))
    shape = draw(st.sampled_from(["fraction-limit", "fraction-request", "fraction-both", "requests-only"]))
    value = draw(fraction) if shape != "requests-only" else draw(whole | fraction)
    resources = {
        "fraction-limit": {"limits": {resource: value}},
        "fraction-request": {"limits": {resource: 1}, "requests": {resource: value}},
        "fraction-both": {"limits": {resource: value}, "requests": {resource: value}},
        "requests-only": {"requests": {resource: value}},
    }[shape]
    return {"name": "bad", "image": "x", "resources": resources}, resource


@st.composite
def pod_specs(draw: st.DrawFn) -> tuple[Spec, Spec, str, str]:
    """(a generated spec with the bad container put anywhere, the spec without it, its label, its resource)."""
    good = draw(generators.pod_specs())
    spec = copy.deepcopy(good)
    bad, resource = draw(bad_container())
    in_init = draw(st.booleans())
    target = spec.setdefault("initContainers", []) if in_init else spec["containers"]
    target.insert(draw(st.integers(0, len(target))), bad)
    label = f'{"init container" if in_init else "container"} "bad"'
    return spec, good, label, resource


def _shape_findings(obj: dict[str, Any]) -> list[str]:
    decision = engine.evaluate(POLICY_SET, Request.for_object(obj), EMPTY_VIEW, "validate")
    return [f.message for f in decision.findings if f.rule == "resourceShape"]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(kind=st.sampled_from(sorted(WRAPPERS)), specs=pod_specs())
def test_a_bad_gpu_request_anywhere_is_always_found(kind: str, specs: tuple[Spec, Spec, str, str]) -> None:
    bad_spec, good_spec, label, resource = specs
    wrap = WRAPPERS[kind]
    obj = wrap(bad_spec, good_spec)
    decision = engine.evaluate(POLICY_SET, Request.for_object(obj), EMPTY_VIEW, "validate")
    assert not decision.allowed, obj
    assert any(label in f.message and resource in f.message for f in decision.denials), decision.message()
    assert _shape_findings(wrap(good_spec, good_spec)) == [], "the same object without the bad container is clean"


def test_a_yaml_boolean_for_a_gpu_count_is_named_as_written() -> None:
    """`nvidia.com/gpu: yes` reads as a boolean: the message says true, as the manifest's JSON would."""
    pod = _obj("v1", "Pod", {"containers": [{"name": "c", "image": "x", "resources": {"limits": {"nvidia.com/gpu": True}}}]})
    decision = engine.evaluate(POLICY_SET, Request.for_object(pod), EMPTY_VIEW, "validate")
    assert "nvidia.com/gpu: true is not a valid quantity" in decision.message(), decision.message()
