"""The policies ConfigMap in deploy/ is a faithful copy of policies/."""

from __future__ import annotations

import subprocess
import sys

import deploy_tree
from deploy_tree import DEPLOY, REPO

SCRIPT = DEPLOY / "sync-policies.py"
CONFIGMAP = DEPLOY / "base" / "policies-configmap.yaml"
HINT = "run: .venv/bin/python deploy/sync-policies.py"


def _shipped() -> dict[str, str]:
    folder = REPO / "policies"
    if not folder.is_dir():
        return {}
    files = [p for p in folder.iterdir() if p.is_file() and p.suffix in (".yaml", ".yml")]
    return {p.name: p.read_text("utf-8") for p in files}


def test_configmap_holds_exactly_the_shipped_policy_files() -> None:
    (doc,) = deploy_tree.load_docs(CONFIGMAP)
    assert doc.name == "gpu-admission-policies"
    assert (doc.body.get("data") or {}) == _shipped(), HINT
    assert "binaryData" not in doc.body


def test_sync_script_agrees() -> None:
    done = subprocess.run([sys.executable, str(SCRIPT), "--check"], capture_output=True,
                          text=True, check=False, timeout=60)
    assert done.returncode == 0, done.stderr or HINT


def test_configmap_stays_small_enough_for_client_side_apply() -> None:
    # kubectl apply (client-side) copies the object into an annotation, and
    # all annotations of an object share 256 KiB.
    assert CONFIGMAP.stat().st_size < 200 * 1024
