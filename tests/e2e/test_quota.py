"""GPU caps and native ResourceQuotas, with GPU pods actually stored."""

from __future__ import annotations

import pytest

from tests.e2e.admission import Admission
from tests.e2e.fixtures import QUOTA_LABEL, gpu_container, native_quota, pod
from tests.e2e.kube import Kube, Refused, eventually

DENIED = 'admission webhook "validate.gpu-admission.io" denied the request'


def _store(admin: Kube, admission: Admission, namespace: str, name: str) -> None:
    # the view holds GPU pods only: wait for it to hold one more
    before = admission.view_count("pods")
    admin.create(pod(name, namespace, gpu_container()))
    eventually(lambda: admission.view_count("pods") == before + 1, what=f"the cluster view holding pod {name}")


@pytest.mark.parametrize("namespace", [{QUOTA_LABEL: "on"}], indirect=True)
def test_a_namespace_cap_lets_pods_in_up_to_it_and_refuses_the_next(
    admin: Kube, admission: Admission, namespace: str
) -> None:
    _store(admin, admission, namespace, "first")
    _store(admin, admission, namespace, "second")
    with pytest.raises(Refused) as refused:
        admin.create(pod("third", namespace, gpu_container()))
    assert DENIED in refused.value.message
    assert f"namespace {namespace} uses 2 of 2 nvidia.com/gpu" in refused.value.message, refused.value.message
    assert sorted(p["metadata"]["name"] for p in admin.list("v1", "Pod", namespace)) == ["first", "second"]


@pytest.mark.parametrize("namespace", [{QUOTA_LABEL: "on"}], indirect=True)  # the policy with quota on
def test_a_native_resource_quota_is_refused_with_a_readable_message(
    admin: Kube, admission: Admission, namespace: str
) -> None:
    native_quota(admin, admission, namespace, 1)
    _store(admin, admission, namespace, "first")
    used = admin.get("v1", "ResourceQuota", "gpus", namespace)["status"]["used"]
    assert used == {"requests.nvidia.com/gpu": "1"}  # counted by the ResourceQuota plugin
    with pytest.raises(Refused) as refused:
        admin.create(pod("second", namespace, gpu_container()))
    assert DENIED in refused.value.message and "ResourceQuota" in refused.value.message, refused.value.message
