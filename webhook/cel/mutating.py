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
from webhook.cel.validating import LABELS, NAME, Compilation, pod_update

#: rule → (what the provenance annotation calls its change, its JSONPatch CEL for the pod spec ``t``
#: given the settings and the policy's GPU test of a resource name ``n``)
MUTATIONS: dict[str, tuple[str, Callable[[Any, str], str]]] = {
    "tolerations": ("tolerations", lambda cfg, gpu: patches.tolerations(cfg)),
    "runtimeClass": ("runtimeClassName", lambda cfg, gpu: patches.runtime_class(cfg)),
    "priorityClass": ("priorityClassName", lambda cfg, gpu: patches.priority_class(cfg)),
    "securityContext": ("securityContext", lambda cfg, gpu: patches.security_context(cfg)),
    "shm": ("shm", patches.shm),
    "gpuVisibility": ("gpuVisibility", patches.gpu_visibility),
    "notebookLifetime": ("activeDeadlineSeconds", lambda cfg, gpu: patches.notebook_lifetime(cfg)),
}
PROVENANCE = "gpu-admission.io/mutated"


def documents(compilation: Compilation, reach: Reach) -> list[dict[str, Any]]:
    """The MutatingAdmissionPolicy and its binding (none when no mutation compiled)."""
    mutations = []
    for policy in compilation.policies.active_policies:
        name = policy.metadata.name
        for rule, (what, build) in MUTATIONS.items():
            cfg = getattr(policy.spec.rules, rule)
            if cfg is None or not compilation.compiled(name, rule):
                continue
            matcher = compilation.policies.matchers[name]
            gpu = cel.matcher("n", [*sorted(matcher.exact), *(p + "*" for p in matcher.prefixes)])
            ops = f"variables.targets.filter(t, {scope.target_applies(policy)}).map(t, {build(cfg, gpu)}).flatten()"
            applies = cel.every("variables.mutating", scope.policy_applies(policy, compilation.kind_keys()),
                                cel.negate(scope.lifted(compilation.policies.exceptions, name, rule)))
            expression = cel.when(applies, f"[{ops}].map(o, size(o) == 0 ? [] : o + {_provenance(what, name)})[0]", "[]")
            mutations.append({"patchType": "JSONPatch", "jsonPatch": {"expression": expression}})
    if not mutations:
        return []
    classes = (podspecs.workload_class(compilation.policies.class_entries, "t.meta", "variables.nsLabels")
               if compilation.needs_class() else None)
    variables = [
        {"name": "nsLabels", "expression": podspecs.namespace_labels()},
        {"name": "mutating", "expression": f"{cel.value_at('object', ['metadata', 'deletionTimestamp'], 'null')} == null && !({pod_update()})"},
        {"name": "podSpecPaths", "expression": podspecs.patterns(compilation.kinds)},
        {"name": "targets", "expression": podspecs.targets(podspecs.raw_targets("object", compilation.kinds),
                                                           list(compilation.policies.gpu_resources), classes)},
    ]
    policy_doc = {
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingAdmissionPolicy",
        "metadata": {"name": NAME, "labels": dict(LABELS)},
        "spec": {
            "failurePolicy": "Fail",
            "reinvocationPolicy": "IfNeeded",
            "matchConstraints": reach.match_constraints,
            "matchConditions": reach.match_conditions,
            "variables": variables,
            "mutations": mutations,
        },
    }
    binding = {
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingAdmissionPolicyBinding",
        "metadata": {"name": NAME, "labels": dict(LABELS)},
        "spec": {"policyName": NAME},
    }
    return [policy_doc, binding]


def _provenance(what: str, policy: str) -> str:
    """The operation merging ``what`` (changed by ``policy``) into the provenance annotation, as
    ``engine._record_provenance`` does: the rules then the policies it names, each once, in order."""
    annotations = "object.metadata.annotations"
    previous = (f"(has({annotations}) && type({annotations}) == map && {cel.quote(PROVENANCE)} in {annotations} && "
                f"type({annotations}[{cel.quote(PROVENANCE)}]) == string ? string({annotations}[{cel.quote(PROVENANCE)}]) : '')")
    # "rules; policy=policies", split as str.partition does (the first "; policy=")
    parts = ("[v.indexOf('; policy=')].map(i, i < 0 ? [v, ''] : [v.substring(0, i), v.substring(i + 9)])[0]")
    names = "(s == '' ? [] : s.split(',').filter(x, x != ''))"
    merged = f"[{parts}].map(h, [h[0], h[1]].map(s, {names}))[0]"
    rules = f"[{merged}[0]].map(r, {cel.quote(what)} in r ? r : r + [{cel.quote(what)}])[0]"
    owners = f"[{merged}[1]].map(r, {cel.quote(policy)} in r ? r : r + [{cel.quote(policy)}])[0]"
    text = f"{rules}.join(',') + '; policy=' + {owners}.join(',')"
    key = cel.quote("/metadata/annotations/" + cel.json_pointer_token(PROVENANCE))
    whole = f"{{{cel.quote(PROVENANCE)}: t}}"
    op = (f"!has({annotations}) || type({annotations}) == null_type ? "
          f"[{patches.add(cel.quote('/metadata/annotations'), whole)}] : "
          f"(type({annotations}) == map ? [{patches.add(key, 't')}] : [])")
    return f"[{previous}].map(v, [{text}].map(t, {op})[0])[0]"
