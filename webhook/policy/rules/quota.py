"""GPU quotas: caps per namespace, team, GPU model and priority class, and native ResourceQuotas.

Pods only: a template has no pods yet, and how many it gets is its
controller's business (autoscalers, parallelism); a template is at most
warned about when its replicas alone exceed a cap. Usage is what the
Pending and Running pods of the cluster view hold. Two pods admitted at the
same moment both see the usage from before either: the native ResourceQuota,
which the API server charges atomically, is the hard backstop
(docs/validations.md).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from decimal import Decimal
from fnmatch import fnmatchcase
from typing import Any

from webhook.policy import claim_gpus, gpu, match, resourcequota, scheduling, severity
from webhook.policy.context import RuleContext
from webhook.policy.patch import pointer
from webhook.policy.validation_settings import QuotaLimit, QuotaRule
from webhook.policy.view import Resource

PHASES = ("validate",)


@dataclass(frozen=True)
class _Pod:
    """What a cap needs to know of a pod."""

    namespace: str
    models: frozenset[str] | None  # values of the model label it can land on; None: any
    priority: str
    gpus: Mapping[str, Decimal]


def run(ctx: RuleContext, cfg: QuotaRule) -> None:
    asks = ctx.pod_gpus()  # extended resources and DRA claims' devices
    if not any(asks.values()):
        return
    me = _Pod(ctx.request.namespace, claim_gpus.confine(scheduling.label_values(ctx.spec, cfg.modelLabel), ctx.claims),
              str(ctx.spec.get("priorityClassName") or ""), asks)
    if not ctx.target.is_pod:
        if cfg.templates == "warn":
            _check_template(ctx, cfg, me)
        return
    caps = [c for c in cfg.limits if _amount(_counted(c), asks) and _covers(c, me, ctx.ns_labels) is not None]
    if caps:
        _check_caps(ctx, cfg, caps, me)
    if cfg.resourceQuotas:
        _check_resource_quotas(ctx, cfg, asks)


def _amount(counted: gpu.ResourceMatcher, gpus: Mapping[str, Decimal]) -> Decimal:
    """GPUs of the counted resources (a cap's name or prefix*) in ``gpus``."""
    return sum((n for name, n in gpus.items() if counted(name)), Decimal(0))


def _counted(cap: QuotaLimit) -> gpu.ResourceMatcher:
    return gpu.ResourceMatcher.of([cap.resource])


def _covers(cap: QuotaLimit, pod: _Pod, ns_labels: Mapping[str, str]) -> str | None:
    """The group (namespace or team) the cap counts the pod in; None when it does not count it."""
    if cap.priorityClasses and pod.priority not in cap.priorityClasses:
        return None
    if cap.model == "any" and pod.models is not None:
        return None
    if cap.model not in ("*", "any") and not any(fnmatchcase(m, cap.model) for m in pod.models or ()):
        return None
    return _group(cap, pod.namespace, ns_labels)


def _group(cap: QuotaLimit, namespace: str, ns_labels: Mapping[str, str]) -> str | None:
    if cap.scope == "namespace":
        return namespace if match.name_matches(cap.namespaces, namespace) else None
    team = ns_labels.get(cap.teamLabel)
    return team if team and (not cap.teams or team in cap.teams) else None


def _check_caps(ctx: RuleContext, cfg: QuotaRule, caps: list[QuotaLimit], me: _Pod) -> None:
    needed: list[Resource] = ["pods"]
    if any(c.scope == "team" for c in caps):
        needed.append("namespaces")
    for resource in needed:
        availability = ctx.view.availability(resource)
        if not availability.known:
            severity.unavailable(ctx, cfg, availability.reason, "GPU quota")
            return
    labels_of = _namespace_labels(ctx)
    groups = [(cap, _covers(cap, me, ctx.ns_labels)) for cap in caps]

    seen: dict[str, bool] = {}

    def relevant(namespace: str) -> bool:
        if namespace not in seen:
            seen[namespace] = any(_group(cap, namespace, labels_of(namespace)) == group for cap, group in groups)
        return seen[namespace]

    # only pods of the groups at stake are parsed: a large cluster has many
    only_here = ctx.request.namespace if all(cap.scope == "namespace" for cap in caps) else None
    pods = list(_running_pods(ctx, cfg, only_here, relevant, any(cap.model != "*" for cap in caps)))
    for cap, group in groups:
        counted = _counted(cap)
        used = sum((_amount(counted, p.gpus) for p in pods if _covers(cap, p, labels_of(p.namespace)) == group),
                   Decimal(0))
        ask = _amount(counted, me.gpus)
        if used + ask > cap.max:
            ctx.report(f"{ctx.where()}: {_subject(cap, str(group))} uses {_n(used)} of {cap.max} {cap.resource}"
                       f"{_qualifier(cap)}; this pod asks for {_n(ask)}", pointer(ctx.spec_path("containers")))


def _running_pods(
    ctx: RuleContext, cfg: QuotaRule, namespace: str | None, relevant: Callable[[str], bool], with_models: bool
) -> Iterator[_Pod]:
    """Pods that hold GPUs now (Pending or Running, not being deleted, not this pod) of relevant namespaces."""
    models_of = _node_models(ctx, cfg) if with_models else {}
    for pod in ctx.view.pods(namespace):
        meta = _map(pod.get("metadata"))
        pod_namespace = str(meta.get("namespace") or "")
        if not relevant(pod_namespace) or meta.get("deletionTimestamp"):
            continue
        if ctx.request.name and (pod_namespace, meta.get("name")) == (ctx.request.namespace, ctx.request.name):
            continue
        spec, status = _map(pod.get("spec")), _map(pod.get("status"))
        if status.get("phase") in ("Succeeded", "Failed"):
            continue
        gpus, claims = claim_gpus.pod_usage(spec, pod_namespace, ctx.view, ctx.device_classes, ctx.is_gpu)
        models = None
        if with_models:
            models = models_of.get(str(spec.get("nodeName") or "")) or claim_gpus.confine(
                scheduling.label_values(spec, cfg.modelLabel), claims)
        yield _Pod(pod_namespace, models, str(spec.get("priorityClassName") or ""), gpus)


def _node_models(ctx: RuleContext, cfg: QuotaRule) -> dict[str, frozenset[str]]:
    """Node name → its model, for pods already bound to a node (when nodes are known)."""
    if not ctx.view.availability("nodes").known:
        return {}
    labelled = ((scheduling.node_name(n), scheduling.node_labels(n).get(cfg.modelLabel)) for n in ctx.view.nodes())
    return {name: frozenset({str(model)}) for name, model in labelled if model}


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
    for breach in resourcequota.breaches(ctx.view.resource_quotas(ctx.request.namespace), ctx.spec, asks,
                                         lambda name: ctx.is_gpu(name) or name.endswith(claim_gpus.QUOTA_SUFFIX)):
        ctx.report(f"{ctx.where()}: namespace {ctx.request.namespace} uses {_n(breach.used)} of {_n(breach.hard)} "
                   f"{breach.key} (ResourceQuota {breach.quota}); this pod asks for {_n(breach.ask)}",
                   pointer(ctx.spec_path("containers")))


def _check_template(ctx: RuleContext, cfg: QuotaRule, me: _Pod) -> None:
    replicas = _replicas(ctx)
    for cap in cfg.limits:
        group, ask = _covers(cap, me, ctx.ns_labels), _amount(_counted(cap), me.gpus)
        if group is not None and ask and replicas * ask > cap.max:
            severity.report(ctx, "warn", f"{ctx.where()}: {replicas} replicas × {_n(ask)} {cap.resource} exceed "
                            f"the cap of {cap.max} for {_subject(cap, group)}{_qualifier(cap)}; pods past it "
                            "will be denied", pointer(ctx.spec_path("containers")))


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


def _subject(cap: QuotaLimit, group: str) -> str:
    return f"namespace {group}" if cap.scope == "namespace" else f"team {group} ({cap.teamLabel}={group})"


def _qualifier(cap: QuotaLimit) -> str:
    text = "" if cap.model == "*" else " with no GPU model selected" if cap.model == "any" else f" on {cap.model}"
    return text + (f" at priority {', '.join(cap.priorityClasses)}" if cap.priorityClasses else "")


def _n(value: Decimal) -> str:
    return f"{value.normalize():f}"


def _map(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, dict) else {}

