"""Native ResourceQuota objects: the GPUs they cap, and whether a pod would breach one.

kube-apiserver's ResourceQuota plugin runs after every webhook and is the
authority; reading the quotas here only moves the denial earlier, with a
message that says how much is used, and lets the audit CLI predict it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from webhook.kube import quantity
from webhook.kube.patch import sublist
from webhook.kube.value_text import text

_PREFIXES = ("requests.", "limits.")


@dataclass(frozen=True)
class Breach:
    """Admitting the pod would take ``key`` of quota ``quota`` past its hard limit."""

    quota: str
    key: str
    used: Decimal
    hard: Decimal
    ask: Decimal


def breaches(
    quotas: Iterable[Mapping[str, Any]],
    spec: Mapping[str, Any],
    asks: Mapping[str, Decimal],
    is_gpu: Callable[[str], bool],
    charged: Mapping[str, Decimal] | None = None,
    empty: bool = False,
) -> list[Breach]:
    """Every GPU quota item (``requests.X``, ``limits.X`` or ``X``) the pod would exceed.

    ``charged``: what ``status.used`` already holds of this pod (a pod that exists), taken out of
    the use before its ask is added, so that a namespace exactly at its quota is not over it.
    ``empty``: as if the namespace used nothing (``asks`` alone exceed the quota).
    """
    found = []
    for quota in quotas:
        if not applies(quota, spec):
            continue
        hard, used = _amounts(quota, "spec", "hard") or _amounts(quota, "status", "hard"), _amounts(quota, "status", "used")
        for key, limit in sorted(hard.items()):
            resource = next((key[len(p):] for p in _PREFIXES if key.startswith(p)), key)
            ask = asks.get(resource, Decimal(0))
            if not (is_gpu(resource) and ask):
                continue
            held = Decimal(0) if empty else used.get(key, Decimal(0))
            if charged is not None:
                held -= min(held, charged.get(resource, Decimal(0)))
            if held + ask > limit:
                found.append(Breach(str(_map(quota.get("metadata")).get("name", "?")), key, held, limit, ask))
    return found


def applies(quota: Mapping[str, Any], spec: Mapping[str, Any]) -> bool:
    """The quota's scopes select this pod. A scope we cannot judge counts as not selecting it:
    the API server's own check stays the authority there."""
    qspec = _map(quota.get("spec"))
    scopes: list[tuple[str, str, list[Any]]] = [(str(s), "Exists", []) for s in sublist(qspec, "scopes")]
    for expr in sublist(_map(qspec.get("scopeSelector")), "matchExpressions"):
        expr = _map(expr)
        scopes.append((str(expr.get("scopeName")), str(expr.get("operator")), list(sublist(expr, "values"))))
    return all(_scope_matches(name, op, values, spec) for name, op, values in scopes)


def _scope_matches(scope: str, operator: str, values: list[Any], spec: Mapping[str, Any]) -> bool:
    if scope == "PriorityClass":
        name = text(spec.get("priorityClassName") or "")
        return {
            "In": bool(name) and name in values,
            "NotIn": name not in values,
            "Exists": bool(name),
            "DoesNotExist": not name,
        }.get(operator, False)
    if scope in ("Terminating", "NotTerminating"):
        holds = (spec.get("activeDeadlineSeconds") is not None) == (scope == "Terminating")
    elif scope in ("BestEffort", "NotBestEffort"):
        holds = _best_effort(spec) == (scope == "BestEffort")
    else:
        return False
    return holds if operator == "Exists" else (not holds if operator == "DoesNotExist" else False)


def _best_effort(spec: Mapping[str, Any]) -> bool:
    """QoS BestEffort: no CPU or memory requests or limits anywhere (other resources do not count)."""
    for key in ("initContainers", "containers"):
        for container in spec.get(key) or ():
            resources = _map(_map(container).get("resources"))
            for field in ("requests", "limits"):
                if {"cpu", "memory"} & set(_map(resources.get(field))):
                    return False
    return True


def _amounts(quota: Mapping[str, Any], part: str, field: str) -> dict[str, Decimal]:
    raw = _map(_map(quota.get(part)).get(field))
    parsed = {str(k): quantity.parse_quantity(v) for k, v in raw.items()}
    return {k: v for k, v in parsed.items() if v is not None}


def _map(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}
