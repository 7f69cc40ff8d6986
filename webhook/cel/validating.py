"""The ValidatingAdmissionPolicies: the compiled checks, with the engine's messages and modes.

kube-apiserver shows only the first denied validation of a request, and a
binding's ``validationActions`` hold for every validation of its policy. So:

- ``gpu-admission`` (bound with Deny) has two validations: the findings the
  mutating webhook would refuse with, then the validating webhook's; each
  message is every such finding, one a line, as the webhook's denial;
- ``gpu-admission-warn`` (bound with Warn) has one validation per warning, so
  that each finding is a warning of its own as the webhook's are;
- ``gpu-admission-audit`` (bound with Audit) records audit-mode findings.

Each runs only where one of its validations fails (its matchCondition, ``_gate``:
kube-apiserver computes every messageExpression whether or not its validation
failed); the Warn policy's looks first for what can warn (``_warn_guard``).

The findings come from one list (variable ``findings``), computed policy by
policy, pod spec by pod spec, rule by rule, as the engine goes; on an UPDATE a
refusal the old object already earned only warns, as the engine's
``_forgive_preexisting`` does.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from webhook.cel import findings, patches, podspecs, scope
from webhook.cel import syntax as cel
from webhook.cel.findings import Checks
from webhook.cel.reach import BUILT_IN, Reach
from webhook.kube.workload import KindPaths
from webhook.policy import offload
from webhook.policy.loader import PolicySet
from webhook.review import MAX_WARNING_CHARS

NAME = "gpu-admission"
#: what kube-apiserver writes before each message of a Warn validation (k8s.io/apiserver
#: admission/plugin/policy/validating/dispatcher.go)
WARNING_PREFIX = f"Validation failed for ValidatingAdmissionPolicy '{NAME}-warn' with binding '{NAME}-warn': "
#: kube-apiserver keeps a request's warnings while they total at most 4096 characters; past that it
#: cuts each to 256 and adds none once 4096 are written (k8s.io/apiserver endpoints/filters/warning.go).
#: Each of ours is at least its prefix and one character long, so no request shows more than this
#: many, which is how many the Warn policy has (each is a validation): every warning kube-apiserver
#: can show is there to be shown
WARNINGS_SHOWN = 4096
WARNING_SLOTS = 1 + (WARNINGS_SHOWN - 1) // (len(WARNING_PREFIX) + 1)
LABELS = {"app.kubernetes.io/name": "gpu-admission", "app.kubernetes.io/component": "compiled-policy",
          "app.kubernetes.io/part-of": "gpu-admission"}

_UPDATE_NOTE = " (already so before this update)"


#: a compiled rule with checks: (policy, rule, settings, its Checks, its findings' CEL); the Checks say
#: which tags its findings can have
Built = tuple[Any, str, Any, Checks, str]


@dataclass(frozen=True)
class RuleCheck:
    """A compiled rule's checks: the phase the engine runs them in, and their CEL."""

    phase: str  # "M": the mutating webhook's findings; "V": the validating webhook's
    build: Callable[[Checks, Any, str], str]


#: rule → its compiled checks (mutation rules' checks are compiled with their changes)
CHECKS: dict[str, RuleCheck] = {
    "resourceShape": RuleCheck("V", lambda checks, cfg, windows: findings.resource_shape(checks, cfg)),
    "securityContext": RuleCheck("M", lambda checks, cfg, windows: findings.security_context(checks, cfg, windows)),
    "gpuVisibility": RuleCheck("M", lambda checks, cfg, windows: findings.gpu_visibility(checks, cfg)),
    "notebookLifetime": RuleCheck("M", lambda checks, cfg, windows: findings.notebook_lifetime(checks, cfg)),
    "nodeAffinity": RuleCheck("M", lambda checks, cfg, windows: findings.node_affinity(checks, cfg, checks.is_gpu("n"))),
    "priorityClass": RuleCheck("M", lambda checks, cfg, windows: findings.priority_class(checks, cfg, patches.class_choice(cfg))),
}


@dataclass(frozen=True)
class Compilation:
    """A policy set as the compiler sees it: what compiles, and for which kinds."""

    policies: PolicySet
    rows: tuple[offload.RuleCoverage, ...]
    kinds: tuple[KindPaths, ...]

    @classmethod
    def of(cls, policies: PolicySet, version: tuple[int, int]) -> Compilation:
        kinds = offload.compilable_kinds(policies)
        return cls(policies, offload.coverage(policies, version), tuple(p for k, p in policies.kinds.items() if k in kinds))

    def compiled(self, policy: str, rule: str) -> bool:
        return any(r.policy == policy and r.rule == rule and r.status in ("compiled", "partly") for r in self.rows)

    def needs_class(self, rules: Iterable[str]) -> bool:
        """Does a policy with one of ``rules`` compiled read the workload class (to match, or to
        pick a priority class)?"""
        wanted = set(rules)
        for policy in self.policies.active_policies:
            compiled = {r for r in wanted if self.compiled(policy.metadata.name, r)}
            spec = policy.spec
            by_class = spec.match.workloadClasses or (spec.exclude is not None and spec.exclude.workloadClasses)
            if compiled and (by_class or "priorityClass" in compiled):
                return True
        return False

    def kind_keys(self) -> list[tuple[str, str]]:
        return [(k.group, k.kind) for k in self.kinds]


def documents(compilation: Compilation, reach: Reach) -> list[dict[str, Any]]:
    """The ValidatingAdmissionPolicies and their bindings (none when nothing compiled checks anything).
    Every validation reads the findings, which are none where the webhook's matchConditions
    (variable ``reached``) would not send the request."""
    rules = _built(compilation)
    built = _policy_checks(compilation, rules)
    if not built:
        return []
    checks = [expr for expr, _ in built]
    variables = [{"name": "reached", "expression": reach.reached()}, *_variables(compilation, checks)]
    modes = {cfg.mode for _, _, cfg in _rules(compilation)}
    docs = _policy(NAME, "Deny", reach, variables, [
        _validation("variables.denyMutate"), _validation("variables.denyValidate"),
    ])
    _gate(docs[0], "refuses", "variables.denyMutate.size() > 0 || variables.denyValidate.size() > 0")
    warning = [i for i, (_, tags) in enumerate(built) if tags & {"MW", "VW"}]
    warn = _policy(f"{NAME}-warn", "Warn", reach, _warn_variables(variables, warning), [
        {"expression": f"variables.warnings.size() <= {i}", "messageExpression": f"variables.warnings[{i}]"}
        for i in range(WARNING_SLOTS)
    ])
    # (a matchCondition reads no variable: the kinds' pod spec paths written in)
    guard = cel.some("request.operation == 'UPDATE' && oldObject != null", _warn_guard(compilation, rules))
    _gate(warn[0], "warns", "variables.warnings.size() > 0", guard)
    docs += warn
    if "audit" in modes:
        docs += _policy(f"{NAME}-audit", "Audit", reach, variables, [
            {"expression": "variables.audits.size() == 0", "messageExpression": f"variables.audits.join({cel.quote(DENIAL_SEPARATOR)})"},
        ])
        _gate(docs[-2], "audits", "variables.audits.size() > 0")
    return docs


def _gate(policy: dict[str, Any], name: str, fails: str, guard: str = "true") -> None:
    """Add to ``policy`` a matchCondition ``name`` that holds where one of its validations fails
    (``fails``, over its variables), after ``guard`` (a cheap condition that holds wherever ``fails``
    can). kube-apiserver evaluates every messageExpression of a policy whose validations ran, failing
    or not, in an activation of its own (k8s.io/apiserver admission/plugin/policy/validating/
    validator.go: the message filter's ``ForInput`` after the validations'), so the variables a
    message reads, here every finding, were computed twice for an object that passes; a matchCondition
    computes them once (``cel.inline``: a matchCondition reads no variable) and, where it is false,
    kube-apiserver skips the policy. An object that fails costs a third computation: it is refused
    or warned, which is rare. The webhook's reach (variable ``reached``) is tested first, so that an
    object it does not send costs no more than that. A condition longer than kube-apiserver parses
    (many policies) is left out: the policy then runs wherever its guard holds, as it did before."""
    variables = [(v["name"], v["expression"]) for v in policy["spec"]["variables"]]
    reached = next(expr for n, expr in variables if n == "reached")
    condition = cel.every(guard, reached, cel.inline(variables, fails, {"reached": "true"}))
    if len(condition) > cel.MAX_EXPRESSION:
        condition = guard
    if condition != "true":
        policy["spec"].setdefault("matchConditions", []).append({"name": name, "expression": condition})


def _rules(compilation: Compilation) -> list[tuple[Any, str, Any]]:
    """(policy, rule, settings) of every compiled rule with checks, in the engine's order."""
    found = []
    for policy in compilation.policies.active_policies:
        for row in compilation.rows:
            if row.policy == policy.metadata.name and row.rule in CHECKS and compilation.compiled(row.policy, row.rule):
                found.append((policy, row.rule, getattr(policy.spec.rules, row.rule)))
    return found


def _built(compilation: Compilation) -> list[Built]:
    """Every compiled rule with checks, in the engine's order."""
    found = []
    for policy, rule, cfg in _rules(compilation):
        check = CHECKS[rule]
        matcher = compilation.policies.matchers[policy.metadata.name]
        gpu = [*sorted(matcher.exact), *(p + "*" for p in matcher.prefixes)]
        checks = Checks(policy.metadata.name, rule, cfg.mode, check.phase, gpu)
        found.append((policy, rule, cfg, checks, check.build(checks, cfg, podspecs.is_windows("t.spec"))))
    return found


def _warn_guard(compilation: Compilation, built: list[Built]) -> str:
    """A condition on the object that holds wherever a compiled rule finds a warning on it (and more
    often): the rules whose findings can warn say where theirs can (``findings.resource_shape_warns``;
    another rule that can warn makes it "true"), over the object's raw pod specs, every one of them.
    The Warn policy's matchCondition (with an UPDATE's, which may forgive a refusal with a warning): where
    it does not hold, kube-apiserver skips the policy, its variables and its validations, so a pod asking
    for whole GPUs costs it no pod spec record, no check and none of its warning slots."""
    per_target = []
    for _, rule, cfg, checks, found in built:
        if found == "[]" or not checks.tags & {"MW", "VW"}:
            continue
        if rule != "resourceShape":
            return "true"
        per_target.append(findings.resource_shape_warns(cfg.mode, cfg, "t.spec", "t.meta"))
    condition = cel.some(*per_target)
    if condition in ("true", "false"):
        return condition
    table = f"({podspecs.patterns(podspecs.starred(compilation.kinds))})"
    return f"({podspecs.raw_targets('object', compilation.kinds, table)}).exists(t, {condition})"


def _policy_checks(compilation: Compilation, built: list[Built]) -> list[tuple[str, set[str]]]:
    """Per policy with compiled checks: a CEL list of its findings (SEP-joined) over the object's
    pod specs and, on an UPDATE, the old object's (as the engine judges it for ``_forgive_preexisting``:
    as created, validating only); and the tags its findings can have ("ME", "VW", ...)."""
    per_policy: dict[str, list[tuple[str, str]]] = {}
    tags: dict[str, set[str]] = {}
    policies = {p.metadata.name: p for p in compilation.policies.active_policies}
    for policy, rule, cfg, checks, found in built:
        check = CHECKS[rule]
        if found == "[]":
            continue
        tags.setdefault(policy.metadata.name, set()).update(checks.tags)
        # (a mutation rule's checks on a built-in kind: the webhook runs it whole on others, offload.built_in)
        active = "ri == 0 && variables.mutating" if check.phase == "M" else "(ri == 0 ? variables.validating : true)"
        lifted = scope.lifted(compilation.policies.exceptions, policy.metadata.name, rule, before_name=check.phase == "M")
        per_policy.setdefault(policy.metadata.name, []).append((cel.every(active, cel.negate(lifted)), found))
    out = []
    for name, parts in per_policy.items():
        policy = policies[name]
        rules = " + ".join(cel.when(active, f"({found})", "[]") for active, found in parts)
        per_target = f"ts.map(t, {scope.target_applies(policy)} ? ({rules}).filter(s, s != '').join({cel.SEP_LITERAL}) : '')"
        applies = scope.policy_applies(policy, compilation.kind_keys())
        out.append((f"variables.specs.transformList(ri, ts, {applies} ? {per_target}.filter(s, s != '').join({cel.SEP_LITERAL}) : '')",
                    tags[name]))
    return out


def _variables(compilation: Compilation, checks: Sequence[str]) -> list[dict[str, str]]:
    any_gpu = list(compilation.policies.gpu_resources)
    classes = (podspecs.workload_class(compilation.policies.class_entries, "t.meta", "variables.nsLabels")
               if compilation.needs_class(CHECKS) else None)
    policies = range(len(checks))
    variables = [
        ("subject", podspecs.subject()),
        ("subjectBefore", podspecs.subject(before_name=True)),
        ("nsLabels", podspecs.namespace_labels()),
        ("live", f"{cel.value_at('object', ['metadata', 'deletionTimestamp'], 'null')} == null"),
        ("mutating", f"variables.live && !({pod_update()}) && {BUILT_IN}"),
        ("validating", f"variables.live && (!({pod_update()}) || {_images('object')} != {_images('oldObject')})"),
        ("podSpecPaths", podspecs.patterns(podspecs.starred(compilation.kinds))),
        # the object's pod specs, and on an UPDATE the old object's: all of them (a refusal is forgiven
        # when the old object earned it, wherever its pod spec was judged: as the webhook does)
        ("specs", "(request.operation == 'UPDATE' && oldObject != null ? [object, oldObject] : [object])"
                  f".transformList(ri, r, {podspecs.targets(podspecs.raw_targets('r', compilation.kinds), any_gpu, classes, 'ri == 1')})"),
    ]
    variables += [(f"p{i}", expr) for i, expr in enumerate(checks)]
    variables += [
        ("all", f"[{', '.join(f'variables.p{i}[0]' for i in policies)}].filter(s, s != '').join({cel.SEP_LITERAL})"),
        ("findings", f"!variables.reached || variables.all == '' ? [] : variables.all.split({cel.SEP_LITERAL})"),
        ("oldAll", f"size(variables.specs) < 2 ? '' : [{', '.join(f'variables.p{i}[1]' for i in policies)}]"
                   f".filter(s, s != '').join({cel.SEP_LITERAL})"),
        ("before", f"variables.oldAll == '' ? [] : variables.oldAll.split({cel.SEP_LITERAL}).filter(f, f.startsWith('VE'))"),
        ("denyMutate", _texts("ME")),
        ("denyValidate", "variables.findings.filter(f, f.startsWith('VE') && !(f in variables.before)).map(f, f.substring(2))"),
        ("forgiven", f"variables.findings.filter(f, f.startsWith('VE') && f in variables.before).map(f, f.substring(2) + {cel.quote(_UPDATE_NOTE)})"),
        ("warnings", f"({_texts('MW')} + (variables.denyMutate.size() == 0 ? {_texts('VW')} + variables.forgiven : []))"
                     f".map(w, {_shorten('w')})"),
        ("audits", f"{_texts('MA')} + {_texts('VA')}"),
    ]
    return [{"name": name, "expression": expr} for name, expr in variables]


def _warn_variables(variables: list[dict[str, str]], warning: Sequence[int]) -> list[dict[str, str]]:
    """The Warn policy's variables: its warnings, where the object is no UPDATE's with an old object
    (nothing to forgive), from the policies whose findings can warn (``warning``: their indices) and not
    from all of them; the rest only when one of those warns in the validating phase, which the engine
    shows only where no mutating-phase finding refuses. Each policy is evaluated in an activation of its
    own (docs/compiled-policies.md, "Cost"): computed whole, the Deny policy's findings were computed a
    second time here."""
    some = f"[{', '.join(f'variables.p{i}[0]' for i in warning)}].filter(s, s != '').join({cel.SEP_LITERAL})"
    added = [
        {"name": "warnAll", "expression": some if warning else "''"},
        {"name": "warnFindings", "expression": f"!variables.reached || variables.warnAll == '' ? [] : variables.warnAll.split({cel.SEP_LITERAL})"},
        {"name": "warnValidating", "expression": "variables.warnFindings.filter(f, f.startsWith('VW')).map(f, f.substring(2))"},
    ]
    out = []
    for variable in variables:
        if variable["name"] == "warnings":
            cheap = ("(variables.warnFindings.filter(f, f.startsWith('MW')).map(f, f.substring(2)) + "
                     "(variables.warnValidating.size() == 0 ? [] : variables.denyMutate.size() == 0 ? variables.warnValidating : []))"
                     f".map(w, {_shorten('w')})")
            out += added
            out.append({"name": "warnings", "expression": f"request.operation == 'UPDATE' && oldObject != null ? ({variable['expression']}) : ({cheap})"})
        else:
            out.append(variable)
    return out


def pod_update() -> str:
    """A pod's UPDATE: nothing to change in it (its spec is immutable), and only a changed image to judge."""
    return "request.kind.group == '' && request.kind.kind == 'Pod' && request.operation == 'UPDATE'"


def _texts(tag: str) -> str:
    return f"variables.findings.filter(f, f.startsWith('{tag}')).map(f, f.substring(2))"


def _images(root: str) -> str:
    """``engine._images``: containers' then init containers' images."""
    spec = cel.sub_map(root, "spec")
    items = [f"{cel.sub_list(spec, name)}.map(c, type(c) == map && has(c.image) ? string(c.image) : '')"
             for name in ("containers", "initContainers")]
    return f"({root} == null ? [] : {' + '.join(items)})"


def _shorten(text: str) -> str:
    """``review._shorten``: a warning over 256 characters loses its middle."""
    head = (MAX_WARNING_CHARS - 1) // 2
    tail = MAX_WARNING_CHARS - 1 - head
    return f"(size({text}) <= {MAX_WARNING_CHARS} ? {text} : {text}.substring(0, {head}) + '…' + {text}.substring(size({text}) - {tail}))"


#: between the findings of one denial: kube-apiserver refuses a messageExpression result with a line
#: break (the webhook's denial puts one finding a line)
DENIAL_SEPARATOR = " | "
#: kube-apiserver falls back to its own message past 5 KiB of messageExpression result; the findings
#: that fit are kept whole (room left for the note of how many more, and for multi-byte characters)
MESSAGE_BUDGET = 4000


def _validation(findings_var: str) -> dict[str, Any]:
    return {"expression": f"{findings_var}.size() == 0", "messageExpression": _limited(findings_var), "reason": "Forbidden"}


def _limited(findings_var: str) -> str:
    """The findings joined, as many whole ones as fit ``MESSAGE_BUDGET``, then how many more (as
    ``review.limit_message`` does past its own limit)."""
    sep = cel.quote(DENIAL_SEPARATOR)
    whole = f"{findings_var}.join({sep})"
    # how many findings fit: those whose end (with the separators before them) is within the budget
    ends = f"{findings_var}.transformList(i, f, {findings_var}.filter(g, {findings_var}.indexOf(g) <= i).join({sep}).size())"
    fits = f"{ends}.filter(e, e <= {MESSAGE_BUDGET}).size()"
    kept = f"[{fits}].map(k, {findings_var}.filter(f, {findings_var}.indexOf(f) < k))[0]"
    more = f"{findings_var}.size() - {fits}"
    return (f"size({whole}) <= {MESSAGE_BUDGET} ? {whole} : {kept}.join({sep}) + ' … and ' + string({more}) + "
            f"' more finding(s) not shown'")


def _policy(name: str, action: str, reach: Reach, variables: list[dict[str, str]],
            validations: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return admission_policy("ValidatingAdmissionPolicy", name, reach, {"variables": variables, "validations": validations},
                            {"validationActions": [action]})


def admission_policy(kind: str, name: str, reach: Reach, spec: dict[str, Any], binding: dict[str, Any],
                     reinvocation: str | None = None) -> list[dict[str, Any]]:
    """A policy of ``kind`` (failing closed, with the webhooks' reach) and its binding. The
    webhooks' ``matchConditions`` are the caller's: ``spec`` gates its results on ``reach.reached()``
    (only ``reach.kept_conditions`` stay matchConditions)."""
    meta = {"name": name, "labels": dict(LABELS)}
    conditions = {"matchConditions": list(reach.kept_conditions)} if reach.kept_conditions else {}
    head: dict[str, Any] = {"failurePolicy": "Fail"}
    if reinvocation is not None:
        head["reinvocationPolicy"] = reinvocation
    return [
        {"apiVersion": "admissionregistration.k8s.io/v1", "kind": kind, "metadata": meta,
         "spec": {**head, "matchConstraints": reach.match_constraints, **conditions, **spec}},
        {"apiVersion": "admissionregistration.k8s.io/v1", "kind": f"{kind}Binding", "metadata": dict(meta),
         "spec": {"policyName": name, **binding}},
    ]
