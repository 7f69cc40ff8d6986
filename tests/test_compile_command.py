"""``gpu-admission policies compile``: the files it writes, its coverage table, and ``--check``,
which keeps deploy/compiled/policies in step with policies/ (CI runs this in ``make test``).

What the compiled policies decide is proven through kube-apiserver itself:
tests/e2e/test_compiled_equivalence.py.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support import POLICIES, REPO
from webhook import cli
from webhook.cel import command, reach
from webhook.cel import syntax as cel
from webhook.cel.reach import BUILT_IN, Reach
from webhook.policy import loader, offload

COMPILED = REPO / "deploy" / "compiled" / "policies"
WEBHOOKS = REPO / "deploy" / "base"


def _compile(*args: str) -> int:
    return cli.main(["policies", "compile", "--policies", str(POLICIES), "--webhooks", str(WEBHOOKS), *args])


def _documents(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def test_the_committed_output_is_what_the_shipped_policies_compile_to(capsys: pytest.CaptureFixture[str]) -> None:
    """CI's guard: a policy change without `policies compile -o deploy/compiled/policies` fails here."""
    assert _compile("--kube-version", "1.36", "-o", str(COMPILED), "--check", "--quiet") == 0, capsys.readouterr().err


def test_check_names_each_stale_file_and_fails(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    shutil.copytree(COMPILED, out)
    policies = tmp_path / "policies"
    shutil.copytree(POLICIES, policies)
    text = (policies / "gpu-defaults.yaml").read_text().replace("maxSize: 32Gi", "maxSize: 16Gi")
    (policies / "gpu-defaults.yaml").write_text(text)
    code = cli.main(["policies", "compile", "--policies", str(policies), "--webhooks", str(WEBHOOKS),
                     "-o", str(out), "--check", "--quiet"])
    err = capsys.readouterr().err
    assert code == 1
    assert f"{out / 'mutating-policies.yaml'}: stale" in err and f"{out / 'offload.json'}: stale" in err
    assert "validating-policies.yaml" not in err  # the shm size is a mutation only
    assert _compile("--kube-version", "1.36", "-o", str(out), "--check", "--quiet") == 0


def test_the_table_lists_every_rule_where_it_runs_and_the_share(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert _compile("--kube-version", "1.36", "-o", str(tmp_path)) == 0
    table = capsys.readouterr().out
    policies = loader.load_directory(POLICIES)
    for row in offload.coverage(policies, (1, 36)):
        assert f"{row.policy}/{row.rule}" in table
    assert "gpu-defaults/tolerations            enforce  compiled fully" in table
    assert "gpu-validations/resourceShape       enforce  compiled partly" in table
    assert "webhook: more GPUs than the largest node, or than the node spec.nodeName names (needs the nodes of the cluster)" in table
    assert "gpu-validations/cudaDriver          enforce  left to the webhook" in table
    assert "gpu-validations/quota               off      off: runs nowhere" in table
    done, total = offload.share(offload.coverage(policies, (1, 36)))
    assert f"coverage: {done} of {total} rule checks run in-process" in table


def test_before_1_36_only_the_checks_compile_and_a_stale_mutating_file_goes(tmp_path: Path) -> None:
    assert _compile("--kube-version", "1.36", "-o", str(tmp_path), "--quiet") == 0
    assert (tmp_path / "mutating-policies.yaml").exists()
    assert _compile("--kube-version", "1.33", "-o", str(tmp_path), "--quiet") == 0
    assert not (tmp_path / "mutating-policies.yaml").exists()
    assert yaml.safe_load((tmp_path / "kustomization.yaml").read_text())["resources"] == ["validating-policies.yaml"]
    assert json.loads((tmp_path / "offload.json").read_text())["kubeVersion"] == "1.33"


def test_without_output_the_manifests_go_to_stdout_and_the_table_to_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    assert _compile("--kube-version", "1.36") == 0
    captured = capsys.readouterr()
    kinds = [d["kind"] for d in yaml.safe_load_all(captured.out) if d]
    assert "ValidatingAdmissionPolicy" in kinds and "MutatingAdmissionPolicy" in kinds
    assert "coverage:" in captured.err


@pytest.mark.parametrize("args", [["--kube-version", "1.29"], ["--kube-version", "one"], ["--check"]])
def test_usage_errors_exit_2(args: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        code = _compile(*args)
        raise SystemExit(code)
    assert exited.value.code == 2


def test_an_invalid_policy_or_missing_webhooks_exit_2_with_the_problem(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "bad.yaml").write_text("apiVersion: gpu-admission.io/v1alpha1\nkind: GPUPolicy\nmetadata: {name: x}\nspec: {order: many}\n")
    assert cli.main(["policies", "compile", "--policies", str(tmp_path), "--webhooks", str(WEBHOOKS)]) == 2
    assert "spec.order" in capsys.readouterr().err
    assert cli.main(["policies", "compile", "--policies", str(POLICIES), "--webhooks", str(tmp_path)]) == 2
    assert "no webhook mutate.gpu-admission.io, validate.gpu-admission.io" in capsys.readouterr().err


def test_the_policies_take_the_webhooks_reach_and_the_modes_actions() -> None:
    validating = _documents(COMPILED / "validating-policies.yaml")
    mutating = _documents(COMPILED / "mutating-policies.yaml")
    webhooks = {h["name"]: h for path in ("mutatingwebhook.yaml", "validatingwebhook.yaml")
                for d in _documents(WEBHOOKS / path) for h in d["webhooks"]}
    actions = {d["spec"]["policyName"]: d["spec"]["validationActions"] for d in validating
               if d["kind"] == "ValidatingAdmissionPolicyBinding"}
    assert actions == {"gpu-admission": ["Deny"], "gpu-admission-warn": ["Warn"]}  # no audit-mode rule compiles
    for policy in [d for d in validating + mutating if d["kind"].endswith("AdmissionPolicy")]:
        hook = webhooks["mutate.gpu-admission.io" if policy["kind"] == "MutatingAdmissionPolicy" else "validate.gpu-admission.io"]
        spec = policy["spec"]
        assert spec["matchConstraints"]["namespaceSelector"] == hook["namespaceSelector"]
        if policy["kind"] == "MutatingAdmissionPolicy":
            # its own (a mutation that runs makes kube-apiserver run the admission chain again)
            assert spec["matchConditions"] == hook["matchConditions"]
        else:
            # the first variable, which the findings are gated on, and one matchCondition that holds
            # where a validation fails (the tests below; each matchCondition costs kube-apiserver an
            # activation more)
            assert [c["name"] for c in spec.get("matchConditions", [])] == (
                ["warns"] if policy["metadata"]["name"] == "gpu-admission-warn" else ["refuses"])
            assert spec["variables"][0] == {"name": "reached", "expression": cel.every(*(c["expression"] for c in hook["matchConditions"]))}
        # (and the MutatingAdmissionPolicy only built-in kinds: a custom kind it has no schema of yet it refuses)
        groups = {g for rule in spec["matchConstraints"]["resourceRules"] for g in rule["apiGroups"]}
        hook_groups = {g for rule in hook["rules"] for g in rule["apiGroups"]} - {"resource.k8s.io"}
        assert groups == ({g for g in hook_groups if "." not in g} if policy["kind"] == "MutatingAdmissionPolicy" else hook_groups)
        assert spec["failurePolicy"] == "Fail"
    (map_policy,) = [d for d in mutating if d["kind"] == "MutatingAdmissionPolicy"]
    assert map_policy["spec"]["reinvocationPolicy"] == "IfNeeded"
    assert {m["patchType"] for m in map_policy["spec"]["mutations"]} == {"JSONPatch"}
    deny = next(d for d in validating if d["metadata"]["name"] == "gpu-admission" and d["kind"] == "ValidatingAdmissionPolicy")
    assert [v["reason"] for v in deny["spec"]["validations"]] == ["Forbidden", "Forbidden"]


def test_the_record_states_the_version_and_each_policys_digest() -> None:
    stated = json.loads((COMPILED / "offload.json").read_text())
    policies = loader.load_directory(POLICIES)
    assert stated == offload.record(policies, (1, 36))
    found, stale = offload.offload(policies, stated)
    assert stale == [] and ("gpu-defaults", "tolerations") in found.webhook


def test_the_mutating_policy_reaches_built_in_kinds_without_a_match_condition_of_its_own() -> None:
    """Custom API groups leave the MutatingAdmissionPolicy's rules; only a rule naming every group
    ("*") needs kube-apiserver to test the kind, as a matchCondition of the policy's own."""
    named = Reach({"resourceRules": [{"apiGroups": ["", "kubeflow.org"], "resources": ["pods", "pytorchjobs"]},
                                     {"apiGroups": ["ray.io"], "resources": ["rayjobs"]}]}, [{"name": "c", "expression": "true"}])
    built_in = named.built_in()
    assert built_in.match_constraints["resourceRules"] == [{"apiGroups": [""], "resources": ["pods", "pytorchjobs"]}]
    assert built_in.match_conditions == named.match_conditions and built_in.kept_conditions == ()
    every = Reach({"resourceRules": [{"apiGroups": ["*"], "resources": ["*"]}]}, []).built_in()
    assert every.match_constraints["resourceRules"] == [{"apiGroups": ["*"], "resources": ["*"]}]
    assert every.kept_conditions == ({"name": "built-in-kinds", "expression": BUILT_IN},)
    assert every.reached() == "true"
    own = named.own()
    assert own.kept_conditions == tuple(named.match_conditions) and own.match_conditions == [] and own.reached() == "true"


def test_no_finding_where_the_webhooks_would_not_be_sent() -> None:
    """The ValidatingAdmissionPolicies' findings are gated on the webhook's matchConditions
    (variable ``reached``): none where they are false, whatever the checks found."""
    import celpy

    for policy in [d for d in _documents(COMPILED / "validating-policies.yaml") if d["kind"] == "ValidatingAdmissionPolicy"]:
        expression = {v["name"]: v["expression"] for v in policy["spec"]["variables"]}["findings"]
        env = celpy.Environment()
        # (kube-apiserver's strings library: split)
        split: dict[str, Any] = {"split": lambda text, sep: celpy.celtypes.ListType([celpy.celtypes.StringType(p) for p in str(text).split(str(sep))])}
        program = env.program(env.compile(expression), functions=split)

        def findings(reached: bool, found: str, run: Any = program) -> list[str]:
            return [str(f) for f in run.evaluate({"variables": celpy.json_to_cel({"reached": reached, "all": found})})]

        assert findings(True, "VEa finding") == ["VEa finding"]
        assert findings(False, "VEa finding") == []


def test_a_nested_read_grows_with_its_depth_not_exponentially() -> None:
    """``syntax.once``: a map read from a map read from a map names each level once (bound to a
    comprehension variable where it is no path). Before, each level named the one inside it three
    times or more, and kube-apiserver evaluated the innermost 4^depth times per admission."""
    sizes = []
    expr = "t.spec"
    for key in ("aa", "bb", "cc", "dd", "ee", "ff"):
        expr = cel.sub_map(expr, key)
        sizes.append(len(expr))
        assert expr.count("has(t.spec.aa)") == 1, expr  # the first level's guard, once
    steps = [b - a for a, b in zip(sizes[1:], sizes[2:])]
    assert max(steps) == min(steps), sizes  # a level adds the same, whatever is inside it (was 4x the level inside)
    # a path is read as it is: nothing bound
    assert cel.sub_map("t.spec", "affinity") == "(((type(t.spec) == map) && (has(t.spec.affinity)) && (type(t.spec.affinity) == map)) ? t.spec.affinity : {})"


def _compiled(text: str) -> dict[str, dict[str, Any]]:
    mutating, validating = reach.read(WEBHOOKS)
    files = command.compile_files(loader.load_text(text), (1, 36), mutating, validating)
    return {d["metadata"]["name"]: d for d in yaml.safe_load_all(files["validating-policies.yaml"])
            if d and d["kind"] == "ValidatingAdmissionPolicy"}


def test_the_warn_policy_computes_only_the_findings_that_can_warn() -> None:
    """The Warn policy's warnings of a CREATE come from the policies whose findings can warn; the
    others' (enforce only) are computed only when a validating-phase warning needs to know whether a
    mutating-phase finding refuses, or on an UPDATE (webhook.cel.validating._warn_variables)."""
    text = (POLICIES / "workload-kinds.yaml").read_text() + """
---
apiVersion: gpu-admission.io/v1alpha1
kind: GPUPolicy
metadata: {name: strict}
spec:
  rules:
    securityContext: {mode: enforce, level: enforce}
---
apiVersion: gpu-admission.io/v1alpha1
kind: GPUPolicy
metadata: {name: shapes}
spec:
  rules:
    resourceShape: {mode: warn, migProfiles: [1g.10gb]}
"""
    docs = _compiled(text)
    deny = {v["name"]: v["expression"] for v in docs["gpu-admission"]["spec"]["variables"]}
    warn = {v["name"]: v["expression"] for v in docs["gpu-admission-warn"]["spec"]["variables"]}
    checks = sorted(name for name in deny if name[0] == "p" and name[1:].isdigit())
    assert len(checks) == 2, checks
    assert "variables.all" in deny["findings"] and "warnAll" not in deny  # the Deny policy: every finding
    warning = [name for name in checks if f"variables.{name}[0]" in warn["warnAll"]]
    assert len(warning) == 1 and "'VW[shapes/resourceShape] '" in warn[warning[0]], warn["warnAll"]
    # the rest only behind an UPDATE, or a validating-phase warning that needs denyMutate
    assert warn["warnings"].startswith("request.operation == 'UPDATE' && oldObject != null ? ")
    assert "variables.warnValidating.size() == 0 ? [] : variables.denyMutate.size() == 0" in warn["warnings"]


def _may_warn(text: str) -> str | None:
    """What the Warn policy's matchCondition "warns" looks for before computing any finding (the
    condition up to the webhook's reach, ``validating._gate``), None when nothing."""
    policy = _compiled(text)["gpu-admission-warn"]["spec"]
    condition = next(c["expression"] for c in policy["matchConditions"] if c["name"] == "warns")
    reached = next(v["expression"] for v in policy["variables"] if v["name"] == "reached")
    assert condition.startswith("((") and f"({reached}) && (" in condition  # (cel.every's form)
    if condition.startswith(f"(({reached}) && ("):
        return None
    return condition[2:condition.index(f") && ({reached}) && (")]


def test_the_warn_policy_looks_for_what_can_warn_before_computing_any_finding() -> None:
    """Of the shipped rules only resourceShape's findings can warn, and only some of them (a sharing scheme,
    a MIG profile of unknown form, GPUs in init containers only): the Warn policy runs only on an UPDATE
    (which may forgive a refusal with a warning) or where the raw pod specs have what those need (its
    matchCondition "warns" looks for them first), so a pod asking for whole GPUs costs it no pod spec record, no check and
    none of its warning slots (webhook.cel.validating._warn_guard)."""
    shipped = "\n---\n".join(p.read_text() for p in sorted(POLICIES.glob("*.yaml")))
    guard = _may_warn(shipped)
    assert guard is not None
    assert guard.startswith("((request.operation == 'UPDATE' && oldObject != null) || "), guard[:200]
    assert "variables." not in guard, guard[:200]  # (a matchCondition reads none: kube-apiserver refuses the policy)
    init_only = "t.spec.initContainers : []).size() > 0"
    for needed in ("'nvidia.com/gpumem'", "n.startsWith('nvidia.com/mig-')", "'gpu-fraction' in", init_only):
        assert needed in guard, needed
    # settings that make none of them warn leave only the MIG profile's form, which always may
    quiet = shipped.replace("initOnly: warn ", "initOnly: allow ").replace("otherwise: warn", "otherwise: deny")
    assert "initOnly: allow" in quiet and "otherwise: deny" in quiet
    guard = _may_warn(quiet)
    assert guard is not None and "n.startsWith('nvidia.com/mig-')" in guard and init_only not in guard, guard
    assert "gpu-fraction" not in guard and "'nvidia.com/gpumem'" not in guard, guard
    # a rule in warn mode warns with every finding: no condition
    loud = shipped.replace("mode: enforce\n      initOnly", "mode: warn\n      initOnly")
    assert loud != shipped and _may_warn(loud) is None


def test_inline_computes_each_variable_once_or_where_it_is_read() -> None:
    """``cel.inline``: a variable read twice is bound once around the rest, in definition order; one
    read once is written where it is read (computed only where that read is reached); a known one is
    given; a string literal that spells a variable's name is text, not a read."""
    variables = [("a", "object.x"), ("b", "variables.a + 1"), ("c", "variables.a * variables.b"),
                 ("unused", "object.y"), ("label", "'variables.a'")]
    with pytest.raises(ValueError, match="variables.r is not defined"):
        cel.inline(variables, "variables.c > 0 && variables.r")
    assert cel.inline(variables, "variables.c > 0 && variables.r", {"r": "true"}) == (
        "[object.x].map(v_a, (v_a * (v_a + 1)) > 0 && (true))[0]")
    # b read twice: bound after a, inside a's binding
    assert cel.inline(variables, "variables.c + variables.b") == (
        "[object.x].map(v_a, [v_a + 1].map(v_b, (v_a * v_b) + v_b)[0])[0]")
    assert cel.inline(variables, "variables.label + \"variables.unused\"") == "('variables.a') + \"variables.unused\""
    assert "v_" not in cel.inline(variables, "variables.unused") and cel.inline(variables, "1") == "1"


def test_each_policy_runs_only_where_one_of_its_validations_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    """kube-apiserver computes every messageExpression of a policy whose validations ran, failing or not,
    in an activation of its own: the findings of an object that passes were computed twice. Each policy's
    matchCondition computes them once, reading no variable (kube-apiserver refuses the policy otherwise),
    each variable it needs more than once bound once, after the webhook's reach; past what
    kube-apiserver's CEL parser takes (100,000 code points) it is left out and the policy runs as before."""
    shipped = "\n---\n".join(p.read_text() for p in sorted(POLICIES.glob("*.yaml")))
    policies = _compiled(shipped)
    for name, condition_name, fails in (("gpu-admission", "refuses", "variables.denyMutate.size() > 0 || variables.denyValidate.size() > 0"),
                                        ("gpu-admission-warn", "warns", "variables.warnings.size() > 0")):
        spec = policies[name]["spec"]
        (condition,) = [c["expression"] for c in spec["matchConditions"] if c["name"] == condition_name]
        assert "variables." not in condition and len(condition) <= cel.MAX_EXPRESSION
        variables = [(v["name"], v["expression"]) for v in spec["variables"]]
        assert condition.endswith(f"({cel.inline(variables, fails, {'reached': 'true'})}))")
        assert f"({variables[0][1]}) && (" in condition  # the webhook's reach first
        for bound in ("specs", "p0", "p1", "p2", "findings"):
            assert condition.count(f".map(v_{bound}, ") == 1, bound
    looks_for = _may_warn(shipped)
    monkeypatch.setattr(cel, "MAX_EXPRESSION", 20_000)
    small = _compiled(shipped)
    assert "matchConditions" not in small["gpu-admission"]["spec"]
    (guard,) = small["gpu-admission-warn"]["spec"]["matchConditions"]
    assert guard["expression"] == looks_for
