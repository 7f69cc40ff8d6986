"""The audit benchmark runs and prints every case with its ratio and target (no timing is asserted)."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from tests.support import REPO


pytestmark = pytest.mark.bench


def test_bench_audit_prints_every_ratio_and_verdict() -> None:
    done = subprocess.run([sys.executable, "bench/audit.py", "--quick", "--rounds", "1"],
                          cwd=REPO, capture_output=True, text=True, timeout=300, check=True)  # fmt: skip
    out = done.stdout
    # the targets are stated at fleet size: a --quick run judges none of them
    for target in ("load <= 3x json.loads", "audit <= 1.5x parsing", "per pod against the fleet <= 1.5x the small cluster"):
        assert re.search(rf"^target: {re.escape(target)} -> not measured at size \([\d.]+x\)$", out, re.M), out
    assert re.search(r"^peak RSS: load --cluster-state \d+ MB \(json.loads alone \d+ MB\); target <= 1024 MB -> not measured at size$",
                     out, re.M), out
    assert " met" not in out, out
    assert re.search(r"^breakdown \(median CPU\): reading\+parsing [\d.]+ s, engine \(mutate\+validate\) [\d.]+ s, "
                     r"JSON report [\d.]+ s, the rest [\d.]+ s$", out, re.M), out
    assert re.search(r"^audit without the engine [\d.]+ s = [\d.]+x parsing \(reading\+parsing alone [\d.]+x\); "
                     r"the engine is [\d.]+x parsing$", out, re.M), out
