"""DRA claims: GPU requests of ResourceClaims and ResourceClaimTemplates, and the claims pods name.

On a ResourceClaim or ResourceClaimTemplate (their own admission, which has
no pod spec: :func:`judge`): ``allocationMode: All`` (every GPU of whichever
node it lands on), more devices than a cap, MIG profiles no GPU has,
``adminAccess`` (access to devices other pods hold) outside the namespaces a
policy allows, and device classes a namespace may not use.

On pod specs (:func:`run`): a claim or template the cluster does not have,
when the view knows them all (the pod would stay Pending: nothing creates
its claim), and the view being unavailable, per ``clusterUnavailable``.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from fnmatch import fnmatchcase

from webhook.gpu import mig
from webhook.gpu.device_classes import DeviceClassInfo
from webhook.kube import dra, termination
from webhook.kube.patch import pointer
from webhook.policy import caps, match, severity
from webhook.policy.context import RuleContext
from webhook.policy.decision import Decision, Finding
from webhook.policy.loader import PolicySet
from webhook.policy.request import Request
from webhook.policy.settings.dra import DraClaimsRule
from webhook.policy.settings.validation import Severity
from webhook.view import claim_gpus, devices
from webhook.view.device_classes import ClusterClasses
from webhook.view.protocol import ClusterView

PHASES = ("validate",)
RULE = "draClaims"


def run(ctx: RuleContext, cfg: DraClaimsRule) -> None:
    claims = ctx.claims
    if claims is None:
        return
    for reason in claims.unknown:
        severity.unavailable(ctx, cfg, reason, "DRA claims")
    for missing in claims.unresolved:
        path = pointer(ctx.spec_path("resourceClaims", missing.claim.index))
        severity.report(ctx, cfg.unresolved, f"{ctx.where()}: claim {missing.claim.name!r}: {missing.reason}; "
                        "the pod would stay Pending", path)
    if cfg.nodeCapacity and claims.alternatives and ctx.view.availability("resourceslices").known:
        _check_node_capacity(ctx, claims.alternatives)


def _check_node_capacity(ctx: RuleContext, alternatives: dra.Alternatives[str]) -> None:
    """A pod's claims are allocated on its one node: more devices of a class than any node has never fit.

    Every ``firstAvailable`` alternative stays open (the scheduler takes the first that fits):
    refused only when no choice of them fits, naming what the smallest choice lacks.
    """
    largest: dict[str, tuple[int, str]] = {}
    for device_class in {c for request in alternatives for c, _ in request}:
        info = ctx.device_classes.get(device_class)
        largest[device_class] = devices.largest_node(ctx.view, info) if info is not None else (0, "")
    # no node publishes any: a driver or an autoscaler may still bring some, so such a class always has room
    if dra.fitting(alternatives, lambda c: largest[c][0] or sys.maxsize) is not None:
        return
    for device_class, count in sorted(dra.smallest(alternatives).items()):
        most, node = largest[device_class]
        if most and count > most:
            ctx.report(f"{ctx.where()}: claims {count} {device_class} devices in one pod, more than any node "
                       f"publishes (largest: {most} on {node}); split the work across pods",
                       pointer(ctx.spec_path("resourceClaims")))


@dataclass
class _Claim:
    """One claim object under one policy's rule: where findings go."""

    policy: str
    cfg: DraClaimsRule
    subject: str
    findings: list[Finding] = field(default_factory=list)

    def report(self, level: Severity, message: str, path: str) -> None:
        mode = severity.mode_of(self.cfg.mode, level)
        if mode is not None:
            self.findings.append(Finding(self.policy, RULE, mode, f"{self.subject} {message}", path))


def judge(
    policies: PolicySet, request: Request, view: ClusterView, ns_labels: Mapping[str, str], lifted: match.Lifted,
) -> Decision:
    """Validate a ResourceClaim or ResourceClaimTemplate under every policy with a draClaims rule
    (less the policies whose draClaims rule an exception lifts for this claim)."""
    obj = request.object or {}
    base = "spec.spec" if request.kind == "ResourceClaimTemplate" else "spec"
    requests = dra.requests_of(dra.claim_spec(obj), base)
    findings: list[Finding] = []
    removed: dict[str, set[str]] = {}  # the policies whose draClaims rule an exception lifted
    for policy in policies.active_policies:
        cfg = policy.spec.rules.draClaims
        if cfg is None or cfg.mode == "off":
            continue
        if not match.policy_applies(policy, request.group, request.kind, request.namespace, ns_labels):
            continue
        if policy.metadata.name in lifted:
            rules = lifted[policy.metadata.name]
            if rules is None or RULE in rules:
                removed[policy.metadata.name] = {RULE}
                continue
        claim = _Claim(policy.metadata.name, cfg, request.subject)
        _check(claim, requests, ClusterClasses(policies.device_classes, view), request.namespace, ns_labels)
        findings.extend(claim.findings)
    if request.operation == "CREATE" and not made_for_pod(request):
        findings.extend(_check_caps(policies, request, view, ns_labels, lifted, requests))
    allowed = not any(f.mode == "enforce" for f in findings)
    warnings = tuple(f.text() for f in findings if f.mode == "warn")
    exceptions = match.lifting(
        policies.exceptions, request.group, request.kind, request.namespace, obj, removed,
    ) if removed else ()
    return Decision(allowed, (), warnings, tuple(findings), (), None, exceptions)


def _check(claim: _Claim, requests: list[dra.ClaimRequest], classes: Mapping[str, DeviceClassInfo],
           namespace: str, ns_labels: Mapping[str, str]) -> None:
    cfg = claim.cfg
    totals: dict[str, int] = {}
    for request in requests:
        largest: dict[str, int] = {}  # the alternative it may get that holds the most devices
        for ask in request.alternatives:
            info = classes.get(ask.device_class)
            if info is None:
                continue
            where = f"{ask.path} ({request.name or 'unnamed'})"
            path = "/" + ask.path.replace(".", "/").replace("[", "/").replace("]", "")
            if ask.all:
                claim.report(cfg.allocationModeAll, f"{where}: allocationMode All takes every {ask.device_class} "
                             "device of the node it lands on; ask for a count", path)
            if ask.admin_access and not (cfg.adminAccessNamespaces and match.name_matches(cfg.adminAccessNamespaces, namespace)):
                claim.report("deny", f"{where}: adminAccess grants access to {ask.device_class} devices other "
                             f"pods hold; the policy allows it only in {', '.join(cfg.adminAccessNamespaces) or 'no namespace'}",
                             path)
            _check_class(claim, ask, where, path, namespace, ns_labels)
            profile = dra.selected(ask, "profile")
            if info.is_mig and profile is not None:
                _check_profile(claim, profile, where, path)
            if not ask.all:  # All is judged above; its count is the node's
                resource = info.counts_as(profile)
                largest[resource] = max(largest.get(resource, 0), ask.count)
        for resource, count in largest.items():
            totals[resource] = totals.get(resource, 0) + count
    for resource, count in sorted(totals.items()):
        cap = _cap(cfg.maxPerClaim, resource)
        if cap is not None and count > cap:
            claim.report("deny", f"asks for {count} {resource} devices in one claim; the policy allows at most {cap}",
                         "/spec")


def _check_class(claim: _Claim, ask: dra.DeviceAsk, where: str, path: str, namespace: str,
                 ns_labels: Mapping[str, str]) -> None:
    for restriction in claim.cfg.restrictedClasses:
        if not any(fnmatchcase(ask.device_class, c) for c in restriction.classes):
            continue
        by_name = bool(restriction.namespaces) and match.name_matches(restriction.namespaces, namespace)
        by_label = restriction.namespaceSelector is not None and match.selector_matches(
            restriction.namespaceSelector, ns_labels)
        if not (by_name or by_label):
            claim.report("deny", f"{where}: namespace {namespace} may not use device class {ask.device_class}", path)


def _check_profile(claim: _Claim, profile: str, where: str, path: str) -> None:
    spelt = mig.resource_profile(profile)
    allowed = [mig.resource_profile(p) for p in claim.cfg.migProfiles]
    if spelt not in mig.valid_profiles() and spelt not in allowed:
        if mig.well_formed(spelt):
            claim.report("warn", f"{where}: MIG profile {profile} is not one of the GPUs gpu-admission knows; "
                         "check the profile name", path)
        else:
            claim.report("deny", f"{where}: {profile!r} is not a MIG profile (e.g. 1g.10gb)", path)
    elif allowed and spelt not in allowed:
        claim.report("deny", f"{where}: MIG profile {profile} is not allowed; the policy allows "
                     f"{', '.join(claim.cfg.migProfiles)}", path)


def _cap(caps: Mapping[str, int], resource: str) -> int | None:
    if resource in caps:
        return caps[resource]
    prefixes = sorted((p for p in caps if p.endswith("*") and resource.startswith(p[:-1])), key=len, reverse=True)
    return caps[prefixes[0]] if prefixes else None


#: who the resourceclaim controller acts as: kube-controller-manager with ``--use-service-account-credentials``
#: (its own service account) and without. The API server authenticates the user; a tenant cannot claim it.
CLAIM_CONTROLLER_USERS = frozenset({"system:serviceaccount:kube-system:resource-claim-controller",
                                    "system:kube-controller-manager"})
#: the quota rule's name in findings
QUOTA_RULE = "quota"


def made_for_pod(request: Request) -> bool:
    """A ResourceClaim the resourceclaim controller makes from a pod's template: sent by the controller
    (``userInfo``, which only the API server writes) and owned by a Pod. Its pod was charged for the
    template's devices when it was admitted. An ownerReference alone proves nothing: whoever creates a
    claim writes it (issue #42)."""
    if request.kind != "ResourceClaim" or request.user not in CLAIM_CONTROLLER_USERS:
        return False
    meta = (request.object or {}).get("metadata")
    refs = meta.get("ownerReferences") if isinstance(meta, Mapping) else None
    return any(isinstance(r, Mapping) and r.get("controller") is True and r.get("kind") == "Pod"
               and r.get("apiVersion") == "v1" for r in refs or ())


def _check_caps(policies: PolicySet, request: Request, view: ClusterView, ns_labels: Mapping[str, str],
                lifted: match.Lifted, requests: list[dra.ClaimRequest]) -> list[Finding]:
    """A new claim or template under the GPU caps of its namespace (quota rules), as ResourceQuota
    judges a claim when it is created (docs/quota.md, "DRA claims"):

    - its devices alone exceed a cap: no pod could ever use it;
    - live pods already name it (they were admitted while it did not exist, or before it was deleted
      and made again): their charges do not hold its devices, and the scheduler would allocate them.
    """
    namespace, obj = request.namespace, request.object or {}
    classes = ClusterClasses(policies.device_classes, view)
    counts = claim_gpus.request_counts(requests, view, classes)
    totals: dict[str, Decimal] = {}
    for per_request in counts.values():
        for resource, n in per_request.items():
            totals[resource] = totals.get(resource, Decimal(0)) + n
    if not totals:
        return []
    models_of = claim_gpus.request_models(obj, counts, view, classes)
    models = frozenset(m for m in models_of if m) if None not in models_of else None
    naming: list[str] | None = None
    findings: list[Finding] = []
    for policy in policies.active_policies:
        cfg = policy.spec.rules.quota
        if cfg is None or cfg.mode == "off" or not cfg.limits:
            continue
        if not (match.policy_applies(policy, request.group, request.kind, namespace, ns_labels)
                or match.policy_applies(policy, "", "Pod", namespace, ns_labels)):
            continue
        if policy.metadata.name in lifted:
            rules = lifted[policy.metadata.name]
            if rules is None or QUOTA_RULE in rules:
                continue
        for cap in cfg.limits:
            group = caps.covers(cap, "", models, namespace, ns_labels)
            ask = caps.amount(caps.counted(cap), totals.items())
            if group is None or not ask:
                continue
            who = f"{caps.subject(cap.scope, group, cap.teamLabel)}{caps.qualifier(cap.model, cap.priorityClasses)}"
            if ask > cap.max:
                findings.append(Finding(policy.metadata.name, QUOTA_RULE, cfg.mode,
                                        f"{request.subject} asks for {caps.number(ask)} {cap.resource} devices, more "
                                        f"than the GPU cap of {cap.max} for {who}: no pod could use it; ask for at "
                                        f"most {cap.max}", "/spec"))
                continue
            if naming is None:
                naming = _named_by(view, request)
            if naming:
                findings.append(Finding(policy.metadata.name, QUOTA_RULE, cfg.mode,
                                        f"{request.subject}: pods {', '.join(naming)} already name it, and were "
                                        f"admitted without its devices counted under the GPU cap of {cap.max} "
                                        f"for {who}; delete those pods, create the {request.kind}, then the pods "
                                        "again", "/metadata/name"))
    return findings


def _named_by(view: ClusterView, request: Request) -> list[str]:
    """Live pods of the view naming this claim (or template, without a claim made from it yet), a few."""
    name, namespace = request.display_name, request.namespace
    if not view.availability("pods").known:
        return []
    found: list[str] = []
    for pod in view.claim_pods():
        meta = pod.get("metadata")
        meta = meta if isinstance(meta, Mapping) else {}
        if meta.get("namespace") != namespace or not termination.holds(pod):
            continue
        spec = pod.get("spec")
        made = dra.generated_claims(pod)
        for claim in dra.pod_claims(spec if isinstance(spec, Mapping) else {}):
            if (request.kind == "ResourceClaim" and claim.claim == name) or (
                    request.kind == "ResourceClaimTemplate" and claim.template == name and claim.name not in made):
                found.append(str(meta.get("name") or ""))
                break
        if len(found) > 3:
            break
    return found
