"""GPUPolicyException: the rules it lifts, for the objects it names, and nothing else."""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import StartWebhook
from tests.support import POLICIES, REVIEWS, apply_patch, load_review
from webhook import cli, review
from webhook.errors import PolicyError
from webhook.policy import engine, loader
from webhook.policy.decision import Decision
from webhook.policy.loader import PolicySet
from webhook.policy.request import Phase, Request
from webhook.policy.view import EMPTY_VIEW

#: the corpus training pod: Pod cap/trainer, one container with 4 GPUs
TRAINER = load_review(REVIEWS / "000_mutate_create_pods_.json")["request"]["object"]


def exception(match: str, exceptions: str = "[{policy: gpu-defaults, rules: [securityContext]}]", name: str = "ex") -> str:
    return (
        f"apiVersion: gpu-admission.io/v1alpha1\nkind: GPUPolicyException\nmetadata: {{name: {name}}}\n"
        f"spec:\n  exceptions: {exceptions}\n  match: {match}\n"
    )


def policies_with(tmp_path: Path, *documents: str) -> PolicySet:
    directory = tmp_path / "policies"
    shutil.copytree(POLICIES, directory)
    (directory / "exceptions.yaml").write_text("---\n".join(documents))
    return loader.load_directory(directory)


def problems_of(tmp_path: Path, *documents: str) -> list[str]:
    with pytest.raises(PolicyError) as caught:
        policies_with(tmp_path, *documents)
    return caught.value.problems


def decide(policies: PolicySet, obj: dict[str, Any], phase: Phase = "mutate") -> Decision:
    return engine.evaluate(policies, Request.for_object(obj), EMPTY_VIEW, phase)


def changed_paths(decision: Decision) -> set[str]:
    return {op["path"] for op in decision.patch}


def test_a_lifted_rule_changes_nothing_and_the_others_still_run(tmp_path: Path) -> None:
    plain = decide(loader.load_directory(POLICIES), TRAINER)
    excepted = decide(policies_with(tmp_path, exception("{namespaces: [cap], names: [trainer]}")), TRAINER)
    assert "/spec/containers/0/securityContext" in changed_paths(plain)
    assert changed_paths(excepted) == changed_paths(plain) - {"/spec/securityContext", "/spec/containers/0/securityContext"}
    assert "securityContext" not in {change.what for change in excepted.changes}
    assert excepted.exceptions == ("ex",) and plain.exceptions == ()
    # what is left is still idempotent
    again = decide(policies_with(tmp_path / "2", exception("{namespaces: [cap], names: [trainer]}")),
                   apply_patch(TRAINER, excepted.patch))
    assert again.patch == ()


@pytest.mark.parametrize("match", [
    "{namespaces: [other], names: [trainer]}",   # another namespace
    "{namespaces: [cap], names: [train]}",       # another name (globs match whole names)
    "{namespaces: [cap], kinds: [Deployment]}",  # another kind
])
def test_objects_the_exception_does_not_name_are_untouched_by_it(tmp_path: Path, match: str) -> None:
    plain = decide(loader.load_directory(POLICIES), TRAINER)
    decision = decide(policies_with(tmp_path, exception(match)), TRAINER)
    assert decision.patch == plain.patch and decision.exceptions == ()


def test_an_exception_lifting_only_rules_that_do_not_run_is_not_named(tmp_path: Path) -> None:
    # the shipped quota rule is off: lifting it for this pod lifts nothing that would have run
    quota = exception("{names: [trainer]}", "[{policy: gpu-validations, rules: [quota]}]")
    assert decide(policies_with(tmp_path, quota), TRAINER, "validate").exceptions == ()


def test_a_pod_without_a_name_yet_is_named_by_its_generate_name(tmp_path: Path) -> None:
    policies = policies_with(tmp_path, exception("{names: [trainer-*]}"))
    generated = copy.deepcopy(TRAINER)
    del generated["metadata"]["name"]
    generated["metadata"]["generateName"] = "trainer-7d9f4-"
    assert "/spec/containers/0/securityContext" not in changed_paths(decide(policies, generated))
    generated["metadata"]["generateName"] = "other-7d9f4-"
    assert "/spec/containers/0/securityContext" in changed_paths(decide(policies, generated))


def test_every_rule_of_a_policy_and_several_exceptions(tmp_path: Path) -> None:
    fractional = copy.deepcopy(TRAINER)
    fractional["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": "0.5"}}
    assert not decide(loader.load_directory(POLICIES), fractional, "validate").allowed
    only_quota = exception("{names: [trainer]}", "[{policy: gpu-validations, rules: [quota]}]", "a")
    assert not decide(policies_with(tmp_path, only_quota), fractional, "validate").allowed
    every_rule = exception("{names: [trainer]}", "[{policy: gpu-validations}]", "b")
    lifted = decide(policies_with(tmp_path / "2", only_quota, every_rule), fractional, "validate")
    assert lifted.allowed and lifted.findings == ()
    # two exceptions lifting two rules of one policy lift both
    two = policies_with(tmp_path / "3", exception("{names: [trainer]}", name="c"),
                        exception("{names: [trainer]}", "[{policy: gpu-defaults, rules: [shm]}]", "d"))
    paths = changed_paths(decide(two, TRAINER))
    assert not any("securityContext" in p or "volume" in p for p in paths), paths
    assert "/spec/runtimeClassName" in paths


def test_a_workload_with_several_templates_skips_the_lifted_rule_in_each(tmp_path: Path) -> None:
    job = load_review(REVIEWS / "017_validate_create_pytorchjobs_.json")["request"]["object"]  # Master and Worker
    plain = decide(loader.load_directory(POLICIES), job, "validate")
    assert {(f.rule, f.message.split(":")[0]) for f in plain.findings} == {
        ("cudaDriver", "PyTorchJob cap/ddp spec.pytorchReplicaSpecs.Master.template"),
        ("cudaDriver", "PyTorchJob cap/ddp spec.pytorchReplicaSpecs.Worker.template"),
    }
    lifted = exception("{kinds: [kubeflow.org/PyTorchJob], names: [ddp]}", "[{policy: gpu-validations, rules: [cudaDriver]}]")
    assert decide(policies_with(tmp_path, lifted), job, "validate").findings == ()
    for_pods = exception("{kinds: [Pod], names: [ddp]}", "[{policy: gpu-validations, rules: [cudaDriver]}]")
    assert decide(policies_with(tmp_path / "2", for_pods), job, "validate").findings == plain.findings


def test_a_dra_claim_skips_a_lifted_claims_rule(tmp_path: Path) -> None:
    claim = {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": "all-gpus", "namespace": "ml"},
        "spec": {"devices": {"requests": [
            {"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com", "allocationMode": "All"}},
        ]}},
    }
    assert not decide(loader.load_directory(POLICIES), claim, "validate").allowed
    lifted = exception("{names: [all-gpus]}", "[{policy: gpu-validations, rules: [draClaims]}]")
    decision = decide(policies_with(tmp_path, lifted), claim, "validate")
    assert decision.allowed and decision.exceptions == ("ex",)
    other_rule = exception("{names: [all-gpus]}", "[{policy: gpu-validations, rules: [quota]}]")
    assert not decide(policies_with(tmp_path / "2", other_rule), claim, "validate").allowed


@pytest.mark.parametrize(("document", "expected"), [
    (exception("{names: [x]}", "[{policy: gpu-defualts}]"),
     "(GPUPolicyException ex): spec.exceptions[0].policy: no GPUPolicy 'gpu-defualts'"),
    (exception("{names: [x]}", "[{policy: gpu-defaults, rules: [quota]}]"),
     "(GPUPolicyException ex): spec.exceptions[0].rules[0]: GPUPolicy gpu-defaults has no rule 'quota' (it has: "),
    (exception("{names: [x]}", "[{policy: gpu-defaults, rules: [securityContxt]}]"),
     "(GPUPolicyException ex): spec.exceptions[0].rules: Value error, 'securityContxt' is no rule"),
    (exception("{kinds: [Pod]}"), "(GPUPolicyException ex): spec.match: Value error, give namespaces or names"),
    (exception("{names: [x], kinds: [Deploymnet]}"), "(GPUPolicyException ex): spec.match.kinds[0]: 'Deploymnet' is no kind"),
    (exception("{names: [x], labels: {a: b}}"), "(GPUPolicyException ex): spec.match.labels: Extra inputs are not permitted"),
])
def test_an_exception_that_would_lift_nothing_is_refused_with_file_and_field(
    tmp_path: Path, document: str, expected: str
) -> None:
    problems = problems_of(tmp_path, document)
    assert len(problems) == 1 and problems[0].startswith("exceptions.yaml: document 1 ") and expected in problems[0], problems


def test_policies_check_lists_each_exception(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    policies_with(tmp_path, exception("{namespaces: [ml-*], names: [llama, llama-*]}",
                                      "[{policy: gpu-defaults, rules: [securityContext, shm]}, {policy: gpu-validations}]",
                                      "llama-root"))
    assert cli.main(["policies", "check", str(tmp_path / "policies")]) == 0
    out = capsys.readouterr().out
    assert ", 1 exceptions: OK" in out
    assert ("exception llama-root: gpu-defaults/securityContext,shm; gpu-validations (every rule) "
            "named llama or llama-* in ml-*") in out


def test_the_documented_example_loads_and_is_listed_as_the_docs_say(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    docs = (POLICIES.parent / "docs" / "policies.md").read_text()
    section = docs.split("## GPUPolicyException", 1)[1]
    example = section.split("```yaml\n", 1)[1].split("```", 1)[0]
    policies = policies_with(tmp_path, example)
    assert [e.metadata.name for e in policies.exceptions] == ["llama-finetune-root"]
    assert cli.main(["policies", "check", str(tmp_path / "policies")]) == 0
    listed = capsys.readouterr().out.splitlines()[-1].strip()
    documented = " ".join(section.split("(`exception ", 1)[1].split("`)", 1)[0].split())
    assert listed == f"exception {documented}"


def test_the_audit_reports_a_lifted_rule_as_skipped_by_the_exception(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    policies_with(tmp_path, exception("{namespaces: [cap], names: [trainer]}"))
    manifest = tmp_path / "trainer.json"
    manifest.write_text(json.dumps(TRAINER))
    cli.main(["audit", str(manifest), "--policies", str(tmp_path / "policies"), "-o", "policyreport"])
    results = {
        (r["policy"], r["rule"]): (r["result"], r["message"])
        for item in json.loads(capsys.readouterr().out)["items"] for r in item["results"]
    }
    assert results[("gpu-defaults", "securityContext")] == ("skip", "lifted by GPUPolicyException ex")
    assert results[("gpu-defaults", "shm")][0] == "pass"


async def test_the_server_names_the_exception_in_an_audit_annotation_and_a_metric(
    start_webhook: StartWebhook, tmp_path: Path,
) -> None:
    policies_with(tmp_path / "x", exception("{namespaces: [cap], names: [trainer]}", name="trainer-root"))
    hook = await start_webhook(tmp_path / "x" / "policies")
    sent = load_review(REVIEWS / "000_mutate_create_pods_.json")
    response = (await hook.review("/mutate", sent))["response"]
    assert response["auditAnnotations"] == {review.EXCEPTIONS_ANNOTATION: "trainer-root"}
    sent["request"]["object"]["metadata"]["name"] = sent["request"]["name"] = "other"
    assert "auditAnnotations" not in (await hook.review("/mutate", sent))["response"]
    async with hook.session.get(hook.base + "/metrics") as resp:
        metrics = await resp.text()
    assert 'gpu_admission_exceptions_total{endpoint="/mutate",exception="trainer-root"} 1.0' in metrics
