"""The caps a ledger states: what lets replicas on different policy versions enforce the same caps.

During a rollout (a Deployment's old and new pods, ConfigMap mounts updated
at different moments), replicas run different policies: one has a team cap of
8 in ``enforce``, another the cap in ``warn``, raised, lowered or gone. Each
charges and judges pods under its own caps only, so each version lets pods
past the other's cap, and a recount by one removes the charges the other made.

So every ledger's recent part **states** the policies whose caps it holds
charges for (``document.Stated``): each policy that enforces caps with the
ledger's model label, reduced to its quota rule (in ``enforce``), with a
digest of that definition and when it was last renewed. Each replica renews
its own in every write it makes of a recent part, and from its start, at
least every ``lease / 4`` seconds, in an anchor ledger (:func:`anchor`;
``Upkeep.state``) so that no version admits a pod before the others know its
caps, whatever ledgers exist; a statement no replica renewed for
``LedgerSettings.lease`` seconds has lapsed (its replicas are gone).

A replica charges and judges every pod under the union of its own policies
and the live statements it does not define identically (:func:`others`):
each such statement is evaluated as a policy of its own
(:func:`stated_decision`), its charges merged into the pod's, so the
strictest live definition of each cap is judged in the same write as the
others. A recount counts a pod's charge when any of them charges it
(:func:`union`): it never removes the charges of a cap it does not define.
docs/quota.md extends the no-overshoot argument to two policy versions.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Mapping

import pydantic

from webhook.policy import charges as charge_rules
from webhook.policy.charges import LedgerKey
from webhook.policy import engine, schema
from webhook.policy.decision import Decision
from webhook.policy.loader import PolicySet
from webhook.policy.request import Request
from webhook.view.protocol import ClusterView

#: a statement as this replica makes it: digest → (the model label of its quota rule, its definition)
Own = Mapping[str, tuple[str, str]]


def statement(policy: schema.GPUPolicy) -> tuple[str, str]:
    """(digest, definition) of a policy's caps: the policy reduced to its quota rule in ``enforce`` (what
    selects a pod, and the caps), as compact JSON without defaults (a field a later version adds with a
    default leaves the definitions of older versions unchanged)."""
    rule = policy.spec.rules.quota
    assert rule is not None
    spec = policy.spec.model_dump(mode="json", exclude_defaults=True, exclude={"rules"})
    spec["rules"] = {"quota": {**rule.model_dump(mode="json", exclude_defaults=True), "mode": "enforce"}}
    doc = {"apiVersion": policy.apiVersion, "kind": policy.kind, "metadata": {"name": policy.metadata.name},
           "spec": spec}
    definition = json.dumps(doc, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(definition.encode()).hexdigest()[:16], definition


def own(policies: PolicySet) -> Mapping[str, tuple[str, str]]:
    """The statements of this replica's policies that enforce caps: digest → (model label, definition)
    (the same object for one policy set)."""
    found = policies.memo.get(_OWN)
    if found is None:
        found = {}
        for policy in policies.policies:
            rule = policy.spec.rules.quota
            if rule is not None and rule.mode == "enforce" and rule.limits:
                digest, definition = statement(policy)
                found[digest] = (rule.modelLabel, definition)
        policies.memo[_OWN] = found
    return found  # type: ignore[no-any-return]


_OWN = ("ledger-statements",)


def anchor(namespace: str, model_label: str) -> LedgerKey:
    """The ledger each replica states its caps in from its start, before any pod is charged: that of the
    webhook's own namespace (which no webhook reaches: it charges nothing), one per model label. A replica
    of another version knows them from its ledger watch's first list, before it is Ready."""
    return LedgerKey("namespace", namespace, "", model_label)


def name_of(definition: str) -> str:
    """The policy a definition states (for logs): its name, or "?" when it does not read."""
    try:
        return str(json.loads(definition)["metadata"]["name"])
    except (ValueError, KeyError, TypeError):
        return "?"


@functools.lru_cache(maxsize=64)
def _policies(stated: tuple[tuple[str, str], ...]) -> tuple[schema.GPUPolicy, ...]:
    """The stated policies, each named ``<name>-<digest>`` (its own name may be one of this replica's, of
    another version); a definition that does not read as a policy of this version is skipped (logged by
    the upkeep, counted in ``gpu_admission_quota_stated_caps{origin="unreadable"}``)."""
    found = []
    for digest, definition in stated:
        policy = readable(definition)
        if policy is not None:
            meta = policy.metadata.model_copy(update={"name": f"{policy.metadata.name}-{digest[:8]}"})
            found.append(policy.model_copy(update={"metadata": meta}))
    return tuple(found)


@functools.lru_cache(maxsize=64)
def readable(definition: str) -> schema.GPUPolicy | None:
    try:
        policy = schema.GPUPolicy.model_validate(json.loads(definition))
    except (ValueError, pydantic.ValidationError):
        return None
    rule = policy.spec.rules.quota
    return policy if rule is not None and rule.mode == "enforce" and rule.limits else None


def others_set(stated: Mapping[str, str], base: PolicySet) -> PolicySet:
    """The statements of other policy versions as a policy set of their own (``base``'s workload classes
    and kinds)."""
    return _set(tuple(sorted(stated.items())), base)


def _set(stated: tuple[tuple[str, str], ...], base: PolicySet) -> PolicySet:
    cache = base.memo.setdefault(("ledger-others",), {})
    found = cache.get(stated)
    if found is None:
        if len(cache) > 16:
            cache.clear()
        found = cache[stated] = PolicySet(policies=_policies(stated), classes=base.classes,
                                          exceptions=base.exceptions, kinds=base.kinds,
                                          fingerprint=hashlib.sha256(repr(stated).encode()).hexdigest()[:16])
    return found


def union(base: PolicySet, stated: Mapping[str, str]) -> PolicySet:
    """``base`` with the statements of other policy versions added: what a recount counts a charge by."""
    if not stated:
        return base
    key = tuple(sorted(stated.items()))
    cache = base.memo.setdefault(("ledger-union",), {})
    found = cache.get(key)
    if found is None:
        if len(cache) > 16:
            cache.clear()
        found = cache[key] = PolicySet(policies=base.policies + _policies(key), classes=base.classes,
                                       exceptions=base.exceptions, kinds=base.kinds,
                                       fingerprint=hashlib.sha256((base.fingerprint + repr(key)).encode()).hexdigest()[:16])
    return found


def stated_decision(stated: PolicySet, request: Request, view: ClusterView, decision: Decision) -> Decision:
    """``decision`` (this replica's, of a pod it allows) with what the stated caps of other policy versions
    charge and deny: their charges merged into the pod's (one charge per ledger, every cap checked in the
    same write), their denials added."""
    theirs = engine.evaluate(stated, request, view, "validate")
    if not theirs.charges and not theirs.denials:
        return decision
    denials = theirs.denials
    return decision._replace(allowed=decision.allowed and not denials,
                             findings=decision.findings + denials,
                             charges=charge_rules.merged(decision.charges + theirs.charges))
