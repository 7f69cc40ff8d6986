"""Inference replicas spread across nodes: anti-affinity on the workload's own labels.

The selector comes from the workload itself, never from a label the webhook
invents: a Deployment's (StatefulSet's, ReplicaSet's) ``spec.selector`` for
its template, and for a pod its labels less those that differ between
replicas or revisions (``pod-template-hash`` …), so replicas of every
revision repel each other during a rollout.
"""

from __future__ import annotations

from webhook.kube import affinity
from webhook.kube.patch import submap
from webhook.kube.value_text import text
from webhook.policy.context import RuleContext
from webhook.policy.settings.mutation import SpreadReplicasRule

PHASES = ("mutate",)
TEMPLATE_META = ("spec", "template", "metadata")


def run(ctx: RuleContext, cfg: SpreadReplicasRule) -> None:
    selector = replica_selector(ctx, cfg.ignoreLabels)
    if not selector:
        return
    if affinity.add_pod_term(
        ctx.builder, ctx.spec, ctx.spec_at, affinity.POD_ANTI_AFFINITY,
        required=cfg.type == "required", weight=cfg.weight, selector=selector, topology_key=cfg.topologyKey,
    ):
        ctx.changed("spreadReplicas")


def replica_selector(ctx: RuleContext, ignore: list[str]) -> dict[str, str]:
    """Labels every replica of the workload carries, and only those."""
    if ctx.target.meta_path == TEMPLATE_META:
        own = submap(submap(ctx.request.object, "spec"), "selector")
        if own and not own.get("matchExpressions"):
            return {text(k): text(v) for k, v in submap(own, "matchLabels").items()}
    labels = submap(ctx.meta, "labels")
    return {text(k): text(v) for k, v in labels.items() if k not in ignore}
