"""Notebook lifetime: a deadline so that forgotten notebooks do not hold GPUs forever.

The kubelet ends a pod at its deadline. That frees the GPU for notebooks a
hub spawns as bare pods (JupyterHub) and starts again on demand; a pod a
controller recreates (a Kubeflow Notebook's StatefulSet) would only restart
in a loop, so it gets no default deadline: use the notebook controller's own
idle culling there.
"""

from __future__ import annotations

from webhook.kube.patch import sublist
from webhook.policy.context import RuleContext
from webhook.policy.settings.mutation import NotebookLifetimeRule

PHASES = ("mutate",)


def run(ctx: RuleContext, cfg: NotebookLifetimeRule) -> None:
    current = ctx.spec.get("activeDeadlineSeconds")
    if current is None:
        if cfg.skipControllerOwned and _recreated(ctx):
            return
        ctx.builder.put(ctx.spec, ctx.spec_at, "activeDeadlineSeconds", cfg.activeDeadlineSeconds)
        ctx.changed("activeDeadlineSeconds")
        return
    limit = cfg.maxActiveDeadlineSeconds
    if limit is not None and isinstance(current, int) and current > limit:
        ctx.report(
            f"{ctx.where(field_path='spec.activeDeadlineSeconds')}: {current}s ({_hours(current)}) is longer than "
            f"the {_hours(limit)} notebooks may hold GPUs; set at most {limit} or leave it out "
            f"for the default {_hours(cfg.activeDeadlineSeconds)}",
            "spec.activeDeadlineSeconds",
        )


def _recreated(ctx: RuleContext) -> bool:
    """A pod with a controller (StatefulSet, ReplicaSet …) comes back when the deadline ends it."""
    return any(isinstance(ref, dict) and ref.get("controller") is True for ref in sublist(ctx.meta, "ownerReferences"))


def _hours(seconds: int) -> str:
    return f"{seconds / 3600:g}h"
