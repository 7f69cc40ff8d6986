"""Benchmark: the live cluster index at fleet scale.

1. Sync: a real ``gpu-admission serve`` lists 5,000 nodes and 100,000 pods
   (30,000 of them GPU pods, 200 namespaces) from the repository's fake API
   server (tests/fakeapi; paginated, 500 a page, as the index asks), running
   in a process of its own. Prints the time from the server's start to
   ``/readyz`` answering 200, and the server's peak and current RSS
   (targets: <= 30 s, <= 300 MB).
2. Watch events: the cost of applying one pod MODIFIED event (parse, trim,
   store, aggregates) with 10,000 and with 100,000 pods in the index, in
   this process, interleaved; prints both medians and their ratio.

    make bench-index             # or: python bench/index.py [--nodes N --pods M]
"""

from __future__ import annotations

import argparse
import gc
import json
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import orjson  # noqa: E402
from kubernetes import client  # noqa: E402

from bench.engine import REPO  # noqa: E402
from bench.proc import cpu_seconds  # noqa: E402
from tests.cluster import builders  # noqa: E402
from webhook.cluster import ClusterIndex  # noqa: E402
from webhook.cluster.pods import gpu_pod_shaper, is_gpu_resource  # noqa: E402

NAMESPACES = 200


def fleet_objects(nodes: int, pods: int) -> list[dict[str, Any]]:
    """Nodes of four models, namespaces of 20 teams, pods of which 3 in 10 hold GPUs."""
    products = ["NVIDIA-A100-SXM4-80GB", "NVIDIA-H100-80GB-HBM3", "NVIDIA-L40S", "Tesla-T4"]
    drivers = ["535.104.05", "550.54.15", "570.86.10"]
    objects = [builders.namespace(f"ml-{n}", team=f"t{n % 20}") for n in range(NAMESPACES)]
    objects += [builders.node(f"gpu-{n:05}", product=products[n % 4], driver=drivers[n % 3]) for n in range(nodes)]
    objects += [builders.pod(f"p{p}", f"ml-{p % NAMESPACES}", gpus=1 if p % 10 < 3 else 0,
                             node=f"gpu-{p % nodes:05}") for p in range(pods)]  # fmt: skip
    return objects


def serve_fake(nodes: int, pods: int) -> None:
    """The fake API server with the fleet, until stdin closes (runs in a child process)."""
    from tests.fakeapi import FakeApiServer

    with FakeApiServer(history_limit=10) as api:
        api.add_many(fleet_objects(nodes, pods))
        print(api.url, flush=True)
        sys.stdin.read()


def _kubeconfig(url: str, directory: Path) -> Path:
    path = directory / "kubeconfig"
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "fake",
        "clusters": [{"name": "fake", "cluster": {"server": url}}],
        "users": [{"name": "fake", "user": {"token": "x"}}],
        "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake"}}],
    }))
    return path


def _memory_mb(pid: int) -> dict[str, float]:
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmHWM", "VmRSS"):
            fields[key] = int(value.split()[0]) / 1024
    return fields


def _ready(port: int, context: ssl.SSLContext) -> bool:
    try:
        with urllib.request.urlopen(f"https://127.0.0.1:{port}/readyz", context=context, timeout=2) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def sync(nodes: int, pods: int) -> None:
    """Start the fake and a real server against it; time the server's first full sync."""
    started = time.perf_counter()
    fake = subprocess.Popen([sys.executable, __file__, "--serve-fake", "--nodes", str(nodes), "--pods", str(pods)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=REPO)
    assert fake.stdout is not None
    url = fake.stdout.readline().strip()
    print(f"fake API server: {nodes} nodes, {pods} pods, {NAMESPACES} namespaces loaded in "
          f"{time.perf_counter() - started:.1f} s at {url}")
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        gpu_admission = str(Path(sys.executable).with_name("gpu-admission"))
        subprocess.run([gpu_admission, "certs", "generate", "--out", tmp, "--dns", "localhost", "--ip", "127.0.0.1"],
                       check=True, capture_output=True)
        port = _free_port()
        began = time.perf_counter()
        server = subprocess.Popen(
            [gpu_admission, "--log-level", "WARNING", "serve", "--policies", str(REPO / "policies"),
             "--host", "127.0.0.1", "--port", str(port), "--kubeconfig", str(_kubeconfig(url, directory)),
             "--tls-cert", str(directory / "tls.crt"), "--tls-key", str(directory / "tls.key")],
            cwd=tmp,
        )
        context = ssl.create_default_context()
        context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
        try:
            while not _ready(port, context):
                if server.poll() is not None or time.perf_counter() - began > 300:
                    raise SystemExit("the server did not become ready")
                time.sleep(0.1)
            took = time.perf_counter() - began
            memory, cpu = _memory_mb(server.pid), cpu_seconds(server.pid)
            time.sleep(2)  # after the sync: garbage collected, gc frozen
            settled = _memory_mb(server.pid)
        finally:
            server.terminate()
            server.wait(30)
            fake.stdin.close() if fake.stdin else None
            fake.wait(30)
    print(f"server start to /readyz: {took:.1f} s (target <= 30 s: {'met' if took <= 30 else 'NOT met'}); "
          f"server CPU time meanwhile: {cpu:.1f} s (the rest is the fake serving, and other load)")
    peak = max(memory["VmHWM"], settled["VmHWM"])
    print(f"server RSS: peak {peak:.0f} MB, after sync {settled['VmRSS']:.0f} MB "
          f"(target <= 300 MB: {'met' if peak <= 300 else 'NOT met'})")


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _indexed(pods: int) -> tuple[Any, list[bytes]]:
    """An index holding ``pods`` pods (3 in 10 with GPUs), and MODIFIED events for some of them."""
    index = ClusterIndex(client.ApiClient(), resources=["nodes", "namespaces", "pods"])
    watch = index._watches["pods"]  # noqa: SLF001 - the bench drives the watch's event step directly
    shape = gpu_pod_shaper(is_gpu_resource)
    objects = [builders.pod(f"p{p}", f"ml-{p % NAMESPACES}", gpus=1 if p % 10 < 3 else 0,
                            node=f"gpu-{p % 5000:05}") for p in range(pods)]  # fmt: skip
    watch.store.replace([s for s in map(shape, objects) if s is not None])
    index._watches["namespaces"].store.replace(  # noqa: SLF001
        [builders.namespace(f"ml-{n}", team=f"t{n % 20}") for n in range(NAMESPACES)])
    index.gpu_usage("nvidia.com/gpu.product", ["team"])  # what a quota policy with team caps asks for
    events = []
    for p in range(0, 3000, 10):  # GPU pods, flipping between Pending and Running
        pod = objects[p]
        for phase in ("Pending", "Running"):
            pod["status"]["phase"] = phase
            pod["metadata"]["resourceVersion"] = str(p)
            events.append(json.dumps({"type": "MODIFIED", "object": pod}).encode())
    return watch, events


def watch_events(rounds: int) -> None:
    cases = {n: _indexed(n) for n in (10_000, 100_000)}
    gc.collect()
    gc.freeze()  # as the server does after its first sync (webhook/server/app.py)
    samples: dict[int, list[float]] = {n: [] for n in cases}
    for _ in range(rounds):
        for n, (watch, events) in cases.items():
            began = time.perf_counter()
            for line in events:
                watch._apply(orjson.loads(line))  # noqa: SLF001 - as the watch loop does
            samples[n].append((time.perf_counter() - began) / len(events))
    medians = {n: statistics.median(v) for n, v in samples.items()}
    for n, median in medians.items():
        print(f"one pod watch event, {n:>7,} pods in the index: median {median * 1e6:7.1f} us")
    print(f"ratio 100,000 / 10,000 pods: {medians[100_000] / medians[10_000]:.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--pods", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--serve-fake", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--skip-sync", action="store_true", help="only the watch-event part")
    args = parser.parse_args()
    if args.serve_fake:
        serve_fake(args.nodes, args.pods)
        return
    if not args.skip_sync:
        sync(args.nodes, args.pods)
    watch_events(args.rounds)


if __name__ == "__main__":
    main()
