"""Benchmark: what each part of the compiled MutatingAdmissionPolicy costs kube-apiserver.

``make bench-cel`` compares whole states; this takes the MutatingAdmissionPolicy apart. One
kube-apiserver (1.36.2 by default) with deploy/'s RuntimeClass and PriorityClasses, no webhook and
no ValidatingAdmissionPolicy of ours; the policy compiled from policies/ is installed in turn as
each variant below, and bench/cel.py's training pod is created (dry-run: nothing stored, so the
figures are the admission chain's and the request's own) ``--pods`` times per variant and round
from ``--clients`` threads. The variants take turns, each round starting one later. It prints
kube-apiserver's CPU per create, the median of the rounds, and each variant's difference to the
shell:

- **shell**: bench/cel.py's shell (the policy's binding and matchConditions, a mutation that adds
  one annotation: kube-apiserver's re-invocation runs as for the compiled one);
- **reads the object**: the same, after reading ``object.spec.containers``;
- **constant patch**: the JSON Patch the compiled policy makes for this pod, written as a constant
  (the pod as stored is checked to be the compiled policy's), returned on the first invocation
  only: what applying our change costs, not computing it;
- **as compiled**: the policy as ``policies compile`` writes it;
- with ``--rules``: **rule X**: the compiled policy with the mutations of rule X only (each with
  the record of pod specs every rule reads, ``targets``), and **targets**: that record alone.

A benchmark, not a test: the figures of one run are compared with each other.

    python bench/cel_parts.py [--pods 400 --clients 4 --rounds 6 --rules --k8s 1.36.2]
"""

from __future__ import annotations

import argparse
import copy
import os
import shutil
import statistics
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonpatch
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.cel import _canaries, canary, create_all, shell, training_pod  # noqa: E402
from bench.proc import cpu_seconds  # noqa: E402
from tests.e2e.apiserver import ADMIN_TOKEN, ApiServer, find_assets  # noqa: E402
from tests.e2e.equivalence import WEBHOOKS_USER, Client  # noqa: E402
from tests.e2e.kube import Kube, Object, eventually  # noqa: E402
from webhook.cel import command, mutating, patches, reach  # noqa: E402
from webhook.cel import syntax as cel  # noqa: E402
from webhook.policy import loader  # noqa: E402
from webhook.policy.engine import PROVENANCE_ANNOTATION  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
NAMESPACE = "bench-cel-parts"
SHELL_MARK = "bench-cel/shell"
#: what the pod as stored has that kube-apiserver, not the policy, decides
_SERVER_FIELDS = ("name", "uid", "creationTimestamp", "resourceVersion", "managedFields")
#: what the Priority plugin writes after the policy sets a class
_PRIORITY_PATHS = ("/spec/priority", "/spec/preemptionPolicy")


def compiled(keep: set[str] | None = None) -> list[Object]:
    """The MutatingAdmissionPolicy and its binding compiled from policies/; with ``keep``, the
    mutations of those rules only (None when none of them compiled)."""
    text = "\n---\n".join(p.read_text() for p in sorted((REPO / "policies").glob("*.yaml")))
    mutating_reach, validating_reach = reach.read(REPO / "deploy" / "base")
    groups = mutating._groups

    def kept(compilation: Any) -> list[list[Any]]:
        out = []
        for group in groups(compilation):
            rules = [(policy, [(r, s) for r, s in rules if keep is None or r in keep]) for policy, rules in group]
            if any(r for _, r in rules):
                out.append([(policy, r) for policy, r in rules if r])
        return out

    mutating._groups = kept  # type: ignore[assignment]
    try:
        files = command.compile_files(loader.load_text(text), (1, 36), mutating_reach, validating_reach)
    finally:
        mutating._groups = groups  # type: ignore[assignment]
    return [d for d in yaml.safe_load_all(files.get("mutating-policies.yaml", "")) if d]


def with_mutation(docs: list[Object], expression: str) -> list[Object]:
    """``docs`` with the policy's one mutation made ``expression``."""
    docs = copy.deepcopy(docs)
    policy = next(d for d in docs if d["kind"] == "MutatingAdmissionPolicy")
    policy["spec"]["mutations"] = [{"patchType": "JSONPatch", "jsonPatch": {"expression": expression}}]
    return docs


def mark(value: str = "yes") -> str:
    return f"[JSONPatch{{op: 'add', path: '/metadata/annotations', value: {{'{SHELL_MARK}': '{value}'}}}}]"


def variants(rules: bool) -> dict[str, list[Object]]:
    full = compiled()
    out = {
        "shell": [shell(d) for d in full],
        "reads the object": with_mutation(full, f"variables.mutating && size(object.spec.containers) > 0 ? {mark()} : []"),
        "as compiled": full,
    }
    if rules:
        out["targets"] = with_mutation(full, f"variables.mutating && size(variables.targets.filter(t, t.gpu)) > 0 ? {mark()} : []")
        for rule in mutating.MUTATIONS:
            docs = compiled({rule})
            if docs:
                out[f"rule {rule}"] = docs
    return out


def constant_patch(ops: list[dict[str, Any]], full: list[Object]) -> list[Object]:
    """The policy returning ``ops`` (JSON Patch adds) as a constant on the first invocation only
    (the second finds runtimeClassName set: every compiled change of the bench pod sets it)."""
    if not all(op["op"] == "add" for op in ops):
        raise SystemExit(f"the compiled change is not adds only: {ops}")
    literal = ", ".join(f"JSONPatch{{op: 'add', path: {cel.quote(op['path'])}, value: {patches.value(op['value'])}}}"
                        for op in ops)
    return with_mutation(full, f"variables.mutating && !has(object.spec.runtimeClassName) ? [{literal}] : []")


class Bench:
    def __init__(self, apiserver: ApiServer, admin: Kube) -> None:
        self.apiserver, self.admin = apiserver, admin
        self.client = Client(apiserver, admin, WEBHOOKS_USER)
        self.client.token = ADMIN_TOKEN
        self.current: list[Object] = []
        self.pid = apiserver.processes[1].pid

    def put(self, name: str, docs: list[Object]) -> None:
        """Install ``docs`` in place of the last, and wait until kube-apiserver runs them."""
        for doc in self.current:
            self.admin.delete(doc)
        for doc in docs + _canaries(name):
            self.admin.apply(doc, manager="bench-cel-parts")
        eventually(lambda: canary(self.client, NAMESPACE) == name, timeout=60, what=name)
        self.current = docs + _canaries(name)

    def outcome(self, name: str, docs: list[Object], annotation: str) -> Object:
        """The pod as kube-apiserver would store it under ``docs``, once their change is seen."""
        self.put(name, docs)

        def created() -> Object | None:
            answer = self.client.create(training_pod(), NAMESPACE)
            if answer.status >= 300 or answer.obj is None:
                raise SystemExit(f"{name}: {answer.status} {answer.message}")
            return answer.obj if annotation in (answer.obj["metadata"].get("annotations") or {}) else None

        obj = eventually(created, timeout=60, what=f"{name}'s change")
        for key in _SERVER_FIELDS:
            obj["metadata"].pop(key, None)
        return obj

    def cpu_per_create(self, pods: int, clients: int) -> float:
        create_all(self.client, NAMESPACE, pods, clients, dry_run=True)  # warm up: programs compiled, caches filled
        before = cpu_seconds(self.pid)
        create_all(self.client, NAMESPACE, pods, clients, dry_run=True)
        return (cpu_seconds(self.pid) - before) / pods * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--pods", type=int, default=400, help="dry-run creates per variant and round")
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--rules", action="store_true", help="also each rule's mutations alone, and the targets record alone")
    parser.add_argument("--k8s", default="1.36.2", help="the kube-apiserver version (1.36 or later: MutatingAdmissionPolicy)")
    args = parser.parse_args()
    os.environ["GPU_ADMISSION_E2E_K8S"] = args.k8s
    found = variants(args.rules)
    folder = Path(tempfile.mkdtemp(prefix="gpu-admission-bench-cel-parts-"))
    apiserver = ApiServer(find_assets(), folder / "kube")
    try:
        apiserver.start()
        admin = Kube(apiserver.kubeconfig(folder / "admin.kubeconfig", ADMIN_TOKEN))
        admin.ensure({"apiVersion": "v1", "kind": "Namespace",
                      "metadata": {"name": NAMESPACE, "labels": {"gpu-admission.io/enabled": "true"}}})
        for path in (REPO / "deploy/runtimeclass/runtimeclass.yaml", REPO / "deploy/base/priorityclasses.yaml"):
            for doc in yaml.safe_load_all(path.read_text()):
                if doc:
                    admin.apply(doc, manager="bench-cel-parts")
        bench = Bench(apiserver, admin)
        shelled = bench.outcome("shell", found["shell"], SHELL_MARK)
        shelled["metadata"]["annotations"].pop(SHELL_MARK)
        if not shelled["metadata"]["annotations"]:
            del shelled["metadata"]["annotations"]
        made = bench.outcome("as compiled", found["as compiled"], PROVENANCE_ANNOTATION)
        ops = [op for op in jsonpatch.make_patch(shelled, made).patch if op["path"] not in _PRIORITY_PATHS]
        found = {**found, "constant patch": constant_patch(ops, found["as compiled"])}
        if bench.outcome("constant patch", found["constant patch"], PROVENANCE_ANNOTATION) != made:
            raise SystemExit("the constant patch does not store the pod the compiled policy makes")
        measure(bench, found, args.pods, args.clients, args.rounds, print)
    finally:
        apiserver.cleanup()
        shutil.rmtree(folder, ignore_errors=True)


def measure(bench: Bench, found: dict[str, list[Object]], pods: int, clients: int, rounds: int,
            say: Callable[[str], None]) -> None:
    say(f"kube-apiserver CPU per dry-run create of the training pod: {pods} per variant and round, "
        f"{clients} clients, {rounds} rounds, the variants taking turns")
    results: dict[str, list[float]] = {name: [] for name in found}
    names = list(found)
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            bench.put(name, found[name])
            results[name].append(bench.cpu_per_create(pods, clients))
            say(f"  round {r + 1}: {name:28s} {results[name][-1]:.3f} ms")
    base = statistics.median(results["shell"])
    width = max(len(n) for n in names)
    for name in names:
        m = statistics.median(results[name])
        say(f"{name:{width}s}  median {m:.2f} ms  ({m - base:+.2f} over the shell)  "
            f"rounds {' '.join(f'{v:.2f}' for v in results[name])}")


if __name__ == "__main__":
    main()
