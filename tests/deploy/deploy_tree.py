"""The deploy/ tree as data: its manifests, kustomizations and pod templates.

Tests read the files as they are: the kustomizations apply no transformers
(test_kustomize.py checks that), so a file's content is what reaches the
cluster. Only configMapGenerator and inline patches are applied here.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
SHARED = REPO.parent / "shared"
NAMESPACE = "gpu-admission"
KUSTOMIZATION_NAMES = ("kustomization.yaml", "kustomization.yml", "Kustomization")

#: Kinds without a namespace among those deploy/ ships.
CLUSTER_SCOPED = frozenset({
    "Namespace",
    "CustomResourceDefinition",
    "ClusterRole",
    "ClusterRoleBinding",
    "PriorityClass",
    "RuntimeClass",
    "MutatingWebhookConfiguration",
    "ValidatingWebhookConfiguration",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
    "MutatingAdmissionPolicy",
    "MutatingAdmissionPolicyBinding",
})


@dataclass(frozen=True)
class Doc:
    """One YAML document of a file under deploy/."""

    path: Path
    index: int
    body: dict[str, Any]

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(REPO)}#{self.index}"

    @property
    def kind(self) -> str:
        return str(self.body.get("kind", ""))

    @property
    def name(self) -> str:
        return str(self.body.get("metadata", {}).get("name", ""))


def is_kustomization(path: Path) -> bool:
    return path.name in KUSTOMIZATION_NAMES


def data_files() -> list[Path]:
    """Every YAML and JSON file under deploy/, kustomizations included."""
    patterns = ("*.yaml", "*.yml", "*.json", "Kustomization")
    return sorted({p for pattern in patterns for p in DEPLOY.rglob(pattern) if p.is_file()})


def load_docs(path: Path) -> list[Doc]:
    with path.open(encoding="utf-8") as handle:
        bodies = list(yaml.safe_load_all(handle))
    return [Doc(path, i, body) for i, body in enumerate(bodies) if body is not None]


def manifests() -> list[Doc]:
    """Every Kubernetes object written in a YAML file under deploy/."""
    docs: list[Doc] = []
    for path in data_files():
        if path.suffix in (".yaml", ".yml") and not is_kustomization(path):
            docs.extend(load_docs(path))
    return docs


def kustomization_dirs() -> list[Path]:
    return sorted(p.parent for p in data_files() if is_kustomization(p))


def kustomization(folder: Path) -> dict[str, Any]:
    for name in KUSTOMIZATION_NAMES:
        if (folder / name).is_file():
            return yaml.safe_load((folder / name).read_text(encoding="utf-8")) or {}
    raise FileNotFoundError(f"no kustomization in {folder}")


def generator_files(entry: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(key, relative path) of a configMapGenerator/secretGenerator entry."""
    for item in entry.get("files", []):
        key, _, source = item.rpartition("=")
        yield (key or Path(source).name), source


def generated_configmaps(folder: Path) -> list[dict[str, Any]]:
    """The ConfigMaps a kustomization's configMapGenerator produces."""
    result = []
    for entry in kustomization(folder).get("configMapGenerator", []):
        data = {key: (folder / src).read_text(encoding="utf-8")
                for key, src in generator_files(entry)}
        for literal in entry.get("literals", []):
            key, _, value = literal.partition("=")
            data[key] = value
        metadata: dict[str, Any] = {"name": entry["name"]}
        if "namespace" in entry:
            metadata["namespace"] = entry["namespace"]
        labels = entry.get("options", {}).get("labels")
        if labels:
            metadata["labels"] = labels
        result.append({"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata, "data": data})
    return result


def resolve(folder: Path) -> list[Doc]:
    """The documents a kustomization's resources name, recursively (no patches)."""
    docs: list[Doc] = []
    for entry in kustomization(folder).get("resources", []):
        target = (folder / entry).resolve()
        docs.extend(resolve(target) if target.is_dir() else load_docs(target))
    return docs


def one(kind: str, name: str | None = None, docs: list[Doc] | None = None) -> dict[str, Any]:
    """The single document of this kind (and name); fails on none or several."""
    found = [d for d in (manifests() if docs is None else docs)
             if d.kind == kind and (name is None or d.name == name)]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {[d.where for d in found]}"
    return found[0].body


def base() -> list[Doc]:
    """What `kubectl apply -k deploy/` creates."""
    return resolve(DEPLOY)


def pod_template(obj: dict[str, Any]) -> dict[str, Any] | None:
    """The pod spec of a workload object, or None."""
    kind = obj.get("kind")
    if kind in ("Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job"):
        return obj["spec"]["template"]["spec"]
    if kind == "CronJob":
        return obj["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    if kind == "Pod":
        return obj["spec"]
    return None


def dashboard() -> dict[str, Any]:
    return json.loads((DEPLOY / "monitoring" / "gpu-admission-dashboard.json").read_text("utf-8"))


def labels_match(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """Whether a LabelSelector (matchLabels and matchExpressions) selects labels."""
    for key, value in selector.get("matchLabels", {}).items():
        if labels.get(key) != value:
            return False
    for expr in selector.get("matchExpressions", []):
        key, op, values = expr["key"], expr["operator"], expr.get("values", [])
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and key in labels and labels[key] in values:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
    return bool(selector.get("matchLabels") or selector.get("matchExpressions"))
