"""runtimeClassName: set when absent (or overridden), never to a class the cluster lacks, never on Windows pods."""

from __future__ import annotations

from webhook.kube.workload import is_windows
from webhook.policy.context import RuleContext
from webhook.policy.settings.mutation import RuntimeClassRule

PHASES = ("mutate",)


class Settings:
    """What ``run`` reads of the rule's settings on every pod, made with the plans of a policy set."""

    def __init__(self, cfg: RuntimeClassRule) -> None:
        self.name = cfg.name
        self.override = cfg.override
        self.skip_dra_pods = cfg.draPods == "skip"


def run(ctx: RuleContext, settings: Settings) -> None:
    if ctx.claims is not None and settings.skip_dra_pods and not ctx.extended_slots():
        return  # GPUs from DRA claims only: CDI, not the runtime class, hands them over
    if is_windows(ctx.spec):
        return  # the nvidia runtime handler is a Linux one: a Windows node has none, and the pod would not start
    current, name = ctx.spec.get("runtimeClassName"), settings.name
    if current == name or (current and not settings.override):
        return
    if ctx.view.availability("runtimeclasses").known and ctx.view.runtime_class(name) is None:
        _report_missing(ctx, name)
        return
    ctx.builder.put(ctx.spec, ctx.spec_at, "runtimeClassName", name)
    # the RuntimeClass plugin fills overhead from the class on its next pass and
    # rejects a pod whose overhead differs from the class's (FACTS.md §5)
    ctx.builder.drop(ctx.spec, ctx.spec_at, "overhead")
    ctx.changed("runtimeClassName")


def run_rest(ctx: RuleContext, settings: Settings) -> None:
    """The part a compiled policy leaves to the webhook (webhook.policy.offload): the class it set
    must exist, which needs the cluster's RuntimeClasses."""
    name = settings.name
    if not is_windows(ctx.spec) and ctx.spec.get("runtimeClassName") == name:
        if ctx.view.availability("runtimeclasses").known and ctx.view.runtime_class(name) is None:
            _report_missing(ctx, name)


def _report_missing(ctx: RuleContext, name: str) -> None:
    ctx.report(
        f"{ctx.where()}: the policy sets RuntimeClass {name!r}, which this cluster does not have; "
        "create it (deploy/runtimeclass) or change the policy",
        "spec.runtimeClassName",
    )
