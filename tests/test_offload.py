"""The split between compiled policies and the webhook (webhook.policy.offload), and the engine
skipping what compiled policies run (``serve --compiled``)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from tests.support import POLICIES, shipped_policies
from webhook.policy import engine, loader, offload
from webhook.policy.request import Request
from webhook.server.policies import OFFLOAD_RECORD, PolicyStore
from webhook.view.snapshot import EMPTY_VIEW, SnapshotView

SHAPE = """
apiVersion: gpu-admission.io/v1alpha1
kind: GPUPolicy
metadata: {name: shape}
spec:
  match: {kinds: ["*"]}
  rules:
    resourceShape: {mode: enforce, nodeCapacity: true}
"""


def _pod(gpus: object, *, claims: bool = False) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "c", "image": "x", "resources": {"limits": {"nvidia.com/gpu": gpus}}}]}
    if claims:
        spec["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "ml"}, "spec": spec}


def _shape_policies(version: str = "1.36") -> loader.PolicySet:
    policies = loader.load_text(SHAPE)
    found, stale = offload.offload(policies, offload.record(policies, offload.kube_version(version)))
    assert stale == []
    return loader.offloaded(policies, found)


def _messages(policies: loader.PolicySet, obj: dict[str, Any], view: Any = EMPTY_VIEW) -> str:
    return engine.evaluate(policies, Request.for_object(obj), view, "validate").message()


def test_kube_versions_are_read_and_older_ones_refused() -> None:
    assert offload.kube_version("1.36") == (1, 36)
    assert offload.kube_version("v1.33.3") == (1, 33)
    for text in ("1.29", "one", "1"):
        with pytest.raises(ValueError):
            offload.kube_version(text)


def test_shipped_policies_compile_validations_on_1_33_and_mutations_wait_for_1_36() -> None:
    rows = {(r.policy, r.rule): r for r in offload.coverage(shipped_policies(), (1, 33))}
    shape = rows[("gpu-validations", "resourceShape")]
    assert shape.status == "partly" and shape.webhook == "rest"
    assert [p.what for p in shape.left_parts()] == ["more GPUs than the largest node, or than the node spec.nodeName names"]
    assert rows[("gpu-defaults", "tolerations")].status == "webhook"
    assert "1.36" in rows[("gpu-defaults", "tolerations")].left_parts()[0].why
    for rule in ("quota", "cudaDriver", "draClaims"):
        assert rows[("gpu-validations", rule)].webhook == "all"
    assert rows[("gpu-validations", "quota")].status == "off"


def test_a_mutation_in_warn_mode_stays_on_the_webhook() -> None:
    policies = loader.load_text(SHAPE.replace("resourceShape: {mode: enforce, nodeCapacity: true}",
                                              "tolerations: {mode: warn}"))
    (row,) = offload.coverage(policies, (1, 36))
    assert row.status == "webhook" and row.webhook == "all"
    assert "cannot warn" in row.left_parts()[0].why


def test_the_share_counts_the_parts_of_rules_that_run() -> None:
    rows = offload.coverage(shipped_policies(), (1, 33))
    done, total = offload.share(rows)
    assert done == sum(len(r.compiled_parts()) for r in rows if r.mode != "off") and 0 < done < total


def test_kinds_whose_paths_need_two_wildcards_are_left_to_the_webhook() -> None:
    policies = loader.load_text(SHAPE + """---
apiVersion: gpu-admission.io/v1alpha1
kind: GPUWorkloadKind
metadata: {name: nested}
spec: {group: example.com, kind: Nested, podTemplates: [/spec/groups/*/members/*/template]}
""")
    kinds = offload.compilable_kinds(policies)
    assert ("apps", "Deployment") in kinds and ("example.com", "Nested") not in kinds


def test_the_webhook_skips_compiled_parts_and_keeps_the_rest() -> None:
    plain, slimmed = loader.load_text(SHAPE), _shape_policies()
    assert "a fraction" in _messages(plain, _pod("0.5"))
    assert _messages(slimmed, _pod("0.5")) == ""  # the ValidatingAdmissionPolicy says it
    # what stays: more GPUs than the largest node, which needs the nodes
    nodes = SnapshotView.from_objects([{"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n"},
                                        "status": {"allocatable": {"nvidia.com/gpu": "4"}}}])
    assert "more than any node offers" in _messages(slimmed, _pod("16"), nodes)


def test_pod_specs_with_dra_claims_are_judged_whole_by_the_webhook() -> None:
    assert "a fraction" in _messages(_shape_policies(), _pod("0.5", claims=True))


@pytest.mark.parametrize("gpus", ["0.9999999999", "1.5Gi", "0.5" + "0" * 10])
def test_pod_specs_with_gpu_quantities_cel_cannot_judge_are_judged_whole_by_the_webhook(gpus: str) -> None:
    # #43 item 3: outside quantity.PLAIN, CEL's isInteger() is false for whole and fractional values
    # alike; the compiled policies leave such a pod spec to the webhook, which judges all of it
    plain, slimmed = loader.load_text(SHAPE), _shape_policies()
    assert _messages(slimmed, _pod(gpus)) == _messages(plain, _pod(gpus))  # (a fraction, or nothing)
    assert offload.left_to_webhook(_pod(gpus)["spec"], plain.any_gpu)
    assert not offload.left_to_webhook(_pod("0.5")["spec"], plain.any_gpu)  # PLAIN: the compiled policy says it


@pytest.mark.parametrize("gpus", [1e100, 10**50, 2**63, 2**64, 1e-300])
def test_gpu_counts_as_json_numbers_cel_cannot_judge_are_judged_whole_by_the_webhook(gpus: object) -> None:
    # a custom resource's pod template may give a GPU count as a JSON number: 1e100 passed the compiled
    # policy (to CEL a double is a valid, whole quantity) and the slimmed webhook, which left it to CEL
    plain, slimmed = loader.load_text(SHAPE), _shape_policies()
    nodes = SnapshotView.from_objects([{"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n"},
                                        "status": {"allocatable": {"nvidia.com/gpu": "8"}}}])
    assert offload.left_to_webhook(_pod(gpus)["spec"], plain.any_gpu)
    # no quantity, or more than any node offers
    assert _messages(slimmed, _pod(gpus), nodes) == _messages(plain, _pod(gpus), nodes) != ""
    for judged in (2, 1.5, 1500000.0):  # the compiled policy judges these alike
        assert not offload.left_to_webhook(_pod(judged)["spec"], plain.any_gpu)


def test_a_policy_changed_since_it_was_compiled_runs_whole() -> None:
    policies = loader.load_text(SHAPE)
    stated = offload.record(policies, (1, 36))
    changed = loader.load_text(SHAPE.replace("nodeCapacity: true", "nodeCapacity: false"))
    found, stale = offload.offload(changed, stated)
    assert stale == ["shape"] and found.webhook == {}
    assert "a fraction" in _messages(loader.offloaded(changed, found), _pod("0.5"))


def _reload_if_changed(store: PolicyStore) -> bool | None:
    """What the server's reload check does (in a worker thread, then on the loop): True, reloaded;
    False, the change was refused; None, nothing (yet) to load."""
    change = store.read_change()
    return None if change is None else store.use(change)


def test_the_server_reads_the_compiled_record_and_runs_everything_without_one(tmp_path: Path) -> None:
    policies, compiled = tmp_path / "policies", tmp_path / "compiled"
    policies.mkdir()
    compiled.mkdir()
    (policies / "shape.yaml").write_text(SHAPE)
    store = PolicyStore(policies, compiled)
    assert store.current.offload is None  # no record: nothing is skipped
    assert "a fraction" in _messages(store.current, _pod("0.5"))
    (compiled / OFFLOAD_RECORD).write_text(json.dumps(offload.record(loader.load_directory(policies), (1, 36))))
    _reload_if_changed(store)  # (a change is loaded once it has stayed put between two checks)
    assert _reload_if_changed(store) is True
    assert store.current.offload is not None and _messages(store.current, _pod("0.5")) == ""
    (compiled / OFFLOAD_RECORD).write_text("{not json")
    _reload_if_changed(store)
    assert _reload_if_changed(store) is True
    assert store.current.offload is None


def test_digests_follow_what_the_compiled_form_depends_on() -> None:
    policies = loader.load_directory(POLICIES)
    assert offload.digest(policies, "gpu-defaults") == offload.digest(loader.load_directory(POLICIES), "gpu-defaults")
    assert offload.digest(policies, "gpu-defaults") != offload.digest(policies, "gpu-validations")


def test_node_affinity_with_two_requirements_on_one_key_stays_on_the_webhook() -> None:
    """Each requirement's merge would see the other's: what the compiled patch does not model."""
    one_key = loader.load_text(SHAPE.replace("resourceShape: {mode: enforce, nodeCapacity: true}", """nodeAffinity:
      required: [{key: zone, operator: In, values: [a, b]}]
      byResource: [{resources: ["nvidia.com/mig-*"], required: [{key: zone, operator: NotIn, values: [c]}]}]"""))
    (row,) = offload.coverage(one_key, (1, 36))
    assert row.status == "webhook" and "one key" in row.left_parts()[0].why
    two_keys = loader.load_text(SHAPE.replace("resourceShape: {mode: enforce, nodeCapacity: true}", """nodeAffinity:
      required: [{key: zone, operator: In, values: [a, b]}]"""))
    (row,) = offload.coverage(two_keys, (1, 36))
    assert row.status == "compiled" and row.webhook == "none"


def _deployment(gpus: str, *, claims: bool) -> dict[str, Any]:
    pod = _pod(gpus, claims=claims)
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d", "namespace": "ml"},
            "spec": {"selector": {}, "template": {"metadata": {}, "spec": pod["spec"]}}}


@pytest.mark.parametrize("claims_before", [False, True])
def test_an_update_moving_a_pod_spec_to_the_webhook_forgives_what_the_old_one_had(claims_before: bool) -> None:
    # #43 item 3: claims added, the webhook judges the new pod spec whole, and forgives a refusal
    # the old spec earned although compiled policies judged that one (its old findings are whole)
    slimmed = _shape_policies()
    update = replace(Request.for_object(_deployment("0.5", claims=True), operation="UPDATE"),
                     old_object=_deployment("0.5", claims=claims_before))
    decision = engine.evaluate(slimmed, update, EMPTY_VIEW, "validate")
    assert decision.allowed and any("a fraction" in w and "already so before this update" in w for w in decision.warnings)


def test_custom_kinds_are_mutated_by_the_webhook_and_built_in_ones_by_the_compiled_policy() -> None:
    # #43 item 6: kube-apiserver's MutatingAdmissionPolicy refuses a kind it has no schema of yet (a
    # CRD installed seconds before), so the compiled mutations reach built-in kinds only
    policy = SHAPE.replace("resourceShape: {mode: enforce, nodeCapacity: true}", "tolerations: {}")
    plain = loader.load_text(policy + "---\n" + (POLICIES / "workload-kinds.yaml").read_text())
    found, _ = offload.offload(plain, offload.record(plain, offload.kube_version("1.36")))
    slimmed = loader.offloaded(plain, found)
    template = {"spec": _pod("1")["spec"]}
    job = {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": "j", "namespace": "ml"},
           "spec": {"pytorchReplicaSpecs": {"Worker": {"replicas": 1, "template": template}}}}
    deployment = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d", "namespace": "ml"},
                  "spec": {"selector": {}, "template": template}}

    def changed(policies: loader.PolicySet, obj: dict[str, Any]) -> set[str]:
        return {rule for _, rule, _ in engine.evaluate(policies, Request.for_object(obj), EMPTY_VIEW, "mutate").changes}

    assert "tolerations" in changed(plain, job) and changed(slimmed, job) == changed(plain, job)
    assert "tolerations" in changed(plain, deployment) and "tolerations" not in changed(slimmed, deployment)
    assert offload.built_in("apps") and offload.built_in("") and not offload.built_in("kubeflow.org")
