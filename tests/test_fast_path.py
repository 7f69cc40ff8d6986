"""The engine's fast path: a pod without GPUs costs nothing in a phase whose active rules all look at GPU pods only."""

from __future__ import annotations

from typing import Any

from tests.support import POLICIES
from webhook.policy import engine, loader
from webhook.policy.decision import ALLOW
from webhook.policy.request import Phase, Request
from webhook.view.snapshot import EMPTY_VIEW

SHIPPED = loader.load_directory(POLICIES)

#: a policy for every pod (not gpuOnly) with a mutation: the mutate phase looks beyond GPU pods too
MUTATES_EVERY_POD = """
apiVersion: gpu-admission.io/v1alpha1
kind: GPUPolicy
metadata: {name: every-pod}
spec:
  match: {kinds: ["*"], gpuOnly: false}
  rules:
    runtimeClass: {mode: enforce, name: nvidia}
"""


def cpu_pod() -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "web", "namespace": "default"},
        "spec": {"containers": [{"name": "web", "image": "nginx:1.27", "resources": {"limits": {"cpu": "1"}}}]},
    }


def decide(policies: loader.PolicySet, phase: Phase) -> Any:
    return engine.evaluate(policies, Request.for_object(cpu_pod()), EMPTY_VIEW, phase)


def test_the_shipped_policies_take_the_fast_path_in_mutate_though_a_validation_looks_at_every_pod() -> None:
    # gpu-access-guard (gpuOnly: false) has only gpuAccess, a validation: the mutate phase's active
    # rules all belong to gpuOnly policies, so a pod without GPUs is allowed at once
    guard = next(p for p in SHIPPED.active_policies if p.metadata.name == "gpu-access-guard")
    assert not guard.spec.match.gpuOnly and guard.spec.rules.gpuAccess is not None
    assert decide(SHIPPED, "mutate") is ALLOW
    # in validate gpuAccess looks at every pod: the pod is evaluated (a decision of its own, allowed)
    validated = decide(SHIPPED, "validate")
    assert validated is not ALLOW and validated.allowed


def test_a_mutation_of_every_pod_keeps_the_mutate_phase_off_the_fast_path() -> None:
    policies = loader.load_text(MUTATES_EVERY_POD)
    decision = decide(policies, "mutate")
    assert decision is not ALLOW and decision.patch
    # and nothing of it runs in validate: the fast path there
    assert decide(policies, "validate") is ALLOW
