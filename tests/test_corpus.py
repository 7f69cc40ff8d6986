"""Every real GPU manifest of the corpus goes through the engine (mutate, then validate)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support import MANIFESTS, apply_patch, assert_same_in_place, assert_schema_valid
from tests.test_properties import POLICY_SET
from webhook.policy import engine
from webhook.policy.request import Request
from webhook.view.snapshot import EMPTY_VIEW


def manifest_documents(path: Path) -> list[Any]:
    """The documents of a file; files that are not valid YAML yield what parses before the error."""
    docs: list[Any] = []
    try:
        for doc in yaml.safe_load_all(path.read_text()):
            docs.append(doc)
    except yaml.YAMLError:
        pass  # several corpus files are real-world invalid YAML (see corpus/SOURCES.md)
    return [d for d in docs if isinstance(d, dict) and "kind" in d]


def schema_valid(obj: Any) -> bool:
    try:
        assert_schema_valid(obj)
    except AssertionError:
        return False
    return True


FILES = sorted(p for p in MANIFESTS.iterdir() if p.is_file() and p.name != "SOURCES.md")


def test_the_corpus_is_there() -> None:
    assert len(FILES) >= 60


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name[:80])
def test_corpus_manifest_is_mutated_validly_and_idempotently(path: Path) -> None:
    for obj in manifest_documents(path):
        request = Request.for_object(obj)
        decision = engine.evaluate(POLICY_SET, request, EMPTY_VIEW, "mutate")
        assert_same_in_place(POLICY_SET, request, EMPTY_VIEW, "mutate", decision)
        if not decision.allowed:
            assert decision.message()
            continue
        patched = apply_patch(obj, decision.patch)
        if decision.patch and schema_valid(obj):  # some corpus files are invalid as published
            assert_schema_valid(patched)
        again = engine.evaluate(POLICY_SET, Request.for_object(patched), EMPTY_VIEW, "mutate")
        assert again.patch == (), f"{obj.get('kind')} {path.name}: second pass patched {again.patch}"
        engine.evaluate(POLICY_SET, Request.for_object(patched), EMPTY_VIEW, "validate")


def test_corpus_gpu_templates_are_found() -> None:
    """The engine sees GPU pod specs in the custom resources of the corpus, not only in pods."""
    mutated_kinds = set()
    for path in FILES:
        for obj in manifest_documents(path):
            if engine.evaluate(POLICY_SET, Request.for_object(obj), EMPTY_VIEW, "mutate").changes:
                mutated_kinds.add(obj["kind"])
    assert {"Pod", "Deployment", "Job", "StatefulSet", "PyTorchJob", "MPIJob", "RayCluster", "LeaderWorkerSet"} <= mutated_kinds
