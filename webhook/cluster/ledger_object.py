"""The GPUQuotaLedger object: one per ledger (a namespace's or a team's), in the webhook's namespace.

Its ``spec`` names the ledger; ``status.charges`` maps each charged pod's
uid to what the pod holds (``webhook.policy.charges.Holding``) and when it
was charged::

    apiVersion: gpu-admission.io/v1alpha1
    kind: GPUQuotaLedger
    metadata: {name: team-vision-3f9c0e21ab, namespace: gpu-admission}
    spec: {scope: team, group: vision, teamLabel: team, modelLabel: nvidia.com/gpu.product}
    status:
      charges:
        0d6c5f0e-…: {namespace: ml-a, name: train-0, priorityClassName: gpu-training,
                     models: [NVIDIA-A100-SXM4-80GB], gpus: {nvidia.com/gpu: "1"}, at: "2026-…Z"}

Charges are added with a JSON merge patch that carries the resourceVersion
the webhook judged them against (a precondition: kube-apiserver answers 409
Conflict when the object changed since), and removed with one that does not
(removing a charge never takes a cap past its maximum). The CRD is
deploy/base/quota-ledger-crd.yaml.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal, InvalidOperation
from typing import Any

from webhook.policy.charges import Holding, LedgerKey

GROUP, VERSION, PLURAL, KIND = "gpu-admission.io", "v1alpha1", "gpuquotaledgers", "GPUQuotaLedger"
API_VERSION = f"{GROUP}/{VERSION}"
MANAGED_BY = {"app.kubernetes.io/managed-by": "gpu-admission"}

Object = dict[str, Any]


@dataclass(frozen=True)
class Entry:
    """One charge as the ledger holds it: what the pod holds, and when (unix seconds) it was charged."""

    holding: Holding
    at: float


def collection_path(namespace: str) -> str:
    return f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/{PLURAL}"


def object_path(namespace: str, name: str) -> str:
    return f"{collection_path(namespace)}/{name}"


_UNSAFE = re.compile(r"[^a-z0-9-]+")


def name_of(key: LedgerKey) -> str:
    """The object's name: readable (scope and group), and unique for the whole key (a hash of it)."""
    digest = hashlib.sha256("\0".join((key.scope, key.group, key.team_label, key.model_label)).encode()).hexdigest()
    readable = _UNSAFE.sub("-", key.group.lower()).strip("-")[:40].strip("-")
    return f"{key.scope}-{readable}-{digest[:10]}" if readable else f"{key.scope}-{digest[:10]}"


def key_of(obj: Mapping[str, Any]) -> LedgerKey | None:
    """The ledger an object is, from its spec; None for an object that is not one of ours."""
    spec = obj.get("spec")
    if not isinstance(spec, Mapping):
        return None
    scope, group = spec.get("scope"), spec.get("group")
    if scope not in ("namespace", "team") or not isinstance(group, str) or not group:
        return None
    key = LedgerKey(str(scope), group, str(spec.get("teamLabel") or ""), str(spec.get("modelLabel") or ""))
    return key if name_of(key) == (obj.get("metadata") or {}).get("name") else None


def new_object(key: LedgerKey, namespace: str, charges: Mapping[str, Entry] | None = None) -> Object:
    """A new ledger object, holding ``charges`` (the pods the cluster view shows in its group)."""
    spec: dict[str, str] = {"scope": key.scope, "group": key.group, "modelLabel": key.model_label}
    if key.team_label:
        spec["teamLabel"] = key.team_label
    return {
        "apiVersion": API_VERSION, "kind": KIND,
        "metadata": {"name": name_of(key), "namespace": namespace, "labels": dict(MANAGED_BY)},
        "spec": spec,
        "status": {"charges": {uid: encode(entry) for uid, entry in (charges or {}).items()}},
    }


def resource_version(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("resourceVersion") or "")


def entries(obj: Mapping[str, Any]) -> dict[str, Entry]:
    """The charges of a ledger object, by pod uid (an entry someone wrote that does not read is skipped:
    it charges nothing, and the next recount replaces it)."""
    status = obj.get("status")
    raw = status.get("charges") if isinstance(status, Mapping) else None
    found: dict[str, Entry] = {}
    for uid, value in (raw.items() if isinstance(raw, Mapping) else ()):
        entry = decode(value)
        if entry is not None:
            found[str(uid)] = entry
    return found


def encode(entry: Entry) -> dict[str, Any]:
    holding = entry.holding
    value: dict[str, Any] = {"namespace": holding.namespace, "name": holding.name,
                             "gpus": {name: _quantity(n) for name, n in holding.gpus}, "at": _time(entry.at)}
    if holding.priority:
        value["priorityClassName"] = holding.priority
    if holding.models is not None:
        value["models"] = sorted(holding.models)
    return value


def decode(value: Any) -> Entry | None:
    if not isinstance(value, Mapping) or not isinstance(value.get("gpus"), Mapping):
        return None
    try:
        gpus = tuple(sorted((str(name), Decimal(str(n))) for name, n in value["gpus"].items()))
        at = datetime.fromisoformat(str(value.get("at", "")).replace("Z", "+00:00")).timestamp()
    except (InvalidOperation, ValueError):
        return None
    models = value.get("models")
    holding = Holding(str(value.get("namespace") or ""), str(value.get("name") or ""),
                      str(value.get("priorityClassName") or ""),
                      frozenset(str(m) for m in models) if isinstance(models, list) else None, gpus)
    return Entry(holding, at)


def charge_patch(resource_version_: str, added: Mapping[str, Entry], released: Iterable[str] = ()) -> Object:
    """Add charges (and remove some) if the object is still at ``resource_version_`` (else 409)."""
    patch = change_patch(added, released)
    patch["metadata"] = {"resourceVersion": resource_version_}
    return patch


def change_patch(added: Mapping[str, Entry], released: Iterable[str]) -> Object:
    """Add and remove charges whatever the object's version (removals, and recounts of pods that exist)."""
    charges: dict[str, Any] = {uid: None for uid in released}
    charges.update((uid, encode(entry)) for uid, entry in added.items())
    return {"status": {"charges": charges}}


def _quantity(n: Decimal) -> str:
    return f"{n.normalize():f}"


def _time(at: float) -> str:
    # milliseconds: a window of a few seconds (the tests') is still measured right
    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def in_flight(ledgers: Iterable[Mapping[str, Any]], listed: Iterable[Mapping[str, Any]]) -> list[Object]:
    """The charges of pods that ``listed`` (the pods of the cluster) does not hold, as the Pending pods
    they stand for: what an audit counts as used, as the webhook does (one per pod, whatever the ledgers)."""
    known = {str((p.get("metadata") or {}).get("uid") or "") for p in listed}
    pods: dict[str, Object] = {}
    for obj in ledgers:
        key = key_of(obj)
        if key is None:
            continue
        for uid, entry in entries(obj).items():
            if uid not in known and uid not in pods:
                pods[uid] = _pod(uid, entry.holding, key.model_label)
    return list(pods.values())


#: the annotation of the pods ``in_flight`` makes up
IN_FLIGHT = "gpu-admission.io/charged-in-flight"


def _pod(uid: str, holding: Holding, model_label: str) -> Object:
    gpus = {name: _quantity(n) for name, n in holding.gpus}
    spec: dict[str, Any] = {"containers": [{"name": "charged", "resources": {"limits": gpus, "requests": gpus}}]}
    if holding.priority:
        spec["priorityClassName"] = holding.priority
    if holding.models:  # (an empty set names no model a selector could hold)
        term = {"matchExpressions": [{"key": model_label, "operator": "In", "values": sorted(holding.models)}]}
        spec["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}}
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": holding.name, "namespace": holding.namespace, "uid": uid,
                         "annotations": {IN_FLIGHT: "true"}},
            "spec": spec, "status": {"phase": "Pending"}}
