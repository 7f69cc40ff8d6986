"""GPU specs that would never run, refused through the apiserver in pods, workloads and custom resources."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.e2e.fixtures import cronjob, deployment, gpu_container, job, pod, pod_template, replication_controller
from tests.e2e.kube import Kube, Object, Refused, eventually

DENIED = 'admission webhook "validate.gpu-admission.io" denied the request'

#: (case, container): each is a GPU spec no node can run
BROKEN: dict[str, Object] = {
    "fractional": gpu_container(gpus="0.5"),
    "requests-only": gpu_container(gpus=None, requests={"nvidia.com/gpu": 1}),
    "request-not-limit": gpu_container(gpus=2, requests={"nvidia.com/gpu": 1}),
    "invalid-mig-profile": {"name": "c", "image": "x", "resources": {"limits": {"nvidia.com/mig-9g.99gb": 1}}},
}

BUILDERS: dict[str, Callable[[str, str, Object], Object]] = {
    "Pod": lambda name, ns, c: pod(name, ns, c),
    "Deployment": deployment,
    "Job": job,
    "CronJob": cronjob,
    "ReplicationController": replication_controller,
    "PodTemplate": pod_template,
}

#: what kube-apiserver itself refuses in pods and in the templates of its own workload kinds,
#: before validating webhooks are called (pkg/apis/core/validation)
APISERVER_REFUSES = {"fractional": "must be an integer", "requests-only": "Limit must be set",
                     "request-not-limit": "must be equal to nvidia.com/gpu limit"}


@pytest.mark.parametrize("case", sorted(BROKEN))
@pytest.mark.parametrize("kind", sorted(BUILDERS))
def test_broken_gpu_specs_are_refused_in_builtin_kinds(admin: Kube, namespace: str, kind: str, case: str) -> None:
    obj = BUILDERS[kind](case, namespace, BROKEN[case])
    with pytest.raises(Refused) as refused:
        admin.create(obj)
    message = refused.value.message
    if case in APISERVER_REFUSES:
        assert APISERVER_REFUSES[case] in message
    else:
        assert DENIED in message and "mig-9g.99gb" in message, message
    assert admin.list(obj["apiVersion"], kind, namespace) == []


PYTORCHJOB_CRD: Object = {
    "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
    "metadata": {"name": "pytorchjobs.kubeflow.org"},
    "spec": {
        "group": "kubeflow.org", "scope": "Namespaced",
        "names": {"kind": "PyTorchJob", "plural": "pytorchjobs", "singular": "pytorchjob", "listKind": "PyTorchJobList"},
        "versions": [{"name": "v1", "served": True, "storage": True, "schema": {"openAPIV3Schema": {
            "type": "object", "x-kubernetes-preserve-unknown-fields": True}}}],
    },
}


@pytest.fixture(scope="module")
def pytorchjobs(admin: Kube) -> Iterator[None]:
    admin.ensure(PYTORCHJOB_CRD)

    def established() -> bool:
        crd = admin.get("apiextensions.k8s.io/v1", "CustomResourceDefinition", "pytorchjobs.kubeflow.org")
        conditions = crd.get("status", {}).get("conditions") or []
        if not any(c["type"] == "Established" and c["status"] == "True" for c in conditions):
            return False
        admin.dynamic.resources.invalidate_cache()
        return bool(admin.dynamic.resources.search(group="kubeflow.org", kind="PyTorchJob"))

    eventually(established, what="the PyTorchJob CRD being served")
    yield


def pytorchjob(name: str, namespace: str, container: Object) -> Object:
    def replica(count: int) -> dict[str, Any]:
        return {"replicas": count, "restartPolicy": "OnFailure",
                "template": {"spec": {"containers": [container | {"name": "pytorch"}]}}}
    return {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": name, "namespace": namespace},
            "spec": {"pytorchReplicaSpecs": {"Master": replica(1), "Worker": replica(3)}}}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_broken_gpu_specs_in_a_custom_resource_are_refused_with_our_message(
    admin: Kube, namespace: str, pytorchjobs: None, case: str
) -> None:
    with pytest.raises(Refused) as refused:
        admin.create(pytorchjob(case, namespace, BROKEN[case]))
    message = refused.value.message
    assert DENIED in message, message
    assert "PyTorchJob" in message and "pytorchReplicaSpecs" in message, message


def test_a_sound_custom_resource_is_stored(admin: Kube, namespace: str, pytorchjobs: None) -> None:
    stored = admin.create(pytorchjob("sound", namespace, gpu_container(gpus=2)))
    assert stored["metadata"]["name"] == "sound"


def _nested(levels: int) -> Any:
    value: Any = []
    for _ in range(levels - 1):
        value = [value]
    return value


@pytest.mark.parametrize("endpoint", ["mutate", "validate"])
def test_a_custom_resource_nested_past_what_the_webhook_reads_is_refused_with_its_message(
    admin: Kube, namespace: str, pytorchjobs: None, endpoint: str
) -> None:
    """kube-apiserver reads JSON 10,000 levels deep and stores such a resource where its schema keeps
    unknown fields; the webhook reads 1,024. Refused in the webhook's answer (its uid echoed), which
    the user reads, not as a call that failed; the control, nested a little less, is stored."""
    import sys

    before = sys.getrecursionlimit()
    sys.setrecursionlimit(10_000)  # (the client's serialization recurses per level)
    try:
        job = pytorchjob(f"deep-{endpoint}", namespace, gpu_container(gpus=1))
        job["spec"]["runPolicy"] = {"x-nested": _nested(1100)}
        with pytest.raises(Refused) as refused:
            admin.create(job)
        message = refused.value.message
        assert "gpu-admission.io\" denied the request" in message, message
        assert "nests lists or maps deeper than 1,024 levels" in message, message
        assert "failed calling webhook" not in message, message
        control = pytorchjob(f"nested-{endpoint}", namespace, gpu_container(gpus=1))
        control["spec"]["runPolicy"] = {"x-nested": _nested(1000)}
        stored = admin.create(control)
        assert stored["metadata"]["name"] == f"nested-{endpoint}"
        stored_names = {j["metadata"]["name"] for j in admin.list("kubeflow.org/v1", "PyTorchJob", namespace)}
        admin.delete(control)
    finally:
        sys.setrecursionlimit(before)
    assert f"nested-{endpoint}" in stored_names and f"deep-{endpoint}" not in stored_names
