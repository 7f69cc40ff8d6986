"""bench/cel.py and bench/cel_parts.py run and print every state or variant (no timing is asserted: the
machine is shared)."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from tests.e2e.apiserver import REPO, ApiServer
from bench.cel import STATES
from webhook.policy import offload


pytestmark = pytest.mark.bench


def test_bench_cel_prints_each_state_latency_and_cpu(apiserver: ApiServer) -> None:
    done = subprocess.run(
        [sys.executable, "bench/cel.py", "--pods", "8", "--clients", "2", "--rounds", "1", "--k8s", apiserver.version],
        cwd=REPO, capture_output=True, text=True, timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    for state in STATES:
        assert re.search(rf"^  {re.escape(state)}\s+p50\s+[\d.]+ ms  p99\s+[\d.]+ ms   \([\d.]+x, [\d.]+x no admission; "
                         r"mean [\d.]+ ms, 8 creates\)$", out, re.M), out
        assert re.search(rf"^  {re.escape(state)}\s+(\s+[\d.]+ ms){{5}}$", out, re.M), out


def test_bench_cel_parts_prints_each_variant_against_the_shell(apiserver: ApiServer) -> None:
    """bench/cel_parts.py installs each variant of the MutatingAdmissionPolicy and prints its CPU per
    create; it stops unless the constant patch stores the pod the compiled policy makes."""
    if offload.kube_version(apiserver.version) < offload.MUTATING_POLICIES_GA:
        pytest.skip("no MutatingAdmissionPolicy before Kubernetes 1.36")
    done = subprocess.run(
        [sys.executable, "bench/cel_parts.py", "--pods", "8", "--clients", "2", "--rounds", "1", "--rules",
         "--k8s", apiserver.version],
        cwd=REPO, capture_output=True, text=True, timeout=900,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    for variant in ("shell", "reads the object", "as compiled", "constant patch", "targets", "rule securityContext", "rule shm"):
        assert re.search(rf"^{re.escape(variant)}\s+median [\d.]+ ms  \([+-][\d.]+ over the shell\)  rounds [\d.]+$", out, re.M), out
