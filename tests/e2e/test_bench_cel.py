"""bench/cel.py runs and prints every state (no timing is asserted: the machine is shared)."""

from __future__ import annotations

import re
import subprocess
import sys

from tests.e2e.apiserver import REPO, ApiServer
from bench.cel import STATES


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
