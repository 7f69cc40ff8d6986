"""``--cluster-state FILE|DIR``: cluster facts from ``kubectl get … -o json|yaml`` dumps and API lists.

A fleet dump is large (5,000 nodes and 100,000 pods are ~50 MB of JSON), so
JSON is parsed as JSON, YAML with the C loader, and every object is slimmed
on arrival exactly as the live index slims it (:mod:`webhook.cluster.kinds`):
pods without GPUs are dropped, GPU pods trimmed to what quota and scheduling
read, node image lists removed. A file that cannot be read is an error, not a
gap: a missing node list would make CUDA checks pass silently.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import yaml

from webhook.audit.inputs import MANIFEST_SUFFIXES
from webhook.audit.yamlload import ManifestLoader
from webhook.cluster import kinds, pods
from webhook.errors import ManifestError
from webhook.policy import yaml_errors
from webhook.view.snapshot import NOT_IN_SNAPSHOT, SnapshotView

_KIND_OF = {k.kind: k for k in kinds.KINDS.values()}


def load(paths: Iterable[Path], complete: Iterable[str] = ()) -> SnapshotView:
    """A snapshot of the objects in ``paths`` (files, or folders of them)."""
    shapers = {kind.kind: kinds.shaper(kind, pods.is_gpu_resource) for kind in kinds.KINDS.values()}
    objects: list[dict[str, Any]] = []
    # listed resources are known even when slimming keeps none of them (no GPU pods)
    seen: set[str] = set(complete)
    for file in _files(paths):
        for obj in _flatten(_parse(file)):
            kind = str(obj.get("kind", ""))
            shape = shapers.get(kind)
            if shape is None:
                continue  # a kind no policy reads
            seen.add(_KIND_OF[kind].resource)
            try:
                shaped = shape(obj)
            except (AttributeError, TypeError, KeyError, ValueError) as exc:
                # the live index slims what kube-apiserver validated; a file may hold anything
                raise ManifestError(f"cluster state {file}: {_named(obj)}: not a valid {kind} ({type(exc).__name__}: {exc})") from exc
            if shaped is not None:
                objects.append(shaped)
    # a resource the files do not list may be one the cluster has none of: say how to declare that
    return SnapshotView.from_objects(
        objects, known=seen, unknown_reason=NOT_IN_SNAPSHOT + " (--complete {resource} if the cluster has none)"
    )


def _files(paths: Iterable[Path]) -> Iterator[Path]:
    for path in paths:
        if path.is_dir():
            yield from sorted(p for p in path.rglob("*") if p.suffix in MANIFEST_SUFFIXES and p.is_file())
        elif path.is_file():
            yield path
        else:
            raise ManifestError(f"cluster state {path}: no such file or folder")


def _parse(file: Path) -> list[Any]:
    try:
        data = file.read_bytes()
    except OSError as exc:
        raise ManifestError(f"cluster state {file}: cannot read: {exc}") from exc
    if file.suffix == ".json" or data.lstrip()[:1] in (b"{", b"["):
        try:
            return [json.loads(data)]
        except ValueError as exc:
            if file.suffix == ".json":
                raise ManifestError(f"cluster state {file}: invalid JSON: {exc}") from exc
    try:
        return list(yaml.load_all(data, Loader=ManifestLoader))
    except yaml_errors.UNREADABLE as exc:
        raise ManifestError(f"cluster state {file}: {yaml_errors.describe(exc)}") from exc


def _named(obj: dict[str, Any]) -> str:
    meta = obj.get("metadata")
    name = meta.get("name") if isinstance(meta, dict) else None
    return f"{obj.get('kind')} {name}" if isinstance(name, str) and name else f"a {obj.get('kind')} without a name"


def _flatten(values: Iterable[Any]) -> Iterator[dict[str, Any]]:
    """Objects, with every List (kubectl's, or an API ``PodList`` whose items have no kind) opened."""
    for value in values:
        if not isinstance(value, dict):
            continue
        kind = str(value.get("kind", ""))
        items = value.get("items")
        if kind.endswith("List") and isinstance(items, list):
            item_kind = _KIND_OF.get(kind[: -len("List")])
            for item in items:
                if isinstance(item, dict):
                    if "kind" not in item and item_kind is not None:
                        item["kind"] = item_kind.kind
                    yield from _flatten([item])
        else:
            yield value
