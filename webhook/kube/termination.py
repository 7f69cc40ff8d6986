"""When a pod stops holding what it asked for, as kube-apiserver's ResourceQuota counts it.

ResourceQuota's pod evaluator (``QuotaV1Pod``, pkg/quota/v1/evaluator/core/pods.go)
counts a pod until its phase is ``Succeeded`` or ``Failed``, and a pod being
deleted (``deletionTimestamp`` set) until ``deletionTimestamp +
deletionGracePeriodSeconds`` has passed: a Terminating pod's containers may
run for its whole grace period, and one stuck past it (a lost node) is no
longer charged. kube-apiserver writes ``deletionTimestamp`` as the moment of
the delete plus the grace period, so a pod deleted with a grace of g seconds
counts for 2g seconds after the delete, or until it is gone; a pod with no
``deletionGracePeriodSeconds`` counts until it is gone.

Plain functions of the pod and a time given by the caller (unix seconds;
None when the caller has no clock, as the pure core has not: a Terminating
pod then counts until it is gone or finished).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any


def released_at(pod: Mapping[str, Any]) -> float | None:
    """Unix seconds after which a pod being deleted holds nothing (``deletionTimestamp`` plus
    ``deletionGracePeriodSeconds``); None when it is not being deleted or holds until it is gone."""
    meta = pod.get("metadata")
    if not isinstance(meta, Mapping):
        return None
    stamp, grace = meta.get("deletionTimestamp"), meta.get("deletionGracePeriodSeconds")
    if not stamp or not isinstance(grace, int) or isinstance(grace, bool):
        return None
    try:
        when = datetime.fromisoformat(str(stamp))
    except ValueError:
        return None
    if when.tzinfo is None:
        return None
    return when.timestamp() + grace


def terminating(pod: Mapping[str, Any]) -> bool:
    meta = pod.get("metadata")
    return isinstance(meta, Mapping) and bool(meta.get("deletionTimestamp"))


def holds(pod: Mapping[str, Any], now: float | None = None) -> bool:
    """Whether the pod holds its resources at ``now`` (None: no clock) as ResourceQuota counts it."""
    status = pod.get("status")
    if isinstance(status, Mapping) and status.get("phase") in ("Succeeded", "Failed"):
        return False
    if now is None or not terminating(pod):
        return True
    until = released_at(pod)
    return until is None or now <= until
