"""Policy files: validation with file, document and field; `policies check`; hot reload."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import StartWebhook
from tests.support import POLICIES, TAG_MISFITS, corpus_reviews, load_review
from webhook import cli
from webhook.errors import PolicyError
from webhook.policy import loader
from webhook.server import keys
from webhook.server.policies import directory_digest

GOOD = """\
apiVersion: gpu-admission.io/v1alpha1
kind: GPUPolicy
metadata: {name: extra}
spec:
  rules:
    tolerations:
      tolerations: [{key: example.com/gpu-pool, operator: Exists, effect: NoSchedule}]
"""


def problems_of(tmp_path: Path, text: str) -> list[str]:
    (tmp_path / "p.yaml").write_text(text)
    with pytest.raises(PolicyError) as caught:
        loader.load_directory(tmp_path)
    return caught.value.problems


def test_shipped_policies_load() -> None:
    policy_set = loader.load_directory(POLICIES)
    assert policy_set.policies


def test_misspelt_field_is_named_with_file_document_and_path(tmp_path: Path) -> None:
    text = GOOD + "---\n" + GOOD.replace("name: extra", "name: second").replace("operator: Exists", "operatr: Exists")
    [problem] = problems_of(tmp_path, text)
    assert problem.startswith("p.yaml: document 2 (GPUPolicy second): spec.rules.tolerations.tolerations[0].operatr")
    assert "Extra inputs are not permitted" in problem


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (("mode: enforce", "mode: strict"), "spec.rules.tolerations.mode"),
        (("operator: Exists", "operator: Exists, value: x"), "takes no value"),
        (("name: extra", "name: Not_A_Name"), "metadata.name"),
        (("kind: GPUPolicy", "kind: GPUPolice"), "kind must be one of"),
        (("gpu-admission.io/v1alpha1", "v1"), "apiVersion must be"),
        (("rules:", "rulez:"), "spec.rulez"),
    ],
)
def test_invalid_values_are_refused(tmp_path: Path, change: tuple[str, str], expected: str) -> None:
    text = GOOD.replace("tolerations:\n      tolerations", "tolerations:\n      mode: enforce\n      tolerations")
    problems = problems_of(tmp_path, text.replace(*change))
    assert any(expected in p for p in problems), problems


@pytest.mark.parametrize("kind", ["Deploymnet", "apps/v1/Deployment", "v1/Pod", "kubeflow.org/PyTorchJobs"])
def test_a_kind_no_policy_knows_is_refused_not_matched_to_nothing(tmp_path: Path, kind: str) -> None:
    # a misspelt kind, or Kyverno's group/version/Kind, would leave the policy inert for that kind
    text = GOOD.replace("spec:\n", f"spec:\n  match: {{kinds: [Pod, {json.dumps(kind)}]}}\n")
    [problem] = problems_of(tmp_path, text)
    assert problem.startswith(f"p.yaml: document 1 (GPUPolicy extra): spec.match.kinds[1]: {kind!r} is no kind")


def test_every_kind_the_policies_know_is_accepted_in_match(tmp_path: Path) -> None:
    kinds = ["*", "Pod", "Deployment", "apps/Deployment", "batch/CronJob", "ResourceClaimTemplate",
             "resource.k8s.io/ResourceClaim", "PyTorchJob", "kubeflow.org/PyTorchJob"]
    for shipped in POLICIES.glob("workload-kinds.yaml"):
        (tmp_path / shipped.name).write_text(shipped.read_text())
    (tmp_path / "p.yaml").write_text(GOOD.replace("spec:\n", f"spec:\n  match: {{kinds: {json.dumps(kinds)}}}\n"))
    [policy] = loader.load_directory(tmp_path).policies
    assert policy.spec.match.kinds == kinds


def test_a_workload_class_no_class_document_assigns_is_refused(tmp_path: Path) -> None:
    # a misspelt class in a priority mapping or a match would never fire, silently
    (tmp_path / "workload-classes.yaml").write_text((POLICIES / "workload-classes.yaml").read_text())
    text = GOOD.replace("spec:\n", "spec:\n  match: {workloadClasses: [training, trainng]}\n  exclude: {workloadClasses: [notebok]}\n")
    text += "    priorityClass: {classes: {inference: gpu-inference, batc: gpu-batch}}\n"
    problems = problems_of(tmp_path, text)
    fields = [p.partition("(GPUPolicy extra): ")[2].partition(":")[0] for p in problems]
    assert fields == ["spec.match.workloadClasses[1]", "spec.exclude.workloadClasses[0]",
                      "spec.rules.priorityClass.classes.batc"], problems
    assert "no GPUWorkloadClass assigns workload class 'batc' (known: batch, inference, notebook, training)" in problems[2]


def test_a_missing_directory_is_told_from_a_file(tmp_path: Path) -> None:
    # a mistyped --policies path (or a ConfigMap not mounted) says so, not "not a directory"
    with pytest.raises(PolicyError) as caught:
        loader.load_directory(tmp_path / "polices")
    assert caught.value.problems == [f"{tmp_path / 'polices'}: no such directory"]
    (tmp_path / "p.yaml").write_text(GOOD)
    with pytest.raises(PolicyError) as caught:
        loader.load_directory(tmp_path / "p.yaml")
    assert caught.value.problems == [f"{tmp_path / 'p.yaml'}: not a directory"]


def test_yaml_errors_and_duplicates_are_all_reported(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text(GOOD)
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.yml").write_text(GOOD)
    (tmp_path / "c.yaml").write_text("spec: [unclosed\n")
    with pytest.raises(PolicyError) as caught:
        loader.load_directory(tmp_path)
    text = str(caught.value)
    assert "c.yaml: invalid YAML at line 2: " in text
    assert "GPUPolicy 'extra' is already defined in a.yaml document 1" in text


@pytest.mark.parametrize("value, error", TAG_MISFITS)
def test_a_value_its_tag_does_not_fit_is_an_invalid_policy_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], value: str, error: str
) -> None:
    (tmp_path / "a.yaml").write_text(GOOD)
    (tmp_path / "b.yaml").write_text(GOOD.replace("name: extra", f"name: other, generation: {value}"))
    assert cli.main(["policies", "check", str(tmp_path)]) == 2
    out, err = capsys.readouterr()
    assert (out, err) == (f"b.yaml: invalid YAML: a value that its tag does not fit ({error})\n", f"1 problem(s) in {tmp_path}\n")


def test_configmap_layout_is_read_through_links(tmp_path: Path) -> None:
    data = tmp_path / "..2026_11_22_data"
    data.mkdir()
    (data / "gpu.yaml").write_text(GOOD)
    os.symlink(data.name, tmp_path / "..data")
    os.symlink("..data/gpu.yaml", tmp_path / "gpu.yaml")
    policy_set = loader.load_directory(tmp_path)
    assert [p.metadata.name for p in policy_set.policies] == ["extra"]


def test_policies_check_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["policies", "check", str(POLICIES)]) == 0
    (tmp_path / "bad.yaml").write_text(GOOD.replace("Exists", "Sometimes"))
    assert cli.main(["policies", "check", str(tmp_path)]) == 2
    out = capsys.readouterr().out
    assert "bad.yaml: document 1 (GPUPolicy extra): spec.rules.tolerations.tolerations[0].operator" in out


def test_policies_check_refuses_a_directory_without_a_policy(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A wrong path inside the ConfigMap, or an empty one, would have the server enforce nothing: not OK."""
    (tmp_path / "classes.yaml").write_text((POLICIES / "workload-classes.yaml").read_text())
    assert cli.main(["policies", "check", str(tmp_path)]) == 2
    out, err = capsys.readouterr()
    assert (out, err) == (f"{tmp_path}: no GPUPolicy found: the server would enforce nothing\n", f"1 problem(s) in {tmp_path}\n")


async def policy_set_digest(hook: Any) -> str:
    async with hook.session.get(hook.base + "/metrics") as resp:
        text = await resp.text()
    (digest,) = re.findall(r'^gpu_admission_policy_set_info\{digest="([0-9a-f]+)"\} 1\.0$', text, re.M)
    return digest


async def wait_for(predicate: Callable[[], bool], timeout: float = 5.0) -> None:
    for _ in range(int(timeout / 0.02)):
        if predicate():
            return
        await asyncio.sleep(0.02)
    raise AssertionError("condition not reached in time")


async def test_hot_reload_applies_valid_and_refuses_invalid(start_webhook: StartWebhook, policy_dir: Path) -> None:
    hook = await start_webhook(reload_interval=0.02)
    store = hook.app[keys.STORE]
    sent = load_review(corpus_reviews()[2])  # already carries the nvidia.com/gpu toleration

    async def added_toleration_keys() -> list[str]:
        answer = await hook.review("/mutate", sent)
        ops = json.loads(base64.b64decode(answer["response"].get("patch", "W10=")))
        return [op["value"]["key"] for op in ops if "/spec/tolerations/" in op["path"]]

    assert await added_toleration_keys() == []
    before, digest = store.current, await policy_set_digest(hook)
    assert digest == directory_digest(policy_dir)
    (policy_dir / "extra.yaml").write_text(GOOD)
    await wait_for(lambda: store.current is not before)
    assert await added_toleration_keys() == ["example.com/gpu-pool"]
    # the metric names the files in force: what a rollout's replicas are compared by
    assert await policy_set_digest(hook) == directory_digest(policy_dir) != digest

    good = store.current
    (policy_dir / "broken.yaml").write_text(GOOD.replace("name: extra", "name: broken").replace("Exists", "Sometimes"))
    await wait_for(lambda: store.last_error != "")
    assert store.current is good and "broken.yaml" in store.last_error
    assert await added_toleration_keys() == ["example.com/gpu-pool"]
    async with hook.session.get(hook.base + "/metrics") as resp:
        text = await resp.text()
    assert 'gpu_admission_policy_reloads_total{result="error"} 1.0' in text
    assert 'gpu_admission_policy_reloads_total{result="success"} 1.0' in text
    assert f"gpu_admission_policies_loaded {float(len(good.policies))}" in text
    # a refused change leaves the set in force, and its digest, as they were
    assert f'gpu_admission_policy_set_info{{digest="{store.digest}"}} 1.0' in text
    assert store.digest != directory_digest(policy_dir)

    (policy_dir / "broken.yaml").unlink()  # fixing the directory brings reloads back
    await wait_for(lambda: store.last_error == "")


async def test_hot_reload_refuses_a_value_its_tag_does_not_fit(start_webhook: StartWebhook, policy_dir: Path) -> None:
    """Refused as any invalid policy (file named, last good set kept), not a reload check that fails each round."""
    hook = await start_webhook(reload_interval=0.02)
    store = hook.app[keys.STORE]
    good = store.current
    (policy_dir / "broken.yaml").write_text(GOOD.replace("name: extra", "name: broken, generation: !!int abc"))
    await wait_for(lambda: store.last_error != "")
    assert store.current is good
    assert store.last_error == "broken.yaml: invalid YAML: a value that its tag does not fit " \
                               "(ValueError: invalid literal for int() with base 10: 'abc')"


SHAPE = """\
apiVersion: gpu-admission.io/v1alpha1
kind: GPUPolicy
metadata: {name: shapes}
spec:
  match: {kinds: [Pod, ResourceClaim]}
  rules:
    resourceShape:
      migProfiles: %s
    draClaims:
      migProfiles: %s
"""


@pytest.mark.parametrize(("profile", "expected"), [
    ("1g.10gbb", "'1g.10gbb' is not a MIG profile such as 1g.10gb"),
    ("bogus", "'bogus' is not a MIG profile"),
    ("mig-1g.10gb", "'mig-1g.10gb' is not a MIG profile"),
    ("nvidia.com/mig-1g.10gb", "'nvidia.com/mig-1g.10gb' is a resource name: give the profile, 1g.10gb"),
])
def test_a_mig_profile_allowlist_entry_not_spelt_as_a_profile_is_refused(tmp_path: Path, profile: str, expected: str) -> None:
    """A typo in the allowlist would refuse every pod of the profile meant, and admit the typo's resource."""
    problems = problems_of(tmp_path, SHAPE % (f"[1g.10gb, '{profile}']", f"['{profile}']"))
    assert len(problems) == 2, problems
    assert problems[0].startswith("p.yaml: document 1 (GPUPolicy shapes): spec.rules.resourceShape.migProfiles[1]") and expected in problems[0]
    assert problems[1].startswith("p.yaml: document 1 (GPUPolicy shapes): spec.rules.draClaims.migProfiles[0]") and expected in problems[1]
    (tmp_path / "p.yaml").write_text(  # the control: profiles as NVIDIA's tools spell them
        SHAPE % ("[1g.10gb, 1g.10gb+me, 1g.10gb.me, 7g.141gb, 1c.2g.10gb, 1g.24gb+gfx, 1g.10gb+me.all]", "[3g.40gb]"))
    assert loader.load_directory(tmp_path).policies


def test_a_shm_minimum_above_its_maximum_is_refused(tmp_path: Path) -> None:
    """A clamp upside down sized /dev/shm at a container's whole memory limit."""
    shm = GOOD.replace("    tolerations:\n      tolerations: [{key: example.com/gpu-pool, operator: Exists, effect: NoSchedule}]\n",
                       "    shm: {minSize: %s, maxSize: 32Gi}\n")
    [problem] = problems_of(tmp_path, shm % "64Gi")
    assert problem.startswith("p.yaml: document 1 (GPUPolicy extra): spec.rules.shm") and "minSize 64Gi is above maxSize 32Gi" in problem
    (tmp_path / "p.yaml").write_text(shm % "32Gi")  # the control: equal bounds, a fixed size in effect
    assert loader.load_directory(tmp_path).policies
    [problem] = problems_of(tmp_path, shm.replace(", maxSize: 32Gi", "") % "64Gi")
    assert "minSize 64Gi is above maxSize 32Gi (the default)" in problem
    # as before: a maximum given alone below the default minimum caps; a fixed size uses neither
    for shm_settings in ("{maxSize: 32Mi}", "{size: 1Gi, minSize: 2Gi, maxSize: 16Mi}"):
        (tmp_path / "p.yaml").write_text(shm.replace("{minSize: %s, maxSize: 32Gi}", shm_settings))
        assert loader.load_directory(tmp_path).policies
