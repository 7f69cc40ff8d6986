"""Benchmark: pod creation through a real kube-apiserver with gpu-admission's compiled policies,
against its webhooks alone and against no admission at all, in the same run.

One kube-apiserver (1.36.2 by default: MutatingAdmissionPolicy is v1 there) and etcd, started
as the end-to-end suite starts them (tests/e2e), with deploy/'s webhooks and two gpu-admission
servers. The configurations take turns within each round, on the same apiserver:

- **no admission**: a namespace not opted in (neither webhooks nor compiled policies select it);
- **compiled policies alone**: the ValidatingAdmissionPolicies and the MutatingAdmissionPolicy
  of ``policies compile``, no webhook (what they cost inside kube-apiserver);
- **compiled + slimmed webhooks**: deploy/compiled/: the compiled policies plus the webhooks,
  which skip what those run (``serve --compiled``) and keep what needs cluster state;
- **webhooks alone**: deploy/: every rule in the webhooks.

Each round creates the same 4-GPU training pod (bench/server.py's) ``--pods`` times per
configuration from ``--clients`` threads, timing each create, then deletes them. It prints
p50 and p99 of each configuration and their ratios to no admission. A benchmark, not a test:
the machine is shared, so compare the figures of one run with each other.

    make bench-cel          # or: python bench/cel.py [--pods 300 --clients 8 --rounds 3 --k8s 1.36.2]
"""

from __future__ import annotations

import argparse
import copy
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.proc import cpu_seconds  # noqa: E402
from tests.e2e.admission import Admission  # noqa: E402
from tests.e2e.apiserver import ADMIN_TOKEN, ApiServer, find_assets  # noqa: E402
from tests.e2e.equivalence import COMPILED_USER, IN_PROCESS_USER, WEBHOOKS_USER, Client, Setups  # noqa: E402
from tests.e2e.kube import Kube, eventually  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
OPT_IN = "gpu-admission.io/enabled"
#: (label, user, opted-in namespace?)
CONFIGURATIONS = (
    ("no admission", WEBHOOKS_USER, False),
    ("compiled policies alone", IN_PROCESS_USER, True),
    ("compiled + slimmed webhooks", COMPILED_USER, True),
    ("webhooks alone", WEBHOOKS_USER, True),
)


def training_pod() -> dict[str, Any]:
    """bench/server.py's 4-GPU training pod, named by the apiserver (generateName)."""
    from bench.server import payloads

    obj = copy.deepcopy(payloads()["training pod"]["request"]["object"])
    obj["metadata"] = {"generateName": "bench-", "labels": obj.get("metadata", {}).get("labels") or {}}
    obj["spec"].pop("nodeName", None)
    return obj


def create_all(client: Client, namespace: str, pods: int, clients: int) -> list[float]:
    """Create ``pods`` pods from ``clients`` threads: each create's latency, in milliseconds."""
    pod = training_pod()
    latencies: list[float] = []
    lock = threading.Lock()
    failures: list[str] = []

    def work(count: int) -> None:
        mine = []
        for _ in range(count):
            start = time.perf_counter()
            outcome = client.create(pod, namespace, dry_run=False)
            mine.append((time.perf_counter() - start) * 1000)
            if outcome.status >= 300:
                failures.append(outcome.message)
        with lock:
            latencies.extend(mine)

    threads = [threading.Thread(target=work, args=(pods // clients + (1 if i < pods % clients else 0),)) for i in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if failures:
        raise RuntimeError(f"{len(failures)} creates refused, e.g.: {failures[0][:300]}")
    return latencies


def delete_all(admin: Kube, namespace: str) -> None:
    admin.core.delete_collection_namespaced_pod(namespace, grace_period_seconds=0)
    eventually(lambda: not admin.core.list_namespaced_pod(namespace).items, timeout=120, what=f"pods of {namespace} deleted")


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


def _processes(setups: Setups) -> dict[str, int]:
    """The processes whose CPU a create costs: kube-apiserver, etcd and both gpu-admission servers."""
    found = {"kube-apiserver": setups.apiserver.processes[1].pid, "etcd": setups.apiserver.processes[0].pid}
    for user, server in setups.servers.items():
        assert server.process is not None
        found[f"gpu-admission ({'slimmed' if user == COMPILED_USER else 'whole'})"] = server.process.pid
    return found


def measure(setups: Setups, admin: Kube, pods: int, clients: int, rounds: int,
            say: Callable[[str], None]) -> tuple[dict[str, list[float]], dict[str, dict[str, float]]]:
    """Every configuration, ``rounds`` times, taking turns: latencies per configuration, and the CPU
    each process spent per create (what a create costs whatever the machine's load)."""
    namespaces = {True: "bench-cel", False: "bench-cel-none"}
    for opted, name in namespaces.items():
        labels = {OPT_IN: "true"} if opted else {}
        admin.ensure({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}})
    processes = _processes(setups)
    results: dict[str, list[float]] = {label: [] for label, _, _ in CONFIGURATIONS}
    cpu: dict[str, dict[str, float]] = {label: dict.fromkeys(processes, 0.0) for label, _, _ in CONFIGURATIONS}
    try:
        for round_ in range(rounds):
            order = CONFIGURATIONS if round_ % 2 == 0 else tuple(reversed(CONFIGURATIONS))
            for label, user, opted in order:
                namespace = namespaces[opted]
                before = {name: cpu_seconds(pid) for name, pid in processes.items()}
                latencies = create_all(setups.clients[user], namespace, pods, clients)
                for name, pid in processes.items():
                    cpu[label][name] += cpu_seconds(pid) - before[name]
                results[label].extend(latencies)
                delete_all(admin, namespace)
                say(f"  round {round_ + 1}: {label:<28} p50 {percentile(latencies, 0.5):7.1f} ms")
    finally:
        for name in namespaces.values():
            admin.delete({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    per_create = {label: {name: 1000 * seconds / len(results[label]) for name, seconds in spent.items()}
                  for label, spent in cpu.items()}
    return results, per_create


def report(results: dict[str, list[float]], cpu: dict[str, dict[str, float]], say: Callable[[str], None]) -> None:
    base = results[CONFIGURATIONS[0][0]]
    base50, base99 = percentile(base, 0.5), percentile(base, 0.99)
    say("latency of a create (wall clock, the machine's load included):")
    for label, latencies in results.items():
        p50, p99 = percentile(latencies, 0.5), percentile(latencies, 0.99)
        say(f"  {label:<28} p50 {p50:7.1f} ms  p99 {p99:7.1f} ms   ({p50 / base50:.2f}x, {p99 / base99:.2f}x no admission; "
            f"mean {statistics.fmean(latencies):.1f} ms, {len(latencies)} creates)")
    say("CPU per create (user + system, from /proc; 10 ms clock ticks, so a few creates' worth of noise):")
    names = list(next(iter(cpu.values())))
    say("  " + " " * 28 + "".join(f"{n:>28}" for n in names) + f"{'total':>10}")
    for label, spent in cpu.items():
        say(f"  {label:<28}" + "".join(f"{spent[n]:25.2f} ms" for n in names) + f"{sum(spent.values()):7.2f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=300, help="pods per configuration and round")
    parser.add_argument("--clients", type=int, default=8, help="threads creating them")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--k8s", default="1.36.2", help="the kube-apiserver version (tests/e2e finds it)")
    args = parser.parse_args()
    os.environ["GPU_ADMISSION_E2E_K8S"] = args.k8s
    folder = Path(tempfile.mkdtemp(prefix="gpu-admission-bench-cel-"))
    apiserver = ApiServer(find_assets(), folder / "kube")
    try:
        apiserver.start()
        admin = Kube(apiserver.kubeconfig(folder / "admin.kubeconfig", ADMIN_TOKEN))
        policies = folder / "policies"
        shutil.copytree(REPO / "policies", policies)
        session = Admission(apiserver, admin, folder / "session", policies)
        session.install()
        session.start()
        setups = Setups(apiserver, admin, session, folder / "setups")
        shipped = {p.name: p.read_text() for p in sorted(policies.glob("*.yaml"))}
        setups.start(shipped)
        setups.load(shipped)
        try:
            print(f"pod creation through kube-apiserver {apiserver.version}: {args.pods} GPU pods per configuration "
                  f"and round, {args.clients} clients, {args.rounds} round(s), configurations taking turns")
            results, cpu = measure(setups, admin, args.pods, args.clients, args.rounds, print)
            report(results, cpu, print)
        finally:
            setups.stop()
            session.stop()
    finally:
        apiserver.cleanup()
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
