"""GPU tolerations: add the taint tolerations GPU nodes need, never a duplicate."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from webhook.policy.context import RuleContext
from webhook.policy.schema import TolerationsRule

PHASES = ("mutate",)


def run(ctx: RuleContext, cfg: TolerationsRule) -> None:
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
            ctx.builder.append(ctx.spec_path("tolerations"), dict(wanted))
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
    if have.get("effect") == "NoExecute" and have.get("tolerationSeconds") is not None:
        if wanted.get("tolerationSeconds") is None or have["tolerationSeconds"] < wanted["tolerationSeconds"]:
            return False
    if have_op == "Exists":
        return True
    return wanted.get("operator") == "Equal" and (have.get("value") or "") == (wanted.get("value") or "")
