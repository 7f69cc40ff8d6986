"""Benchmark: one engine evaluation vs json.loads + json.dumps of the same review.

Prints medians and their ratio (target: evaluation <= 0.5x the JSON round
trip). Both run in this process, interleaved, so machine noise hits both.
``--large`` also times validation against a synthetic large cluster (2,000
GPU nodes, 8,000 GPU pods, quota caps on), which is not part of the target.
``--opcodes`` also counts the Python bytecodes one evaluation of each case
executes: unlike time, the count does not move with the machine's load, so
it shows a change of a few percent that timings on a shared machine hide.

    make bench-engine            # or: python bench/engine.py [--rounds N] [--large]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

import yaml

from webhook import compiled
from webhook.policy import engine, loader
from webhook.policy.request import Request
from webhook.review import parse_review
from webhook.view.snapshot import EMPTY_VIEW, SnapshotView

REPO = Path(__file__).resolve().parents[1]
REVIEW = REPO.parent / "shared/corpus/admissionreviews/kube-apiserver-1.36/000_mutate_create_pods_.json"
FALLBACK = REPO / "examples/review-4gpu-training.json"


def _median_seconds(fn: Callable[[], Any], rounds: int, batch: int) -> list[float]:
    samples = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(batch):
            fn()
        samples.append((time.perf_counter() - start) / batch)
    return samples


def _large_cluster(nodes: int = 2000, pods: int = 8000, namespaces: int = 50) -> SnapshotView:
    """GPU nodes of two models and drivers, and GPU pods spread over namespaces of 10 teams."""
    products = [("NVIDIA-A100-SXM4-80GB", "535.104.05"), ("NVIDIA-H100-80GB-HBM3", "550.54.15")]
    objects: list[dict[str, Any]] = []
    for n in range(nodes):
        product, driver = products[n % 2]
        major, minor, rev = driver.split(".")
        objects.append({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": f"gpu-{n}", "labels": {
                "nvidia.com/gpu.product": product, "nvidia.com/gpu.count": "8",
                "nvidia.com/cuda.driver-version.full": driver, "nvidia.com/cuda.driver-version.major": major,
                "nvidia.com/cuda.driver-version.minor": minor, "nvidia.com/cuda.driver-version.revision": rev,
            }},
            "spec": {"taints": [{"key": "nvidia.com/gpu", "effect": "NoSchedule", "value": "present"}]},
            "status": {"allocatable": {"cpu": "96", "memory": "1Ti", "nvidia.com/gpu": "8"}},
        })
    for ns in range(namespaces):
        objects.append({"apiVersion": "v1", "kind": "Namespace",
                        "metadata": {"name": f"ml-{ns}", "labels": {"team": f"t{ns % 10}"}}})
    for p in range(pods):
        objects.append({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"p{p}", "namespace": f"ml-{p % namespaces}"},
            "spec": {"nodeName": f"gpu-{p % nodes}", "containers": [
                {"name": "c", "image": "nvcr.io/nvidia/pytorch:24.01-py3", "resources": {"limits": {"nvidia.com/gpu": "1"}}}
            ]},
            "status": {"phase": "Running"},
        })
    return SnapshotView.from_objects(objects, known=("resourcequotas",))


def with_quota_caps(limits: list[dict[str, Any]]) -> loader.PolicySet:
    """The shipped policies with these GPU quota caps enforced."""
    documents = []
    for file in sorted((REPO / "policies").glob("*.yaml")):
        for doc in yaml.safe_load_all(file.read_text()):
            if doc and doc.get("kind") == "GPUPolicy" and doc["metadata"]["name"] == "gpu-validations":
                doc["spec"]["rules"]["quota"].update(mode="enforce", limits=limits)
            if doc:
                documents.append(doc)
    return loader.load_text(yaml.safe_dump_all(documents), "shipped+caps")


def large(text: str) -> None:
    view, policies = _large_cluster(), with_quota_caps([
        {"scope": "namespace", "namespaces": ["ml-*"], "max": 1000},
        {"scope": "team", "teamLabel": "team", "max": 5000},
        {"scope": "namespace", "model": "NVIDIA-H100-80GB-HBM3", "max": 1000},
    ])
    request = replace(parse_review(text).request, namespace="ml-0")
    samples = _median_seconds(lambda: engine.evaluate(policies, request, view, "validate"), 15, 1)
    print(f"validate, 2000 nodes + 8000 GPU pods, quota caps on: median {statistics.median(samples) * 1e3:.1f} ms")


def opcodes(fn: Callable[[], Any]) -> tuple[int, int]:
    """(Python bytecodes, Python calls) one run of ``fn`` executes, counted with sys.settrace."""
    fn()  # warm: caches per policy set and per image are filled, as on a running server
    counts = [0, 0]

    def trace(frame: Any, event: str, arg: Any) -> Any:
        if event == "call":
            counts[1] += 1
            frame.f_trace_opcodes, frame.f_trace_lines = True, False
        elif event == "opcode":
            counts[0] += 1
        return trace

    sys.settrace(trace)
    try:
        fn()
    finally:
        sys.settrace(None)
    return counts[0], counts[1]


def _pod_with(containers: int) -> Request:
    """A pod of ``containers`` GPU containers (a one-GPU worker each)."""
    return Request.for_object({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "wide", "namespace": "ml"}, "spec": {
        "containers": [{"name": f"w{i}", "image": "nvcr.io/nvidia/pytorch:24.01-py3",
                        "resources": {"limits": {"nvidia.com/gpu": "1", "cpu": "4", "memory": "16Gi"}}}
                       for i in range(containers)]}})  # fmt: skip


def slope(policies: loader.PolicySet, rounds: int) -> None:
    """Evaluation cost against the number of GPU containers: 1, 10, 100."""
    sizes = (1, 10, 100)
    requests = {n: _pod_with(n) for n in sizes}
    samples: dict[int, list[float]] = {n: [] for n in sizes}
    for _ in range(rounds):
        for n, request in requests.items():
            samples[n].extend(_median_seconds(partial(engine.evaluate, policies, request, EMPTY_VIEW, "mutate"), 1, 20))
    medians = {n: statistics.median(v) for n, v in samples.items()}
    per = (medians[100] - medians[1]) / 99
    for n in sizes:
        print(f"evaluate pod of {n:3} GPU containers     median {medians[n] * 1e6:8.1f} us")
    linear = medians[1] + 9 * per
    print(f"per-container slope 1->100: {per * 1e6:.1f} us; at 10 containers {medians[10] * 1e6:.0f} us "
          f"against {linear * 1e6:.0f} us on the line ({medians[10] / linear:.2f}x)")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--batch", type=int, default=200)
    parser.add_argument("--large", action="store_true", help="also validate against a large synthetic cluster")
    parser.add_argument("--opcodes", action="store_true", help="also count the bytecodes of one evaluation of each case")
    args = parser.parse_args()
    text = (REVIEW if REVIEW.exists() else FALLBACK).read_text()
    policies = loader.load_directory(REPO / "policies")
    request = parse_review(text).request
    no_gpu = Request.for_object(
        {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "web"},
         "spec": {"containers": [{"name": "c", "image": "nginx", "resources": {"limits": {"cpu": "1"}}}]}}
    )
    cluster = SnapshotView.from_objects(
        obj for f in sorted((REPO / "examples/cluster").glob("*.yaml")) for obj in yaml.safe_load_all(f.read_text()) if obj
    )
    cases = {
        "json.loads+dumps (baseline)": lambda: json.dumps(json.loads(text)),
        "evaluate 4-GPU training pod": lambda: engine.evaluate(policies, request, EMPTY_VIEW, "mutate"),
        "evaluate pod without GPU": lambda: engine.evaluate(policies, no_gpu, EMPTY_VIEW, "mutate"),
        "mutate, example cluster": lambda: engine.evaluate(policies, request, cluster, "mutate"),
        "validate, example cluster": lambda: engine.evaluate(policies, request, cluster, "validate"),
    }
    samples: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(args.rounds):  # interleave so noise hits every case alike
        for name, fn in cases.items():
            samples[name].extend(_median_seconds(fn, 1, args.batch))
    base = statistics.median(samples["json.loads+dumps (baseline)"])
    # `make bench-engine` runs this on the compiled core (what the image runs), then on the interpreted one
    print(f"policy core: {compiled.policy_core()}")
    print(f"review: {len(text)} bytes, {len(policies.policies)} policies")
    for name, values in samples.items():
        median = statistics.median(values)
        print(f"{name:32} median {median * 1e6:8.1f} us   ratio {median / base:5.2f}x")
    ratio = statistics.median(samples["evaluate 4-GPU training pod"]) / base
    print(f"target: evaluate <= 0.50x baseline -> {'met' if ratio <= 0.5 else 'NOT met'} ({ratio:.2f}x)")
    slope(policies, max(3, args.rounds // 3))
    if args.opcodes:
        if compiled.policy_core() != "interpreted":
            print("(bytecodes of the interpreted modules only: the compiled ones run none)")
        for name, fn in cases.items():
            if name.startswith(("evaluate", "mutate", "validate")):
                ops, calls = opcodes(fn)
                print(f"{name:32} {ops:6} Python bytecodes, {calls:4} Python calls per evaluation")
    if args.large:
        large(text)


if __name__ == "__main__":
    main()
