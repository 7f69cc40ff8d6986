"""Two setups side by side in one kube-apiserver, and what each answers: the compiled-policy
equivalence test's machinery (tests/e2e/test_compiled_equivalence.py, docs/compiled-policies.md).

- **webhooks**: gpu-admission's two webhooks alone, on every rule;
- **compiled**: the compiled ValidatingAdmissionPolicies and MutatingAdmissionPolicy (as
  ``policies compile`` writes them for this kube-apiserver's version) plus the slimmed webhooks
  (``serve --compiled``), which skip what those run.

Each setup has its own gpu-admission server and its own copy of deploy/'s webhook
configurations; requests reach one setup or the other by their user (a ``matchCondition`` on
``request.userInfo.username`` added to the copies, to the compiled policies and, excluding both
users, to the session's shipped configurations). Nothing else of deploy/ or of the compiled
output changes. Requests are dry runs (``dryRun=All``): nothing is stored, and the answer is
what would be.
"""

from __future__ import annotations

import copy
import json
import re
import ssl
import urllib.error
import urllib.request
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tests.e2e.admission import WEBHOOK_FILES, Admission, DEPLOY
from tests.e2e.apiserver import ApiServer
from tests.e2e.kube import Kube, Object, documents, eventually
from webhook.cel import command, reach
from webhook.policy import loader, offload
from webhook.server.policies import directory_digest

WEBHOOKS_USER, COMPILED_USER, IN_PROCESS_USER = "e2e-webhooks", "e2e-compiled", "e2e-in-process"
TOKENS = {WEBHOOKS_USER: "e2e-webhooks-token", COMPILED_USER: "e2e-compiled-token", IN_PROCESS_USER: "e2e-in-process-token"}
#: the users whose requests the setups' webhook copies take
ROUTED = (WEBHOOKS_USER, COMPILED_USER)
PROVENANCE = "gpu-admission.io/mutated"
ROUTING = "e2e-equivalence-routing"
CANARY = "e2e-canary"
#: the label of the canary ConfigMap its generation's bindings select
CANARY_GENERATION = "e2e-canary-generation"


def _user_condition(expression: str) -> dict[str, str]:
    return {"name": ROUTING, "expression": expression}


ONLY = {user: _user_condition(f"request.userInfo.username == '{user}'") for user in TOKENS}
NEITHER = _user_condition(f"!(request.userInfo.username in {json.dumps(list(TOKENS))})".replace('"', "'"))
#: the compiled policies act for the compiled setup, and alone (no webhook) for the in-process user
COMPILED_ONLY = _user_condition(f"request.userInfo.username in {json.dumps([COMPILED_USER, IN_PROCESS_USER])}".replace('"', "'"))


@dataclass
class Outcome:
    """What kube-apiserver answered one request."""

    status: int
    obj: Object | None = None
    message: str = ""
    warnings: list[str] = field(default_factory=list)


class Client:
    """Raw HTTPS to the apiserver as one user: the answer's status, body and Warning headers
    (which the kubernetes client does not return)."""

    def __init__(self, apiserver: ApiServer, admin: Kube, user: str) -> None:
        self.apiserver, self.admin = apiserver, admin
        self.token = TOKENS[user]
        self.context = ssl.create_default_context(cafile=str(apiserver.ca_file))

    def path(self, obj: Object, namespace: str, name: str | None = None) -> str:
        resource = self.admin.dynamic.resources.get(api_version=obj["apiVersion"], kind=obj["kind"])
        return str(resource.path(name=name, namespace=namespace if resource.namespaced else None))

    def send(self, method: str, path: str, body: Object | None = None, dry_run: bool = True) -> Outcome:
        url = self.apiserver.url + path + ("?dryRun=All" if dry_run else "")
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(url, data=data, method=method, headers={
            "Authorization": f"Bearer {self.token}", "Content-Type": "application/json", "Accept": "application/json"})
        try:
            with urllib.request.urlopen(request, context=self.context, timeout=60) as response:
                return Outcome(response.status, json.loads(response.read()), "", _warnings(response.headers))
        except urllib.error.HTTPError as exc:
            payload = exc.read()
            try:
                message = str(json.loads(payload).get("message", ""))
            except ValueError:
                message = payload.decode(errors="replace")
            return Outcome(exc.code, None, message, _warnings(exc.headers))

    def create(self, obj: Object, namespace: str, dry_run: bool = True) -> Outcome:
        return self.send("POST", self.path(obj, namespace), obj, dry_run)

    def replace(self, obj: Object, namespace: str, dry_run: bool = True) -> Outcome:
        return self.send("PUT", self.path(obj, namespace, obj["metadata"]["name"]), obj, dry_run)

    def delete(self, obj: Object, namespace: str) -> None:
        """At once: no kubelet confirms a bound pod's graceful deletion here."""
        options = {"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0}
        self.send("DELETE", self.path(obj, namespace, obj["metadata"]["name"]), options, dry_run=False)


def _warnings(headers: Any) -> list[str]:
    found = []
    for value in headers.get_all("Warning") or []:
        text = re.sub(r'^\d{3} \S+ "', "", value)
        text = text[:-1] if text.endswith('"') else text
        found.append(text.replace('\\"', '"').replace("\\\\", "\\"))
    return found


class Setups:
    """The two setups, their servers, their routing and the compiled policies they load."""

    def __init__(self, apiserver: ApiServer, admin: Kube, session: Admission, folder: Path) -> None:
        self.apiserver, self.admin, self.session, self.folder = apiserver, admin, session, folder
        major, minor = (int(p) for p in apiserver.version.split(".")[:2])
        self.version = (major, minor)
        self.compiled_dir = folder / "compiled"
        self.servers = {  # (the users ROUTED names)
            WEBHOOKS_USER: Admission(apiserver, admin, folder / "webhooks", folder / "webhooks-policies"),
            COMPILED_USER: Admission(apiserver, admin, folder / "slimmed", folder / "slimmed-policies",
                                     serve_args=("--compiled", str(self.compiled_dir))),
        }
        self.clients = {user: Client(apiserver, admin, user) for user in TOKENS}
        self.applied: list[Object] = []
        #: each compiled policy or binding as last applied: one unchanged is not applied again (kube-apiserver
        #: compiles every CEL expression of a policy it is sent, ~1 s of its CPU for the mutating one)
        self.sent: dict[tuple[str, str], Object] = {}
        self.shipped: list[Object] = []
        self.generation = 0

    # -- set-up and tear-down

    def start(self, policies: dict[str, str]) -> None:
        self._write(policies)
        for server in self.servers.values():
            server.project_secret()
            server.server_kubeconfig()
            server.start()
        self._route()

    def stop(self) -> None:
        for config in self.shipped:  # the session's configurations as they were
            current = self.admin.get(config["apiVersion"], config["kind"], config["metadata"]["name"])
            for hook in current["webhooks"]:
                hook["matchConditions"] = [c for c in hook.get("matchConditions") or [] if c["name"] != ROUTING]
            self.admin.replace(current)
        for obj in reversed(self.applied):
            self.admin.delete(obj)
        for server in self.servers.values():
            server.stop()

    def _route(self) -> None:
        """Copies of deploy/'s configurations per setup (the session's caBundle, its own server),
        and the session's own configurations kept from both setups' users."""
        for name in WEBHOOK_FILES:
            for doc in documents(DEPLOY / name):
                current = self.admin.get(doc["apiVersion"], doc["kind"], doc["metadata"]["name"])
                ca = {h["name"]: h["clientConfig"].get("caBundle") for h in current["webhooks"]}
                self.shipped.append(current)
                kept = copy.deepcopy(current)
                for hook in kept["webhooks"]:
                    hook["matchConditions"] = [*(hook.get("matchConditions") or []), NEITHER]
                self.admin.replace(_bare(kept))
                for user, server in self.servers.items():
                    routed = copy.deepcopy(doc)
                    routed["metadata"]["name"] = f"{doc['metadata']['name']}-{user}"
                    for hook in routed["webhooks"]:
                        path = hook["clientConfig"]["service"]["path"]
                        hook["clientConfig"] = {"url": f"https://127.0.0.1:{server.port}{path}", "caBundle": ca[hook["name"]]}
                        hook["matchConditions"] = [*(hook.get("matchConditions") or []), ONLY[user]]
                    self.applied.append(self.admin.create(routed))

    # -- one policy set, in both setups

    def load(self, policies: dict[str, str]) -> None:
        """The policies (file name → text) in both servers, and compiled into the compiled setup."""
        before = {user: self._reloads(server) for user, server in self.servers.items()}
        changed = self._write(policies)
        record_changed = self._apply_compiled()
        for user, server in self.servers.items():
            if changed or (user == COMPILED_USER and record_changed):
                self._wait_reload(server, before[user], user)
            self._wait_in_force(server, user)
        self.same_nodes()

    def _wait_in_force(self, server: Admission, user: str) -> None:
        """Until the server has in force the files as written (its gpu_admission_policy_set_info digest):
        a reload counted may be of a state half written (the policies, before the compiled record)."""
        wanted = directory_digest(server.policies, self.compiled_dir if user == COMPILED_USER else None)

        def in_force() -> bool:
            _, text = server.get("/metrics")
            return f'gpu_admission_policy_set_info{{digest="{wanted}"}} 1.0' in text

        eventually(in_force, timeout=60, what=f"the {user} server running the policies as written")

    def same_nodes(self) -> None:
        """Until both servers' cluster views hold the nodes kube-apiserver lists, unchanged while
        checked. Each server judges "more than any node offers" (resourceShape nodeCapacity) from
        its own view and names the largest node: a node another test made or deleted just before
        would otherwise reach one view before the other, and the two setups would answer
        differently for a moment."""
        def settled() -> bool:
            listed = self._nodes()
            held = all(server.view_count("nodes") == len(listed) for server in self.servers.values())
            return held and self._nodes() == listed

        eventually(settled, timeout=60, what="both servers' cluster views holding kube-apiserver's nodes")

    def _nodes(self) -> list[tuple[str, str]]:
        return sorted((n["metadata"]["name"], n["metadata"]["resourceVersion"]) for n in self.admin.list("v1", "Node"))

    def _wait_reload(self, server: Admission, before: float, user: str) -> None:
        eventually(lambda: self._reloads(server) > before, timeout=60, what=f"the {user} server loading the policies")

    def _write(self, policies: dict[str, str]) -> bool:
        """Write the policy files of both servers; whether any changed."""
        changed = False
        for server in self.servers.values():
            server.policies.mkdir(parents=True, exist_ok=True)
            for old in server.policies.glob("*.yaml"):
                if old.name not in policies:
                    old.unlink()
                    changed = True
            for name, text in policies.items():
                if not (server.policies / name).exists() or (server.policies / name).read_text() != text:
                    (server.policies / name).write_text(text)
                    changed = True
        self.policy_set = loader.load_directory(self.servers[COMPILED_USER].policies)
        return changed

    def _apply_compiled(self) -> bool:
        """Compile for this apiserver, write the output where the slimmed server reads its record,
        and install the policies (with the routing condition), then wait until they act. Whether
        the record changed."""
        mutating, validating = reach.read(DEPLOY / "base")
        files = command.compile_files(self.policy_set, self.version, mutating, validating)
        self.compiled_dir.mkdir(parents=True, exist_ok=True)
        record = self.compiled_dir / "offload.json"
        record_changed = not record.exists() or record.read_text() != files["offload.json"]
        for name, text in files.items():
            (self.compiled_dir / name).write_text(text)
        wanted = []
        for name in ("validating-policies.yaml", "mutating-policies.yaml"):
            if name in files:
                wanted += [d for d in yaml.safe_load_all(files[name]) if isinstance(d, dict)]
        for doc in wanted:
            if doc["kind"] in ("ValidatingAdmissionPolicy", "MutatingAdmissionPolicy"):
                doc["spec"]["matchConditions"] = [*(doc["spec"].get("matchConditions") or []), COMPILED_ONLY]
        self.generation += 1
        wanted += _canaries(self.generation, self.version)
        names = {(d["kind"], d["metadata"]["name"]) for d in wanted}
        for old in [o for o in self.applied if o["kind"].endswith("AdmissionPolicy") or o["kind"].endswith("Binding")]:
            if (old["kind"], old["metadata"]["name"]) not in names:
                self.admin.delete(old)
                self.applied.remove(old)
                self.sent.pop((old["kind"], old["metadata"]["name"]), None)
        for doc in wanted:
            key = (doc["kind"], doc["metadata"]["name"])
            if self.sent.get(key) == doc:
                continue
            self.sent[key] = copy.deepcopy(doc)
            stored = self.admin.apply(doc, manager="e2e-equivalence")
            if not any((o["kind"], o["metadata"]["name"]) == (doc["kind"], doc["metadata"]["name"]) for o in self.applied):
                self.applied.append(stored)
        eventually(self._canaries_seen, timeout=60, what="kube-apiserver acting on the compiled policies")
        return record_changed

    def _canaries_seen(self) -> bool:
        probe = {"apiVersion": "v1", "kind": "ConfigMap",
                 "metadata": {"name": CANARY, "labels": {CANARY_GENERATION: str(self.generation)}}, "data": {}}
        outcome = self.clients[COMPILED_USER].create(probe, "default")
        marker = f"{CANARY} {self.generation}"
        mutated = self.version < offload.MUTATING_POLICIES_GA or (outcome.obj or {}).get("data", {}).get("generation") == str(self.generation)
        return any(w.endswith(marker) for w in outcome.warnings) and mutated

    def moved_checks(self) -> frozenset[str]:
        """"policy/rule" of the mutating webhook's checks the compiled ValidatingAdmissionPolicy makes."""
        from webhook.cel.validating import CHECKS

        return frozenset(f"{r.policy}/{r.rule}" for r in offload.coverage(self.policy_set, self.version)
                         if r.status in ("compiled", "partly") and r.rule in CHECKS and CHECKS[r.rule].phase == "M")

    def _reloads(self, server: Admission) -> float:
        return server.metric('gpu_admission_policy_reloads_total{result="success"}')

    # -- requests in both setups

    def ask(self, user: str, obj: Object, namespace: str) -> Outcome:
        return self.clients[user].create(obj, namespace)


def _bare(obj: Object) -> Object:
    """An object as read, ready to be written back (no managed fields)."""
    obj = copy.deepcopy(obj)
    obj["metadata"].pop("managedFields", None)
    return obj


def _canaries(generation: int, version: tuple[int, int]) -> list[Object]:
    """A policy of each kind that marks a ConfigMap named e2e-canary with this generation: once
    kube-apiserver acts on them, it acts on the compiled policies applied before them. The
    policies and their bindings change with each generation (the message, the object selector):
    kube-apiserver reads policies and bindings through two informers, each in order of writing,
    and a binding created with the compiled policies shows only once the canary's binding of the
    same generation does."""
    rules = [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["configmaps"]}]
    this_generation = {"objectSelector": {"matchLabels": {CANARY_GENERATION: str(generation)}}}
    condition = [{"name": "canary", "expression": f"object.metadata.name == '{CANARY}'"}, ONLY[COMPILED_USER]]
    docs: list[Object] = [
        {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy", "metadata": {"name": CANARY},
         "spec": {"matchConstraints": {"resourceRules": rules}, "matchConditions": condition,
                  "validations": [{"expression": "false", "message": f"{CANARY} {generation}"}]}},
        {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding", "metadata": {"name": CANARY},
         "spec": {"policyName": CANARY, "validationActions": ["Warn"], "matchResources": this_generation}},
    ]
    if version >= offload.MUTATING_POLICIES_GA:
        docs += [
            {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingAdmissionPolicy", "metadata": {"name": CANARY},
             "spec": {"matchConstraints": {"resourceRules": rules}, "matchConditions": condition, "reinvocationPolicy": "Never",
                      "mutations": [{"patchType": "JSONPatch", "jsonPatch": {
                          "expression": f"[JSONPatch{{op: 'add', path: '/data', value: {{'generation': '{generation}'}}}}]"}}]}},
            {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingAdmissionPolicyBinding", "metadata": {"name": CANARY},
             "spec": {"policyName": CANARY, "matchResources": this_generation}},
        ]
    return docs


# -- comparing the two answers

WEBHOOK_DENIAL = re.compile(r'admission webhook "(?:mutate|validate)\.gpu-admission\.io" denied the request: (.*)\Z', re.S)
POLICY_DENIAL = re.compile(r"ValidatingAdmissionPolicy '[^']+' with binding '[^']+' denied request: (.*)\Z", re.S)
POLICY_WARNING = re.compile(r"^Validation failed for ValidatingAdmissionPolicy '[^']+' with binding '[^']+': ")
MUTATED_WARNING = "gpu-admission mutated: "
_VOLATILE = ("uid", "creationTimestamp", "resourceVersion", "managedFields", "selfLink", "generation")


def findings(message: str) -> tuple[str, list[str]] | None:
    """("webhook"|"compiled", the findings) of a gpu-admission denial; None for another refusal."""
    found = WEBHOOK_DENIAL.search(message)
    if found:
        return "webhook", found.group(1).split("\n")
    found = POLICY_DENIAL.search(message)
    if found:
        return "compiled", found.group(1).split(" | ")
    return None


def warnings(outcome: Outcome) -> Counter[str]:
    """The warnings as the user reads them, less the VAP's prefix; the webhook's own note of what it
    changed aside (it names only what the slimmed webhook changed: documented)."""
    return Counter(POLICY_WARNING.sub("", w) for w in outcome.warnings if not w.startswith(MUTATED_WARNING))


def stored(obj: Object | None, generate_name: str = "") -> Object | None:
    """The object as stored, less what differs from request to request (uid, times, versions; a
    generated name), the provenance annotation as the rules and policies it names (documented:
    compiled policies write theirs first)."""
    if obj is None:
        return None
    uid = (obj.get("metadata") or {}).get("uid")
    # a Job's selector and labels carry its uid (batch.kubernetes.io/controller-uid)
    obj = json.loads(json.dumps(obj).replace(uid, "<uid>")) if uid else copy.deepcopy(obj)
    meta = obj.get("metadata") or {}
    for key in _VOLATILE:
        meta.pop(key, None)
    if generate_name:
        meta["name"] = generate_name + "*****"
    annotations = meta.get("annotations") or {}
    if PROVENANCE in annotations:
        rules, _, policies = annotations[PROVENANCE].partition("; policy=")
        annotations[PROVENANCE] = f"{sorted(rules.split(','))}; policy={sorted(policies.split(','))}"
    return obj


def generated(text: str, generate_name: str) -> str:
    return re.sub(re.escape(generate_name) + r"[a-z0-9]{5}", generate_name + "*****", text) if generate_name else text


def compare(webhooks: Outcome, compiled: Outcome, generate_name: str = "", moved: frozenset[str] = frozenset()) -> tuple[str, str]:
    """("same" | "split" | "validated-first" | "different", what differs). "split": both refuse, and
    the compiled setup names some of the findings only (documented: a refusal comes from the side
    that judges first, and names that side's findings). "validated-first": the mutating webhook
    refused with findings of checks compiled into a ValidatingAdmissionPolicy (``moved``:
    "policy/rule"), which runs after kube-apiserver's own validation, and that refused first."""
    a_msg, b_msg = generated(webhooks.message, generate_name), generated(compiled.message, generate_name)
    if (webhooks.status < 300) != (compiled.status < 300):
        return "different", f"webhooks {webhooks.status} {a_msg[:300]!r} vs compiled {compiled.status} {b_msg[:300]!r}"
    a_warn = Counter({generated(k, generate_name): v for k, v in warnings(webhooks).items()})
    b_warn = Counter({generated(k, generate_name): v for k, v in warnings(compiled).items()})
    if webhooks.status < 300:
        a, b = stored(webhooks.obj, generate_name), stored(compiled.obj, generate_name)
        if a != b:
            return "different", f"stored objects differ: {diff(a, b)}"
        if a_warn != b_warn:
            return "different", f"warnings differ: webhooks only {sorted((a_warn - b_warn).elements())}, compiled only {sorted((b_warn - a_warn).elements())}"
        return "same", ""
    a_found, b_found = findings(a_msg), findings(b_msg)
    if a_found is not None and b_found is None and '"mutate.gpu-admission.io"' in a_msg and all(
            _rule_of(f) in moved for f in a_found[1]):
        return "validated-first", f"kube-apiserver's validation: {b_msg[:200]}"
    if a_found is None or b_found is None:
        if a_msg == b_msg and webhooks.status == compiled.status:
            return "same", ""
        return "different", f"refusals differ: {a_msg[:400]!r} vs {b_msg[:400]!r}"
    if a_found[1] == b_found[1] and webhooks.status == compiled.status:
        return "same", ""
    if webhooks.status == compiled.status and b_found[1] and set(b_found[1]) <= set(a_found[1]):
        return "split", f"{len(b_found[1])} of {len(a_found[1])} findings, from the {b_found[0]} side"
    return "different", f"denials differ: webhooks {a_found[1]} vs compiled {b_found[1]}"


def _rule_of(finding: str) -> str:
    """"policy/rule" of a finding "[policy/rule] message"."""
    found = re.match(r"\[([^\]]+)\] ", finding)
    return found.group(1) if found else ""


def diff(a: Any, b: Any, at: str = "") -> str:
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b)):
            if a.get(key) != b.get(key):
                return diff(a.get(key), b.get(key), f"{at}.{key}")
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b)):
            if x != y:
                return diff(x, y, f"{at}[{i}]")
    return f"{at}: webhooks {json.dumps(a)[:300]} vs compiled {json.dumps(b)[:300]}"

