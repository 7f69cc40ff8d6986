"""Tests of the deployment artefacts: deploy/, Dockerfile, .dockerignore."""

from __future__ import annotations

import sys
from pathlib import Path

# deploy_tree sits beside the tests; make it importable under any --import-mode.
sys.path.insert(0, str(Path(__file__).resolve().parent))
