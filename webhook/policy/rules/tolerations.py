"""GPU tolerations: add the taint tolerations GPU nodes need, never a duplicate."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from webhook.policy.context import RuleContext
from webhook.policy.schema import TolerationsRule

PHASES = ("mutate",)


class Settings:
    """What ``run`` reads of the rule's settings, made with the plans of a policy set."""

    def __init__(self, cfg: TolerationsRule) -> None:
        self.wanted: tuple[dict[str, object], ...] = cfg.wanted


def run(ctx: RuleContext, cfg: Settings) -> None:
    current = ctx.spec.get("tolerations")
    existing: list[Any] | None = None
    for wanted in cfg.wanted:
        if type(current) is list and wanted in current:  # the common case, compared without Python calls
            continue
        if existing is None:
            existing = [t for t in current if type(t) is dict] if type(current) is list else []
        for have in existing:
            if covers(have, wanted):
                break
        else:
            ctx.builder.append_to(ctx.spec, ctx.spec_at, "tolerations", dict(wanted))
            existing.append(wanted)
            ctx.changed("tolerations")


def covers(have: Mapping[str, Any], wanted: Mapping[str, Any]) -> bool:
    """True when toleration ``have`` already tolerates every taint ``wanted`` does.

    An empty key with Exists tolerates every taint; an empty effect every
    effect; Exists every value. This is also what keeps us from duplicating
    the toleration the ExtendedResourceToleration plugin adds.
    """
    have_key, have_op = have.get("key") or "", have.get("operator") or "Equal"
    if have_key and have_key != (wanted.get("key") or ""):
        return False
    if not have_key and have_op != "Exists":
        return False
    if have.get("effect") and have.get("effect") != wanted.get("effect"):
        return False
    have_seconds, wanted_seconds = have.get("tolerationSeconds"), wanted.get("tolerationSeconds")
    if have.get("effect") == "NoExecute" and have_seconds is not None:
        # a bounded toleration covers a bound no longer than its own; one whose
        # bound is not a number (no API server would accept it) covers nothing
        if wanted_seconds is None or not _is_number(have_seconds) or have_seconds < wanted_seconds:
            return False
    if have_op == "Exists":
        return True
    return wanted.get("operator") == "Equal" and (have.get("value") or "") == (wanted.get("value") or "")


def _is_number(value: Any) -> bool:
    return type(value) in (int, float) and value == value  # not a bool, not NaN
