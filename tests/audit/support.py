"""Running ``gpu-admission audit`` in tests: in process through the CLI, or as a real process."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support import POLICIES, REPO
from webhook import cli

CLUSTER = REPO / "examples" / "cluster"
DATA = Path(__file__).parent / "data"

GPU_POD = """\
apiVersion: v1
kind: Pod
metadata: {name: trainer, namespace: ml-a}
spec:
  containers:
    - name: c
      image: pytorch/pytorch:2.4.0-cuda12.4-cudnn9-runtime
      resources: {limits: {nvidia.com/gpu: 1}}
"""
#: CUDA 12.4 (an image without cuda-compat) on nodes whose newest driver is 535: denied with the example cluster
TOO_NEW_POD = GPU_POD.replace("name: trainer", "name: too-new").replace(
    "  containers:", "  nodeSelector: {nvidia.com/gpu.product: NVIDIA-A100-SXM4-80GB}\n  containers:"
)
#: a HAMi share the cluster does not run: a warning, not a denial
SHARED_POD = GPU_POD.replace("name: trainer", "name: shared").replace(
    "{nvidia.com/gpu: 1}", "{nvidia.com/gpu: 1, nvidia.com/gpumem: 4000}"
)


def audit(capsys: pytest.CaptureFixture[str], *args: str, policies: Path = POLICIES) -> tuple[int, str, str]:
    """The CLI in this process: exit code, stdout, stderr."""
    code = cli.main(["audit", "--policies", str(policies), *args])
    out, err = capsys.readouterr()
    return code, out, err


def audit_process(*args: str, stdin: str = "", **kw: Any) -> subprocess.CompletedProcess[str]:
    """The CLI as a real process, as CI runs it."""
    return subprocess.run(
        [sys.executable, "-m", "webhook", "audit", "--policies", str(POLICIES), *args],
        input=stdin, capture_output=True, text=True, cwd=REPO, timeout=120, **kw,
    )  # fmt: skip


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path
