"""What the webhooks are sent, read from their configurations: the compiled policies get the same reach.

The namespace opt-in (``namespaceSelector``), the kinds (``rules``) and the
``matchConditions`` of deploy/'s MutatingWebhookConfiguration and
ValidatingWebhookConfiguration become the ``matchConstraints`` and
``matchConditions`` of the MutatingAdmissionPolicy and the
ValidatingAdmissionPolicies, so that both see exactly the same requests (a
cluster that edited its webhook configurations compiles against its own).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from webhook.errors import PolicyError

MUTATING_WEBHOOK = "mutate.gpu-admission.io"
VALIDATING_WEBHOOK = "validate.gpu-admission.io"
#: DRA claims go to the validating webhook alone: nothing compiled reads them
_LEFT_TO_THE_WEBHOOK = {"resource.k8s.io"}


@dataclass(frozen=True)
class Reach:
    """One webhook's selection of requests, as a policy's ``matchConstraints`` and ``matchConditions``."""

    match_constraints: dict[str, Any]
    match_conditions: list[dict[str, Any]]


def read(folder: Path) -> tuple[Reach, Reach]:
    """(mutating, validating) from the webhook configurations in the YAML files of ``folder``."""
    hooks: dict[str, dict[str, Any]] = {}
    if not folder.is_dir():
        raise PolicyError([f"{folder}: no such directory (the webhook configurations to take the reach from)"])
    for path in sorted(folder.glob("*.y*ml")):
        try:
            documents = list(yaml.safe_load_all(path.read_text(encoding="utf-8")))
        except (OSError, yaml.YAMLError) as exc:
            raise PolicyError([f"{path}: cannot read: {exc}"]) from exc
        for doc in documents:
            if isinstance(doc, dict) and doc.get("kind") in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
                for hook in doc.get("webhooks") or []:
                    if isinstance(hook, dict) and hook.get("name") in (MUTATING_WEBHOOK, VALIDATING_WEBHOOK):
                        hooks[hook["name"]] = hook
    missing = [name for name in (MUTATING_WEBHOOK, VALIDATING_WEBHOOK) if name not in hooks]
    if missing:
        raise PolicyError([f"{folder}: no webhook {', '.join(missing)} in its webhook configurations"])
    return _reach(hooks[MUTATING_WEBHOOK]), _reach(hooks[VALIDATING_WEBHOOK])


def _reach(hook: dict[str, Any]) -> Reach:
    constraints: dict[str, Any] = {
        "resourceRules": [rule for r in hook.get("rules") or []
                          if not set(r.get("apiGroups") or []) & _LEFT_TO_THE_WEBHOOK
                          and (rule := _main_resources(r)) is not None],
        "matchPolicy": hook.get("matchPolicy", "Equivalent"),
    }
    for key in ("namespaceSelector", "objectSelector"):
        if hook.get(key):
            constraints[key] = copy.deepcopy(hook[key])
    return Reach(constraints, copy.deepcopy(hook.get("matchConditions") or []))


def _main_resources(rule: dict[str, Any]) -> dict[str, Any] | None:
    """A webhook rule without its subresources (``pods/ephemeralcontainers``: the engine judges them
    with a rule left to the webhook, and nothing compiled does), or None when nothing is left."""
    resources = [r for r in rule.get("resources") or [] if "/" not in r]
    if not resources:
        return None
    kept = copy.deepcopy(rule)
    kept["resources"] = resources
    return kept
