"""Where a policy applies, in CEL: ``webhook.policy.match`` for the compiled policies.

The object-level part (kind, namespace names and labels, exclusions) reads
the request; the pod-spec part (GPU pods only, workload classes) reads a
target record (webhook.cel.podspecs); exceptions lift a rule for the objects
they name.
"""

from __future__ import annotations

from collections.abc import Iterable

from webhook.cel import syntax as cel
from webhook.cel.podspecs import REQUEST_KIND, generated_name, kind_key
from webhook.policy import match, schema


def policy_applies(policy: schema.GPUPolicy, kinds: Iterable[tuple[str, str]]) -> str:
    """``match.policy_applies`` for the request (``kinds``: those the compiled policies reach)."""
    spec = policy.spec
    matched = sorted(kind_key(g, k) for g, k in kinds if match.kind_matches(spec.match.kinds, g, k))
    if not matched:
        return "false"
    conditions = [
        f"{REQUEST_KIND} in {cel.strings(matched)}",
        cel.globs("request.namespace", spec.match.namespaces),
        cel.selector("variables.nsLabels", spec.match.namespaceSelector),
    ]
    exclude = spec.exclude
    if exclude is not None:
        if exclude.namespaces:
            conditions.append(cel.negate(cel.globs("request.namespace", exclude.namespaces)))
        if exclude.namespaceSelector is not None:
            conditions.append(cel.negate(cel.selector("variables.nsLabels", exclude.namespaceSelector)))
    return cel.every(*conditions)


def target_applies(policy: schema.GPUPolicy) -> str:
    """The pod-spec part: a GPU pod (by any policy's GPU resources) where the policy asks for one,
    of its workload classes and none it excludes."""
    spec = policy.spec
    conditions = ["t.gpu" if spec.match.gpuOnly else "true"]
    if spec.match.workloadClasses:
        conditions.append(f"t.class in {cel.strings(spec.match.workloadClasses)}")
    if spec.exclude is not None and spec.exclude.workloadClasses:
        conditions.append(f"!(t.class in {cel.strings(spec.exclude.workloadClasses)})")
    return cel.every(*conditions)


def lifted(exceptions: Iterable[schema.GPUPolicyException], policy: str, rule: str, before_name: bool = False) -> str:
    """Whether an exception names the object and lifts ``rule`` of ``policy`` (``match.lifted``).
    ``before_name``: for the mutating webhook's checks, which a ValidatingAdmissionPolicy makes after
    kube-apiserver generated the name: judged, as that webhook judges them, by the generateName
    prefix it saw."""
    conditions = []
    for exception in exceptions:
        if any(e.policy == policy and (not e.rules or rule in e.rules) for e in exception.spec.exceptions):
            conditions.append(_covers(exception.spec.match, before_name))
    return cel.some(*conditions)


def _covers(m: schema.ExceptionMatch, before_name: bool = False) -> str:
    """``match.covering`` for one exception: its kinds, namespaces and names (a generateName prefix
    only by a pattern ending in ``*``)."""
    name = cel.value_at("object", ["metadata", "name"], "''")
    generated = cel.value_at("object", ["metadata", "generateName"], "''")
    if before_name:
        name = f"({generated_name(f'string({name})', f'string({generated})')} ? '' : string({name}))"
    conditions = [cel.globs("request.namespace", m.namespaces)]
    if m.kinds:
        conditions.append(cel.some(*(_kind(k) for k in m.kinds)))
    if m.names:
        by_name = cel.globs(f"string({name})", m.names)
        prefixes = [p for p in m.names if p.endswith("*")]
        by_prefix = cel.every(f"{generated} != ''", cel.globs(f"string({generated})", prefixes)) if prefixes else "false"
        conditions.append(f"({name} != '' ? ({by_name}) : ({by_prefix}))")
    return cel.every(*conditions)


def _kind(pattern: str) -> str:
    if pattern == "*":
        return "true"
    if "/" in pattern:
        return f"{REQUEST_KIND} == {cel.quote(pattern)}"
    return f"request.kind.kind == {cel.quote(pattern)}"
