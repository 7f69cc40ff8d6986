"""Benchmark: requests per second of one gpu-admission process against the floors of a Python webhook.

The servers run pinned to CPU 0, over TLS with the same certificate, on
the same event loop (uvloop where installed, as `serve` picks by default);
h2load (HTTP/1.1, keep-alive, 20 connections) drives them from CPU 1. The
floors, measured in the same rounds:

- the null webhook: a bare aiohttp server that parses the review and
  answers "allowed", what any Python webhook must do at least, twice: with
  the standard `json` module, and with orjson (what a performance-minded
  Python webhook would use, and what gpu-admission uses): the floor the
  targets are set against;
- a plain-Python webhook (bench/plain_webhook.py): the core mutations
  (GPU toleration, runtimeClassName, non-root, /dev/shm) and whole-GPU
  checks hand-written over the standard `json` module, with no policies,
  classes, exceptions, cluster view, logs or metrics: gpu-admission must
  stay ahead of it.

gpu-admission runs as it ships: at its default log level (INFO), where
every denial writes a JSON line (a patch: at DEBUG), its stderr on a pipe
that this process reads (as a container runtime reads a pod's). A second
gpu-admission with ``--log-mutations`` (a line per patch as well) is
measured beside it, in the same rounds: the difference is what that line
costs.

Each round runs every payload against every server back to back (the
order rotates), and each ratio is taken within its round: on a shared
machine the same server's CPU per request moves by a quarter from one
second to the next (other jobs, the host), and a pair measured a second
apart shares most of that drift. It prints, per payload, the medians of
the rounds' ratios, the quartiles of the CPU ratio, and the median
throughput and p99 of each server.

On a shared machine a server pinned to CPU 0 rarely gets the whole core
(other jobs run there too), so req/s measures the scheduler as much as the
server. The CPU time each server spends per request (user + system, from
/proc, its log writer thread included) does not depend on that share: its
inverse is the throughput of a whole core, and its ratio is printed too
("cpu"). A payload meets its target when both throughput ratios and the
p99 ratio do.

Targets (at the default log level, against the orjson floor, issue #44):
>= 0.85x on the GPU pods (the training pod of examples/, and a PyTorchJob's
worker pod, which the shipped policies also give a priority class and
training locality), >= 0.95x on the Deployment and the pod without GPU,
>= 0.7x on the 20-container pod (66 KB); p99 <= 1.25x on each; and ahead
of the plain-Python webhook (>= 1.0x) on each.

    make bench-server            # the compiled policy core (as the image runs), then the interpreted one
    python bench/server.py [--rounds N --requests M --event-loop uvloop|asyncio]

Needs h2load (Debian: nghttp2-client; `make bench-server` installs it).
"""

from __future__ import annotations

import argparse
import copy
import json
import shutil
import ssl
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import IO, Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.proc import CLOCK_TICKS, cpu_seconds, rss_mb  # noqa: E402
from webhook import compiled  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
GPU_ADMISSION = str(Path(sys.executable).with_name("gpu-admission"))
CORPUS = REPO.parent / "shared/corpus/admissionreviews/kube-apiserver-1.36"
#: against the orjson floor (the null webhook parsing and answering with orjson)
TARGETS = {"training pod": 0.85, "PyTorchJob pod": 0.85, "Deployment": 0.95, "20-container pod": 0.7, "pod without GPU": 0.95}
#: the servers each round measures: the floors (null webhooks with json and orjson, the plain-Python
#: webhook), and gpu-admission as it ships and with a log line per patch (serve --log-mutations)
FLOORS = ("null json", "null orjson", "plain")
LOG_MUTATIONS = "gpu-admission --log-mutations"
SERVERS = (*FLOORS, "gpu-admission", LOG_MUTATIONS)
FLOOR = "null orjson"
P99_TARGET = 1.25
#: ahead of the plain-Python webhook on every payload
PLAIN_TARGET = 1.0
#: resident memory is read right after the load and this many seconds after it
REST_SECONDS = 3.0


def null_answer(body: bytes) -> dict[str, Any]:
    """What the null webhook answers to a review: parsed, then allowed."""
    uid = json.loads(body)["request"]["uid"]
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": {"uid": uid, "allowed": True}}


def null_webhook(port: int, cert: str, key: str, event_loop: str, parser: str = "json") -> None:
    """Parse the review, answer allowed: the floor for any Python webhook (runs in a child process),
    on the event loop `serve --event-loop` picks; ``parser``: json (the standard module) or orjson."""
    import orjson
    from aiohttp import web

    from bench.floor_app import serve

    async def review(request: web.Request) -> web.Response:
        return web.json_response(null_answer(await request.read()))

    async def review_orjson(request: web.Request) -> web.Response:
        uid = orjson.loads(await request.read())["request"]["uid"]
        answer = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": {"uid": uid, "allowed": True}}
        return web.Response(body=orjson.dumps(answer), content_type="application/json")

    serve(port, cert, key, event_loop, review_orjson if parser == "orjson" else review)


def payloads() -> dict[str, dict[str, Any]]:
    training = json.loads((CORPUS / "000_mutate_create_pods_.json").read_text())
    deployment = json.loads((CORPUS / "006_mutate_create_deployments_.json").read_text())
    job = copy.deepcopy(training)
    meta = job["request"]["object"]["metadata"]
    # a PyTorchJob's worker, as the training operator labels it: the shipped workload classes make it
    # training, so it also gets the training priority class and training locality (pod affinity by job)
    meta["labels"] = {"training.kubeflow.org/job-name": "llama-ft", "training.kubeflow.org/replica-type": "worker",
                      "training.kubeflow.org/replica-index": "0", "training.kubeflow.org/operator-name": "pytorchjob-controller"}
    meta["ownerReferences"] = [{"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "name": "llama-ft", "controller": True,
                                "blockOwnerDeletion": True, "uid": "5f1c6f0e-6a8d-4d0e-9b51-2f6f3b0b7c11"}]
    wide = copy.deepcopy(training)
    first = wide["request"]["object"]["spec"]["containers"][0]
    # 20 containers as real ones come (~66 KB in all): what no rule reads (env, ports, probes)
    # beside their resources
    wide["request"]["object"]["spec"]["containers"] = [
        {**copy.deepcopy(first), "name": f"worker-{i}", "resources": {"limits": {"nvidia.com/gpu": "1"}},
         "env": [{"name": f"TRAINER_SETTING_{n}", "value": f"value-{n}-for-worker-{i}"} for n in range(36)],
         "ports": [{"name": f"w{i}-p{n}", "containerPort": 8000 + 10 * i + n, "protocol": "TCP"} for n in range(4)],
         "livenessProbe": {"httpGet": {"path": "/healthz", "port": f"w{i}-p0"}, "periodSeconds": 10, "failureThreshold": 3},
         "readinessProbe": {"httpGet": {"path": "/ready", "port": f"w{i}-p0"}, "periodSeconds": 5}}
        for i in range(20)
    ]
    plain = copy.deepcopy(training)
    for container in plain["request"]["object"]["spec"]["containers"]:
        container["image"] = "nginx:1.27"
        for field in ("limits", "requests"):
            container.get("resources", {}).get(field, {}).pop("nvidia.com/gpu", None)
    return {"training pod": training, "PyTorchJob pod": job, "Deployment": deployment, "20-container pod": wide,
            "pod without GPU": plain}


def certificates(tmp: Path) -> tuple[str, str]:
    """A development CA's serving certificate and key for localhost, written to ``tmp``."""
    subprocess.run([GPU_ADMISSION, "certs", "generate", "--out", str(tmp), "--dns", "localhost", "--ip", "127.0.0.1"],
                   check=True, capture_output=True)
    return str(tmp / "tls.crt"), str(tmp / "tls.key")


def serve_command(port: int, cert: str, key: str, event_loop: str = "auto", log_mutations: bool = False) -> list[str]:
    """gpu-admission's server as the benchmarks run it: the shipped policies, no cluster, on localhost, at
    its default log level (with ``log_mutations``: serve --log-mutations)."""
    return [GPU_ADMISSION, "serve", "--event-loop", event_loop, *(["--log-mutations"] if log_mutations else []),
            "--no-cluster", "--policies", str(REPO / "policies"), "--host", "127.0.0.1", "--port", str(port),
            "--tls-cert", cert, "--tls-key", key]


def floor_command(port: int, cert: str, key: str, event_loop: str = "auto", parser: str = "orjson") -> list[str]:
    """The null webhook (``null_webhook``) with ``parser``: the floor."""
    return [sys.executable, __file__, "--null-webhook", str(port), cert, key, event_loop, parser]


def wait_ready(port: int, process: subprocess.Popen[bytes], seconds: float = 60) -> None:
    context = ssl.create_default_context()
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit("a server exited before it was ready")
        try:
            with urllib.request.urlopen(f"https://127.0.0.1:{port}/readyz", context=context, timeout=2):
                return
        except (urllib.error.URLError, OSError):
            time.sleep(0.1)
    raise SystemExit("a server did not become ready")


def measure(port: int, pid: int, payload: Path, requests: int, log: Path) -> tuple[float, float, float]:
    """(requests per second, p99 latency in ms, server CPU microseconds per request) of one h2load run.

    CPU time comes in clock ticks (10 ms): a run of 4,000 requests reads it to ~1%."""
    before = cpu_seconds(pid)
    rate, p99 = h2load(port, payload, requests, log)
    return rate, p99, max(cpu_seconds(pid) - before, 1 / CLOCK_TICKS) / requests * 1e6


def h2load(port: int, payload: Path, requests: int, log: Path) -> tuple[float, float]:
    """(requests per second, p99 latency in ms) of one h2load run from CPU 1."""
    out = subprocess.run(
        ["taskset", "-c", "1", "h2load", "--h1", "-n", str(requests), "-c", "20", "-t", "1",
         "-H", "content-type: application/json", "-d", str(payload), "--log-file", str(log),
         f"https://127.0.0.1:{port}/mutate"],
        capture_output=True, text=True, check=True,
    ).stdout
    if f"{requests} succeeded" not in out:
        raise SystemExit(f"h2load: not every request succeeded:\n{out}")
    rate = float(out.split(" req/s")[0].rsplit(" ", 1)[1])
    durations = sorted(int(line.split()[2]) for line in log.read_text().splitlines() if line.strip())
    return rate, durations[int(len(durations) * 0.99)] / 1000


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--event-loop", default="auto", choices=["auto", "uvloop", "asyncio"],
                        help="every server's (serve --event-loop; the null webhook's too)")
    parser.add_argument("--null-webhook", nargs=5, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.null_webhook:
        null_webhook(int(args.null_webhook[0]), *args.null_webhook[1:])
        return
    if shutil.which("h2load") is None:
        raise SystemExit("h2load not found: apt-get install nghttp2-client (make bench-server does it)")
    with tempfile.TemporaryDirectory() as tmp:
        run(Path(tmp), args.rounds, args.requests, args.event_loop)


class LogReader:
    """Reads a server's stderr as it comes (as a container runtime reads a pod's): lines and drop notices."""

    def __init__(self, stream: IO[bytes]) -> None:
        self.lines = self.dropped = 0
        self._stream = stream
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        for line in self._stream:
            self.lines += 1
            if b'"dropped":' in line:
                self.dropped += int(json.loads(line)["dropped"])


def run(tmp: Path, rounds: int, requests: int, event_loop: str) -> None:
    # (imported here: bench/instructions.py imports this module, and its counts move by a few percent
    # from one run to the next once the test helpers' imports are in the process)
    from tests.support import free_ports

    cert, key = certificates(tmp)
    ports = dict(zip(SERVERS, free_ports(len(SERVERS))))
    ours = [name for name in SERVERS if name not in FLOORS]
    servers = {
        name: subprocess.Popen(
            ["taskset", "-c", "0", *serve_command(ports[name], cert, key, event_loop, name == LOG_MUTATIONS)],
            cwd=tmp, stderr=subprocess.PIPE,
        ) for name in ours
    }
    logs = {name: LogReader(process.stderr) for name, process in servers.items() if process.stderr is not None}
    for name, parser in (("null json", "json"), ("null orjson", "orjson")):
        servers[name] = subprocess.Popen(["taskset", "-c", "0", *floor_command(ports[name], cert, key, event_loop, parser)],
                                         cwd=tmp)
    servers["plain"] = subprocess.Popen(["taskset", "-c", "0", sys.executable, str(REPO / "bench" / "plain_webhook.py"),
                                         str(ports["plain"]), cert, key, event_loop], cwd=tmp)
    try:
        for name, process in servers.items():
            wait_ready(ports[name], process)
        files: dict[str, Path] = {}
        for case, review in payloads().items():
            files[case] = tmp / f"{len(files)}.json"
            files[case].write_text(json.dumps(review))
        results: dict[tuple[str, str], list[tuple[float, float, float]]] = {}
        for n in range(rounds):
            for case, file in files.items():
                for name in SERVERS[n % len(SERVERS):] + SERVERS[:n % len(SERVERS)]:
                    run = measure(ports[name], servers[name].pid, file, requests, tmp / "log")
                    results.setdefault((case, name), []).append(run)
        time.sleep(0.5)  # the last lines written
        lines = {name: reader.lines for name, reader in logs.items()}
        right_after = {name: rss_mb(servers[name].pid) for name in SERVERS}
        # at rest: gpu-admission hands the allocator's free pages back once a burst is over (webhook.server.memory:
        # within two of its one-second looks)
        time.sleep(REST_SECONDS - 0.5)
        at_rest = {name: rss_mb(servers[name].pid) for name in SERVERS}
        for name in ours:
            report(files, results, name)
        admissions = rounds * requests * len(files)
        print("log lines written: " + "; ".join(
            f"{name} {lines[name]:,} ({lines[name] / admissions:.2f} per admission), {logs[name].dropped} dropped"
            for name in ours))
        print("resident memory right after the load / at rest 3 s later: " + "; ".join(
            f"{name} {right_after[name]:.0f} / {at_rest[name]:.0f} MB" for name in SERVERS))
        print(f"{rounds} rounds; ratios are medians of each round's own ratio; event loop: {event_loop}; "
              f"policy core: {compiled.policy_core()}")  # (the servers run with this process's environment)
    finally:
        for process in servers.values():
            process.terminate()
            process.wait(30)


def report(files: dict[str, Path], results: dict[tuple[str, str], list[tuple[float, float, float]]], server: str) -> None:
    """Per payload: the orjson floor's and our medians, and the medians of the ratios taken within each
    round: req/s and p99 against the orjson floor; CPU per request ("cpu": the floor's CPU per request /
    ours, the throughput ratio of a whole core) against each floor, with its quartiles against orjson."""
    level = "a line per patch or denial" if server == LOG_MUTATIONS else "as shipped: --log-level INFO, a line per denial"
    print(f"{server} ({level})")
    print(f"{'payload':18} {'bytes':>7} {'floor req/s':>11} {'ours req/s':>11} {'ratio':>6} {'target':>7} "
          f"{'floor p99':>9} {'our p99':>8} {'ratio':>6}  {'cpu vs json':>11} {'vs orjson':>9} {'quartiles':>11} "
          f"{'vs plain':>8}  verdict")
    for case, file in files.items():
        floor, ours = results[(case, FLOOR)], results[(case, server)]
        rate, p99 = ((statistics.median(r[i] for r in floor), statistics.median(r[i] for r in ours)) for i in range(2))
        pairs = list(zip(floor, ours))
        ratio = statistics.median(o[0] / n[0] for n, o in pairs)
        tail = statistics.median(o[1] / n[1] for n, o in pairs)
        per_core = {name: sorted(n[2] / o[2] for n, o in zip(results[(case, name)], ours)) for name in FLOORS}
        low, high = _quartiles(per_core[FLOOR])
        cpu = {name: statistics.median(runs) for name, runs in per_core.items()}
        met = (min(ratio, cpu[FLOOR]) >= TARGETS[case] and tail <= P99_TARGET and cpu["plain"] >= PLAIN_TARGET)
        print(f"{case:18} {file.stat().st_size:7} {rate[0]:11.0f} {rate[1]:11.0f} {ratio:5.2f}x {TARGETS[case]:6.2f}x "
              f"{p99[0]:7.1f}ms {p99[1]:6.1f}ms {tail:5.2f}x  {cpu['null json']:10.2f}x {cpu[FLOOR]:8.2f}x "
              f"{low:4.2f}-{high:4.2f}x {cpu['plain']:7.2f}x  {'met' if met else 'NOT met'}")


def _quartiles(values: list[float]) -> tuple[float, float]:
    """First and third quartiles of sorted ``values`` (both the value itself for one)."""
    if len(values) < 4:
        return values[0], values[-1]
    q = statistics.quantiles(values, n=4)
    return q[0], q[2]


if __name__ == "__main__":
    main()
