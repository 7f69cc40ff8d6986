"""docs/dra.md documents every DRA setting, and the shipped policy's choices for claims."""

from __future__ import annotations

import re

import pytest
from pydantic import BaseModel

from tests.support import REPO, shipped_policies
from webhook.gpu.device_classes import DEFAULT_DEVICE_CLASSES
from webhook.policy.settings import dra as ds

DOC = (REPO / "docs" / "dra.md").read_text(encoding="utf-8")


@pytest.mark.parametrize("model", [ds.DraClaimsRule, ds.DeviceClassEntry, ds.ClassRestriction], ids=lambda m: m.__name__)
def test_every_field_is_documented(model: type[BaseModel]) -> None:
    missing = [name for name in model.model_fields if name != "mode" and not re.search(rf"\b{name}\b", DOC)]
    assert not missing, f"{model.__name__}: document {missing} in docs/dra.md"


def test_every_built_in_device_class_is_in_the_table() -> None:
    for info in DEFAULT_DEVICE_CLASSES:
        assert f"| `{info.name}` |" in DOC, info.name


def test_shipped_policy_checks_claims() -> None:
    [policy] = [p for p in shipped_policies().policies if p.metadata.name == "gpu-validations"]
    rule = policy.spec.rules.draClaims
    assert rule is not None and rule.mode == "enforce"
    assert rule.allocationModeAll == "deny" and rule.adminAccessNamespaces == [] and rule.unresolved == "warn"
    [defaults] = [p for p in shipped_policies().policies if p.metadata.name == "gpu-defaults"]
    assert defaults.spec.rules.runtimeClass is not None and defaults.spec.rules.runtimeClass.draPods == "skip"
