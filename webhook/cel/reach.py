"""What the webhooks are sent, read from their configurations: the compiled policies get the same reach.

The namespace opt-in (``namespaceSelector``), the kinds (``rules``) and the
``matchConditions`` of deploy/'s MutatingWebhookConfiguration and
ValidatingWebhookConfiguration become the ``matchConstraints`` and
``matchConditions`` of the MutatingAdmissionPolicy and the
ValidatingAdmissionPolicies, so that both see exactly the same requests (a
cluster that edited its webhook configurations compiles against its own).

The ValidatingAdmissionPolicies take the webhook's ``matchConditions`` as
their first variable, ``reached`` (their conjunction), which every finding is
gated on, rather than as ``matchConditions`` of their own: kube-apiserver
evaluates a policy's ``matchConditions`` in an activation of their own,
converting the object (and the old one) to CEL values once more, where a
variable is evaluated in the activation the validations use anyway
(docs/compiled-policies.md "Cost"). What ``reached`` is false for gets no
finding, as the webhooks do not see it. The MutatingAdmissionPolicy keeps
them as its own (``Reach.own``): kube-apiserver marks the object changed
whenever a policy's mutation runs, even to an empty patch, and then runs the
whole admission chain again, so a mutation gated inside its expression would
cost every request the webhook is not sent a second pass.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from webhook.cel import syntax as cel
from webhook.errors import PolicyError
from webhook.policy import offload

#: the request's kind is ``offload.built_in``
BUILT_IN = "!request.kind.group.contains('.')"
MUTATING_WEBHOOK = "mutate.gpu-admission.io"
VALIDATING_WEBHOOK = "validate.gpu-admission.io"
#: DRA claims go to the validating webhook alone: nothing compiled reads them
_LEFT_TO_THE_WEBHOOK = {"resource.k8s.io"}


@dataclass(frozen=True)
class Reach:
    """One webhook's selection of requests, as a policy's ``matchConstraints`` and ``matchConditions``."""

    match_constraints: dict[str, Any]
    #: the webhook's: variable ``reached`` of the policies
    match_conditions: list[dict[str, Any]]
    #: the policy's own matchConditions (what must keep kube-apiserver from acting at all)
    kept_conditions: tuple[dict[str, Any], ...] = ()

    def reached(self) -> str:
        """The webhook's ``matchConditions`` as one CEL condition (kube-apiserver's own semantics:
        false when one is false, whichever others fail)."""
        return cel.every(*(str(c["expression"]) for c in self.match_conditions))

    def own(self) -> Reach:
        """The same reach with the webhook's ``matchConditions`` as the policy's own (no ``reached``)."""
        return Reach(copy.deepcopy(self.match_constraints), [], (*copy.deepcopy(self.match_conditions), *self.kept_conditions))

    def built_in(self) -> Reach:
        """The same reach restricted to built-in kinds (``offload.built_in``): the rules' custom API
        groups left out, or, where a rule names every group ("*"), a match condition for it
        (kube-apiserver refuses a MutatingAdmissionPolicy's change to a custom kind it has no
        schema of yet, #43 item 6)."""
        rules, every_group = [], False
        for rule in self.match_constraints.get("resourceRules") or []:
            groups = [g for g in rule.get("apiGroups") or [] if offload.built_in(g) or g == "*"]
            every_group = every_group or "*" in groups
            if groups:
                rules.append({**copy.deepcopy(rule), "apiGroups": groups})
        kept = (*self.kept_conditions, {"name": "built-in-kinds", "expression": BUILT_IN}) if every_group else self.kept_conditions
        return Reach({**copy.deepcopy(self.match_constraints), "resourceRules": rules}, copy.deepcopy(self.match_conditions), kept)


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
