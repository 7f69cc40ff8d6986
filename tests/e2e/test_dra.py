"""GPUs through Dynamic Resource Allocation, through the real kube-apiserver.

resource.k8s.io/v1 is served without any driver: the tests create the
DeviceClass NVIDIA's DRA driver installs, the ResourceClaimTemplates, and
the pods naming them, as a user would (no scheduler or resourceclaim
controller runs, so nothing is allocated; admission is what is under test).
The templates follow NVIDIA's quickstart specs (corpus/manifests/
NVIDIA__k8s-dra-driver__demo__specs__quickstart__gpu-test-{mps,mig}.yaml),
in the v1 shape.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from tests.e2e.admission import Admission
from tests.e2e.apiserver import ApiServer
from tests.e2e.conftest import ALLOW_CLASSES, OPT_IN
from tests.e2e.fixtures import QUOTA_LABEL, RESERVE_LABEL, register_node, wait_for_view
from tests.e2e.kube import Kube, Object, Refused, eventually

DENIED = 'admission webhook "validate.gpu-admission.io" denied the request'
V1 = "resource.k8s.io/v1"
GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}


@pytest.fixture(autouse=True)
def _dra_served(apiserver: ApiServer) -> None:
    major, minor = (int(p) for p in apiserver.version.split(".")[:2])
    if (major, minor) < (1, 34):
        pytest.skip(f"kube-apiserver {apiserver.version} does not serve resource.k8s.io/v1 (1.34 and later do); "
                    "gpu-admission reads DRA objects through v1 only")


@pytest.fixture
def device_class(admin: Kube) -> Iterator[Object]:
    """NVIDIA's gpu.nvidia.com class (deployments/helm/…/deviceclass-gpu.yaml), as its chart installs it."""
    stored = admin.ensure({
        "apiVersion": V1, "kind": "DeviceClass", "metadata": {"name": "gpu.nvidia.com"},
        "spec": {"selectors": [{"cel": {"expression":
                 "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'"}}]},
    })
    yield stored


def template(name: str, namespace: str, **exactly: Any) -> Object:
    return {
        "apiVersion": V1, "kind": "ResourceClaimTemplate", "metadata": {"name": name, "namespace": namespace},
        "spec": {"spec": {"devices": {"requests": [
            {"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com", **exactly}}]}}},
    }


def dra_pod(name: str, namespace: str, template_name: str) -> Object:
    return {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "containers": [
                {"name": "train", "image": "nvcr.io/nvidia/pytorch:24.05-py3",
                 "resources": {"claims": [{"name": "gpu"}], "limits": {"memory": "8Gi"}}},
                {"name": "logs", "image": "busybox"},
            ],
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": template_name}],
        },
    }


def _store_template(admin: Kube, admission: Admission, obj: Object) -> Object:
    stored = admin.create(obj)
    wait_for_view(admin, admission, "resourceclaimtemplates", V1, "ResourceClaimTemplate")
    return stored


def test_a_dra_gpu_pod_is_mutated_and_stored(
    admin: Kube, admission: Admission, namespace: str, device_class: Object
) -> None:
    _store_template(admin, admission, template("one-gpu", namespace))
    stored = admin.create(dra_pod("trainer", namespace, "one-gpu"))
    spec = stored["spec"]
    assert spec["tolerations"].count(GPU_TOLERATION) == 1, spec["tolerations"]
    train, logs = spec["containers"]
    assert [m["mountPath"] for m in train["volumeMounts"]] == ["/dev/shm"]
    assert train["securityContext"]["allowPrivilegeEscalation"] is False
    # the sidecar without the claim is kept from seeing the node's GPUs
    assert {"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"} in logs["env"]
    # GPUs from claims only: the DRA driver injects them through CDI, no runtime class is set
    assert "runtimeClassName" not in spec
    assert "gpu-admission.io/mutated" in stored["metadata"]["annotations"]
    assert spec["resourceClaims"] == [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}]
    assert admin.get("v1", "Pod", "trainer", namespace)["spec"] == spec


def test_an_allocation_mode_all_template_is_refused(admin: Kube, namespace: str, device_class: Object) -> None:
    with pytest.raises(Refused) as refused:
        admin.create(template("every-gpu", namespace, allocationMode="All"))
    assert DENIED in refused.value.message
    assert "allocationMode All takes every gpu.nvidia.com device" in refused.value.message, refused.value.message
    assert admin.list(V1, "ResourceClaimTemplate", namespace) == []
    admin.create(template("two-gpus", namespace, count=2))  # a count is fine


@pytest.mark.parametrize("namespace", [{QUOTA_LABEL: "on"}], indirect=True)  # e2e-quota: 2 GPUs a namespace
def test_a_dra_pod_over_a_quota_cap_is_refused(
    admin: Kube, admission: Admission, namespace: str, device_class: Object
) -> None:
    _store_template(admin, admission, template("two-gpus", namespace, count=2))
    before = admission.view_count("pods")
    admin.create(dra_pod("first", namespace, "two-gpus"))
    eventually(lambda: admission.view_count("pods") == before + 1, what="the cluster view holding pod first")
    with pytest.raises(Refused) as refused:
        admin.create(dra_pod("second", namespace, "two-gpus"))
    assert DENIED in refused.value.message
    assert f"namespace {namespace} uses 2 of 2 nvidia.com/gpu" in refused.value.message, refused.value.message
    assert [p["metadata"]["name"] for p in admin.list("v1", "Pod", namespace)] == ["first"]


def _dra_node(name: str, pool: str) -> Object:
    """A node whose GPUs NVIDIA's DRA driver hands out: no GPU Feature Discovery labels, no nvidia.com/gpu."""
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, "e2e-pool": pool}},
            "status": {"capacity": {"cpu": "64", "memory": "256Gi", "pods": "110"},
                       "allocatable": {"cpu": "64", "memory": "256Gi", "pods": "110"}}}


def _gpu_slice(node: str, driver_version: str, gpus: int) -> Object:
    """What NVIDIA's gpu-kubelet-plugin publishes for a node's GPUs (driverVersion a semver)."""
    devices = [{"name": f"gpu-{i}", "attributes": {
        "type": {"string": "gpu"}, "productName": {"string": "NVIDIA GeForce RTX 4090"},
        "driverVersion": {"version": driver_version}}} for i in range(gpus)]
    return {"apiVersion": V1, "kind": "ResourceSlice", "metadata": {"name": f"{node}-gpu.nvidia.com"},
            "spec": {"driver": "gpu.nvidia.com", "nodeName": node,
                     "pool": {"name": node, "generation": 1, "resourceSliceCount": 1}, "devices": devices}}


def test_a_dra_pod_is_checked_against_the_driver_its_nodes_devices_report(
    admin: Kube, admission: Admission, namespace: str, device_class: Object
) -> None:
    """Nodes without GFD labels: the driver version comes from their ResourceSlices, as the server's
    watch delivers them; a node publishing no GPU (a CPU node of the pool) is not where the pod could run."""
    pool = f"dra-{uuid.uuid4().hex[:6]}"
    for name in (f"{pool}-gpu", f"{pool}-cpu"):
        register_node(admin, admission, _dra_node(name, pool), ready=True)
    admin.create(_gpu_slice(f"{pool}-gpu", "535.104.5", gpus=2))
    wait_for_view(admin, admission, "resourceslices", V1, "ResourceSlice")
    _store_template(admin, admission, template("one-gpu", namespace))
    newer = dra_pod("cuda-12-4", namespace, "one-gpu")
    newer["spec"]["containers"][0]["image"] = "nvidia/cuda:12.4.1-runtime-ubuntu22.04"  # needs >= 550.54.15
    newer["spec"]["nodeSelector"] = {"e2e-pool": pool}
    with pytest.raises(Refused) as refused:
        admin.create(newer)
    assert DENIED in refused.value.message
    assert "the newest driver on the 1 node(s) it could land on is 535.104.5" in refused.value.message, refused.value.message
    # the driver is upgraded: the plugin republishes its slice, and the same pod is admitted
    stored_slice = admin.get(V1, "ResourceSlice", f"{pool}-gpu-gpu.nvidia.com")
    upgraded = _gpu_slice(f"{pool}-gpu", "550.54.15", gpus=2)
    admin.patch(stored_slice, {"spec": {"devices": upgraded["spec"]["devices"]}},
                content_type="application/merge-patch+json")
    eventually(lambda: _admitted(admin, newer), what="the pod admitted once the slice reports driver 550.54.15")


def _admitted(admin: Kube, pod: Object) -> bool:
    try:
        admin.create(pod, dry_run="All")
    except Refused:
        return False
    return True


def _claim(name: str, namespace: str, count: int) -> Object:
    return {"apiVersion": V1, "kind": "ResourceClaim", "metadata": {"name": name, "namespace": namespace},
            "spec": {"devices": {"requests": [
                {"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": count}}]}}}


def _ahead(name: str, namespace: str, template_name: str) -> Object:
    """A DRA pod created before its template, its GPU toleration written by hand (issue #42 row 2)."""
    obj = dra_pod(name, namespace, template_name)
    obj["spec"]["tolerations"] = [GPU_TOLERATION]
    return obj


@pytest.mark.parametrize("namespace", [{QUOTA_LABEL: "on"}], indirect=True)  # e2e-quota: 2 GPUs a namespace
def test_pods_ahead_of_their_template_and_a_late_template_cannot_pass_the_cap(
    admin: Kube, admission: Admission, namespace: str, device_class: Object
) -> None:
    """Pods naming a template that does not exist yet, then an 8-GPU template (and claim): refused, so
    nothing can be allocated past the cap of 2. A namespace under a larger cap (64) takes the same
    template and pods."""
    _store_template(admin, admission, template("one-gpu", namespace))  # the view knows the namespace's templates
    for name in ("ahead-1", "ahead-2"):
        with pytest.raises(Refused) as refused:
            admin.create(_ahead(name, namespace, "eight-gpus"))
        assert DENIED in refused.value.message
        assert f"ResourceClaimTemplate {namespace}/eight-gpus does not exist" in refused.value.message, \
            refused.value.message
    for late in (template("eight-gpus", namespace, count=8), _claim("eight-gpus", namespace, 8)):
        with pytest.raises(Refused) as refused:
            admin.create(late)
        assert "asks for 8 nvidia.com/gpu devices, more than the GPU cap of 2" in refused.value.message, \
            refused.value.message
    assert admin.list("v1", "Pod", namespace) == []
    assert admin.list(V1, "ResourceClaim", namespace) == []
    assert [t["metadata"]["name"] for t in admin.list(V1, "ResourceClaimTemplate", namespace)] == ["one-gpu"]

    # the control: under 64 GPUs the template comes first and both pods are admitted
    roomy = f"e2e-{uuid.uuid4().hex[:8]}"
    admin.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": roomy, "labels": {
        OPT_IN: "true", **ALLOW_CLASSES, RESERVE_LABEL: "on"}}})
    # a node publishing 8 GPUs (another test's pool may publish fewer: the pods must fit one node)
    pool = f"dra-{uuid.uuid4().hex[:6]}"
    register_node(admin, admission, _dra_node(f"{pool}-gpu", pool), ready=True)
    admin.create(_gpu_slice(f"{pool}-gpu", "570.124.6", gpus=8))
    wait_for_view(admin, admission, "resourceslices", V1, "ResourceSlice")
    try:
        _store_template(admin, admission, template("eight-gpus", roomy, count=8))
        eventually(lambda: _admitted(admin, _ahead("first", roomy, "eight-gpus")), what="the template in the view")
        for name in ("first", "second"):
            admin.create(_ahead(name, roomy, "eight-gpus"))
        assert sorted(p["metadata"]["name"] for p in admin.list("v1", "Pod", roomy)) == ["first", "second"]
    finally:
        admin.delete({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": roomy}})
        admin.delete({"apiVersion": V1, "kind": "ResourceSlice", "metadata": {"name": f"{pool}-gpu-gpu.nvidia.com"}})
        admin.delete({"apiVersion": "v1", "kind": "Node", "metadata": {"name": f"{pool}-gpu"}})
