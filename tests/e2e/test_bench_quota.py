"""bench/quota.py runs through a real kube-apiserver and prints every line (no timing is asserted)."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from tests.e2e.apiserver import REPO, ApiServer


pytestmark = pytest.mark.bench


def test_bench_quota_prints_caps_on_and_off_and_the_burst(apiserver: ApiServer) -> None:
    # (the apiserver fixture: the suite's binaries are there; the benchmark starts its own)
    done = subprocess.run([sys.executable, "bench/quota.py", "--pods", "16", "--clients", "4"], cwd=REPO,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    out = done.stdout
    for case in ("caps off", r"caps on \(a team ledger\)"):
        assert len(re.findall(rf"^  {case}\s+p50\s+[\d.]+ ms\s+p99\s+[\d.]+ ms\s+CPU ms per pod: kube-apiserver [\d.]+, "
                              rf"etcd [\d.]+, gpu-admission [\d.]+$", out, re.M)) == 2, out
    assert len(re.findall(r"^  added by the ledger: p50 [+-][\d.]+ ms \([\d.]+x\)\s+p99 [+-][\d.]+ ms$", out, re.M)) == 2
    assert re.search(r"^64 pods at once under a team cap of 32: 32 stored, 32 refused by the cap, 0 otherwise; "
                     r"slowest \d+ ms \(webhook timeout 5 s\)$", out, re.M), out
    assert "target: every request decided, none past the webhook timeout -> met" in out
