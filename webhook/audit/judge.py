"""One object through the same engine as the server: mutate, then validate the mutated object.

kube-apiserver calls the mutating webhook first and the validating webhook
with what the mutations left, and so does :func:`judge`.
:func:`outcomes` then breaks a result down per policy and rule (pass, fail,
warn, skip), which is what PolicyReport, JUnit and SARIF report on.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any, Literal

from webhook.audit.inputs import Document
from webhook.kube.dra import is_claim
from webhook.policy import engine, loader, match, schema
from webhook.policy.decision import Decision, Finding
from webhook.policy.request import Phase, Request
from webhook.policy.rules import dra_claims
from webhook.view.protocol import ClusterView

Verdict = Literal["deny", "warn", "mutate", "pass"]
Status = Literal["pass", "fail", "warn", "error", "skip"]


@dataclass(frozen=True)
class Result:
    """What the two webhooks would answer for one object."""

    document: Document
    request: Request
    mutation: Decision
    validation: Decision
    #: the request the validating webhook judges: the object as the mutating webhook leaves it
    validated: Request

    @property
    def findings(self) -> tuple[Finding, ...]:
        return self.mutation.findings + self.validation.findings

    @property
    def denied(self) -> bool:
        return not (self.mutation.allowed and self.validation.allowed)

    @property
    def warned(self) -> bool:
        return any(f.mode == "warn" for f in self.findings)

    @property
    def patched(self) -> Any:
        """The object as the mutating webhook leaves it."""
        return self.mutation.patched if self.mutation.patch else self.document.obj

    @property
    def verdict(self) -> Verdict:
        if self.denied:
            return "deny"
        if self.warned:
            return "warn"
        return "mutate" if self.mutation.patch else "pass"

    @property
    def warnings(self) -> tuple[str, ...]:
        """What kube-apiserver would show the client: both webhooks' warnings."""
        return self.mutation.warnings + self.validation.warnings


def judge(policies: loader.PolicySet, view: ClusterView, document: Document, namespace: str | None = None,
          *, old: dict[str, Any] | None = None) -> Result | None:  # fmt: skip
    """Mutate then validate one object; None when it is no workload kind the policies know.

    ``namespace`` is for an object that names none; with ``old`` (the object as
    stored) the request is an UPDATE of it.
    """
    obj = document.obj
    meta = obj.get("metadata")
    if isinstance(meta, dict) and meta.get("namespace"):
        namespace = None  # the object's own namespace wins, as with kubectl apply -n
    operation = "CREATE" if old is None else "UPDATE"
    request = replace(Request.for_object(obj, operation=operation, namespace=namespace), old_object=old)
    if (request.group, request.kind) not in policies.kinds and not is_claim(request.group, request.kind):
        return None
    mutation = engine.evaluate(policies, request, view, "mutate")
    validated = (
        replace(Request.for_object(mutation.patched, operation=operation, namespace=namespace), old_object=old)
        if mutation.patch else request
    )  # fmt: skip
    validation = engine.evaluate(policies, validated, view, "validate")
    return Result(document, request, mutation, validation, validated)


@dataclass(frozen=True)
class Outcome:
    """One policy rule's result on one object."""

    policy: str
    rule: str
    status: Status
    mode: str  # enforce | warn | audit
    message: str
    phase: Phase

    @property
    def rule_id(self) -> str:
        return f"{self.policy}/{self.rule}"


#: per policy that applies: its name, whether it is GPU-only, its enabled rules (name, mode, phase), and the
#: policy itself when it has workload-class conditions (checked per object: the classes of its pod specs)
Plan = tuple[tuple[str, bool, tuple[tuple[str, str, Phase], ...], schema.GPUPolicy | None], ...]


def outcomes(
    policies: loader.PolicySet, view: ClusterView, result: Result, plans: dict[tuple[str, str, str], Plan] | None = None
) -> Iterator[Outcome]:
    """Every enabled rule of every policy that applies to the object, with its result.

    A finding is ``fail`` (enforce, audit) or ``warn``, a note what it says (``pass``, ``skip``); a rule that ran and
    found nothing is ``pass`` (a mutation it made is named in the message);
    a GPU-only policy on an object without GPUs, and a rule a GPUPolicyException
    lifts for it, are ``skip``. ``plans`` keeps which rules apply per kind and
    namespace across the objects of a run.
    """
    request = result.request
    key = (request.group, request.kind, request.namespace)
    plan = plans.get(key) if plans is not None else None
    if plan is None:
        plan = _plan(policies, view, *key)
        if plans is not None:
            plans[key] = plan
    found: dict[tuple[str, str], list[tuple[Phase, Finding]]] = {}
    phases: tuple[tuple[Phase, tuple[Finding, ...]], ...] = (
        ("mutate", result.mutation.findings), ("validate", result.validation.findings))
    for where, findings in phases:
        for finding in findings:
            found.setdefault((finding.policy, finding.rule), []).append((where, finding))
    changed: dict[tuple[str, str], list[str]] = {}
    for policy, rule, what in result.mutation.changes:
        changed.setdefault((policy, rule), []).append(what)
    has_gpu: dict[Phase, bool] = {}  # per phase, as the engine judges it (only when a GPU-only policy asks)
    lifted_by = _lifted_by(policies, result) if policies.exceptions else {}
    classes: dict[Phase, tuple[str, ...]] = {}  # per phase, the object's pod specs' workload classes
    for name, gpu_only, rules, scoped in plan:
        for rule, mode, phase in rules:
            if scoped is not None and not _takes(scoped, policies, view, result, phase, classes):
                continue
            key_ = (name, rule)
            exception = lifted_by.get(key_) or lifted_by.get((name, ""))
            if exception:
                yield Outcome(name, rule, "skip", mode, f"lifted by GPUPolicyException {exception}", phase)
            elif key_ in found:
                for found_in, f in found[key_]:
                    # a note is what it says (pass, skip), with the rule's mode; a violation fails or warns
                    status: Status = f.note or ("warn" if f.mode == "warn" else "fail")
                    yield Outcome(name, rule, status, mode if f.note else f.mode, f.message, found_in)
            elif gpu_only and not _has_gpu(policies, view, result, phase, has_gpu):
                yield Outcome(name, rule, "skip", mode, "no GPU requested", phase)
            elif key_ in changed:
                what = ", ".join(dict.fromkeys(changed[key_]))
                yield Outcome(name, rule, "pass", mode, f"mutated: {what}", "mutate")
            else:
                yield Outcome(name, rule, "pass", mode, "passed", phase)


def _plan(policies: loader.PolicySet, view: ClusterView, group: str, kind: str, namespace: str) -> Plan:
    labels = engine.namespace_labels(view, namespace)
    plan: list[tuple[str, bool, tuple[tuple[str, str, Phase], ...], schema.GPUPolicy | None]] = []
    claim = is_claim(group, kind)  # a claim has no pod spec: only draClaims runs, GPU-only or not (its GPUs are asked)
    for policy in policies.active_policies:
        if not match.policy_applies(policy, group, kind, namespace, labels):
            continue
        rules: list[tuple[str, str, Phase]] = []
        for rule in engine.RULES:
            cfg = getattr(policy.spec.rules, rule.name)
            if cfg is not None and cfg.mode != "off" and (not claim or rule.name == dra_claims.RULE):
                phase: Phase = "validate" if "validate" in rule.phases else "mutate"
                rules.append((rule.name, cfg.mode, phase))
        if rules or not claim:
            scoped = policy if match.by_workload_class(policy) else None
            plan.append((policy.metadata.name, bool(policy.spec.match.gpuOnly) and not claim, tuple(rules), scoped))
    return tuple(plan)


def _takes(policy: schema.GPUPolicy, policies: loader.PolicySet, view: ClusterView, result: Result, phase: Phase,
           classes: dict[Phase, tuple[str, ...]]) -> bool:
    """Whether the class-scoped ``policy`` runs on one of the object's pod specs in ``phase``."""
    found = classes.get(phase)
    if found is None:
        request = result.request if phase == "mutate" else result.validated
        found = classes[phase] = engine.workload_classes(policies, request, view, phase)
    return any(match.takes_workload_class(policy, c) for c in found)


def _lifted_by(policies: loader.PolicySet, result: Result) -> dict[tuple[str, str], str]:
    """(policy, rule) → the exception lifting that rule for this object; rule "": every rule of the policy."""
    request, found = result.request, dict[tuple[str, str], str]()
    for exception in match.covering(policies.exceptions, request.group, request.kind, request.namespace,
                                    result.document.obj):
        for entry in exception.spec.exceptions:
            for rule in entry.rules or ("",):
                found.setdefault((entry.policy, rule), exception.metadata.name)
    return found


def _has_gpu(policies: loader.PolicySet, view: ClusterView, result: Result, phase: Phase,
             known: dict[Phase, bool]) -> bool:
    """Is the object a GPU workload in ``phase``, as the engine decides it: GPU extended resources,
    or DRA claims resolving to GPU devices (remembered in ``known``)?"""
    if phase not in known:
        known[phase] = engine.is_gpu_object(policies, result.request, view, phase)
    return known[phase]
