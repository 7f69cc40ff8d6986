"""The import contracts of pyproject.toml hold on webhook/, and break on an import that points outward or closes a circle.

The contracts (docs/architecture.md) are checked by import-linter; these
tests run it on the tree as it is, and on copies of the tree with one
import added, so that a contract which stopped checking anything fails here.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import REPO

LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"


def _lint(root: Path) -> subprocess.CompletedProcess[str]:
    # import-linter builds the graph of the `webhook` found on the path: the copy's, not the installed one
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run([str(LINT_IMPORTS), "--no-cache"], cwd=root, env=env, capture_output=True, text=True,
                          timeout=300)


def _copy(tmp_path: Path) -> Path:
    root = tmp_path / "tree"
    shutil.copytree(REPO / "webhook", root / "webhook", ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    shutil.copy(REPO / "pyproject.toml", root / "pyproject.toml")
    return root


def _add_import(module: Path, line: str) -> None:
    text = module.read_text()
    marker = "from __future__ import annotations\n"
    assert marker in text
    module.write_text(text.replace(marker, f"{marker}\n{line}  # noqa: F401\n", 1))


def test_the_tree_keeps_every_contract() -> None:
    result = _lint(REPO)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


@pytest.mark.parametrize(
    ("module", "line", "broken"),
    [
        # Kubernetes semantics importing GPU knowledge: an import pointing outward
        ("kube/quantity.py", "from webhook.gpu import mig", "webhook.kube is not allowed to import webhook.gpu"),
        # the policy core importing the server
        ("policy/engine.py", "from webhook.server import keys", "webhook.policy is not allowed to import webhook.server"),
        # node groups importing the aggregates that import them: a circle inside the cluster view
        ("view/nodegroups.py", "from webhook.view import aggregates", "No cycles are allowed in webhook.view"),
        # the audit CLI importing the kubernetes client itself instead of going through webhook.cluster
        ("audit/inputs.py", "import kubernetes", "the only packages that import the kubernetes client"),
        # the cluster shell importing the ledger it serves: the ledger sits above it
        ("cluster/index.py", "from webhook.ledger import document", "webhook.cluster is not allowed to import webhook.ledger"),
        # the ledger importing the server that uses it
        ("ledger/store.py", "from webhook.server import keys", "webhook.ledger is not allowed to import webhook.server"),
        # the pure core importing a client library
        ("gpu/images.py", "import aiohttp", "need the standard library only"),
    ],
)
def test_an_import_against_the_layers_breaks_a_contract(tmp_path: Path, module: str, line: str, broken: str) -> None:
    root = _copy(tmp_path)
    _add_import(root / "webhook" / module, line)
    result = _lint(root)
    assert result.returncode == 1, result.stdout + result.stderr
    assert broken in " ".join(result.stdout.split()), result.stdout
