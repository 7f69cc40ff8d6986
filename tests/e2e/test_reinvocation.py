"""Another mutator after gpu-admission: kube-apiserver calls us again, and nothing is added twice."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e import sidecar_injector
from tests.e2e.apiserver import ApiServer
from tests.e2e.fixtures import gpu_container, pod
from tests.e2e.kube import Kube, Object, eventually
from tests.e2e.test_mutations import assert_mutated_once

MAP_LABEL = "e2e.gpu-admission.io/map-sidecar"


def _sidecar(stored: Object, name: str) -> Object:
    return next(c for c in stored["spec"]["containers"] if c["name"] == name)


def _assert_reinvoked(stored: Object, sidecar: str) -> None:
    """Every mutation once, and ours applied to the container added after our first call."""
    assert_mutated_once(stored, "gpu-training", 50000)
    names = [c["name"] for c in stored["spec"]["containers"]]
    assert names.count(sidecar) == 1, names
    added = _sidecar(stored, sidecar)
    assert {"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"} in added.get("env", [])


@pytest.fixture
def injector(admin: Kube, tmp_path: Path) -> Iterator[list[int]]:
    with sidecar_injector.running(tmp_path) as (url, ca_bundle, calls):
        config = sidecar_injector.configuration(url, ca_bundle)
        admin.create(config)
        try:
            yield calls
        finally:
            admin.delete(config)


def test_a_sidecar_injector_after_us_reinvokes_us_and_nothing_is_duplicated(
    admin: Kube, namespace: str, injector: list[int]
) -> None:
    labels = {"gpu-admission.io/workload-class": "training", sidecar_injector.SELECT_LABEL: "on"}
    probe = pod("probe", namespace, gpu_container(), labels=labels)
    eventually(lambda: any(c["name"] == sidecar_injector.SIDECAR["name"]
                           for c in admin.create(probe, dry_run="All")["spec"]["containers"]),
               what="the apiserver calling the injector")
    stored = admin.create(pod("train", namespace, gpu_container(), labels=labels))
    _assert_reinvoked(stored, str(sidecar_injector.SIDECAR["name"]))


def test_a_class_label_added_after_our_first_call_brings_the_class_and_its_priority(
    admin: Kube, namespace: str, injector: list[int]
) -> None:
    """We set the class on the reinvocation, after which no built-in plugin runs: the pod must not
    be stored without the class's priority (0, free to preempt) or be refused for it."""
    labels = {sidecar_injector.SELECT_LABEL: "on", sidecar_injector.CLASS_LABEL: "inference"}
    probe = pod("probe-class", namespace, gpu_container(), labels=labels)
    eventually(lambda: any(c["name"] == sidecar_injector.SIDECAR["name"]
                           for c in admin.create(probe, dry_run="All")["spec"]["containers"]),
               what="the apiserver calling the injector")
    stored = admin.create(pod("late-class", namespace, gpu_container(), labels=labels))
    assert stored["metadata"]["labels"]["gpu-admission.io/workload-class"] == "inference"
    spec = stored["spec"]
    assert spec["priorityClassName"] == "gpu-inference"
    assert (spec.get("priority"), spec.get("preemptionPolicy")) == (100000, "PreemptLowerPriority")


def _map_version(admin: Kube) -> str | None:
    found = {r.group_version for r in admin.dynamic.resources.search(kind="MutatingAdmissionPolicy")}
    for version in ("v1", "v1beta1", "v1alpha1"):
        if f"admissionregistration.k8s.io/{version}" in found:
            return f"admissionregistration.k8s.io/{version}"
    return None


def _mutating_admission_policy(api_version: str) -> list[Object]:
    sidecar = '{name: "map-sidecar", image: "busybox:1.36"}'
    return [
        {"apiVersion": api_version, "kind": "MutatingAdmissionPolicy", "metadata": {"name": "e2e-map-sidecar"},
         "spec": {
             "failurePolicy": "Fail", "reinvocationPolicy": "IfNeeded",
             "matchConstraints": {"resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"],
                                                     "operations": ["CREATE"], "resources": ["pods"]}]},
             "matchConditions": [{"name": "labelled", "expression":
                                  f"has(object.metadata.labels) && '{MAP_LABEL}' in object.metadata.labels"}],
             "mutations": [{"patchType": "JSONPatch", "jsonPatch": {"expression":
                            "object.spec.containers.exists(c, c.name == 'map-sidecar') ? [] : "
                            "[JSONPatch{op: 'add', path: '/spec/containers/-', "
                            f"value: Object.spec.containers{sidecar}}}]"}}],
         }},
        {"apiVersion": api_version, "kind": "MutatingAdmissionPolicyBinding", "metadata": {"name": "e2e-map-sidecar"},
         "spec": {"policyName": "e2e-map-sidecar"}},
    ]


def test_a_mutating_admission_policy_and_us_settle_with_every_mutation_once(
    admin: Kube, namespace: str, apiserver: ApiServer
) -> None:
    api_version = _map_version(admin)
    if api_version is None:
        pytest.skip(f"kube-apiserver {apiserver.version} serves no MutatingAdmissionPolicy")
    objects = _mutating_admission_policy(api_version)
    for obj in objects:
        admin.create(obj)
    try:
        labels: dict[str, Any] = {"gpu-admission.io/workload-class": "training", MAP_LABEL: "on"}
        probe = pod("probe", namespace, gpu_container(), labels=labels)
        eventually(lambda: any(c["name"] == "map-sidecar"
                               for c in admin.create(probe, dry_run="All")["spec"]["containers"]),
                   what="the apiserver applying the MutatingAdmissionPolicy")
        stored = admin.create(pod("train", namespace, gpu_container(), labels=labels))
        _assert_reinvoked(stored, "map-sidecar")
    finally:
        for obj in reversed(objects):
            admin.delete(obj)
