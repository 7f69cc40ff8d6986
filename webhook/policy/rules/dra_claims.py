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
from fnmatch import fnmatchcase

from webhook.gpu import mig
from webhook.gpu.device_classes import DeviceClassInfo
from webhook.kube import dra
from webhook.kube.patch import pointer
from webhook.policy import match, severity
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
