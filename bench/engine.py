"""Benchmark: one engine evaluation vs json.loads + json.dumps of the same review.

Prints medians and their ratio (target: evaluation <= 0.5x the JSON round
trip). Both run in this process, interleaved, so machine noise hits both.

    make bench-engine            # or: python bench/engine.py [--rounds N]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from webhook.policy import engine, loader
from webhook.policy.request import Request
from webhook.policy.view import EMPTY_VIEW, SnapshotView
from webhook.review import parse_review

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


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--batch", type=int, default=200)
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
    print(f"review: {len(text)} bytes, {len(policies.policies)} policies")
    for name, values in samples.items():
        median = statistics.median(values)
        print(f"{name:32} median {median * 1e6:8.1f} us   ratio {median / base:5.2f}x")
    ratio = statistics.median(samples["evaluate 4-GPU training pod"]) / base
    print(f"target: evaluate <= 0.50x baseline -> {'met' if ratio <= 0.5 else 'NOT met'} ({ratio:.2f}x)")


if __name__ == "__main__":
    main()
