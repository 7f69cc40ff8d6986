"""Benchmark: pod creation through a real kube-apiserver with gpu-admission's compiled policies,
against its webhooks alone and against no admission at all, in the same run.

One kube-apiserver (1.36.2 by default: MutatingAdmissionPolicy is v1 there) and etcd, started as
the end-to-end suite starts them (tests/e2e), with deploy/'s objects and two gpu-admission
servers (one whole, one ``serve --compiled``). The cluster is put, in turn, in each state a
platform team would install, and the same pods are created:

- **no admission**: a namespace not opted in (nothing selects it);
- **webhooks alone**: deploy/: both webhooks, every rule in the server;
- **compiled + slimmed webhooks**: deploy/compiled/: the ValidatingAdmissionPolicies and the
  MutatingAdmissionPolicy of ``policies compile``, and the webhooks of the server that skips
  what they run;
- **compiled policies alone**: those policies and no webhook (what they cost in kube-apiserver);
- **their shells alone**: the same policies and bindings (match constraints, the webhooks' match
  conditions, failure policies, validation actions, reinvocation) with every expression of ours taken
  out: each ValidatingAdmissionPolicy validates ``true`` (no matchCondition: its own compute its
  findings), the MutatingAdmissionPolicy adds one annotation (a
  change, as the compiled mutation makes one to every GPU pod, which starts kube-apiserver's
  re-invocation). What kube-apiserver spends on running in-process policies at all, before any
  expression of ours (a policy that a matchCondition of ours skips costs less than its shell, which
  runs on every object the webhooks' reach sends it).

Each round goes through every state (each round starting one state later: over as many rounds as
there are states, each takes every place once) and creates the same 4-GPU training
pod (bench/server.py's) ``--pods`` times from ``--clients`` threads, timing each create, then
deletes them. It prints p50 and p99 of each state, their ratios to no admission, and the CPU
each process spent per create, which does not depend on how loaded the machine is. A
benchmark, not a test: compare the figures of one run with each other.

    make bench-cel          # or: python bench/cel.py [--pods 200 --clients 8 --rounds N --k8s 1.36.2]
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

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.proc import cpu_seconds  # noqa: E402
from tests.e2e.admission import DEPLOY, Admission, webhook_configurations  # noqa: E402
from tests.e2e.apiserver import ADMIN_TOKEN, ApiServer, find_assets  # noqa: E402
from tests.e2e.equivalence import WEBHOOKS_USER, Client  # noqa: E402
from tests.e2e.kube import Kube, Object, Refused, eventually  # noqa: E402
from webhook.cel import command, output, reach  # noqa: E402
from webhook.policy import loader, offload  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
OPT_IN = "gpu-admission.io/enabled"
NAMESPACE, PLAIN = "bench-cel", "bench-cel-none"
CANARY = "bench-canary"
#: state → (the namespace its pods are created in, the compiled policies installed ("now", "before"
#: with ``--before``, or None), webhooks' server or None)
STATES: dict[str, tuple[str, str | None, str | None]] = {
    "no admission": (PLAIN, None, "whole"),
    "webhooks alone": (NAMESPACE, None, "whole"),
    "compiled + slimmed webhooks": (NAMESPACE, "now", "slimmed"),
    "compiled policies alone": (NAMESPACE, "now", None),
    "their shells alone": (NAMESPACE, "shells", None),
}
#: with ``--before DIR``: another compiled output (e.g. an earlier commit's deploy/compiled/policies) alone
BEFORE = "compiled alone, --before"


def training_pod() -> dict[str, Any]:
    """bench/server.py's 4-GPU training pod, named by the apiserver (generateName)."""
    from bench.server import payloads

    obj = copy.deepcopy(payloads()["training pod"]["request"]["object"])
    obj["metadata"] = {"generateName": "bench-", "labels": obj.get("metadata", {}).get("labels") or {}}
    obj["spec"].pop("nodeName", None)
    return obj


class Cluster:
    """The apiserver, the two servers, and the states it is put in."""

    def __init__(self, apiserver: ApiServer, admin: Kube, folder: Path, before: Path | None = None) -> None:
        self.apiserver, self.admin = apiserver, admin
        policies = folder / "policies"
        shutil.copytree(REPO / "policies", policies)
        compiled = folder / "compiled"
        self.servers = {
            "whole": Admission(apiserver, admin, folder / "whole", policies),
            "slimmed": Admission(apiserver, admin, folder / "slimmed", policies, serve_args=("--compiled", str(compiled))),
        }
        mutating, validating = reach.read(DEPLOY / "base")
        files = command.compile_files(loader.load_directory(policies), offload.kube_version(apiserver.version),
                                      mutating, validating)
        compiled.mkdir()
        for name, text in files.items():
            (compiled / name).write_text(text)
        now = [d for name in (output.VALIDATING, output.MUTATING) if name in files for d in yaml.safe_load_all(files[name]) if d]
        self.compiled = {"now": now + _canaries("now"), "shells": [shell(d) for d in now] + _canaries("shells")}
        if before is not None:
            self.compiled["before"] = [d for name in (output.VALIDATING, output.MUTATING) if (before / name).exists()
                                       for d in yaml.safe_load_all((before / name).read_text()) if d] + _canaries("before")
        self.client = Client(apiserver, admin, WEBHOOKS_USER)
        self.state: tuple[str | None, str | None] = (None, "whole")

    def start(self) -> None:
        whole = self.servers["whole"]
        whole.install()  # deploy/'s objects, its webhook configurations pointed at the whole server
        whole.start()
        slimmed = self.servers["slimmed"]
        slimmed.project_secret()
        slimmed.server_kubeconfig()
        slimmed.start()
        for name, labels in ((NAMESPACE, {OPT_IN: "true"}), (PLAIN, {})):
            self.admin.ensure({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}})

    def stop(self) -> None:
        for server in self.servers.values():
            server.stop()

    def put(self, compiled: str | None, webhooks: str | None) -> None:
        """Install or remove the compiled policies, point the webhooks at a server or remove them,
        and wait until kube-apiserver acts so."""
        if compiled != self.state[0]:
            if self.state[0] is not None:
                for doc in self.compiled[self.state[0]]:
                    self.admin.delete(doc)
            for doc in self.compiled[compiled] if compiled is not None else []:
                self.admin.apply(doc, manager="bench")
            eventually(lambda: canary(self.client, NAMESPACE) == compiled, timeout=60, what="kube-apiserver acting on the compiled policies")
        if webhooks != self.state[1]:
            configs = webhook_configurations(self.servers[webhooks].port if webhooks else 0)
            for config in configs:
                if webhooks is None:
                    self.admin.delete(config)
                    continue
                try:
                    current = self.admin.get(config["apiVersion"], config["kind"], config["metadata"]["name"])
                except Refused:
                    current = None
                if current is None:
                    self.admin.create(_with_ca(config, self.servers["whole"]))
                else:
                    for hook, wanted in zip(current["webhooks"], config["webhooks"]):
                        hook["clientConfig"]["url"] = wanted["clientConfig"]["url"]
                    current["metadata"].pop("managedFields", None)
                    self.admin.replace(current)
            eventually(lambda: self._answering() == webhooks, timeout=60, what=f"the webhooks reaching {webhooks}")
        self.state = (compiled, webhooks)

    def _answering(self) -> str | None:
        """Which server the webhooks call now (a dry-run pod: whose request count moves)."""
        counts = {name: s.metric('gpu_admission_request_duration_seconds_count{endpoint="/mutate"}') for name, s in self.servers.items()}
        self.client.create(training_pod(), NAMESPACE)
        for name, server in self.servers.items():
            if server.metric('gpu_admission_request_duration_seconds_count{endpoint="/mutate"}') > counts[name]:
                return name
        return None

    def processes(self) -> dict[str, int]:
        found = {"kube-apiserver": self.apiserver.processes[1].pid, "etcd": self.apiserver.processes[0].pid}
        for name, server in self.servers.items():
            assert server.process is not None
            found[f"gpu-admission ({name})"] = server.process.pid
        return found


def _with_ca(config: Object, server: Admission) -> Object:
    """A webhook configuration recreated with the CA bundle certs install wrote."""
    ca = (server.cert_dir / "ca.crt").read_bytes()
    import base64

    config = copy.deepcopy(config)
    for hook in config["webhooks"]:
        hook["clientConfig"]["caBundle"] = base64.b64encode(ca).decode()
    return config


def shell(doc: Object) -> Object:
    """A compiled policy or binding with no expression of ours: a ValidatingAdmissionPolicy that
    validates ``true`` wherever it is bound, a MutatingAdmissionPolicy that adds one annotation where
    the webhooks' matchConditions hold; bindings as they are."""
    doc = copy.deepcopy(doc)
    spec = doc["spec"]
    if doc["kind"] == "ValidatingAdmissionPolicy":
        # (its matchConditions are ours: each computes what its validations would find; the
        # webhooks' reach is a variable, which the shell has no use for)
        spec.pop("matchConditions", None)
        spec.pop("variables", None)
        spec.pop("auditAnnotations", None)
        spec["validations"] = [{"expression": "true"}]
    elif doc["kind"] == "MutatingAdmissionPolicy":
        spec.pop("variables", None)
        spec["mutations"] = [{"patchType": "JSONPatch", "jsonPatch": {
            "expression": "[JSONPatch{op: 'add', path: '/metadata/annotations', value: {'bench-cel/shell': 'yes'}}]"}}]
    return doc


def _canaries(which: str) -> list[Object]:
    rules = [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["configmaps"]}]
    return [
        {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy", "metadata": {"name": CANARY},
         "spec": {"matchConstraints": {"resourceRules": rules},
                  "matchConditions": [{"name": "canary", "expression": f"object.metadata.name == '{CANARY}'"}],
                  "validations": [{"expression": "false", "message": f"{CANARY} {which}"}]}},
        {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding", "metadata": {"name": CANARY},
         "spec": {"policyName": CANARY, "validationActions": ["Warn"]}},
    ]


def canary(client: Client, namespace: str) -> str | None:
    """Which compiled policies kube-apiserver runs (the canary applied with them, ``_canaries``, warns so)."""
    probe = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": CANARY}, "data": {}}
    marks = [w.rsplit(f"{CANARY} ", 1)[-1] for w in client.create(probe, namespace).warnings if f"{CANARY} " in w]
    return marks[0] if len(marks) == 1 else None


def create_all(client: Client, namespace: str, pods: int, clients: int, dry_run: bool = False) -> list[float]:
    """Create ``pods`` pods from ``clients`` threads (``dry_run``: none stored): each create's latency,
    in milliseconds."""
    pod = training_pod()
    latencies: list[float] = []
    lock = threading.Lock()
    failures: list[str] = []

    def work(count: int) -> None:
        mine = []
        for _ in range(count):
            start = time.perf_counter()
            outcome = client.create(pod, namespace, dry_run=dry_run)
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


def measure(cluster: Cluster, pods: int, clients: int, rounds: int,
            say: Callable[[str], None]) -> tuple[dict[str, list[float]], dict[str, dict[str, float]]]:
    """Every state, ``rounds`` times: latencies per state, and the CPU each process spent per create."""
    processes = cluster.processes()
    states = [s for s in STATES if STATES[s][1] in (None, *cluster.compiled)]
    rounds = rounds or len(states)
    results: dict[str, list[float]] = {state: [] for state in states}
    cpu: dict[str, dict[str, float]] = {state: dict.fromkeys(processes, 0.0) for state in states}
    for round_ in range(rounds):
        # each state in turn first: a state's place in the round moves its figures (an output compared with
        # itself through --before measured 0.9 ms of CPU and 4 ms of p50 dearer in the last place than in
        # the fourth), so over as many rounds as states each takes every place once
        shift = round_ % len(states)
        order = states[shift:] + states[:shift]
        for state in order:
            namespace, compiled, webhooks = STATES[state]
            cluster.put(compiled, webhooks)
            before = {name: cpu_seconds(pid) for name, pid in processes.items()}
            latencies = create_all(cluster.client, namespace, pods, clients)
            for name, pid in processes.items():
                cpu[state][name] += cpu_seconds(pid) - before[name]
            results[state].extend(latencies)
            delete_all(cluster.admin, namespace)
            say(f"  round {round_ + 1}: {state:<28} p50 {percentile(latencies, 0.5):7.1f} ms")
    per_create = {state: {name: 1000 * seconds / len(results[state]) for name, seconds in spent.items()}
                  for state, spent in cpu.items()}
    return results, per_create


def profile(cluster: Cluster, states: list[str], seconds: int, folder: Path, clients: int,
            say: Callable[[str], None]) -> None:
    """kube-apiserver's CPU profile (its /debug/pprof/profile, on by default: ``--profiling``) while
    pods are created without pause in each of ``states``: ``folder``/<state>.pb.gz, for ``go tool pprof``."""
    import ssl
    import urllib.request

    folder.mkdir(parents=True, exist_ok=True)
    context = ssl.create_default_context(cafile=str(cluster.apiserver.ca_file))
    for state in states:
        namespace, compiled, webhooks = STATES[state]
        cluster.put(compiled, webhooks)
        found: list[bytes] = []

        def fetch() -> None:
            request = urllib.request.Request(f"{cluster.apiserver.url}/debug/pprof/profile?seconds={seconds}",
                                             headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
            with urllib.request.urlopen(request, context=context, timeout=seconds + 60) as response:
                found.append(response.read())

        fetching = threading.Thread(target=fetch)
        fetching.start()
        created = 0
        while fetching.is_alive():
            created += len(create_all(cluster.client, namespace, 8 * clients, clients))
        fetching.join()
        path = folder / f"{state.replace(' ', '-').replace('+', 'and')}.pb.gz"
        path.write_bytes(found[0])
        delete_all(cluster.admin, namespace)
        say(f"  profile of {state}: {seconds} s, {created} creates: {path}")


def report(results: dict[str, list[float]], cpu: dict[str, dict[str, float]], say: Callable[[str], None]) -> None:
    base = results["no admission"]
    base50, base99 = percentile(base, 0.5), percentile(base, 0.99)
    say("latency of a create (wall clock, the machine's load included):")
    for state, latencies in results.items():
        p50, p99 = percentile(latencies, 0.5), percentile(latencies, 0.99)
        say(f"  {state:<28} p50 {p50:7.1f} ms  p99 {p99:7.1f} ms   ({p50 / base50:.2f}x, {p99 / base99:.2f}x no admission; "
            f"mean {statistics.fmean(latencies):.1f} ms, {len(latencies)} creates)")
    say("CPU per create (user + system, from /proc, 10 ms clock ticks):")
    names = list(next(iter(cpu.values())))
    say("  " + " " * 28 + "".join(f"{n:>24}" for n in names) + f"{'total':>10}")
    for state, spent in cpu.items():
        say(f"  {state:<28}" + "".join(f"{spent[n]:21.2f} ms" for n in names) + f"{sum(spent.values()):7.2f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--pods", type=int, default=200, help="pods per state and round")
    parser.add_argument("--clients", type=int, default=8, help="threads creating them")
    parser.add_argument("--rounds", type=int, default=0, help="default: as many as states (each takes every place once)")
    parser.add_argument("--k8s", default="1.36.2", help="the kube-apiserver version (tests/e2e finds it)")
    parser.add_argument("--before", type=Path, metavar="DIR",
                        help="also measure another compiled output alone (a folder as `policies compile -o` writes)")
    parser.add_argument("--profile", type=Path, metavar="DIR",
                        help="then write kube-apiserver's CPU profile of each state with admission to DIR")
    parser.add_argument("--profile-seconds", type=int, default=20)
    args = parser.parse_args()
    os.environ["GPU_ADMISSION_E2E_K8S"] = args.k8s
    folder = Path(tempfile.mkdtemp(prefix="gpu-admission-bench-cel-"))
    apiserver = ApiServer(find_assets(), folder / "kube")
    try:
        apiserver.start()
        admin = Kube(apiserver.kubeconfig(folder / "admin.kubeconfig", ADMIN_TOKEN))
        if args.before is not None:
            STATES[BEFORE] = (NAMESPACE, "before", None)
        cluster = Cluster(apiserver, admin, folder, args.before)
        cluster.start()
        try:
            print(f"pod creation through kube-apiserver {apiserver.version}: {args.pods} GPU pods per state and round, "
                  f"{args.clients} clients, {args.rounds or 'one per state'} round(s), the states taking turns")
            results, cpu = measure(cluster, args.pods, args.clients, args.rounds, print)
            report(results, cpu, print)
            if args.profile is not None:
                profile(cluster, [s for s in STATES if s != "no admission"], args.profile_seconds, args.profile, args.clients, print)
        finally:
            cluster.stop()
    finally:
        apiserver.cleanup()
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
