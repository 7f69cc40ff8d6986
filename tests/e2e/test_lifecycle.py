"""After creation: updates, subresources, deletion, server-side apply and dry runs."""

from __future__ import annotations

import pytest

from tests.e2e.fixtures import gpu_container, pod
from tests.e2e.kube import Kube, Object, Refused
from tests.e2e.test_mutations import assert_mutated_once

TRAINING = {"gpu-admission.io/workload-class": "training"}


@pytest.fixture
def stored(admin: Kube, namespace: str) -> Object:
    return admin.create(pod("train", namespace, gpu_container(), labels=TRAINING))


def _same_spec(before: Object, after: Object) -> None:
    assert after["spec"] == before["spec"]


def test_a_label_update_of_a_mutated_pod_is_allowed_untouched(admin: Kube, stored: Object) -> None:
    updated = admin.patch(stored, {"metadata": {"labels": {"team": "vision"}}})
    assert updated["metadata"]["labels"]["team"] == "vision"
    _same_spec(stored, updated)
    assert updated["metadata"]["annotations"] == stored["metadata"]["annotations"]


def test_a_full_update_of_a_mutated_pod_is_allowed_untouched(admin: Kube, stored: Object) -> None:
    stored["metadata"]["labels"]["team"] = "speech"
    updated = admin.replace(stored)
    assert updated["metadata"]["labels"]["team"] == "speech"
    _same_spec(stored, updated)


def test_ephemeral_containers_can_be_added_to_a_gpu_pod(admin: Kube, stored: Object) -> None:
    debug = {"name": "debugger", "image": "busybox:1.36", "command": ["sh"], "stdin": True, "tty": True}
    body = {"spec": {"ephemeralContainers": [debug]}}
    updated = admin.patch(stored, body, content_type="application/strategic-merge-patch+json",
                          subresource="ephemeralcontainers")
    assert [c["name"] for c in updated["spec"]["ephemeralContainers"]] == ["debugger"]
    assert updated["spec"]["containers"] == stored["spec"]["containers"]


def test_status_updates_are_not_ours_to_judge(admin: Kube, stored: Object) -> None:
    status = {"status": {"phase": "Running", "conditions": [{"type": "PodScheduled", "status": "True"}]}}
    updated = admin.patch(stored, status, content_type="application/strategic-merge-patch+json",
                          subresource="status")
    assert updated["status"]["phase"] == "Running"
    _same_spec(stored, updated)


def test_a_gpu_pod_can_be_deleted(admin: Kube, stored: Object) -> None:
    admin.delete(stored, missing_ok=False)
    with pytest.raises(Refused) as gone:
        admin.get("v1", "Pod", stored["metadata"]["name"], stored["metadata"]["namespace"])
    assert gone.value.status == 404 or "deletionTimestamp" in str(gone.value)


def test_server_side_apply_of_a_gpu_pod_is_mutated_and_applying_again_changes_nothing(
    admin: Kube, namespace: str
) -> None:
    manifest = pod("applied", namespace, gpu_container(), labels=TRAINING)
    first = admin.apply(manifest)
    assert_mutated_once(first, "gpu-training", 50000)
    again = admin.apply(manifest)
    _same_spec(first, again)
    assert again["metadata"]["resourceVersion"] == first["metadata"]["resourceVersion"]


def test_a_dry_run_answers_as_the_real_request_and_stores_nothing(admin: Kube, namespace: str) -> None:
    manifest = pod("dry", namespace, gpu_container(), labels=TRAINING)
    dry = admin.create(manifest, dry_run="All")
    assert_mutated_once(dry, "gpu-training", 50000)
    assert admin.list("v1", "Pod", namespace) == []
    real = admin.create(manifest)
    assert real["spec"] == dry["spec"]


def test_a_dry_run_of_a_refused_pod_is_refused_with_the_same_message(admin: Kube, namespace: str) -> None:
    fractional = pod("half", namespace, gpu_container(gpus="500m"))
    with pytest.raises(Refused) as dry:
        admin.create(fractional, dry_run="All")
    with pytest.raises(Refused) as real:
        admin.create(fractional)
    assert dry.value.message == real.value.message
    assert admin.list("v1", "Pod", namespace) == []
