"""Properties of every mutation, over generated pods and templates of every built-in kind."""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import HealthCheck, given, settings

from tests.generators import workloads
from tests.support import POLICIES, apply_patch, assert_same_in_place, assert_schema_valid
from webhook.policy import engine, loader
from webhook.policy.request import Request
from webhook.view.snapshot import EMPTY_VIEW

ALL_KINDS_POLICY = """
apiVersion: gpu-admission.io/v1alpha1
kind: GPUPolicy
metadata: {name: everything}
spec:
  order: 200
  match: {kinds: ["*"]}
  rules:
    tolerations: {tolerations: [{key: nvidia.com/gpu, operator: Exists, effect: NoSchedule}]}
    nodeAffinity:
      required: [{key: nvidia.com/gpu.product, operator: In, values: [NVIDIA-A100-SXM4-80GB, NVIDIA-H100-80GB-HBM3]}]
      preferred: [{weight: 10, matchExpressions: [{key: topology.kubernetes.io/zone, operator: In, values: [a]}]}]
      byResource: [{resources: ["nvidia.com/mig-*"], required: [{key: nvidia.com/mig.capable, operator: In, values: ["true"]}]}]
    runtimeClass: {name: nvidia, override: true}
    priorityClass: {classes: {training: gpu-training, batch: gpu-batch}, default: gpu-default, override: true,
                    userChoice: {everywhere: [batch], ownClass: allowed-namespaces}}
    securityContext: {level: default}
    shm: {}
    gpuVisibility: {}
    spreadReplicas: {type: required}
    trainingLocality: {topologyKey: example.com/fabric}
"""

POLICY_SET = loader.load_text(
    "\n---\n".join([(POLICIES / f).read_text() for f in ("workload-kinds.yaml", "workload-classes.yaml", "gpu-defaults.yaml", "gpu-workload-shape.yaml")] + [ALL_KINDS_POLICY])
)
#: pod-spec fields a rule removes (FACTS.md §5) or overrides (override: true above) on purpose
RULE_OWNED = {"priority", "preemptionPolicy", "overhead", "runtimeClassName", "priorityClassName"}


def rule_owned(path: tuple[Any, ...]) -> bool:
    return any(path[i] in RULE_OWNED and path[i - 1] == "spec" for i in range(1, len(path)))


def leaves(node: Any, path: tuple[Any, ...] = ()) -> list[tuple[tuple[Any, ...], Any]]:
    if isinstance(node, dict) and node:
        return [leaf for key, value in node.items() for leaf in leaves(value, (*path, key))]
    if isinstance(node, list) and node:
        return [leaf for i, value in enumerate(node) for leaf in leaves(value, (*path, i))]
    return [(path, node)]


def lookup(node: Any, path: tuple[Any, ...]) -> Any:
    for key in path:
        node = node[key]
    return node


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(obj=workloads())
def test_mutations_apply_validate_repeat_and_keep_user_fields(obj: dict[str, Any]) -> None:
    assert_schema_valid(obj)  # the generator makes valid objects
    before = copy.deepcopy(obj)
    request = Request.for_object(obj)
    decision = engine.evaluate(POLICY_SET, request, EMPTY_VIEW, "mutate")
    assert obj == before, "the engine changed the request's object"
    assert_same_in_place(POLICY_SET, request, EMPTY_VIEW, "mutate", decision)
    if not decision.allowed:
        assert decision.denials and decision.message()
        return
    patched = apply_patch(obj, decision.patch)
    assert patched == (decision.patched if decision.patch else obj)
    assert_schema_valid(patched)
    again = engine.evaluate(POLICY_SET, Request.for_object(patched), EMPTY_VIEW, "mutate")
    assert again.patch == () and again.allowed
    for path, value in leaves(obj):
        if rule_owned(path):
            continue
        now = lookup(patched, path)
        if value in ({}, []):  # an empty map or list may be filled in, not replaced
            assert type(now) is type(value), f"user field {path} replaced"
        else:
            assert now == value, f"user field {path} changed"


def pod_spec_paths(node: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Where the pod specs of an object are: the maps holding a list of containers."""
    if isinstance(node, dict):
        here = [path] if isinstance(node.get("containers"), list) else []
        return here + [p for key, value in node.items() for p in pod_spec_paths(value, (*path, key))]
    if isinstance(node, list):
        return [p for i, value in enumerate(node) for p in pod_spec_paths(value, (*path, i))]
    return []


def _asks_for_root(sc: Any) -> bool:
    return isinstance(sc, dict) and (sc.get("runAsUser") == 0 or sc.get("runAsNonRoot") is False)


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(obj=workloads())
def test_explicit_root_keeps_its_capabilities_and_gets_no_identity(obj: dict[str, Any]) -> None:
    """Root asked for (runAsUser 0, runAsNonRoot false) on the pod or a container is never half taken away."""
    decision = engine.evaluate(POLICY_SET, Request.for_object(obj), EMPTY_VIEW, "mutate")
    patched = apply_patch(obj, decision.patch)
    for path in pod_spec_paths(obj):
        spec, after = lookup(obj, path), lookup(patched, path)
        pod_sc = spec.get("securityContext") or {}
        containers = [*spec.get("initContainers", []), *spec["containers"]]
        mutated = [*after.get("initContainers", []), *after["containers"]]
        if _asks_for_root(pod_sc) or any(_asks_for_root(c.get("securityContext")) for c in containers):
            for key in ("runAsNonRoot", "runAsUser", "runAsGroup", "fsGroup"):
                assert (after.get("securityContext") or {}).get(key) == pod_sc.get(key), key
        for before, now in zip(containers, mutated):
            own = before.get("securityContext") or {}
            chose_user = own.get("runAsUser") is not None or own.get("runAsNonRoot") is True
            if _asks_for_root(own) or (_asks_for_root(pod_sc) and not chose_user):
                assert (now.get("securityContext") or {}).get("capabilities") == own.get("capabilities"), before["name"]
