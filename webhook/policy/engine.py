"""evaluate(policies, request, view, phase) -> Decision: the pure core.

No I/O, no clock, no globals: the server, the audit CLI and the tests call
this same function, so they cannot disagree. It does not change the request,
unless its caller gives the request's object up (``in_place``: the server,
which drops it after answering), and then the decision is the same.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from types import ModuleType
from typing import Any, Final

from webhook.gpu import resources
from webhook.gpu.device_classes import DeviceClassInfo
from webhook.kube import dra
from webhook.kube.patch import PatchBuilder
from webhook.kube.workload import PodTarget, pod_targets
from webhook.policy import match, schema
from webhook.policy.charges import merged as charges_merged
from webhook.policy.context import Findings, RuleContext
from webhook.policy.decision import ALLOW, Change, Decision
from webhook.policy.loader import PolicySet
from webhook.policy.offload import Offload
from webhook.policy.request import Phase, Request
from webhook.policy.rules import (
    cuda_driver,
    dra_claims,
    gpu_access,
    gpu_visibility,
    node_affinity,
    notebook_lifetime,
    priority_class,
    quota,
    resource_shape,
    runtime_class,
    security_context,
    shm,
    spread_replicas,
    tolerations,
    training_locality,
)
from webhook.view import claim_gpus
from webhook.view.device_classes import ClusterClasses
from webhook.view.protocol import ClusterView

PROVENANCE_ANNOTATION = "gpu-admission.io/mutated"

_new_tuple: Final = tuple.__new__  # (a C static when compiled)


@dataclass(frozen=True)
class _Rule:
    name: str
    phases: tuple[str, ...]
    run: Callable[[RuleContext, Any], None]
    #: the parts compiled policies leave to the webhook (webhook.policy.offload), where some are compiled
    rest: Callable[[RuleContext, Any], None] | None = None
    #: the pod subresources it judges too (validation only); no other rule runs on a subresource
    subresources: tuple[str, ...] = ()
    #: the settings as ``run`` (and ``rest``) takes them: the module's ``Settings`` class, made of the
    #: settings model with the plans (once per policy set and kind; None: the model itself): compiled, a
    #: native object's attribute is a load, a pydantic model's a generic lookup
    prepare: Callable[[Any], Any] | None = None


def _rule(name: str, module: ModuleType) -> _Rule:
    """A rule family: the module holding its ``PHASES`` and ``run`` (and ``run_rest``, ``SUBRESOURCES``,
    ``Settings``), under its settings name."""
    return _Rule(name, module.PHASES, module.run, getattr(module, "run_rest", None), getattr(module, "SUBRESOURCES", ()),
                 getattr(module, "Settings", None))


#: Every rule family, in the order they run within a policy.
RULES: tuple[_Rule, ...] = (
    _rule("tolerations", tolerations),
    _rule("nodeAffinity", node_affinity),
    _rule("runtimeClass", runtime_class),
    _rule("priorityClass", priority_class),
    _rule("securityContext", security_context),
    _rule("shm", shm),
    _rule("gpuVisibility", gpu_visibility),
    _rule("spreadReplicas", spread_replicas),
    _rule("trainingLocality", training_locality),
    _rule("notebookLifetime", notebook_lifetime),
    # validations (issue #5); gpuAccess first: it also judges pods/ephemeralcontainers (issue #42);
    # cudaDriver last: its steering sees the pod as
    # the other mutations left it
    _rule("gpuAccess", gpu_access),
    _rule("resourceShape", resource_shape),
    _rule("draClaims", dra_claims),
    _rule("quota", quota),
    _rule("cudaDriver", cuda_driver),
)


def evaluate(policies: PolicySet, request: Request, view: ClusterView, phase: Phase, in_place: bool = False) -> Decision:
    """Run every matching policy's rules of ``phase`` over the request's pod specs.

    ``in_place``: the caller gives the request's object up, and the rules write into it rather
    than into copies (the decision is the same; ``Decision.patched`` is then that object)."""
    # each field read once: Request is an interpreted dataclass, whose fields cost a generic lookup each
    obj, operation, kind, group = request.object, request.operation, request.kind, request.group
    if operation not in ("CREATE", "UPDATE") or not isinstance(obj, dict):
        return ALLOW
    sub_resource = request.sub_resource
    if sub_resource and not (phase == "validate" and kind == "Pod" and group == "" and sub_resource in _JUDGED_SUBRESOURCES):
        return ALLOW
    if kind == "Pod" and operation == "UPDATE" and not sub_resource and (
            phase != "validate" or not _images_changed(obj, request.old_object)):
        # a pod's spec is immutable but for its images (and a few scheduling fields): nothing to patch,
        # and nothing newly wrong unless an image changed (kubectl set image), which validation judges,
        # a violation the old pod already had only warning (_forgive_preexisting)
        return ALLOW
    paths = policies.kinds.get((group, kind))
    claim = dra.is_claim(group, kind)
    metadata = obj.get("metadata")
    if (paths is None and not claim) or (type(metadata) is dict and metadata.get("deletionTimestamp")):
        # being deleted: only finalizers may change, and they must be able to
        return ALLOW
    if claim:
        # a claim has no pod spec: only its own validations apply
        if phase != "validate":
            return ALLOW
        lifted = _lifted(policies, request, obj) if policies.exceptions else {}
        decision = dra_claims.judge(policies, request, view, namespace_labels(view, request.namespace), lifted)
    else:
        decision = _evaluate(policies, request, obj, paths, view, phase, in_place)
    if phase == "validate" and operation == "UPDATE" and not decision.allowed:
        return _forgive_preexisting(policies, request, view, decision)
    return decision


#: pod subresources some rule judges (kube-apiserver sends the whole pod, as it would be stored)
_JUDGED_SUBRESOURCES = frozenset(sub for rule in RULES for sub in rule.subresources)


def _images_changed(obj: dict[str, Any], old: Mapping[str, Any] | None) -> bool:
    """Whether a pod UPDATE changes an image of its containers or init containers (without the old
    pod, which kube-apiserver always sends, nothing is known to have changed)."""
    return isinstance(old, dict) and _images(obj) != _images(old)


def _images(pod: Mapping[str, Any]) -> list[Any]:
    spec = pod.get("spec")
    images: list[Any] = []
    if type(spec) is dict:
        for list_name in ("containers", "initContainers"):
            items = spec.get(list_name)
            if type(items) is list:
                for container in items:
                    images.append(container.get("image") if type(container) is dict else None)
    return images


def _forgive_preexisting(policies: PolicySet, request: Request, view: ClusterView, decision: Decision) -> Decision:
    """On UPDATE, a violation the object already had warns instead of denying.

    Otherwise an object that became non-compliant (a policy or the cluster
    changed) could not be scaled, relabelled or have its finalizers removed.
    """
    old = request.old_object
    if not isinstance(old, dict):
        return decision
    # every rule whole, compiled parts too: the webhook's findings to forgive are those of pod specs it
    # judges whole (offload.left_to_webhook), whose old spec may be one compiled policies judge
    before = evaluate(_whole(policies), replace(request, operation="CREATE", object=old, old_object=None), view, "validate")
    known = {(f.policy, f.rule, f.message) for f in before.denials}
    findings = tuple(
        replace(f, mode="warn", message=f.message + " (already so before this update)")
        if f.mode == "enforce" and (f.policy, f.rule, f.message) in known else f
        for f in decision.findings
    )
    return decision._replace(
        allowed=not any(f.mode == "enforce" for f in findings),
        findings=findings,
        warnings=tuple([*decision.warnings, *(f.text() for f in findings if f.mode == "warn" and f not in decision.findings)]),
    )


def _whole(policies: PolicySet) -> PolicySet:
    """The policies with no part left to compiled policies (kept beside their plans)."""
    if policies.offload is None:
        return policies
    whole = policies.memo.get("whole")
    if whole is None:
        whole = policies.memo["whole"] = replace(policies, offload=None, memo={}, pointers={})
    return whole


#: one rule as a policy runs it: (its run function, settings, (rule name, mode, policy name)),
#: three items, so that the loop over them stores little per rule
_Step = tuple[Callable[[RuleContext, Any], None], Any, tuple[str, schema.Mode, str]]


@dataclass(frozen=True)
class _PolicyPlan:
    """One policy as it runs on one kind in one phase, worked out once per policy set."""

    policy: schema.GPUPolicy
    rules: tuple[_Step, ...]
    dry: tuple[bool, ...] | None  # per rule, run as a dry run (a mutation in warn/audit mode)? None: none is
    is_gpu: resources.ResourceMatcher
    narrower: bool  # counts fewer resources as GPUs than the engine's fast path does
    gpu_only: bool
    by_namespace: bool  # has namespace conditions, checked per request
    by_class: bool  # has workload-class conditions, checked per pod spec
    classes: frozenset[str]  # the classes it applies to (empty: any)
    excluded_classes: frozenset[str]

    def takes(self, workload_class: str) -> bool:
        """Does it apply to a pod spec of this workload class?"""
        return (not self.classes or workload_class in self.classes) and workload_class not in self.excluded_classes


def _plans(policies: PolicySet, group: str, kind: str, phase: Phase, sub_resource: str = "") -> tuple[_PolicyPlan, ...]:
    """The policies that can apply to ``kind`` (or its ``sub_resource``) in ``phase``, with their rules
    (worked out once)."""
    key = ("plans", group, kind, phase, sub_resource)
    plans = policies.memo.get(key)
    if plans is None:
        built = []
        for policy in policies.active_policies:
            rules = [(rule, cfg) for rule in RULES if _runs(cfg := getattr(policy.spec.rules, rule.name), rule, phase)
                     and (not sub_resource or sub_resource in rule.subresources)]
            if not rules or not match.kind_matches(policy.spec.match.kinds, group, kind):
                continue
            spec = policy.spec
            is_gpu, narrower = policies.matcher_of(policy)
            dry = tuple(phase == "mutate" and cfg.mode != "enforce" for _, cfg in rules)
            built.append(_PolicyPlan(
                policy=policy,
                rules=tuple((_step_run(policies.offload, rule, policy.metadata.name, (group, kind)),
                             cfg if rule.prepare is None else rule.prepare(cfg),
                             (rule.name, cfg.mode, policy.metadata.name)) for rule, cfg in rules),
                dry=dry if any(dry) else None,
                is_gpu=is_gpu,
                narrower=narrower,
                gpu_only=spec.match.gpuOnly,
                by_namespace=bool(
                    spec.match.namespaces or spec.match.namespaceSelector is not None
                    or (spec.exclude is not None and (spec.exclude.namespaces or spec.exclude.namespaceSelector is not None))
                ),
                by_class=bool(spec.match.workloadClasses or (spec.exclude is not None and spec.exclude.workloadClasses)),
                classes=frozenset(spec.match.workloadClasses),
                excluded_classes=frozenset(spec.exclude.workloadClasses if spec.exclude is not None else ()),
            ))
        plans = policies.memo[key] = tuple(built)
    return plans


def _step_run(offloaded: Offload | None, rule: _Rule, policy: str, kind: tuple[str, str]) -> Callable[[RuleContext, Any], None]:
    """The function a plan runs for one rule: the rule itself, unless compiled policies run some of it."""
    if offloaded is None:
        return rule.run
    return offloaded.run_for(rule.run, rule.rest, policy, rule.name, kind)


def _lifted(policies: PolicySet, request: Request, obj: dict[str, Any]) -> match.Lifted:
    return match.lifted(policies.exceptions, request.group, request.kind, request.namespace, obj)


def _lifted_plans(
    policies: PolicySet, plans: tuple[_PolicyPlan, ...], lifted: match.Lifted
) -> tuple[_PolicyPlan, ...]:
    """The plans less the rules exceptions lift for one object (worked out once per plans and lift).

    A plan that lost rules starts with a step noting them, so that what was lifted is known
    only where the plan would have run (its class, GPU-ness and namespace conditions held).
    """
    key = ("lifted", id(plans), frozenset(lifted.items()))  # (plans live as long as the memo: ids stay theirs)
    found = policies.memo.get(key)
    if found is None:
        found = policies.memo[key] = tuple(_without(plan, lifted) for plan in plans)
    result: tuple[_PolicyPlan, ...] = found
    return result


def _without(plan: _PolicyPlan, lifted: match.Lifted) -> _PolicyPlan:
    name = plan.policy.metadata.name
    if name not in lifted:
        return plan
    rules = lifted[name]  # None: every rule of the policy
    keep = [i for i, step in enumerate(plan.rules) if rules is not None and step[2][0] not in rules]
    if len(keep) == len(plan.rules):  # it lifts rules this plan does not run
        return plan
    removed = tuple(step[2][0] for i, step in enumerate(plan.rules) if i not in keep)
    note: _Step = (_note_lifted, removed, ("", "enforce", name))
    dry = (False, *(plan.dry[i] for i in keep)) if plan.dry is not None else None
    return replace(plan, rules=(note, *(plan.rules[i] for i in keep)), dry=dry if dry and any(dry) else None)


def _note_lifted(ctx: RuleContext, removed: tuple[str, ...]) -> None:
    """The first step of a plan that lost rules: note them (the sink's map is made on first use)."""
    sink = ctx.sink
    noted = sink.lifted
    if noted is None:
        noted = sink.lifted = {}
    noted.setdefault(ctx.step[2], set()).update(removed)


def _lifting(policies: PolicySet, request: Request, obj: dict[str, Any], sink: Findings) -> tuple[str, ...]:
    """The exceptions that lifted a rule which would have run."""
    noted = sink.lifted
    if not noted:
        return ()
    return match.lifting(policies.exceptions, request.group, request.kind, request.namespace, obj, noted)


def _looks_beyond_gpu_pods(policies: PolicySet, phase: Phase) -> bool:
    """Does an active rule of ``phase`` apply to pods without GPUs (a policy that is not ``gpuOnly``)?

    Per phase: gpu-access-guard (not ``gpuOnly``) runs only in validate, and a pod without GPUs need not
    pay for the mutate phase's policies, which are all ``gpuOnly``. (Worked out once per policy set.)"""
    key = ("beyond gpu pods", phase)
    found = policies.memo.get(key)
    if found is None:
        found = policies.memo[key] = any(
            _runs(getattr(policy.spec.rules, rule.name), rule, phase)
            for policy in policies.active_policies if not policy.spec.match.gpuOnly for rule in RULES)
    return found


def _runs(cfg: Any, rule: _Rule, phase: Phase) -> bool:
    return cfg is not None and cfg.mode != "off" and phase in rule.phases


def _evaluate(
    policies: PolicySet, request: Request, obj: dict[str, Any], paths: Any, view: ClusterView, phase: Phase,
    in_place: bool,
) -> Decision:
    targets, slots, claims, gpu_pods, device_classes = _pod_specs(policies, request, obj, paths, view, phase)
    if not any(gpu_pods) and not _looks_beyond_gpu_pods(policies, phase):
        return ALLOW
    if claims is None:  # (after the return above: a pod without GPUs does not pay for it)
        claims = [None] * len(targets)
    group, kind, namespace = request.group, request.kind, request.namespace  # (read once each)
    plans = _plans(policies, group, kind, phase, request.sub_resource)
    lifted = policies.exceptions and _lifted(policies, request, obj)  # (most policy sets have no exceptions)
    if lifted:
        plans = _lifted_plans(policies, plans, lifted)
    ns_labels, ns_known = _namespace(view, namespace)
    builder = PatchBuilder(obj, policies.pointers, in_place)
    sink = Findings([], [])
    # policy by policy, each on every pod spec it applies to; one context per pod spec, made when a
    # policy first applies to it and carried from policy to policy (its class is worked out once)
    contexts: list[RuleContext | None] = [None] * len(targets)
    for plan in plans:
        if plan.by_namespace and not match.policy_applies(plan.policy, group, kind, namespace, ns_labels):
            continue
        for index, target in enumerate(targets):
            if plan.gpu_only and not gpu_pods[index]:
                continue
            ctx = contexts[index] or _context(
                policies, request, view, phase, plan.policy, target, ns_labels, ns_known, builder, sink, slots[index],
                claims[index], device_classes,
            )
            contexts[index] = ctx
            if not plan.by_class or plan.takes(ctx.workload_class):
                _run_plan(ctx, plan, slots[index])
    summary = _summary(sink.changes) if sink.changes else ""
    if summary and phase == "mutate":
        _record_provenance(builder, summary)
    decision = _decide(builder, sink, summary)
    if lifted:
        decision = decision._replace(exceptions=_lifting(policies, request, obj, sink))
    return decision


def workload_classes(policies: PolicySet, request: Request, view: ClusterView, phase: Phase) -> tuple[str, ...]:
    """The workload class of each of the object's pod specs in ``phase``, as :func:`evaluate` classifies
    them (a policy with workload-class conditions runs on the pod specs whose class it takes)."""
    paths = policies.kinds.get((request.group, request.kind))
    obj = request.object
    if paths is None or not isinstance(obj, dict) or not policies.active_policies:
        return ()
    targets, slots, claims, _, device_classes = _pod_specs(policies, request, obj, paths, view, phase)
    ns_labels, ns_known = _namespace(view, request.namespace)
    builder, sink, policy = PatchBuilder(obj, policies.pointers, False), Findings([], []), policies.active_policies[0]
    return tuple(
        _context(policies, request, view, phase, policy, target, ns_labels, ns_known, builder, sink, slots[index],
                 claims[index] if claims is not None else None, device_classes).workload_class
        for index, target in enumerate(targets)
    )


def is_gpu_object(policies: PolicySet, request: Request, view: ClusterView, phase: Phase) -> bool:
    """Does a pod spec of the object count as a GPU pod in ``phase`` (what a ``gpuOnly`` policy runs on)?"""
    paths = policies.kinds.get((request.group, request.kind))
    obj = request.object
    if paths is None or not isinstance(obj, dict):
        return False
    return any(_pod_specs(policies, request, obj, paths, view, phase)[3])


def _pod_specs(
    policies: PolicySet, request: Request, obj: dict[str, Any], paths: Any, view: ClusterView, phase: Phase,
) -> tuple[list[PodTarget], list[resources.Slots], list[claim_gpus.PodClaims | None] | None, list[Any],
           Mapping[str, DeviceClassInfo]]:
    """The object's pod specs: targets, GPU slots, resolved claims (None: no spec names any), which are
    GPU pods, and the device classes their rules look up (the claims' own lookups, when they have claims)."""
    targets = pod_targets(obj, paths)
    any_gpu = policies.any_gpu
    specs, slots = [], []  # (loops, not comprehensions: this runs for every pod, GPU or not)
    with_claims = False
    for target in targets:
        spec: Any = obj
        for key in target.spec_path:  # (inline: pod_targets found a map there)
            spec = spec[key]
        specs.append(spec)
        slots.append(resources.gpu_slots(spec, any_gpu))
        with_claims = with_claims or "resourceClaims" in spec
    if not with_claims:
        return targets, slots, None, slots, policies.device_classes
    # the pod's claims and its rules look DRA device classes up through this one ClusterClasses
    device_classes = ClusterClasses(policies.device_classes, view)
    claims = _claims(request, specs, slots, view, device_classes)
    gpu_pods: list[Any] = slots
    # a pod spec is a GPU pod when it has slots (a non-empty map), or GPU claims even when
    # no container uses them (the pod holds the devices, on their node); a claim the view
    # cannot resolve may be one: validations look at it
    if any(claims):
        gpu_pods = [bool(s) or (c is not None and bool(c.counts or (phase == "validate" and (c.unresolved or c.unknown))))
                    for s, c in zip(slots, claims)]
    return targets, slots, claims, gpu_pods, device_classes


def _context(
    policies: PolicySet, request: Request, view: ClusterView, phase: Phase, policy: schema.GPUPolicy, target: PodTarget,
    ns_labels: dict[str, str], ns_known: bool, builder: PatchBuilder, sink: Findings, slots: resources.Slots,
    claims: claim_gpus.PodClaims | None, device_classes: Mapping[str, DeviceClassInfo],
) -> RuleContext:
    # positional: keyword arguments cost as much again on every admission; the
    # policy, its matcher and the rule are set again before each rule runs; ns_known: from the one
    # lookup of the namespace that found its labels
    return RuleContext(
        request, view, phase, policy, "", "enforce", target, policies.any_gpu, ns_labels, builder, sink,
        builder.owned(target.spec_path), policies.classifier, slots, claims, device_classes, ns_known,
    )


def _run_plan(ctx: RuleContext, plan: _PolicyPlan, slots: resources.Slots) -> None:
    """One policy's rules on one pod spec."""
    ctx.policy, ctx.is_gpu = plan.policy, plan.is_gpu
    ctx.slots = resources.narrow(slots, plan.is_gpu) if plan.narrower else slots
    if plan.dry is not None:
        _run_some_dry(ctx, plan.rules, plan.dry)
        return
    for run, cfg, ctx.step in plan.rules:
        run(ctx, cfg)


def _claims(
    request: Request, specs: list[Mapping[str, Any]], slots: list[resources.Slots], view: ClusterView,
    classes: ClusterClasses,
) -> list[claim_gpus.PodClaims | None]:
    """Each pod spec's DRA claims, resolved; containers using GPU claims join ``slots`` (in place)."""
    found: list[claim_gpus.PodClaims | None] = [None] * len(specs)
    for index, spec in enumerate(specs):
        if "resourceClaims" in spec:
            # (an existing pod, as a recount judges it: the claims it holds, not its templates)
            generated = dra.generated_claims(request.object) if isinstance(request.object, dict) else None
            found[index] = resolved = claim_gpus.resolve(spec, request.namespace, view, classes, generated)
            if resolved is not None:
                slots[index] = claim_gpus.container_slots(spec, resolved, slots[index])
    return found


def namespace_labels(view: ClusterView, namespace: str) -> dict[str, str]:
    """The namespace's labels, with the name label the API server always sets."""
    return _namespace(view, namespace)[0]


def _namespace(view: ClusterView, namespace: str) -> tuple[dict[str, str], bool]:
    """``namespace_labels``, and whether the view knows the namespace (one call of the view)."""
    ns = view.namespace(namespace) if namespace else None
    return _labels_of(ns, namespace), ns is not None


def _labels_of(ns: Mapping[str, Any] | None, namespace: str) -> dict[str, str]:
    """``namespace_labels`` of the Namespace object ``ns`` (None: one the view does not know)."""
    labels: dict[str, str] = {}
    if ns is not None:
        raw = (ns.get("metadata") or {}).get("labels") or {}
        labels.update({str(k): str(v) for k, v in raw.items()})
    if namespace:
        labels.setdefault("kubernetes.io/metadata.name", namespace)
    return labels


def _run_some_dry(ctx: RuleContext, rules: tuple[_Step, ...], dry_runs: tuple[bool, ...]) -> None:
    """A policy's rules where some mutations only report what they would change."""
    for (run, cfg, ctx.step), dry in zip(rules, dry_runs):
        if dry:
            _dry_run(ctx.dry_run(), run, cfg)
        else:
            run(ctx, cfg)


def _dry_run(ctx: RuleContext, run: Callable[[RuleContext, Any], None], cfg: Any) -> None:
    """Run a mutation in warn/audit mode on a context's dry-run copy: report what it would change."""
    run(ctx, cfg)
    for change in dict.fromkeys(what for _, _, what in ctx.sink.changes):
        ctx.report(f"{ctx.where()}: would set {change}")


def _record_provenance(builder: PatchBuilder, summary: str) -> None:
    """Name what changed and which policy did it, merged into an earlier pass's note."""
    # the root is the builder's: each context took the builder's own copy of its pod spec
    metadata = builder.own(builder.doc, "metadata")
    annotations = metadata.get("annotations") if type(metadata) is dict else None
    if annotations is not None and type(annotations) is not dict:
        return  # not an object kube-apiserver would accept; nothing to annotate
    previous = annotations.get(PROVENANCE_ANNOTATION) if annotations else None
    if isinstance(previous, str) and previous:
        rules, policies = _parse_provenance(previous)
        more_rules, more_policies = _parse_provenance(summary)
        rules.update(more_rules)
        policies.update(more_policies)
        summary = f"{','.join(rules)}; policy={','.join(policies)}"
    if type(metadata) is not dict:
        builder.set(("metadata", "annotations", PROVENANCE_ANNOTATION), summary)
    elif annotations is None:  # absent or null: written whole
        builder.put(metadata, "/metadata", "annotations", {PROVENANCE_ANNOTATION: summary})
    else:
        builder.put(builder.own(metadata, "annotations"), "/metadata/annotations", PROVENANCE_ANNOTATION, summary)


def _parse_provenance(value: str) -> tuple[dict[str, None], dict[str, None]]:
    changed, _, policy_part = value.partition("; policy=")
    return (
        dict.fromkeys(x for x in changed.split(",") if x),
        dict.fromkeys(x for x in policy_part.split(",") if x),
    )


def _summary(changes: list[Change]) -> str:
    """"tolerations,shm; policy=gpu-defaults": what changed, then which policies changed it. Remembered
    per sequence of changes, within a bound: pods of one workload are changed alike, and compiled, the
    lookup of a few changes costs about a fifth of working the text out again."""
    key = tuple(changes)
    found = _SUMMARIES.get(key)
    if found is not None:
        return found
    # a loop into lists, not zip(*changes) and dict.fromkeys: compiled, a membership test of a few
    # strings (the same objects, found by identity) and the join of a list cost far less than a dict's
    # stores and the join of its keys
    parts: list[str] = []
    owners: list[str] = []
    for owner, _, what in changes:
        if owner not in owners:
            owners.append(owner)
        if what not in parts:
            parts.append(what)
    summary = f"{','.join(parts)}; policy={','.join(owners)}"
    if len(_SUMMARIES) < _SUMMARIES_SIZE:  # (what a rule changed is a literal: the sequences are a policy set's)
        _SUMMARIES[key] = summary
    return summary


#: summaries worked out so far (``_summary``), at most _SUMMARIES_SIZE
_SUMMARIES: Final[dict[tuple[Change, ...], str]] = {}
_SUMMARIES_SIZE: Final = 1024


def _decide(builder: PatchBuilder, sink: Findings, summary: str) -> Decision:
    findings = tuple(sink.findings)
    warnings = []
    allowed = True
    for finding in findings:
        if finding.mode == "warn":
            warnings.append(finding.text())
        elif finding.mode == "enforce":
            allowed = False
    if summary and allowed:  # a denied object is not stored: saying it was mutated would mislead
        warnings.insert(0, f"gpu-admission mutated: {summary}")
    # allowed, patch, warnings, findings, changes, patched, exceptions, charges: Decision(...) without
    # the named tuple's __new__, a Python function on CPython 3.11 (this runs on every admission)
    charges = sink.charges
    fields = (allowed, tuple(builder.ops), tuple(warnings), findings, tuple(sink.changes), builder.doc, (),
              charges_merged(charges) if charges else ())
    return _new_tuple(Decision, fields)
