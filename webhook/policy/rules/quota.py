"""GPU quotas: caps per namespace, team, GPU model and priority class, and native ResourceQuotas.

Pods only: a template has no pods yet, and how many it gets is its
controller's business (autoscalers, parallelism); a template is at most
warned about when its replicas alone exceed a cap. Usage is what the
Pending and Running pods of the cluster view hold. The view lags behind a
burst (two pods admitted at the same moment both see the usage from before
either), so for the caps it enforces on a new pod the rule also states what
the pod charges to each cap's ledger (``webhook.policy.charges``): the
server charges them in the API server, with optimistic concurrency, before
it allows the pod (docs/quota.md).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from webhook.gpu import resources
from webhook.kube import dra, resourcequota, termination
from webhook.kube.patch import pointer
from webhook.kube.value_text import text
from webhook.policy import caps as cap_rules
from webhook.policy import charge_bounds, severity
from webhook.policy.caps import WHAT_TO_DO, amount, counted, covers, held, number
from webhook.policy.charges import CapCheck, Charge, Claims, Holding, LedgerKey
from webhook.policy.context import RuleContext
from webhook.policy.settings.validation import QuotaLimit, QuotaRule
from webhook.view import claim_gpus, scheduling
from webhook.view.protocol import Resource
from webhook.view.usage import Amounts, Share

PHASES = ("validate",)


@dataclass(frozen=True)
class _Pod:
    """What a cap needs to know of a pod."""

    namespace: str
    models: frozenset[str] | None  # values of the model label it can land on; None: any
    priority: str
    gpus: Mapping[str, Decimal]


def run(ctx: RuleContext, cfg: QuotaRule) -> None:
    if ctx.claims is not None and (ctx.claims.unresolved or ctx.claims.unknown) and ctx.target.is_pod:
        _unknown_claims(ctx, cfg, ctx.claims)
    asks = ctx.pod_gpus()  # extended resources and DRA claims' devices
    if not any(asks.values()):
        return
    # (models as a charge keeps them: a pod naming thousands is counted by every model cap, here as there)
    models = charge_bounds.models_kept(claim_gpus.confine(scheduling.label_values(ctx.spec, cfg.modelLabel),
                                                          ctx.claims))
    me = _Pod(ctx.request.namespace, models, text(ctx.spec.get("priorityClassName") or ""), asks)
    if not ctx.target.is_pod:
        if cfg.templates == "warn":
            _check_template(ctx, cfg, me)
        return
    caps = [c for c in cfg.limits if amount(counted(c), asks.items()) and _covers(c, me, ctx.ns_labels) is not None]
    if caps:
        _check_caps(ctx, cfg, caps, me)
        if ctx.mode == "enforce" and ctx.request.operation == "CREATE":
            _charge(ctx, cfg, caps, me)
    if cfg.resourceQuotas:
        _check_resource_quotas(ctx, cfg, asks)


def _unknown_claims(ctx: RuleContext, cfg: QuotaRule, claims: claim_gpus.PodClaims) -> None:
    """A pod naming claims or templates the view does not have, where a GPU cap covers the namespace.

    Their devices are unknown, so the pod cannot be charged for them; and a claim or template
    made later would be allocated for it uncounted (issue #42). Refused, not charged 0: kube-apiserver's
    own ResourceQuota charges a claim when it is created, so there too the claim must come first. The
    cap is judged on its namespace or team alone (whatever model or resource it counts: those
    depend on the devices the claim would ask for).
    """
    priority = text(ctx.spec.get("priorityClassName") or "")
    if not any(cap_rules.covers(c, priority, cap_rules.MANY, ctx.request.namespace, ctx.ns_labels) is not None
               for c in cfg.limits):
        return
    for reason in claims.unknown:
        severity.unavailable(ctx, cfg, reason, "GPU quota of DRA claims")
    for missing in claims.unresolved:
        ctx.report(f"{ctx.where()}: claim {missing.claim.name!r}: {missing.reason}, and GPU caps apply in "
                   f"namespace {ctx.request.namespace}: a pod is charged for the devices of its claims when "
                   "it is created, so they must exist first. Create the "
                   f"{'ResourceClaimTemplate' if missing.claim.template else 'ResourceClaim'} first, then the pod "
                   "(if you just did, try again in a few seconds)",
                   pointer(ctx.spec_path("resourceClaims", missing.claim.index)))


def _covers(cap: QuotaLimit, pod: _Pod, ns_labels: Mapping[str, str]) -> str | None:
    """The group (namespace or team) the cap counts the pod in; None when it does not count it."""
    return covers(cap, pod.priority, pod.models, pod.namespace, ns_labels)


def _counts(cap: QuotaLimit, priority: str, models: frozenset[str] | None) -> bool:
    """The cap counts pods of this priority class on these models (None: any model)."""
    return cap_rules.counts(cap.model, cap.priorityClasses, priority, models)


def _check_caps(ctx: RuleContext, cfg: QuotaRule, caps: list[QuotaLimit], me: _Pod) -> None:
    needed: list[Resource] = ["pods"]
    if any(c.scope == "team" for c in caps):
        needed.append("namespaces")
    for resource in needed:
        availability = ctx.view.availability(resource)
        if not availability.known:
            severity.unavailable(ctx, cfg, availability.reason, "GPU quota")
            return
    # the sums the cluster view keeps per namespace and team (webhook.view.usage):
    # one small table per cap, however many pods the cluster runs
    usage = ctx.view.gpu_usage(cfg.modelLabel, sorted({c.teamLabel for c in caps if c.scope == "team"}))
    mine = usage.share(ctx.request.namespace, ctx.request.name) if ctx.request.name else None
    for cap in caps:
        group = str(_covers(cap, me, ctx.ns_labels))
        sums = usage.in_namespace(group) if cap.scope == "namespace" else usage.in_team(cap.teamLabel, group)
        matcher = counted(cap)
        claimed, claims = _claimed_by_namespace(ctx, cfg, cap, group, matcher)
        used = held(cap, matcher, ctx.is_gpu, sums.items()) + sum(claimed.values(), Decimal(0))
        if mine is not None:  # the pod being updated does not count against itself
            used -= held(cap, matcher, ctx.is_gpu, mine.amounts)
        # (a ResourceClaim other pods the cap counts name already is counted: it holds nothing more)
        ask = amount(matcher, me.gpus.items()) - _counted_already(ctx, claims, matcher)
        if ask and used + ask > cap.max:
            held_in = _holders(ctx, cfg, cap, group, matcher, usage.namespaces, mine) if cap.scope == "team" else ""
            ctx.report(cap_rules.over(ctx.where(), cap.scope, group, cap.teamLabel, cap.model, cap.priorityClasses,
                                      cap.resource, used, cap.max, ask, held_in),
                       pointer(ctx.spec_path("containers")))


def _charge(ctx: RuleContext, cfg: QuotaRule, caps: list[QuotaLimit], me: _Pod) -> None:
    """What the pod charges to the ledgers its enforced caps are judged in (docs/quota.md).

    Only a new pod with a uid (the validating webhook's, or a pod of the view
    being recounted): a charge is keyed by the uid, which kube-apiserver gives
    the pod before validating admission. A team cap is judged in its team's
    ledger, and so are the namespace caps of the team's namespaces (one
    write admits the pod); a namespace no team cap of the rule covers has a
    ledger of its own.
    """
    uid = str(_map(ctx.meta).get("uid") or "")
    if not uid:
        return
    gpus = tuple(sorted((name, n) for name, n in me.gpus.items() if n))
    where, field = ctx.where(), pointer(ctx.spec_path("containers"))
    # a charge line of bounded size, holding nothing a line could be misread by (a forged review)
    refused = charge_bounds.refusal(me.namespace, ctx.request.name, uid, me.priority, gpus)
    if refused:
        ctx.report(f"{where}: cannot be charged to the GPU quota ledger: {refused}", field)
        return
    holding = Holding(me.namespace, ctx.request.name, me.priority, me.models, gpus,
                      charge_bounds.claims_kept(_named_claims(ctx), gpus))
    team = _team_ledger(cfg, ctx.ns_labels)
    charges = ctx.sink.charges
    if charges is None:
        charges = ctx.sink.charges = []
    for cap in caps:
        group = str(_covers(cap, me, ctx.ns_labels))
        if cap.scope == "team":
            key, only = LedgerKey("team", group, cap.teamLabel, cfg.modelLabel), ""
        elif team is not None:
            key, only = team, group
        else:
            key, only = LedgerKey("namespace", group, "", cfg.modelLabel), ""
        check = CapCheck(ctx.policy.metadata.name, where, field, cap.resource, cap.model, tuple(cap.priorityClasses),
                         cap.max, cfg.clusterUnavailable == "fail-closed", cap.scope, group,
                         cap.teamLabel if cap.scope == "team" else "", only)
        charges.append(Charge(key, uid, holding, (check,)))


def _named_claims(ctx: RuleContext) -> Claims:
    """The ResourceClaims the pod names (``resourceClaimName``), with their GPU devices: the part of its
    GPUs that other pods naming the same claims hold too, counted once in a ledger. The claims its
    templates make are its own (one per pod), as on the recount of an existing pod, whose template
    entries stay its own: the line a recount states is the one admission wrote."""
    if ctx.claims is None:
        return ()
    found: dict[str, dict[str, Decimal]] = {}
    for claim in dra.pod_claims(ctx.spec):
        if claim.template or not claim.claim:
            continue
        devices: dict[str, Decimal] = {}
        for counts in ctx.claims.counts.get(claim.name, {}).values():
            for name, n in counts.items():
                if n and ctx.is_gpu(name):
                    devices[name] = devices.get(name, Decimal(0)) + n
        if devices:  # (a claim named twice by one pod has counts under its first name only: claim_gpus.resolve)
            found.setdefault(claim.claim, devices)
    return tuple(sorted((claim, tuple(sorted(devices.items()))) for claim, devices in found.items()))


def _team_ledger(cfg: QuotaRule, ns_labels: Mapping[str, str]) -> LedgerKey | None:
    """The ledger of the namespace's team when a team cap of the rule covers that team (whatever the
    pod): the namespace's pods are charged there, so that their namespace caps are judged in it too."""
    for cap in sorted((c for c in cfg.limits if c.scope == "team"), key=lambda c: c.teamLabel):
        team = ns_labels.get(cap.teamLabel)
        if team and (not cap.teams or team in cap.teams):
            return LedgerKey("team", team, cap.teamLabel, cfg.modelLabel)
    return None


def _holders(ctx: RuleContext, cfg: QuotaRule, cap: QuotaLimit, team: str, matcher: resources.ResourceMatcher,
             namespaces: Mapping[str, Amounts], mine: Share | None) -> str:
    """Where a team cap's GPUs are held: "; held in ml-a 6, ml-b 1", the team's namespaces, most first.

    Worked out only for a denial, so that whoever reads it knows whom to ask:
    the team's namespaces holding counted GPUs through extended resources
    (the usage sums) or DRA claims, each counted as the cap counts them.
    """
    labels_of = _namespace_labels(ctx)
    claimed, _ = _claimed_by_namespace(ctx, cfg, cap, team, matcher)
    holders: dict[str, Decimal] = {}
    for namespace in set(namespaces) | set(claimed):
        if labels_of(namespace).get(cap.teamLabel) != team:
            continue
        count = held(cap, matcher, ctx.is_gpu, namespaces.get(namespace, {}).items()) + claimed.get(namespace, 0)
        if mine is not None and namespace == ctx.request.namespace:  # the pod under admission, already in the view
            count -= held(cap, matcher, ctx.is_gpu, mine.amounts)
        if count > 0:
            holders[namespace] = count
    return cap_rules.held_in(holders)


def _counted_already(ctx: RuleContext, counted: Mapping[tuple[str, str], Decimal],
                     matcher: resources.ResourceMatcher) -> Decimal:
    """Devices of the pod's claims that ``counted`` (the ResourceClaims of other pods a cap counts)
    holds already: a claim several pods name counts once."""
    if ctx.claims is None or not counted:
        return Decimal(0)
    found = Decimal(0)
    seen: set[str] = set()
    for pod_claim, claim in ctx.claims.held.items():
        there = counted.get((ctx.request.namespace, claim))
        if there is None or claim in seen:
            continue
        seen.add(claim)
        mine = sum((n for counts in ctx.claims.counts.get(pod_claim, {}).values() for name, n in counts.items()
                    if matcher(name) and ctx.is_gpu(name)), Decimal(0))
        found += min(mine, there)
    return found


def _claimed_by_namespace(ctx: RuleContext, cfg: QuotaRule, cap: QuotaLimit, group: str,
                          matcher: resources.ResourceMatcher
                          ) -> tuple[dict[str, Decimal], dict[tuple[str, str], Decimal]]:
    """Devices of DRA claims held by the pods ``cap`` counts in ``group`` (Pending or Running, not this pod),
    per namespace holding some; and the ResourceClaims counted, with their devices (counted once however
    many pods name them).

    The usage sums hold extended resources only: a claim's devices depend on
    templates, claims and device classes that change on their own, so they
    are counted here, over the pods that name claims (few on most clusters):
    one pass over them.
    """
    total: dict[str, Decimal] = {}
    counted_devices: dict[tuple[str, str], Decimal] = {}
    labels_of = _namespace_labels(ctx)
    counted_claims: set[tuple[str, str]] = set()  # a ResourceClaim several pods share counts once
    for pod in ctx.view.claim_pods():
        meta = _map(pod.get("metadata"))
        namespace = str(meta.get("namespace") or "")
        if ctx.request.name and (namespace, meta.get("name")) == (ctx.request.namespace, ctx.request.name):
            continue
        spec = _map(pod.get("spec"))
        in_group = namespace if cap.scope == "namespace" else labels_of(namespace).get(cap.teamLabel)
        # (a pod being deleted holds its devices until it is gone: the core has no clock for its grace period)
        if not termination.holds(pod) or in_group != group:
            continue
        claims = claim_gpus.resolve(spec, namespace, ctx.view, ctx.device_classes, dra.generated_claims(pod))
        models = claim_gpus.confine(scheduling.label_values(spec, cfg.modelLabel), claims)
        if claims is None or not _counts(cap, str(spec.get("priorityClassName") or ""), models):
            continue
        devices = Decimal(0)
        for pod_claim, requests in claims.counts.items():
            held = claims.held.get(pod_claim)
            if held:
                if (namespace, held) in counted_claims:
                    continue
                counted_claims.add((namespace, held))
            these = sum((Decimal(n) for counts in requests.values() for name, n in counts.items()
                         if matcher(name) and ctx.is_gpu(name)), Decimal(0))
            if held:
                counted_devices[(namespace, held)] = these
            devices += these
        if devices:
            total[namespace] = total.get(namespace, Decimal(0)) + devices
    return total, counted_devices


def _namespace_labels(ctx: RuleContext) -> Callable[[str], dict[str, str]]:
    cache: dict[str, dict[str, str]] = {ctx.request.namespace: dict(ctx.ns_labels)}

    def labels_of(namespace: str) -> dict[str, str]:
        if namespace not in cache:
            raw = _map(_map(ctx.view.namespace(namespace)).get("metadata")).get("labels")
            cache[namespace] = {str(k): str(v) for k, v in _map(raw).items()}
        return cache[namespace]

    return labels_of


def _check_resource_quotas(ctx: RuleContext, cfg: QuotaRule, asks: Mapping[str, Decimal]) -> None:
    availability = ctx.view.availability("resourcequotas")
    if not availability.known:
        severity.unavailable(ctx, cfg, availability.reason, "ResourceQuota")
        return
    if ctx.claims is not None and ctx.claims.quota:  # DRA items: <device-class>.deviceclass.resource.k8s.io/devices
        asks = {**asks, **{k: Decimal(n) for k, n in ctx.claims.quota.items()}}
    quotas = list(ctx.view.resource_quotas(ctx.request.namespace))
    is_gpu = _quota_gpu(ctx)
    found = resourcequota.breaches(quotas, ctx.spec, asks, is_gpu)
    if found and _charged_already(ctx):  # (looked for only on a breach: rare, and a scan of the namespace's pods)
        found = resourcequota.breaches(quotas, ctx.spec, asks, is_gpu, charged=asks)
    for breach in found:
        ctx.report(f"{ctx.where()}: namespace {ctx.request.namespace} uses {number(breach.used)} of {number(breach.hard)} "
                   f"{breach.key} (ResourceQuota {breach.quota}); this pod asks for {number(breach.ask)}{WHAT_TO_DO}",
                   pointer(ctx.spec_path("containers")))


def _charged_already(ctx: RuleContext) -> bool:
    """Is the pod one the quotas' ``status.used`` already counts: a pod of the view, Pending or Running,
    and this very one (its uid, when it has one)?

    An audit judges pods that exist (``audit --cluster``, a manifest of a pod the cluster state
    holds); at admission the pod is new: kube-apiserver gives it a uid of its own before the
    validating webhooks see it, so a pod the view still has under its name is another one.
    """
    namespace, name = ctx.request.namespace, ctx.request.name
    if not name or not ctx.view.availability("pods").known:
        return False
    uid = _map(ctx.meta).get("uid")
    for pod in (*ctx.view.pods(namespace), *ctx.view.claim_pods()):
        meta = _map(pod.get("metadata"))
        if (meta.get("namespace"), meta.get("name")) != (namespace, name) or (uid and meta.get("uid") != uid):
            continue
        return termination.holds(pod)
    return False


def _check_template(ctx: RuleContext, cfg: QuotaRule, me: _Pod) -> None:
    replicas = _replicas(ctx)
    for cap in cfg.limits:
        group, ask = _covers(cap, me, ctx.ns_labels), amount(counted(cap), me.gpus.items())
        if group is not None and ask and replicas * ask > cap.max:
            severity.report(ctx, "warn", f"{ctx.where()}: {replicas} replicas × {number(ask)} {cap.resource} exceed "
                            f"the cap of {cap.max} for {cap_rules.subject(cap.scope, group, cap.teamLabel)}"
                            f"{cap_rules.qualifier(cap.model, cap.priorityClasses)}; pods past it "
                            "will be denied", pointer(ctx.spec_path("containers")))
    if cfg.resourceQuotas and ctx.view.availability("resourcequotas").known:
        # the namespace's native ResourceQuotas: what the API server itself will refuse pods past
        asks = {**me.gpus, **{k: Decimal(n) for k, n in (ctx.claims.quota if ctx.claims is not None else {}).items()}}
        quotas = ctx.view.resource_quotas(ctx.request.namespace)
        for breach in resourcequota.breaches(quotas, ctx.spec, {k: replicas * n for k, n in asks.items()},
                                             _quota_gpu(ctx), empty=True):
            severity.report(ctx, "warn", f"{ctx.where()}: {replicas} replicas × {number(breach.ask / replicas)} "
                            f"{breach.key} exceed ResourceQuota {breach.quota} ({number(breach.hard)} in namespace "
                            f"{ctx.request.namespace}); the API server will refuse pods past it",
                            pointer(ctx.spec_path("containers")))


def _quota_gpu(ctx: RuleContext) -> Callable[[str], bool]:
    """GPU resources as quotas name them: extended resources, and DRA devices per device class."""

    def is_gpu(name: str) -> bool:
        return ctx.is_gpu(name) or name.endswith(claim_gpus.QUOTA_SUFFIX)

    return is_gpu


def _replicas(ctx: RuleContext) -> int:
    """replicas / parallelism of every object enclosing the template, multiplied (1 when none)."""
    path = ctx.target.spec_path[:-1] if ctx.target.meta_path is not None else ctx.target.spec_path
    total = 1
    for depth in range(len(path) - 1, -1, -1):
        node = _map(ctx.builder.get(path[:depth]))
        value = node.get("replicas", node.get("parallelism"))
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            total *= value
    return total


def _map(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, dict) else {}

