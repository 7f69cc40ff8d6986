"""A GPUPolicyException lifts the rules it names for the objects it names, through the apiserver."""

from __future__ import annotations

import pytest

from tests.e2e.apiserver import ApiServer
from tests.e2e.fixtures import EXEMPT_PREFIX, deployment, pod
from tests.e2e.kube import Kube, Refused, eventually

DENIED = 'admission webhook "validate.gpu-admission.io" denied the request'
#: a MIG profile no GPU has: kube-apiserver stores it, the resourceShape rule refuses it
BAD_MIG = {"name": "c", "image": "x", "resources": {"limits": {"nvidia.com/mig-9g.99gb": 1}}}


def test_a_named_pod_skips_the_lifted_rule_and_others_do_not(admin: Kube, apiserver: ApiServer, namespace: str) -> None:
    stored = admin.create(pod(f"{EXEMPT_PREFIX}mig", namespace, BAD_MIG))
    assert stored["metadata"]["name"] == f"{EXEMPT_PREFIX}mig"
    # the rules the exception does not lift still ran: the mutations are there
    assert stored["spec"]["runtimeClassName"] == "nvidia"
    # and the request's audit event says which exception let it through
    event = eventually(lambda: apiserver.create_event(namespace, f"{EXEMPT_PREFIX}mig"), what="the pod's audit event")
    assert (event.get("annotations") or {}).get("validate.gpu-admission.io/exceptions") == "e2e-exempt-shape", event
    with pytest.raises(Refused) as refused:
        admin.create(pod("other-mig", namespace, BAD_MIG))
    assert DENIED in refused.value.message and "mig-9g.99gb" in refused.value.message


def test_a_generated_name_is_matched_by_its_prefix(admin: Kube, namespace: str) -> None:
    # kube-apiserver calls the mutating webhook with generateName only and makes the name before
    # the validating one, as for every pod a controller creates: both see it named by exempt-*
    generated = pod("", namespace, BAD_MIG)
    del generated["metadata"]["name"]
    generated["metadata"]["generateName"] = f"{EXEMPT_PREFIX}worker-"
    stored = admin.create(generated)
    assert stored["metadata"]["name"].startswith(f"{EXEMPT_PREFIX}worker-")
    generated["metadata"]["generateName"] = "worker-"
    with pytest.raises(Refused) as refused:
        admin.create(generated)
    assert DENIED in refused.value.message


def test_an_exception_for_pods_leaves_a_workload_of_the_same_name_checked(admin: Kube, namespace: str) -> None:
    with pytest.raises(Refused) as refused:
        admin.create(deployment(f"{EXEMPT_PREFIX}serve", namespace, BAD_MIG))
    assert DENIED in refused.value.message
    assert admin.list("apps/v1", "Deployment", namespace) == []
