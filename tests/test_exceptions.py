"""GPUPolicyException: the rules it lifts, for the objects it names, and nothing else."""

from __future__ import annotations

import copy
import json
import shutil
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.conftest import StartWebhook
from tests.support import POLICIES, REVIEWS, apply_patch, load_review
from webhook import cli, review
from webhook.errors import PolicyError
from webhook.policy import engine, loader, schema
from webhook.policy.decision import Decision
from webhook.policy.loader import PolicySet
from webhook.policy.request import Phase, Request
from webhook.view.snapshot import EMPTY_VIEW

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
    assert "securityContext" not in {what for _, _, what in excepted.changes}
    assert excepted.exceptions == ("ex",) and plain.exceptions == ()
    # what is left is still idempotent
    again = decide(policies_with(tmp_path / "2", exception("{namespaces: [cap], names: [trainer]}")),
                   apply_patch(TRAINER, excepted.patch))
    assert again.patch == ()


@pytest.mark.parametrize(("match", "lifts"), [
    ("{namespaces: [other], names: [trainer]}", "[{policy: gpu-defaults}]"),   # another namespace
    ("{namespaces: [cap], names: [train]}", "[{policy: gpu-defaults}]"),       # another name (globs match whole names)
    ("{namespaces: [cap], kinds: [Deployment]}", "[{policy: gpu-validations}]"),  # another kind
])
def test_objects_the_exception_does_not_name_are_untouched_by_it(tmp_path: Path, match: str, lifts: str) -> None:
    plain = decide(loader.load_directory(POLICIES), TRAINER)
    decision = decide(policies_with(tmp_path, exception(match, lifts)), TRAINER)
    assert decision.patch == plain.patch and decision.exceptions == ()


def test_an_exception_lifting_only_rules_that_do_not_run_is_not_named(tmp_path: Path) -> None:
    # the shipped quota rule is off: lifting it for this pod lifts nothing that would have run
    quota = exception("{namespaces: [cap], names: [trainer]}", "[{policy: gpu-validations, rules: [quota]}]")
    assert decide(policies_with(tmp_path, quota), TRAINER, "validate").exceptions == ()


def test_a_generate_name_is_named_only_by_a_pattern_ending_in_a_star(tmp_path: Path) -> None:
    # kube-apiserver calls the mutating webhooks with generateName only and makes the name before the
    # validating ones: a prefix is named only when every name made from it is (the pattern ends in *)
    generated = copy.deepcopy(TRAINER)
    del generated["metadata"]["name"]
    generated["metadata"]["generateName"] = "trainer-7d9f4-"
    named = copy.deepcopy(TRAINER)
    named["metadata"]["name"] = "trainer-7d9f4-x2k8q"
    by_prefix = policies_with(tmp_path, exception("{namespaces: [cap], names: [trainer-*]}"))
    for obj in (generated, named):  # mutate sees the prefix, validate the name: they agree
        assert "/spec/containers/0/securityContext" not in changed_paths(decide(by_prefix, obj))
    exact = policies_with(tmp_path / "2", exception("{namespaces: [cap], names: [trainer-7d9f4-, trainer]}"))
    for prefix in ("trainer-7d9f4-", "trainer"):  # an exact name never names a prefix: it could be any name
        generated["metadata"]["generateName"] = prefix
        assert "/spec/containers/0/securityContext" in changed_paths(decide(exact, generated))
    generated["metadata"]["generateName"] = "other-7d9f4-"
    assert "/spec/containers/0/securityContext" in changed_paths(decide(by_prefix, generated))


def test_every_rule_of_a_policy_and_several_exceptions(tmp_path: Path) -> None:
    fractional = copy.deepcopy(TRAINER)
    fractional["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": "0.5"}}
    assert not decide(loader.load_directory(POLICIES), fractional, "validate").allowed
    only_quota = exception("{namespaces: [cap], names: [trainer]}", "[{policy: gpu-validations, rules: [quota]}]", "a")
    assert not decide(policies_with(tmp_path, only_quota), fractional, "validate").allowed
    every_rule = exception("{namespaces: [cap], names: [trainer]}", "[{policy: gpu-validations}]", "b")
    lifted = decide(policies_with(tmp_path / "2", only_quota, every_rule), fractional, "validate")
    assert lifted.allowed and lifted.findings == ()
    # only the exception that lifted a rule which would have run is named (quota is off)
    assert lifted.exceptions == ("b",)
    # two exceptions lifting two rules of one policy lift both
    two = policies_with(tmp_path / "3", exception("{namespaces: [cap], names: [trainer]}", name="c"),
                        exception("{namespaces: [cap], names: [trainer]}", "[{policy: gpu-defaults, rules: [shm]}]", "d"))
    paths = changed_paths(decide(two, TRAINER))
    assert not any("securityContext" in p or "volume" in p for p in paths), paths
    assert "/spec/runtimeClassName" in paths
    assert decide(two, TRAINER).exceptions == ("c", "d")


def test_a_workload_with_several_templates_skips_the_lifted_rule_in_each(tmp_path: Path) -> None:
    job = load_review(REVIEWS / "017_validate_create_pytorchjobs_.json")["request"]["object"]  # Master and Worker
    plain = decide(loader.load_directory(POLICIES), job, "validate")
    assert {(f.rule, f.message.split(":")[0]) for f in plain.findings} == {
        ("cudaDriver", "PyTorchJob cap/ddp spec.pytorchReplicaSpecs.Master.template"),
        ("cudaDriver", "PyTorchJob cap/ddp spec.pytorchReplicaSpecs.Worker.template"),
    }
    lifted = exception("{namespaces: [cap], kinds: [kubeflow.org/PyTorchJob], names: [ddp]}",
                       "[{policy: gpu-validations, rules: [cudaDriver]}]")
    decision = decide(policies_with(tmp_path, lifted), job, "validate")
    assert decision.findings == () and decision.exceptions == ("ex",)
    for_pods = exception("{namespaces: [cap], kinds: [Pod], names: [ddp]}", "[{policy: gpu-validations, rules: [cudaDriver]}]")
    assert decide(policies_with(tmp_path / "2", for_pods), job, "validate").findings == plain.findings


def test_a_policy_whose_class_a_template_is_not_of_names_no_exception(tmp_path: Path) -> None:
    # notebook-lifetime applies to notebooks only: lifting it for a training job lifts nothing that would run
    job = load_review(REVIEWS / "017_validate_create_pytorchjobs_.json")["request"]["object"]
    notebook = exception("{namespaces: [cap], names: [ddp]}", "[{policy: notebook-lifetime}]")
    assert decide(policies_with(tmp_path, notebook), job, "mutate").exceptions == ()


def test_a_dra_claim_skips_a_lifted_claims_rule(tmp_path: Path) -> None:
    claim = {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": "all-gpus", "namespace": "ml"},
        "spec": {"devices": {"requests": [
            {"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com", "allocationMode": "All"}},
        ]}},
    }
    assert not decide(loader.load_directory(POLICIES), claim, "validate").allowed
    lifted = exception("{namespaces: [ml], names: [all-gpus]}", "[{policy: gpu-validations, rules: [draClaims]}]")
    decision = decide(policies_with(tmp_path, lifted), claim, "validate")
    assert decision.allowed and decision.exceptions == ("ex",)
    every_rule = exception("{namespaces: [ml], names: [all-gpus]}", "[{policy: gpu-validations}]")
    assert decide(policies_with(tmp_path / "3", every_rule), claim, "validate").allowed
    other_rule = exception("{namespaces: [ml], names: [all-gpus]}", "[{policy: gpu-validations, rules: [quota]}]")
    decision = decide(policies_with(tmp_path / "2", other_rule), claim, "validate")
    assert not decision.allowed and decision.exceptions == ()


@pytest.mark.parametrize(("document", "expected"), [
    (exception("{namespaces: [ml], names: [x]}", "[{policy: gpu-defualts}]"),
     "(GPUPolicyException ex): spec.exceptions[0].policy: no GPUPolicy 'gpu-defualts'"),
    (exception("{namespaces: [ml], names: [x]}", "[{policy: gpu-defaults, rules: [quota]}]"),
     "(GPUPolicyException ex): spec.exceptions[0].rules[0]: GPUPolicy gpu-defaults has no rule 'quota' (it has: "),
    (exception("{namespaces: [ml], names: [x]}", "[{policy: gpu-defaults, rules: [securityContxt]}]"),
     "(GPUPolicyException ex): spec.exceptions[0].rules: Value error, 'securityContxt' is no rule"),
    # names are the creator's to choose: an exception by names alone would hold in every namespace
    (exception("{names: [trainer]}"), "(GPUPolicyException ex): spec.match: Value error, give namespaces"),
    (exception("{namespaces: ['*'], names: [trainer]}"),
     "(GPUPolicyException ex): spec.match: Value error, namespace pattern '*' matches every namespace"),
    (exception("{namespaces: [ml], kinds: [Deploymnet]}"), "(GPUPolicyException ex): spec.match.kinds[0]: 'Deploymnet' is no kind"),
    (exception("{namespaces: [ml], kinds: [Deployment]}"),  # gpu-defaults mutates Pods only
     "(GPUPolicyException ex): spec.match.kinds: GPUPolicy gpu-defaults applies to Pod only: this exception's kinds lift nothing"),
    (exception("{namespaces: [ml], labels: {a: b}}"), "(GPUPolicyException ex): spec.match.labels: Extra inputs are not permitted"),
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
    assert ", 1 exception: OK" in out
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


def test_around_a_lifted_rule_enforced_mutations_apply_and_warn_mode_ones_only_report(tmp_path: Path) -> None:
    policy = (
        "apiVersion: gpu-admission.io/v1alpha1\nkind: GPUPolicy\nmetadata: {name: mixed}\nspec:\n  order: 1\n"
        "  rules:\n    tolerations: {mode: enforce, tolerations: [{key: example.com/pool, operator: Exists}]}\n"
        "    runtimeClass: {mode: warn, name: gpu-runtime, override: true}\n"
        "    securityContext: {mode: warn}\n"
    )
    lifted = exception("{namespaces: [cap], names: [trainer]}", "[{policy: mixed, rules: [runtimeClass]}]")
    decision = decide(policies_with(tmp_path, policy, lifted), TRAINER)
    tolerations = [op["value"] for op in decision.patch if op["path"].startswith("/spec/tolerations")]
    assert {"key": "example.com/pool", "operator": "Exists"} in tolerations  # enforce: applied
    mixed = [w for w in decision.warnings if w.startswith("[mixed/")]
    assert mixed and all("[mixed/securityContext]" in w and "would set" in w for w in mixed), mixed  # warn: reported
    assert not any("gpu-runtime" in str(op) for op in decision.patch)  # lifted: neither applied nor reported


def test_two_objects_lifting_different_rules_of_one_policy_each_get_their_own(tmp_path: Path) -> None:
    policies = policies_with(
        tmp_path, exception("{namespaces: [cap], names: [a]}", name="a"),
        exception("{namespaces: [cap], names: [b]}", "[{policy: gpu-defaults, rules: [shm]}]", "b"))
    for name, gone, kept in (("a", "securityContext", "volumeMounts"), ("b", "volumeMounts", "securityContext"),
                             ("a", "securityContext", "volumeMounts")):
        pod = copy.deepcopy(TRAINER)
        pod["metadata"]["name"] = name
        paths = changed_paths(decide(policies, pod))
        assert not any(gone in p for p in paths) and any(kept in p for p in paths), (name, paths)


def test_the_audit_reports_every_rule_of_a_lifted_policy_as_skipped(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    policies_with(tmp_path, exception("{namespaces: [cap], names: [trainer]}", "[{policy: gpu-validations}]", "all"))
    manifest = tmp_path / "trainer.json"
    manifest.write_text(json.dumps(TRAINER))
    cli.main(["audit", str(manifest), "--policies", str(tmp_path / "policies"), "-o", "policyreport"])
    results = [r for item in json.loads(capsys.readouterr().out)["items"] for r in item["results"]]
    ours = {r["rule"]: (r["result"], r["message"]) for r in results if r["policy"] == "gpu-validations"}
    assert ours and set(ours.values()) == {("skip", "lifted by GPUPolicyException all")}, ours


@pytest.mark.parametrize("pattern", ["*", "**", "?*", "*?", "[a-z0-9]*", "*[a-z0-9]", "*[!.]", "*[!.]*", "*?*"])
def test_a_namespace_pattern_that_matches_every_namespace_is_refused(tmp_path: Path, pattern: str) -> None:
    problems = problems_of(tmp_path, exception(f"{{namespaces: ['{pattern}'], names: [trainer]}}"))
    assert len(problems) == 1 and f"namespace pattern '{pattern}' matches every namespace" in problems[0], problems


@pytest.mark.parametrize("patterns", [["[a-m]*", "[!a-m]*"], ["[a-z]*", "[0-9]*"], ["?", "??", "???*"], ["*[a-m]", "*[!a-m]"]])
def test_namespace_patterns_that_together_match_every_namespace_are_refused(tmp_path: Path, patterns: list[str]) -> None:
    listed = ", ".join(f"'{p}'" for p in patterns)
    problems = problems_of(tmp_path, exception(f"{{namespaces: [{listed}], names: [trainer]}}"))
    assert len(problems) == 1 and f"namespace patterns {', '.join(patterns)} together match every namespace" in problems[0]
    # the control: one of them left out leaves namespaces out
    assert len(policies_with(tmp_path / "control", exception(f"{{namespaces: ['{patterns[0]}'], names: [trainer]}}")).exceptions) == 1


@pytest.mark.parametrize("pattern", ["ml-*", "*-gpu", "[a-z]*", "?", "??*", "*[a-y0-9]", "team-[ab]*"])
def test_a_namespace_pattern_that_leaves_namespaces_out_loads(tmp_path: Path, pattern: str) -> None:
    """The control: each leaves some namespace out ('0', 'z', 'a', …)."""
    assert len(policies_with(tmp_path, exception(f"{{namespaces: ['{pattern}'], names: [trainer]}}")).exceptions) == 1


namespace_names = st.from_regex(r"\A[a-z0-9]([-a-z0-9]{0,8}[a-z0-9])?\Z")
glob_parts = st.sampled_from(["*", "?", "[a-z0-9]", "[a-z]", "[!.]", "[!a]", "[0-9a-z-]", "a", "-", "0", "[a-y0-9]"])


@settings(max_examples=400)
@given(st.lists(glob_parts, min_size=1, max_size=4))
def test_the_every_namespace_check_is_what_matching_says(parts: list[str]) -> None:
    """The probes decide as matching every name would: a glob the check passes leaves out some name
    (found among the one- and two-character names and a few longer), one it refuses matches every
    generated name."""
    pattern = "".join(parts)
    alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
    names = [*alphabet, *(a + b for a in alphabet for b in alphabet), *(a + "-" + b for a in "a0z9" for b in "a0z9"),
             "kube-system", "a" * 63]
    if schema.matches_every_namespace(pattern):
        assert all(fnmatchcase(n, pattern) for n in names)
    else:
        assert not all(fnmatchcase(n, pattern) for n in names)


@given(namespace_names)
def test_a_refused_pattern_matches_any_namespace(name: str) -> None:
    for pattern in ("?*", "*[a-z0-9]", "[!.]*", "*[a-z0-9]*"):
        assert schema.matches_every_namespace(pattern) and fnmatchcase(name, pattern)
