"""Benchmark: what the GPU quota ledger costs a pod's creation, and a burst under one team cap.

Through a real kube-apiserver (the e2e harness: deploy/'s webhook
configurations, one ``gpu-admission serve`` with its ServiceAccount), in one
run:

1. Caps on vs off. 300 one-GPU pods are created with caps off (namespaces
   no quota policy matches) and 300 with caps on (a namespace cap and a team
   cap never reached: every pod is charged to its team's ledger before it is
   allowed, mostly against the server's reservation: docs/quota.md), by 8
   clients, in alternating rounds of 50 so that both see the same machine. Prints p50 and p99 of each and the differences (targets:
   <= 5 ms p50, <= 20 ms p99 added).
2. A burst: 64 one-GPU pods created at once (64 clients) into a team's two
   namespaces under a team cap of 32. Every request must be decided (stored,
   or refused by the cap) and none past the webhook's timeoutSeconds; prints
   the slowest and how many were stored.

    make bench-quota             # or: python bench/quota.py [--pods 300 --clients 8]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.proc import cpu_seconds  # noqa: E402
from tests.e2e.admission import Admission  # noqa: E402
from tests.e2e.apiserver import ADMIN_TOKEN, REPO, ApiServer, find_assets  # noqa: E402
from tests.e2e.fixtures import gpu_container, pod  # noqa: E402
from tests.e2e.kube import Kube, Refused, documents  # noqa: E402
from tests.support import POLICIES  # noqa: E402
from webhook.ledger.settings import LedgerSettings  # noqa: E402

OPT_IN = "gpu-admission.io/enabled"
CAPS_LABEL = "bench.gpu-admission.io/caps"
CAPS = f"""\
apiVersion: gpu-admission.io/v1alpha1
kind: GPUPolicy
metadata: {{name: bench-caps}}
spec:
  order: 300
  match:
    kinds: [Pod]
    namespaceSelector: {{matchLabels: {{{CAPS_LABEL}: "on"}}}}
  rules:
    quota:
      mode: enforce
      clusterUnavailable: fail-closed
      limits:
        - {{scope: namespace, max: 100000}}
        - {{scope: team, max: 100000}}
        - {{scope: team, teams: [burst], max: 32}}
"""
ROUND = 50


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def namespace(admin: Kube, team: str, caps: bool) -> str:
    name = f"bench-{uuid.uuid4().hex[:8]}"
    labels = {OPT_IN: "true", "team": team, **({CAPS_LABEL: "on"} if caps else {})}
    admin.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}})
    return name


def timed_create(admin: Kube, obj: dict[str, Any]) -> tuple[float, str]:
    """(seconds, "" when stored, else the refusal)."""
    started = time.perf_counter()
    try:
        admin.create(obj)
        outcome = ""
    except Refused as exc:
        outcome = exc.message
    return time.perf_counter() - started, outcome


def creations(admin: Kube, clients: int, pods: list[dict[str, Any]]) -> list[tuple[float, str]]:
    with ThreadPoolExecutor(clients) as pool:
        return list(pool.map(lambda p: timed_create(admin, p), pods))


def wait_for_namespaces(admin: Kube, admission: Admission) -> None:
    want = len(admin.list("v1", "Namespace"))
    deadline = time.monotonic() + 30
    while admission.view_count("namespaces") != want:
        if time.monotonic() > deadline:
            raise SystemExit("the server's view did not catch up with the namespaces")
        time.sleep(0.1)


def caps_on_vs_off(admin: Kube, admission: Admission, total: int, clients: int, apiserver_pids: list[int],
                   webhook_pid: int) -> None:
    spaces = {caps: [namespace(admin, f"team-{caps}", caps) for _ in range(2)] for caps in (False, True)}
    wait_for_namespaces(admin, admission)
    # warm up both paths (connections, the ledger objects' creation, first-use caches)
    for caps in (False, True):
        creations(admin, clients, [pod(f"warm-{i}", spaces[caps][i % 2], gpu_container()) for i in range(clients)])
    times: dict[bool, list[float]] = {False: [], True: []}
    processes = {"kube-apiserver": apiserver_pids[1], "etcd": apiserver_pids[0], "gpu-admission": webhook_pid}
    cpu: dict[bool, dict[str, float]] = {caps: dict.fromkeys(processes, 0.0) for caps in (False, True)}
    for start in range(0, total, ROUND):
        for caps in (False, True):
            batch = [pod(f"p{start + i}", spaces[caps][i % 2], gpu_container()) for i in range(min(ROUND, total - start))]
            before = {name: cpu_seconds(pid) for name, pid in processes.items()}
            results = creations(admin, clients, batch)
            for name, pid in processes.items():
                cpu[caps][name] += cpu_seconds(pid) - before[name]
            refused = [r for _, r in results if r]
            if refused:
                raise SystemExit(f"caps {'on' if caps else 'off'}: refused: {refused[0]}")
            times[caps].extend(t for t, _ in results)
    off, on = times[False], times[True]
    print(f"pod creation through kube-apiserver, {total} GPU pods each, {clients} clients, caps never reached")
    for name, values in (("caps off", off), ("caps on (a team ledger)", on)):
        caps = values is on
        spent = ", ".join(f"{p} {cpu[caps][p] / total * 1000:.2f}" for p in processes)
        print(f"  {name:<24} p50 {percentile(values, 0.5) * 1000:7.2f} ms   p99 {percentile(values, 0.99) * 1000:7.2f} ms"
              f"   CPU ms per pod: {spent}")
    p50 = (percentile(on, 0.5) - percentile(off, 0.5)) * 1000
    p99 = (percentile(on, 0.99) - percentile(off, 0.99)) * 1000
    ratio = percentile(on, 0.5) / percentile(off, 0.5)
    print(f"  added by the ledger: p50 {p50:+.2f} ms ({ratio:.2f}x)   p99 {p99:+.2f} ms")
    print(f"target: added <= 5 ms p50 -> {'met' if p50 <= 5 else 'NOT met'}; "
          f"<= 20 ms p99 -> {'met' if p99 <= 20 else 'NOT met'}")


def burst(admin: Kube, admission: Admission, timeout: float) -> None:
    spaces = [namespace(admin, "burst", True) for _ in range(2)]
    wait_for_namespaces(admin, admission)
    results = creations(admin, 64, [pod(f"b{i}", spaces[i % 2], gpu_container()) for i in range(64)])
    stored = sum(1 for _, r in results if not r)
    capped = sum(1 for _, r in results if "uses 32 of 32" in r)
    other = [r for _, r in results if r and "uses 32 of 32" not in r]
    slowest = max(t for t, _ in results)
    print(f"64 pods at once under a team cap of 32: {stored} stored, {capped} refused by the cap, "
          f"{len(other)} otherwise; slowest {slowest * 1000:.0f} ms (webhook timeout {timeout:g} s)")
    decided = stored + capped == 64 and slowest < timeout
    print(f"target: every request decided, none past the webhook timeout -> {'met' if decided else 'NOT met'}"
          + (f" ({other[0][:200]})" if other else ""))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=300)
    parser.add_argument("--clients", type=int, default=8)
    args = parser.parse_args(argv)
    folder = Path(tempfile.mkdtemp(prefix="gpu-admission-bench-quota-"))
    apiserver = ApiServer(find_assets(), folder / "kube")
    try:
        apiserver.start()
        admin = Kube(apiserver.kubeconfig(folder / "admin.kubeconfig", ADMIN_TOKEN))
        policies = folder / "policies"
        shutil.copytree(POLICIES, policies)
        (policies / "bench-caps.yaml").write_text(CAPS)
        # the shipped release window (not the e2e suite's short one): reservations last what they would
        admission = Admission(apiserver, admin, folder / "gpu-admission", policies, LedgerSettings().window)
        admission.install()
        admission.start()
        try:
            timeout = float(next(h["timeoutSeconds"] for d in documents(REPO / "deploy" / "base" / "validatingwebhook.yaml")
                                 for h in d["webhooks"]))
            assert admission.process is not None
            pids = [p.pid for p in apiserver.processes]
            caps_on_vs_off(admin, admission, args.pods, args.clients, pids, admission.process.pid)
            # the same, one client at a time: what a charge adds when kube-apiserver is not kept busy
            caps_on_vs_off(admin, admission, max(args.pods // 5, ROUND), 1, pids, admission.process.pid)
            burst(admin, admission, timeout)
        finally:
            admission.stop()
            admin.close()
    finally:
        apiserver.cleanup()
        shutil.rmtree(folder, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
