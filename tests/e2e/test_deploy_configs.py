"""deploy/'s webhook configurations and CEL as the real apiserver compiles them."""

from __future__ import annotations

import copy

import pytest

from tests.e2e.admission import DEPLOY, WEBHOOK_FILES
from tests.e2e.apiserver import ApiServer
from tests.e2e.kube import Kube, Refused, documents


@pytest.mark.parametrize("name", WEBHOOK_FILES)
def test_every_match_condition_is_accepted_as_written(admin: Kube, admission: object, name: str) -> None:
    (shipped,) = documents(DEPLOY / name)
    stored = admin.get(shipped["apiVersion"], shipped["kind"], shipped["metadata"]["name"])
    for want, have in zip(shipped["webhooks"], stored["webhooks"], strict=True):
        assert have["matchConditions"] == want["matchConditions"]
        for field in ("namespaceSelector", "rules", "failurePolicy", "timeoutSeconds", "sideEffects"):
            assert have[field] == want[field] or field == "rules" and _same_rules(have[field], want[field])


def _same_rules(have: list[dict[str, object]], want: list[dict[str, object]]) -> bool:
    return [{k: r[k] for k in ("apiGroups", "apiVersions", "operations", "resources")} for r in have] == [
        {k: r[k] for k in ("apiGroups", "apiVersions", "operations", "resources")} for r in want]


def test_the_apiserver_does_compile_match_conditions(admin: Kube, apiserver: ApiServer) -> None:
    (shipped,) = documents(DEPLOY / WEBHOOK_FILES[0])
    broken = copy.deepcopy(shipped)
    broken["metadata"]["name"] = "e2e-broken-cel"
    broken["webhooks"][0]["clientConfig"] = {"url": "https://127.0.0.1:1/mutate"}
    broken["webhooks"][0]["matchConditions"] = [{"name": "typo", "expression": "object.spec.containerz.size() > 0 &&"}]
    with pytest.raises(Refused) as refused:
        admin.create(broken)
    assert refused.value.status == 422 and "compilation failed" in refused.value.message, refused.value.message

