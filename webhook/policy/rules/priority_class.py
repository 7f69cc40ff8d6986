"""priorityClassName by workload class, with spec.priority and preemptionPolicy set to the class's (or dropped, to be recomputed)."""

from __future__ import annotations

from collections.abc import Mapping

from webhook.policy.context import RuleContext
from webhook.policy.settings.mutation import PriorityClassRule

PHASES = ("mutate",)


class Settings:
    """What ``run`` reads of the rule's settings on every pod, made with the plans of a policy set:
    the class a pod gets worked out from native attributes (a method of the pydantic model, interpreted,
    cost ~10,000 instructions an admission)."""

    def __init__(self, cfg: PriorityClassRule) -> None:
        self.cfg = cfg
        self.classes: dict[str, str] = dict(cfg.classes)
        self.default: str | None = cfg.default
        self.override: bool = cfg.override
        choice = cfg.userChoice
        #: the class's PriorityClass only where the namespace may choose the class (ownClass
        #: allowed-namespaces); elsewhere ``fallback``
        self.own_where_allowed = choice is not None and choice.ownClass == "allowed-namespaces"
        self.everywhere: frozenset[str] = frozenset(choice.everywhere if choice is not None else ())
        self.label_prefix: str = choice.namespaceLabelPrefix if choice is not None else ""
        self.fallback: str | None = next(
            (self.classes[w] for w in (choice.everywhere if choice is not None else ()) if w in self.classes), cfg.default)

    def own(self, workload_class: str | None, ns_labels: Mapping[str, str] | None) -> str | None:
        """The PriorityClass the policy gives a pod of ``workload_class`` in a namespace with ``ns_labels``
        (None: a namespace the cluster view does not know, whose labels cannot be judged)."""
        name = self.classes.get(workload_class) if workload_class else None
        if name and workload_class and self.own_where_allowed and ns_labels is not None \
                and workload_class not in self.everywhere and ns_labels.get(self.label_prefix + workload_class) != "true":
            return self.fallback
        return name or self.default


def run(ctx: RuleContext, settings: Settings) -> None:
    name = settings.own(ctx.workload_class, _labels(ctx))
    current = ctx.spec.get("priorityClassName")
    if not name:
        if current and isinstance(current, str):
            _judge(ctx, settings.cfg, current, name)
        return
    if current == name:
        return
    if current and not settings.override and not _cluster_default(ctx, current):
        if isinstance(current, str):
            _judge(ctx, settings.cfg, current, name)
        return
    found = ctx.view.priority_class(name)
    if found is None and _missing(ctx, name):
        return
    builder, spec, base = ctx.builder, ctx.spec, ctx.spec_at
    builder.put(spec, base, "priorityClassName", name)
    # The Priority plugin already wrote these from the old class: left in place they make its
    # second pass reject the pod (FACTS.md §5). A pod gets its new class's values where the view
    # knows the class: when this change comes on a reinvocation (another webhook changed the pod
    # after our first call, e.g. added the label that decides its class), no built-in plugin runs
    # after it, and a pod without them would be stored at priority 0, free to preempt. Otherwise,
    # and in templates, they are removed, for the plugin to compute.
    value = found.get("value") if found and ctx.target.is_pod else None
    if found and type(value) is int:
        builder.put(spec, base, "priority", value)
        builder.put(spec, base, "preemptionPolicy", found.get("preemptionPolicy") or "PreemptLowerPriority")
    else:
        builder.drop(spec, base, "priority")
        builder.drop(spec, base, "preemptionPolicy")
    ctx.changed("priorityClassName")


def _judge(ctx: RuleContext, cfg: PriorityClassRule, current: str, own: str | None) -> None:
    """Refuse a class the pod names and keeps that it may not use: a reserved one (the cluster's
    system classes), or one of the policy's GPU classes its namespace may not choose. The pod's
    author sets priorityClassName, so a class above its own would let any tenant preempt other
    teams' GPU pods."""
    where = ctx.where(field_path="spec.priorityClassName")
    instead = f"remove priorityClassName and this pod gets {own!r}" if own else "remove priorityClassName"
    if cfg.refused(current, ctx.request.namespace):
        ctx.report(
            f"{where}: PriorityClass {current!r} is for the cluster's own components, not workloads: it would "
            f"let this pod preempt them and every other GPU pod; {instead}",
            "spec.priorityClassName",
        )
        return
    choice = cfg.userChoice
    classes = cfg.workload_classes.get(current) if choice is not None else None
    if choice is None or not classes:
        return
    labels = _labels(ctx)
    if labels is None or any(choice.allows(w, labels) for w in classes):
        return
    ctx.report(
        f"{where}: PriorityClass {current!r} is for {' or '.join(classes)} pods, which namespace "
        f"{ctx.request.namespace} may not choose (the platform team allows it with the namespace label "
        f"{' or '.join(choice.namespaceLabelPrefix + w + '=true' for w in classes)}); {instead}",
        "spec.priorityClassName",
    )


def _labels(ctx: RuleContext) -> Mapping[str, str] | None:
    """The namespace's labels, or None while the cluster view does not know the namespace (a view not
    synced, or one that has not seen a namespace just made): the classes a namespace may choose are then
    not judged, rather than judged from labels it may well have. A request reaches the webhooks only for
    a namespace labelled by the platform, which tenants cannot make; the compiled policies read the
    namespace from kube-apiserver and always judge (docs/compiled-policies.md)."""
    return ctx.ns_labels if ctx.namespace_known() else None


def _cluster_default(ctx: RuleContext, name: object) -> bool:
    """Whether ``name`` is the globalDefault class, which the Priority plugin writes into every pod without one.

    kube-apiserver resolves the default before webhooks run, so a pod that
    named no class arrives with it: that is no choice of the user's to keep.
    """
    found = ctx.view.priority_class(name) if isinstance(name, str) else None
    return bool(found and found.get("globalDefault") is True)


def run_rest(ctx: RuleContext, settings: Settings) -> None:
    """The parts a compiled policy leaves to the webhook (webhook.policy.offload), which need the
    cluster's PriorityClasses: a pod carrying the globalDefault class (the compiled policy keeps a
    class it finds), and the class it set must exist."""
    name = settings.own(ctx.workload_class, _labels(ctx))
    current = ctx.spec.get("priorityClassName")
    if not name or not current:
        return
    if current != name and not settings.override and _cluster_default(ctx, current):
        run(ctx, settings)
    elif current == name and ctx.view.priority_class(name) is None:
        _missing(ctx, name)


def _missing(ctx: RuleContext, name: str) -> bool:
    """Report the policy's class when the cluster is known not to have it."""
    if ctx.view.availability("priorityclasses").known:
        ctx.report(
            f"{ctx.where()}: the policy gives {ctx.workload_class or 'these'} pods PriorityClass {name!r}, "
            "which this cluster does not have; create it (deploy/) or change the policy",
            "spec.priorityClassName",
        )
        return True
    return False
