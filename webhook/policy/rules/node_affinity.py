"""Node affinity: required expressions ANDed into every term, preferred terms added once."""

from __future__ import annotations

from typing import Any

from webhook.gpu.resources import ResourceMatcher
from webhook.kube import affinity
from webhook.policy.context import RuleContext
from webhook.policy.settings.mutation import NodeAffinityRule, NodeRequirement, PreferredTerm

PHASES = ("mutate",)


class Settings:
    """What ``run`` reads of the rule's settings, made with the plans of a policy set."""

    def __init__(self, cfg: NodeAffinityRule) -> None:
        self.required: list[NodeRequirement] = cfg.required
        self.preferred: list[PreferredTerm] = cfg.preferred
        #: byResource: (its matcher, its required, its preferred)
        self.by_resource: list[tuple[ResourceMatcher, list[NodeRequirement], list[PreferredTerm]]] = [
            (extra.matcher, extra.required, extra.preferred) for extra in cfg.byResource]
        self.deny_conflicts = cfg.onConflict == "deny"


def run(ctx: RuleContext, cfg: Settings) -> None:
    required, preferred = _requirements(ctx, cfg)
    if not required and not preferred:
        return
    for requirement in required:
        wanted = expression(requirement)
        merge = affinity.require(ctx.builder, ctx.target.spec_path, wanted)
        if merge.conflict:
            if cfg.deny_conflicts:
                ctx.report(
                    f"{ctx.where()}: {merge.conflict}; the policy requires {affinity.describe(wanted)}, "
                    "so no allowed node could run it",
                    "spec.affinity",
                )
        elif merge.added:
            ctx.changed("nodeAffinity")
    for term in preferred:
        if affinity.prefer(ctx.builder, ctx.target.spec_path, term.weight, [expression(e) for e in term.matchExpressions]):
            ctx.changed("nodeAffinity")


def _requirements(ctx: RuleContext, cfg: Settings) -> tuple[list[NodeRequirement], list[PreferredTerm]]:
    required, preferred = cfg.required, cfg.preferred  # copied only when extended (read-only settings)
    by_resource = cfg.by_resource
    if by_resource:
        # by extended resource only: the scheduler places DRA claims by the devices nodes publish
        slots = ctx.extended_slots()
        for matcher, more_required, more_preferred in by_resource:
            if matcher.any_of(slots):
                required, preferred = [*required, *more_required], [*preferred, *more_preferred]
    return required, preferred


def expression(requirement: NodeRequirement) -> dict[str, Any]:
    """The requirement as pod-spec JSON (no empty values list for Exists/DoesNotExist)."""
    data: dict[str, Any] = {"key": requirement.key, "operator": requirement.operator}
    if requirement.values:
        data["values"] = list(requirement.values)
    return data
