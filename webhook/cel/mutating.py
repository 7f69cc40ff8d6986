"""The MutatingAdmissionPolicy: the compiled mutations, in the engine's order (Kubernetes 1.36+).

One policy, so that its mutations apply in order (kube-apiserver runs several
MutatingAdmissionPolicies in no set order): policy by policy, rule by rule,
each a JSONPatch over every pod spec the policy applies to, followed by the
provenance annotation the engine writes (``gpu-admission.io/mutated``, merged
with what is there). Its variables are evaluated anew for each mutation, so
each sees what the ones before it changed. ``reinvocationPolicy: IfNeeded``:
kube-apiserver calls it again when a later mutation (a webhook's) changes the
object, and it then changes nothing it already did.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from webhook.cel import patches, podspecs, scope
from webhook.cel import syntax as cel
from webhook.cel.reach import Reach
from webhook.cel.validating import NAME, Compilation, admission_policy, pod_update
from webhook.policy import offload
from webhook.policy.engine import PROVENANCE_ANNOTATION

#: rule → (what the provenance annotation calls its change, its JSONPatch CEL for the pod spec ``t``
#: given the settings and the policy's GPU test of a resource name ``n``)
MUTATIONS: dict[str, tuple[str, Callable[[Any, str], str]]] = {
    "tolerations": ("tolerations", lambda cfg, gpu: patches.tolerations(cfg)),
    "nodeAffinity": ("nodeAffinity", patches.node_affinity),
    "runtimeClass": ("runtimeClassName", lambda cfg, gpu: patches.runtime_class(cfg)),
    "priorityClass": ("priorityClassName", lambda cfg, gpu: patches.priority_class(cfg)),
    "securityContext": ("securityContext", lambda cfg, gpu: patches.security_context(cfg)),
    "shm": ("shm", patches.shm),
    "gpuVisibility": ("gpuVisibility", patches.gpu_visibility),
    "spreadReplicas": ("spreadReplicas", lambda cfg, gpu: patches.spread_replicas(cfg)),
    "trainingLocality": ("trainingLocality", lambda cfg, gpu: patches.training_locality(cfg)),
    "notebookLifetime": ("activeDeadlineSeconds", lambda cfg, gpu: patches.notebook_lifetime(cfg)),
}


def documents(compilation: Compilation, reach: Reach) -> list[dict[str, Any]]:
    """The MutatingAdmissionPolicy and its binding (none when no mutation compiled)."""
    mutations = [{"patchType": "JSONPatch", "jsonPatch": {"expression": _mutation(compilation, group)}}
                 for group in _groups(compilation)]
    if not mutations:
        return []
    classes = (podspecs.workload_class(compilation.policies.class_entries, "t.meta", "variables.nsLabels")
               if compilation.needs_class(MUTATIONS) else None)
    # built-in kinds only (offload.built_in): kube-apiserver refuses a custom kind it has no schema of yet
    kinds = [k for k in compilation.kinds if offload.built_in(k.group)]
    variables = [
        {"name": "nsLabels", "expression": podspecs.namespace_labels()},
        {"name": "mutating", "expression": f"{cel.value_at('object', ['metadata', 'deletionTimestamp'], 'null')} == null && !({pod_update()})"},
    ]
    if podspecs.starred(kinds):
        variables.append({"name": "podSpecPaths", "expression": podspecs.patterns(podspecs.starred(kinds))})
    variables.append({"name": "targets", "expression": podspecs.targets(podspecs.raw_targets("object", kinds),
                                                                        list(compilation.policies.gpu_resources), classes)})
    # (the webhook's matchConditions as the policy's own: a mutation that runs starts a second pass, reach.py)
    return admission_policy("MutatingAdmissionPolicy", NAME, reach.built_in().own(), {"variables": variables, "mutations": mutations}, {},
                            reinvocation="IfNeeded")


#: a policy's compiled mutations: (policy, [(rule, settings)])
_Policy = tuple[Any, list[tuple[str, Any]]]


def _groups(compilation: Compilation) -> list[list[_Policy]]:
    """The policies with compiled mutations, in order, in groups one mutation can make: each
    mutation re-evaluates the variables, so the fewer the cheaper, but a rule family's second policy
    must see what its first changed, so a family repeats only in the next group."""
    groups: list[list[_Policy]] = []
    seen: set[str] = set()
    for policy in compilation.policies.active_policies:
        rules = [(rule, getattr(policy.spec.rules, rule)) for rule in MUTATIONS
                 if getattr(policy.spec.rules, rule) is not None and compilation.compiled(policy.metadata.name, rule)]
        if not rules:
            continue
        if not groups or seen & {rule for rule, _ in rules}:
            groups.append([])
            seen = set()
        groups[-1].append((policy, rules))
        seen |= {rule for rule, _ in rules}
    return groups


def _mutation(compilation: Compilation, group: list[_Policy]) -> str:
    """One mutation: the group's policies, each rule's JSONPatch over the pod specs it applies to,
    then the provenance annotation naming what changed (in rule order) and who changed it (the rules
    of a group change disjoint fields: all may read the object as the group found it)."""
    changes, names = [], []
    for policy, rules in group:
        name = policy.metadata.name
        matcher = compilation.policies.matchers[name]
        gpu = cel.matcher("n", [*sorted(matcher.exact), *(p + "*" for p in matcher.prefixes)])
        applies = cel.every(scope.policy_applies(policy, compilation.kind_keys()))
        for rule, cfg in rules:
            what, build = MUTATIONS[rule]
            ops = f"variables.targets.filter(t, {scope.target_applies(policy)}).map(t, {build(cfg, gpu)}).flatten()"
            lifted = scope.lifted(compilation.policies.exceptions, name, rule)
            changes.append(cel.when(cel.every(applies, cel.negate(lifted)), ops, "[]"))
            names.append((what, name))
    whats = cel.strings(what for what, _ in names)
    owners = cel.strings(owner for _, owner in names)
    changed = f"C.transformList(j, q, size(q) > 0, {whats}[j])"
    by = f"C.transformList(j, q, size(q) > 0, {owners}[j])"
    ops = "C.flatten()"
    if sum(rule in AFFINITY_RULES for _, rules in group for rule, _ in rules) > 1:
        ops = _one_affinity(ops)
    body = f"[[{', '.join(changes)}]].map(C, [{ops}].map(P, size(P) == 0 ? [] : P + {_provenance(changed, by)})[0])[0]"
    return cel.when("variables.mutating", body, "[]")


#: rules whose change may create a pod spec's ``affinity`` (each its own part of it)
AFFINITY_RULES = frozenset({"nodeAffinity", "spreadReplicas", "trainingLocality"})


def _one_affinity(ops: str) -> str:
    """The operations ``ops`` with ``affinity`` added once per pod spec: the rules of a group read the
    pod spec as the group found it, so where it has no affinity, each that adds a part of it adds
    the whole ``affinity`` (``{part: …}``); the second such ``add`` would replace the first. Each
    after the first adds its parts under the one created (the rules' parts are distinct)."""
    again = "JSONPatch{op: 'add', path: p.path + '/' + k, value: p.value[k]}"
    later = "p.op == 'add' && p.path.endsWith('/affinity') && A.indexOf(p.path) < i"
    return f"[{ops}].map(O, [O.map(p, p.path)].map(A, O.transformList(i, p, {later} ? p.value.map(k, {again}) : [p]).flatten())[0])[0]"


def _provenance(changed: str, by: str) -> str:
    """The operation merging what changed (``changed``: a CEL list of names, in rule order) and who
    changed it (``by``: policy names) into the provenance annotation, as
    ``engine._record_provenance`` does: the rules then the policies it names, each once, in order."""
    annotations = "object.metadata.annotations"
    previous = (f"(has({annotations}) && type({annotations}) == map && {cel.quote(PROVENANCE_ANNOTATION)} in {annotations} && "
                f"type({annotations}[{cel.quote(PROVENANCE_ANNOTATION)}]) == string ? string({annotations}[{cel.quote(PROVENANCE_ANNOTATION)}]) : '')")
    # "rules; policy=policies", split as str.partition does (the first "; policy=")
    parts = "[v.indexOf('; policy=')].map(i, i < 0 ? [v, ''] : [v.substring(0, i), v.substring(i + 9)])[0]"
    names = "(s == '' ? [] : s.split(',').filter(x, x != ''))"
    merged = f"[{parts}].map(h, [h[0], h[1]].map(s, {names}))[0]"

    def added(have: str, more: str) -> str:  # what is new, once each, in order (``more`` computed once)
        return cel.once(more, lambda m: f"[{have}].map(r, r + {m}.transformList(i, w, !(w in r) && {m}.indexOf(w) == i, w))[0]")

    text = f"{added(merged + '[0]', changed)}.join(',') + '; policy=' + {added(merged + '[1]', by)}.join(',')"
    key = cel.quote("/metadata/annotations/" + cel.json_pointer_token(PROVENANCE_ANNOTATION))
    whole = f"{{{cel.quote(PROVENANCE_ANNOTATION)}: t}}"
    op = (f"!has({annotations}) || type({annotations}) == null_type ? "
          f"[{patches.add(cel.quote('/metadata/annotations'), whole)}] : "
          f"(type({annotations}) == map ? [{patches.add(key, 't')}] : [])")
    return f"[{previous}].map(v, [{text}].map(t, {op})[0])[0]"
