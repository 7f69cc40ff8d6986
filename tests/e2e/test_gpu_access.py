"""Issue #42 through a real kube-apiserver: a tenant with `edit` and the debugging grant in an
opted-in namespace gets no GPU without requesting one (policies/gpu-access-guard.yaml)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.apiserver import ApiServer
from tests.e2e.fixtures import gpu_container, pod
from tests.e2e.kube import Kube, Object, Refused, eventually

USER = "e2e-tenant"
OURS = "[gpu-access-guard/gpuAccess]"
ALL_GPUS = [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]


@pytest.fixture
def tenant(admin: Kube, apiserver: ApiServer, namespace: str, tmp_path: Path) -> Iterator[Kube]:
    """The namespace's user: the built-in edit rules (those it aggregates: this apiserver runs no
    aggregation controller), and pods/ephemeralcontainers (kubectl debug)."""
    for role in ("edit", "view"):
        admin.create({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": f"tenant-{role}", "namespace": namespace},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                        "name": f"system:aggregate-to-{role}"},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": USER}],
        })
    admin.create({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
        "metadata": {"name": "debug", "namespace": namespace},
        "rules": [{"apiGroups": [""], "resources": ["pods/ephemeralcontainers"], "verbs": ["get", "update", "patch"]}],
    })
    admin.create({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": "tenant-debug", "namespace": namespace},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "debug"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": USER}],
    })
    user = Kube(apiserver.kubeconfig(tmp_path / "tenant.kubeconfig", f"{USER}-token"))
    eventually(lambda: _can_list(user, namespace), what="the tenant's grants taking effect")
    try:
        yield user
    finally:
        user.close()


def _can_list(user: Kube, namespace: str) -> bool:
    try:
        user.list("v1", "Pod", namespace)
    except Refused:
        return False
    return True


def _refused(create: object, *texts: str) -> str:
    assert callable(create)
    with pytest.raises(Refused) as refused:
        create()
    for text in texts:
        assert text in refused.value.message, refused.value.message
    return refused.value.message


def _debug(user: Kube, stored: Object, **container: object) -> Object:
    body = {"spec": {"ephemeralContainers": [{"name": "debugger", "image": "busybox:1.36", "stdin": True,
                                              "tty": True, **container}]}}
    return user.patch(stored, body, content_type="application/strategic-merge-patch+json",
                      subresource="ephemeralcontainers")


def test_a_cpu_pod_with_the_gpu_runtime_class_and_every_gpu_is_refused(tenant: Kube, namespace: str) -> None:
    cpu = {"name": "c", "image": "nvidia/cuda:12.4.1-base-ubuntu22.04", "env": ALL_GPUS}
    _refused(lambda: tenant.create(pod("miner", namespace, cpu, runtimeClassName="nvidia")),
             OURS, "runtime class 'nvidia' hands GPUs to a pod that requests none",
             "NVIDIA_VISIBLE_DEVICES='all' hands it the node's GPUs")
    _refused(lambda: tenant.create(pod("rc", namespace, {"name": "c", "image": "busybox"}, runtimeClassName="nvidia")),
             OURS, "runtimeClassName")


def test_a_root_pod_mounting_the_gpu_device_from_the_node_is_refused(tenant: Kube, namespace: str) -> None:
    root = {"name": "c", "image": "busybox", "securityContext": {"runAsUser": 0},
            "volumeMounts": [{"name": "gpu0", "mountPath": "/dev/nvidia0"}]}
    volumes = [{"name": "gpu0", "hostPath": {"path": "/dev/nvidia0", "type": "CharDevice"}}]
    _refused(lambda: tenant.create(pod("devices", namespace, root, volumes=volumes)),
             OURS, "volume 'gpu0' mounts '/dev/nvidia0' from the node")
    privileged = {**root, "securityContext": {"runAsUser": 0, "privileged": True}}
    _refused(lambda: tenant.create(pod("devices", namespace, privileged, volumes=volumes)), OURS)


def test_a_privileged_one_gpu_pod_is_refused(tenant: Kube, namespace: str) -> None:
    greedy = {**gpu_container(), "securityContext": {"privileged": True}}
    _refused(lambda: tenant.create(pod("greedy", namespace, greedy)), OURS, "a privileged container sees every GPU")
    every = {**gpu_container(), "env": ALL_GPUS}
    _refused(lambda: tenant.create(pod("every", namespace, every)), OURS, "overrides the GPUs the device plugin allocated")


def test_debug_containers_reaching_gpus_are_refused_on_gpu_and_cpu_pods(tenant: Kube, namespace: str) -> None:
    gpu_pod = tenant.create(pod("train", namespace, gpu_container()))
    cpu_pod = tenant.create(pod("web", namespace, {"name": "c", "image": "nginx"}))
    for stored in (gpu_pod, cpu_pod):
        _refused(lambda: _debug(tenant, stored, env=ALL_GPUS), OURS, 'ephemeral container "debugger" (env[0])')
    _refused(lambda: _debug(tenant, gpu_pod, securityContext={"privileged": True}), OURS,
             "a privileged container sees every GPU")
    # the control: a plain debug container is added to both
    for stored in (gpu_pod, cpu_pod):
        updated = _debug(tenant, stored)
        assert [c["name"] for c in updated["spec"]["ephemeralContainers"]] == ["debugger"]


def test_ordinary_pods_are_stored(tenant: Kube, namespace: str) -> None:
    gpu = tenant.create(pod("train", namespace, gpu_container()))
    assert gpu["spec"]["runtimeClassName"] == "nvidia"  # set by gpu-defaults, for the pod that requests a GPU
    tenant.create(pod("web", namespace, {"name": "c", "image": "nginx", "env": [{"name": "PORT", "value": "80"}]}))
    sidecar = {"name": "proxy", "image": "envoyproxy/envoy:v1.30.0",
               "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}]}
    stored = tenant.create(pod("serve", namespace, gpu_container(), sidecar))
    assert [c["name"] for c in stored["spec"]["containers"]] == ["train", "proxy"]
