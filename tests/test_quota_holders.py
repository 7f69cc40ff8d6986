"""A team cap's denial names the team's namespaces holding what the cap counts, most first."""

from __future__ import annotations

from typing import Any

from tests.support import POLICIES
from webhook.policy import engine, loader
from webhook.policy.request import Request
from webhook.view.snapshot import SnapshotView


def _policies(limit: str) -> loader.PolicySet:
    policy = f"""\
apiVersion: gpu-admission.io/v1alpha1
kind: GPUPolicy
metadata: {{name: caps}}
spec:
  rules: {{quota: {{resourceQuotas: false, limits: [{limit}]}}}}
"""
    return loader.load_text((POLICIES / "workload-kinds.yaml").read_text() + "\n---\n" + policy)


def namespace(name: str, team: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": {"team": team}}}


def pod(name: str, ns: str, gpus: int, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": ns},
        "spec": {"containers": [{"name": "c", "image": "x", "resources": {"limits": {"nvidia.com/gpu": gpus}}}], **spec},
        "status": {"phase": "Running"},
    }


def _denial(policies: loader.PolicySet, cluster: list[dict[str, Any]], request: Request) -> str:
    decision = engine.evaluate(policies, request, SnapshotView.from_objects(cluster), "validate")
    assert not decision.allowed, decision.message()
    return decision.message()


def test_five_namespaces_are_named_most_first_then_how_many_more() -> None:
    cluster = [namespace(f"ns-{i}", "a") for i in range(8)] + [pod(f"p{i}", f"ns-{i}", i + 1) for i in range(8)]
    message = _denial(_policies("{scope: team, max: 36}"), cluster, Request.for_object(pod("new", "ns-0", 1)))
    # 1+2+...+8 = 36 held; ties would be named in namespace order
    assert "uses 36 of 36 nvidia.com/gpu; this pod asks for 1; held in ns-7 8, ns-6 7, ns-5 6, ns-4 5, ns-3 4 " \
           "and 3 more namespaces (stop" in message, message


def test_only_what_the_cap_counts_and_only_the_team_is_named() -> None:
    cluster = [
        namespace("ml-a", "a"), namespace("ml-b", "a"), namespace("ml-c", "a"), namespace("other", "b"),
        pod("high", "ml-a", 4, priorityClassName="high"),
        pod("low", "ml-b", 4, priorityClassName="low"),  # not counted by a cap on "high" pods
        pod("high-too", "ml-c", 1, priorityClassName="high"),
        pod("elsewhere", "other", 8, priorityClassName="high"),  # another team
    ]
    request = Request.for_object(pod("new", "ml-b", 2, priorityClassName="high"))
    message = _denial(_policies("{scope: team, priorityClasses: [high], max: 6}"), cluster, request)
    assert "uses 5 of 6 nvidia.com/gpu at priority high; this pod asks for 2; held in ml-a 4, ml-c 1 (stop" in message


def test_the_pod_under_admission_is_not_named_as_a_holder() -> None:
    # already in the view under its own name (a re-invocation, an audit snapshot): it is not counted twice
    cluster = [namespace("ml-a", "a"), namespace("ml-b", "a"), pod("same", "ml-a", 2), pod("big", "ml-b", 4)]
    request = Request.for_object(pod("same", "ml-a", 3))
    message = _denial(_policies("{scope: team, max: 6}"), cluster, request)
    # the pod's own 2 GPUs are not counted against it: 4 held, 3 asked; ml-a holds nothing else
    assert "uses 4 of 6 nvidia.com/gpu; this pod asks for 3; held in ml-b 4 (stop" in message, message


def test_a_namespace_cap_names_no_holders() -> None:
    cluster = [namespace("ml-a", "a"), pod("p", "ml-a", 4)]
    message = _denial(_policies("{scope: namespace, max: 4}"), cluster, Request.for_object(pod("new", "ml-a", 1)))
    assert "namespace ml-a uses 4 of 4 nvidia.com/gpu; this pod asks for 1 (stop" in message, message
