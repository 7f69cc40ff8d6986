"""How loudly a validation finding is reported: a policy's severity under the rule's mode.

A rule's mode caps everything it reports (a rule in warn never denies); a
per-finding severity can only lower it further: ``deny`` keeps the rule's
mode, ``warn`` lowers enforce to warn, ``allow`` reports nothing.
"""

from __future__ import annotations

from webhook.policy.context import RuleContext
from webhook.policy.settings.base import Mode
from webhook.policy.settings.validation import ClusterRuleBase, Severity

_STRENGTH: dict[str, int] = {"off": 0, "audit": 1, "warn": 2, "enforce": 3}


def weaker(a: Mode, b: Mode) -> Mode:
    return a if _STRENGTH[a] <= _STRENGTH[b] else b


def mode_of(rule_mode: Mode, severity: Severity) -> Mode | None:
    """The mode a finding of ``severity`` is recorded with; None: not at all."""
    if severity == "allow":
        return None
    return rule_mode if severity == "deny" else weaker(rule_mode, "warn")


def report(ctx: RuleContext, severity: Severity, message: str, field_path: str = "") -> None:
    mode = mode_of(ctx.mode, severity)
    if mode is not None:
        ctx.report(message, field_path, mode=mode)


def unavailable(ctx: RuleContext, cfg: ClusterRuleBase, reason: str, unchecked: str) -> None:
    """The cluster state the rule needs is unknown: fail open (warn) or closed (deny in enforce)."""
    severity: Severity = "deny" if cfg.clusterUnavailable == "fail-closed" else "warn"
    report(ctx, severity, f"{ctx.where()}: cluster state unavailable: {reason} ({unchecked} not checked)")
