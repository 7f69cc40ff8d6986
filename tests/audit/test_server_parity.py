"""The audit and the HTTPS server give the same answers: every audit case is also sent through the real TLS server."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest

from tests.audit.support import CLUSTER, GPU_POD, SHARED_POD, TOO_NEW_POD, audit, write
from tests.conftest import StartWebhook
from tests.support import MANIFESTS, apply_patch
from webhook import review
from webhook.audit import inputs, snapshot


def _originals(paths: list[Path]) -> dict[tuple[str, int, int | None], dict[str, Any]]:
    """The objects as read, keyed as the JSON report locates them."""
    found = {}
    for source in inputs.find_files([str(p) for p in paths]):
        for item in inputs.parse(source, inputs.read_text(source)):
            if isinstance(item, inputs.Document):
                found[(item.source, item.index, item.item)] = item.obj
    return found


def _review(result: dict[str, Any], obj: dict[str, Any], uid: str) -> dict[str, Any]:
    group, _, version = result["apiVersion"].rpartition("/")
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": uid, "kind": {"group": group, "version": version, "kind": result["kind"]},
        "namespace": result["namespace"], "name": obj.get("metadata", {}).get("name", ""),
        "operation": "CREATE", "object": obj, "userInfo": {"username": "audit-parity"},
    }}  # fmt: skip


@pytest.fixture
def cases(tmp_path: Path) -> Path:
    return write(tmp_path / "cases.yaml", "---\n".join([GPU_POD, TOO_NEW_POD, SHARED_POD]))


async def test_every_audit_case_gets_the_same_answer_from_the_https_server(
    start_webhook: StartWebhook, capsys: pytest.CaptureFixture[str], cases: Path
) -> None:
    code, out, _ = audit(capsys, "-o", "json", "--cluster-state", str(CLUSTER), str(MANIFESTS), str(cases))
    results = json.loads(out)["results"]
    assert code == 1 and len(results) > 50
    originals = _originals([MANIFESTS, cases])
    # the DRA templates the manifests carry are, for the server, in the cluster
    webhook = await start_webhook(view=snapshot.load([CLUSTER]).with_objects(originals.values()))
    for number, result in enumerate(results):
        obj = originals[(result["source"], result["document"], result["item"])]
        where = f"{result['source']} document {result['document']}"
        mutated = (await webhook.review("/mutate", _review(result, obj, f"m{number}")))["response"]
        patch = json.loads(base64.b64decode(mutated["patch"])) if "patch" in mutated else []
        assert patch == result["patch"], where
        patched = apply_patch(obj, patch)
        validated = (await webhook.review("/validate", _review(result, patched, f"v{number}")))["response"]
        assert (mutated["allowed"] and validated["allowed"]) == result["allowed"], where
        denials = "\n".join(r.get("status", {}).get("message", "") for r in (mutated, validated))
        for finding in result["findings"]:
            if finding["mode"] == "enforce":
                assert f"[{finding['policy']}/{finding['rule']}] {finding['message']}" in denials, where
        served = mutated.get("warnings", []) + validated.get("warnings", [])
        assert served == [review.limit_warnings([w])[0] for w in result["warnings"]], where
