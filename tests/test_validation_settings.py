"""Validation rule settings are checked at load time, with the field path in the message."""

from __future__ import annotations

import pytest

from webhook.errors import PolicyError
from webhook.policy import loader

BASE = """\
apiVersion: gpu-admission.io/v1alpha1
kind: GPUPolicy
metadata: {name: p}
spec:
  rules:
"""


@pytest.mark.parametrize(
    ("rules", "expected"),
    [
        ("resourceShape: {maxPerPod: -1}", "spec.rules.resourceShape.maxPerPod.all: Input should be greater than or equal to 0"),
        ("resourceShape: {maxPerPod: {'bad name': 1}}", "maxPerPod.by-resource.bad name.[key]: Value error, 'bad name' is not a resource name"),
        ("resourceShape: {initOnly: block}", "spec.rules.resourceShape.initOnly: Input should be 'allow', 'warn' or 'deny'"),
        ("resourceShape: {sharingSchemes: {resources: ['a b']}}", "sharingSchemes.resources[0]: Value error, 'a b' is not a resource name"),
        ("quota: {limits: [{max: -1}]}", "spec.rules.quota.limits[0].max: Input should be greater than or equal to 0"),
        ("quota: {limits: [{scope: cluster, max: 1}]}", "spec.rules.quota.limits[0].scope: Input should be 'namespace' or 'team'"),
        ("quota: {limits: [{namespaces: [a]}]}", "spec.rules.quota.limits[0].max: Field required"),
        ("quota: {clusterUnavailable: ignore}", "spec.rules.quota.clusterUnavailable: Input should be 'fail-open' or 'fail-closed'"),
        ("cudaDriver: {compatibility: forward}", "spec.rules.cudaDriver.compatibility: Input should be 'strict' or 'minor-version'"),
        ("cudaDriver: {images: [{image: x, cuda: twelve}]}", "cudaDriver.images[0].cuda: Value error, 'twelve' is not a CUDA version"),
        ("cudaDriver: {minDrivers: {'12.x': '550'}}", "minDrivers: '12.x': '550' must map a CUDA version to a driver version"),
        ("cudaDriver: {forwardCompat: {mode: always}}", "spec.rules.cudaDriver.forwardCompat.mode: Input should be 'auto' or 'off'"),
        ("cudaDriver: {partial: steer, steer: true}", "spec.rules.cudaDriver.steer: Extra inputs are not permitted"),
        # an empty class would be no class for the engine and '' for the compiled policies
        ("priorityClass: {classes: {inference: ''}}", "spec.rules.priorityClass.classes.inference: String should have at least 1 character"),
        ("priorityClass: {userChoice: {ownClass: everywhere}}", "priorityClass.userChoice.ownClass: Input should be 'anywhere' or 'allowed-namespaces'"),
    ],
)
def test_bad_settings_are_refused_with_their_path(rules: str, expected: str) -> None:
    with pytest.raises(PolicyError) as caught:
        loader.load_text(BASE + "    " + rules + "\n")
    assert any(expected in problem for problem in caught.value.problems), caught.value.problems


def test_both_forms_of_max_per_pod() -> None:
    for value, expected in (("8", 8), ("{nvidia.com/gpu: 8, 'nvidia.com/mig-*': 2}", {"nvidia.com/gpu": 8, "nvidia.com/mig-*": 2})):
        policy = loader.load_text(BASE + f"    resourceShape: {{maxPerPod: {value}}}\n").policies[0]
        assert policy.spec.rules.resourceShape is not None
        assert policy.spec.rules.resourceShape.maxPerPod == expected
