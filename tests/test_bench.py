"""The benchmark runs and prints every case (no timing is asserted: the machine is shared)."""

from __future__ import annotations

import base64
import copy
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import jsonpatch
import pytest

REPO = Path(__file__).resolve().parents[1]


pytestmark = pytest.mark.bench


def test_bench_engine_prints_every_case_and_the_target_verdict() -> None:
    result = subprocess.run(
        [sys.executable, "bench/engine.py", "--rounds", "1", "--batch", "2", "--large"],
        cwd=REPO, capture_output=True, text=True, timeout=300, check=True,
    )
    out = result.stdout
    for case in ("json.loads+dumps (baseline)", "evaluate 4-GPU training pod", "evaluate pod without GPU",
                 "mutate, example cluster", "validate, example cluster"):
        assert re.search(rf"^{re.escape(case)}\s+median\s+[\d.]+ us\s+ratio\s+[\d.]+x$", out, re.M), out
    assert re.search(r"^target: evaluate <= 0.50x baseline -> (met|NOT met) \([\d.]+x\)$", out, re.M), out
    assert re.search(r"^validate, 2000 nodes \+ 8000 GPU pods, quota caps on: median [\d.]+ ms$", out, re.M), out


def test_bench_engine_counts_the_bytecodes_of_an_evaluation() -> None:
    result = subprocess.run(
        [sys.executable, "bench/engine.py", "--rounds", "1", "--batch", "2", "--opcodes"],
        cwd=REPO, capture_output=True, text=True, timeout=300, check=True,
    )
    counts = dict(re.findall(r"^(\S.*?)\s+(\d+) Python bytecodes, +\d+ Python calls per evaluation$", result.stdout, re.M))
    assert counts.keys() == {"evaluate 4-GPU training pod", "evaluate pod without GPU", "mutate, example cluster",
                             "validate, example cluster"}, result.stdout
    # a pod without GPUs leaves right after finding none; a GPU pod runs the policies
    assert 0 < int(counts["evaluate pod without GPU"]) < int(counts["evaluate 4-GPU training pod"]), result.stdout


def test_bench_scale_prints_both_clusters_and_the_ratio() -> None:
    result = subprocess.run(
        [sys.executable, "bench/scale.py", "--rounds", "1", "--batch", "1", "--nodes", "200", "--pods", "2000"],
        cwd=REPO, capture_output=True, text=True, timeout=300, check=True,
    )
    out = result.stdout
    assert re.search(r"^mutation against the fleet: \d+ patch operations, steered: True$", out, re.M), out
    for pod in ("training pod", "DRA claim pod"):
        for case in ("10 nodes", "200 nodes / 2,000 pods"):
            assert re.search(rf"^{pod}: mutate\+validate, {re.escape(case)}\s+median\s+[\d.]+ us$", out, re.M), out
        assert re.search(rf"^target \({pod}\): fleet <= 1.50x 10 nodes -> (met|NOT met) \([\d.]+x\)$", out, re.M), out


def test_bench_index_syncs_a_real_server_and_prints_event_costs() -> None:
    result = subprocess.run(
        [sys.executable, "bench/index.py", "--rounds", "1", "--nodes", "50", "--pods", "2000"],
        cwd=REPO, capture_output=True, text=True, timeout=300, check=True,
    )
    out = result.stdout
    assert re.search(r"^server start to /readyz: [\d.]+ s \(target <= 30 s: (met|NOT met)\); "
                     r"server CPU time meanwhile: [\d.]+ s", out, re.M), out
    assert re.search(r"^server RSS: peak \d+ MB, after sync \d+ MB", out, re.M), out
    for pods in ("10,000", "100,000"):
        assert re.search(rf"^one pod watch event, +{pods} pods in the index: median +[\d.]+ us$", out, re.M), out
    assert re.search(r"^ratio 100,000 / 10,000 pods: [\d.]+x$", out, re.M), out


@pytest.mark.skipif(shutil.which("h2load") is None, reason="h2load (nghttp2-client) is installed by make bench-server")
def test_bench_server_compares_every_payload_with_the_null_webhook() -> None:
    result = subprocess.run(
        [sys.executable, "bench/server.py", "--rounds", "1", "--requests", "200"],
        cwd=REPO, capture_output=True, text=True, timeout=300, check=True,
    )
    out = result.stdout
    tables = out.split("gpu-admission --log-mutations (a line per patch or denial)")
    assert len(tables) == 2 and tables[0].startswith("gpu-admission (as shipped: --log-level INFO, a line per denial)"), out
    for table in tables:  # as shipped, then with --log-mutations: a row per payload in each
        for case in ("training pod", "PyTorchJob pod", "Deployment", "20-container pod", "pod without GPU"):
            assert re.search(rf"^{re.escape(case)} +\d+ +\d+ +\d+ +[\d.]+x +[\d.]+x +[\d.]+ms +[\d.]+ms +[\d.]+x  "
                             r"+[\d.]+x +[\d.]+x +[\d.]+-[\d.]+x +[\d.]+x  (met|NOT met)$", table, re.M), out
    # as shipped, a line per denial (none: every payload is allowed); with --log-mutations, a line per patch
    # too: three of the five payloads are patched (not the Deployment, whose template the shipped policies
    # only check, nor the pod without GPU), 200 requests each
    logged = re.search(r"^log lines written: gpu-admission (\d+) \([\d.]+ per admission\), 0 dropped; "
                       r"gpu-admission --log-mutations ([\d,]+) \(([\d.]+) per admission\), 0 dropped$", out, re.M)
    assert logged, out
    assert int(logged.group(1)) < 10 and 3 * 200 <= int(logged.group(2).replace(",", "")) < 3 * 200 + 10, out
    assert re.search(r"^resident memory right after the load / at rest 3 s later: null json \d+ / \d+ MB; "
                     r"null orjson \d+ / \d+ MB; plain \d+ / \d+ MB; gpu-admission \d+ / \d+ MB; "
                     r"gpu-admission --log-mutations \d+ / \d+ MB$", out, re.M), out


def test_the_plain_webhook_of_bench_server_mutates_and_refuses_as_a_hand_written_webhook_would() -> None:
    """bench/plain_webhook.py is a fair floor: it does the core work (its patch applies and is what it
    says), refuses fractional GPUs, and leaves pods without GPUs alone."""
    from bench.plain_webhook import admit
    from bench.server import payloads

    reviews = payloads()
    answer = admit(json.dumps(reviews["20-container pod"]).encode())["response"]
    patched = jsonpatch.apply_patch(reviews["20-container pod"]["request"]["object"],
                                    json.loads(base64.b64decode(answer["patch"])))
    spec = patched["spec"]
    assert spec["runtimeClassName"] == "nvidia" and spec["securityContext"]["runAsNonRoot"] is True
    assert any(t["key"] == "nvidia.com/gpu" for t in spec["tolerations"])
    assert all({"name": "dshm", "mountPath": "/dev/shm"} in c["volumeMounts"] for c in spec["containers"])
    assert "patch" not in admit(json.dumps(reviews["pod without GPU"]).encode())["response"]
    fractional = copy.deepcopy(reviews["training pod"])
    fractional["request"]["object"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = "0.5"
    refused = admit(json.dumps(fractional).encode())["response"]
    assert refused["allowed"] is False and "whole number" in refused["status"]["message"]


@pytest.mark.skipif(shutil.which("valgrind") is None, reason="valgrind is installed by make bench-instructions")
def test_bench_instructions_counts_an_admission_and_the_null_webhooks_work() -> None:
    result = subprocess.run(
        # (20 admissions apart: the two runs' start-ups differ by up to ~1M instructions, the writer
        # thread's wake-ups falling differently under valgrind, which swamped a difference of two)
        [sys.executable, "bench/instructions.py", "--only", "training pod", "--small", "1", "--large", "21"],
        cwd=REPO, capture_output=True, text=True, timeout=600, check=True,
    )
    found = re.search(r"^training pod +\d+ +([\d,]+) +([\d,]+) +([\d.]+)x$", result.stdout, re.M)
    assert found, result.stdout
    ours, null = (int(found.group(i).replace(",", "")) for i in (1, 2))
    # both sides parse a 4 KB review (tens of thousands of instructions at least); the compiled core's
    # admission runs in fewer instructions than the null webhook's json round trip, the interpreted one in more
    assert ours > 10_000 and null > 10_000, result.stdout
    assert abs(ours / null - float(found.group(3))) < 0.011, result.stdout
    assert re.search(r"^admissions 21 - 1 per count; log level INFO; policy core: (compiled|interpreted)$", result.stdout, re.M), result.stdout


def test_bench_report_writes_reports_from_the_fake_and_prints_time_and_memory() -> None:
    result = subprocess.run(
        [sys.executable, "bench/report.py", "--nodes", "20", "--pods", "400"],
        cwd=REPO, capture_output=True, text=True, timeout=600, check=True,
    )
    out = result.stdout
    for name in ("report (first run)", "report (second run)", "audit --cluster -o json (baseline)"):
        assert re.search(rf"^{re.escape(name)}\s+wall\s+[\d.]+ s  CPU\s+[\d.]+ s  peak RSS\s+\d+ MB  exit \d$", out, re.M), out
    written = re.search(r"^report: (\d+) PolicyReport\(s\) written \((\d+) objects;", out, re.M)
    assert written and int(written.group(1)) > 0 and int(written.group(2)) > 0, out
    assert re.search(r"^ratio report / audit: wall [\d.]+x, CPU [\d.]+x, peak RSS [\d.]+x$", out, re.M), out


@pytest.mark.skipif(shutil.which("valgrind") is None or shutil.which("h2load") is None,
                    reason="valgrind and h2load are installed by make bench-instructions and make bench-server")
def test_bench_instructions_counts_whole_servers_per_request() -> None:
    result = subprocess.run(
        [sys.executable, "bench/instructions.py", "--server", "--only", "pod without GPU", "--requests", "40"],
        cwd=REPO, capture_output=True, text=True, timeout=900, check=True,
    )
    found = re.search(r"^pod without GPU +\d+ +([\d,]+) +([\d,]+) +([\d.]+)x$", result.stdout, re.M)
    assert found, result.stdout
    ours, floor = (int(found.group(i).replace(",", "")) for i in (1, 2))
    # a request over TLS costs each server hundreds of thousands of instructions (here most of them its
    # share of the 20 handshakes): counted for each, in process of its own (not the same count twice)
    assert floor > 100_000 and ours > 100_000 and ours != floor, result.stdout
    assert abs(floor / ours - float(found.group(3))) < 0.011, result.stdout
    assert re.search(r"^40 requests per count .*policy core: (compiled|interpreted)$", result.stdout, re.M), result.stdout
