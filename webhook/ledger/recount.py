"""What a ledger should hold, counted from the pods of the cluster view (the quota controller's resync).

Each live pod of the ledger's group (Pending or Running, and not deleted longer ago than its grace period allows)
is judged by the engine as the validating webhook judged it when it was
created, with the policies in force now: the charges the engine states for
it to this ledger are what it holds there. So a recount charges exactly what
admission charges, and a pod admitted while the ledger could not be written
(the API server unreachable, a rule failing open), or before its caps were
enforced, is charged by the next recount.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from webhook.kube import termination
from webhook.policy import engine
from webhook.policy.charges import Holding, LedgerKey
from webhook.policy.loader import PolicySet
from webhook.policy.request import Request
from webhook.view.protocol import ClusterView, Object


def live(pod: Mapping[str, Any], now: float | None) -> bool:
    """Whether a pod holds its GPUs at ``now`` (unix seconds): not finished, and not deleted longer ago than
    its grace period allows, as ResourceQuota counts it (``webhook.kube.termination``)."""
    return termination.holds(pod, now)


def uid_of(pod: Mapping[str, Any]) -> str:
    return str((pod.get("metadata") or {}).get("uid") or "")


def namespaces_of(key: LedgerKey, namespaces: Iterable[Object]) -> list[str]:
    """The namespaces of a ledger's group."""
    if key.scope == "namespace":
        return [key.group]
    found = []
    for namespace in namespaces:
        meta = namespace.get("metadata") or {}
        if (meta.get("labels") or {}).get(key.team_label) == key.group:
            found.append(str(meta.get("name") or ""))
    return found


def holdings(policies: PolicySet, view: ClusterView, key: LedgerKey, namespaces: Iterable[str],
             now: float | None) -> dict[str, Holding]:
    """Pod uid → what it holds in the ledger ``key``, for the live pods of ``namespaces`` in the view (at
    ``now``: a pod being deleted holds until its grace period has passed)."""
    found: dict[str, Holding] = {}
    for namespace in namespaces:
        for pod in view.pods(namespace):
            if not live(pod, now) or not uid_of(pod):
                continue
            decision = engine.evaluate(policies, Request.for_object(_as_created(pod)), view, "validate")
            for charge in decision.charges:
                if charge.key == key:
                    found[charge.uid] = charge.holding
    return found


def _as_created(pod: Object) -> Object:
    """The pod as admission judged it: one being deleted is judged as when it was created (the engine lets
    a pod being deleted through unjudged: only its finalizers may change)."""
    meta = pod.get("metadata") or {}
    if not meta.get("deletionTimestamp"):
        return pod
    return {**pod, "metadata": {k: v for k, v in meta.items()
                                if k not in ("deletionTimestamp", "deletionGracePeriodSeconds")}}


def ledgers_of(policies: PolicySet, view: ClusterView, pods: Iterable[Object], now: float | None) -> set[LedgerKey]:
    """The ledgers these pods (of the view) are charged to, as admission would charge them (those that hold
    GPUs at ``now``)."""
    keys: set[LedgerKey] = set()
    for pod in pods:
        if live(pod, now) and uid_of(pod):
            decision = engine.evaluate(policies, Request.for_object(_as_created(pod)), view, "validate")
            keys.update(charge.key for charge in decision.charges)
    return keys
