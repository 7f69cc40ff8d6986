"""Notebook lifetime: a deadline so that idle notebooks do not hold GPUs forever."""

from __future__ import annotations

from webhook.policy.context import RuleContext
from webhook.policy.mutation_settings import NotebookLifetimeRule

PHASES = ("mutate",)


def run(ctx: RuleContext, cfg: NotebookLifetimeRule) -> None:
    current = ctx.spec.get("activeDeadlineSeconds")
    if current is None:
        ctx.builder.set(ctx.spec_path("activeDeadlineSeconds"), cfg.activeDeadlineSeconds)
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


def _hours(seconds: int) -> str:
    return f"{seconds / 3600:g}h"
