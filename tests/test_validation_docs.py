"""docs/validations.md documents every setting of the validation rules, and the shipped policy's choices."""

from __future__ import annotations

import re

import pytest
from pydantic import BaseModel

from tests.support import REPO, shipped_policies
from webhook.policy.settings import validation as vs

DOC = (REPO / "docs" / "validations.md").read_text(encoding="utf-8")
MODELS = [vs.ClusterRuleBase, vs.ResourceShapeRule, vs.SharingSchemes, vs.QuotaRule, vs.QuotaLimit,
          vs.CudaDriverRule, vs.ImageCuda, vs.ForwardCompat, vs.GpuAccessRule]


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.__name__)
def test_every_field_is_documented(model: type[BaseModel]) -> None:
    missing = [name for name in model.model_fields if name != "mode" and not re.search(rf"\b{name}\b", DOC)]
    assert not missing, f"{model.__name__}: document {missing} in docs/validations.md"


def test_shipped_validation_policy() -> None:
    [policy] = [p for p in shipped_policies().policies if p.metadata.name == "gpu-validations"]
    rules = policy.spec.rules
    assert policy.spec.match.kinds == ["*"]
    assert rules.resourceShape is not None and rules.resourceShape.mode == "enforce"
    assert rules.quota is not None and rules.quota.mode == "off"
    assert rules.cudaDriver is not None and rules.cudaDriver.mode == "enforce"
    assert rules.cudaDriver.compatibility == "strict" and rules.cudaDriver.forwardCompat.mode == "auto"
    # steering must see what gpu-defaults adds in the same mutating pass
    defaults = next(p for p in shipped_policies().policies if p.metadata.name == "gpu-defaults")
    assert policy.spec.order > defaults.spec.order
