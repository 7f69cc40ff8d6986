"""gpu-admission down: what the shipped failurePolicy and matchConditions promise."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.e2e.admission import Admission
from tests.e2e.fixtures import deployment, gpu_container, pod
from tests.e2e.kube import Kube, Refused


@pytest.fixture
def outage(admission: Admission) -> Iterator[None]:
    admission.stop()
    try:
        yield
    finally:
        admission.start()


def test_an_outage_refuses_gpu_pods_in_opted_in_namespaces_only(
    admin: Kube, namespace: str, plain_namespace: str, outage: None
) -> None:
    with pytest.raises(Refused) as refused:
        admin.create(pod("gpu", namespace, gpu_container()))
    message = refused.value.message
    assert 'failed calling webhook "mutate.gpu-admission.io"' in message, message
    assert "connection refused" in message, message
    # failurePolicy Fail applies only to requests the webhooks match: these never reach them
    assert admin.create(pod("web", namespace, {"name": "web", "image": "nginx"}))["metadata"]["name"] == "web"
    assert admin.create(pod("gpu", plain_namespace, gpu_container()))["metadata"]["name"] == "gpu"
    assert admin.create(pod("gpu", "default", gpu_container()), dry_run="All")["metadata"]["name"] == "gpu"


def test_an_outage_leaves_workloads_without_gpus_alone(admin: Kube, namespace: str, outage: None) -> None:
    """The matchConditions send built-in workloads only when their template asks for a GPU:
    a web Deployment or a plain Job in an opted-in namespace is created during an outage."""
    web = admin.create(deployment("web", namespace, {"name": "web", "image": "nginx"}))
    assert web["metadata"]["name"] == "web"
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "hello", "namespace": namespace},
           "spec": {"template": {"spec": {"restartPolicy": "Never",
                                          "containers": [{"name": "hello", "image": "busybox"}]}}}}
    assert admin.create(job)["metadata"]["name"] == "hello"
    with pytest.raises(Refused) as refused:
        admin.create(deployment("train", namespace, gpu_container()))
    assert "gpu-admission.io" in refused.value.message, refused.value.message
