"""The GPUQuotaLedger objects: each ledger (a namespace's or a team's) is two, in the webhook's namespace.

Every charge is a line: the pod's uid, where it is, what it holds
(``webhook.policy.charges.Holding``) and when it was charged. A ledger keeps
them in two parts, so that admission writes a small object however many pods
the ledger holds:

- the **recent** part (``name_of(key)``), which admission writes: the
  charges made since they were last settled, the charges given back since
  (``released``), the generation of the settled part that holds everything
  moved out of it (``settledGeneration``), and an ``epoch`` counted up on
  every write;
- the **settled** part (``name_of(key, SETTLED)``): charges of pods the
  cluster view has seen stored, moved there in batches by the upkeep
  (``webhook.ledger.upkeep``), with a ``generation`` counted up on
  every write and the ``recentEpoch`` of the recent part it was settled from.

What the ledger holds is the settled part (at least at ``settledGeneration``)
less ``released``, plus the recent charges::

    apiVersion: gpu-admission.io/v1alpha1
    kind: GPUQuotaLedger
    metadata: {name: team-vision-3f9c0e21ab, namespace: gpu-admission}
    spec: {scope: team, group: vision, teamLabel: team, modelLabel: nvidia.com/gpu.product}
    status:
      settledGeneration: 12
      charges: |
        0d6c5f0e-… ml-a/train-0 nvidia.com/gpu=1 at=2026-01-01T00:00:00.123Z priority=gpu-training models=NVIDIA-A100-SXM4-80GB
      released: |
        9b1e22aa-…
      caps: |
        5d0c2a7e41b9f3c8 renewed=2026-01-01T00:00:00.120Z {"apiVersion":"gpu-admission.io/v1alpha1",…}

The recent part also **states the caps** its charges are held for
(``caps``): one line per policy that enforces caps in this ledger's model
label, its digest, when a replica whose policies define it identically last
renewed it, and its definition (the policy reduced to its quota rule, in
``enforce``). A statement no replica renews for ``LedgerSettings.lease``
seconds has lapsed; every replica charges and judges a pod under the union
of its own caps and the live statements (``webhook.ledger.statements``):
while two policy versions overlap, the stricter holds (docs/quota.md).

Charges are a string rather than a map of objects: kube-apiserver tracks the
owner of every field it stores (managedFields), which for a map of charges
costs a write time in proportion to the square of its size (~200 ms at 300
pods, 4 ms as one string); and a write of either part costs kube-apiserver
CPU in proportion to its size, which is why admission writes only the recent
one. Each write replaces the object (PUT) as it was read, with the
``resourceVersion`` it was read at as a precondition: kube-apiserver answers
409 Conflict when any other writer (another replica) changed it since. The
CRD is deploy/base/quota-ledger-crd.yaml; docs/quota.md argues why this
cannot overshoot a cap.
"""

from __future__ import annotations

import functools
import hashlib
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal, InvalidOperation
from typing import Any

from webhook.kube import names
from webhook.policy import charge_bounds
from webhook.policy.charges import Claims, Gpus, Holding, LedgerKey

GROUP: str = "gpu-admission.io"
VERSION: str = "v1alpha1"
PLURAL: str = "gpuquotaledgers"
KIND: str = "GPUQuotaLedger"
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


RECENT, SETTLED = "recent", "settled"


@dataclass(frozen=True)
class Part:
    """What one ledger object says."""

    key: LedgerKey
    part: str  # RECENT or SETTLED
    charges: dict[str, Entry]
    #: the recent part: charges of the settled part given back since (removed there at the next settling)
    released: frozenset[str]
    #: the recent part: the settled part's generation it needs; the settled part: its own generation
    generation: int
    #: the recent part: counted up on every write; the settled part: that of the recent part it was
    #: settled from (a settling must not start from a recent part older than the last one did)
    epoch: int = 0
    #: the recent part: the caps it states, by digest (``Stated``)
    caps: Mapping[str, Stated] = field(default_factory=dict)


@dataclass(frozen=True)
class Stated:
    """One policy's caps as a ledger states them: its definition (JSON), and when a replica that defines
    it so last renewed it (unix seconds, the writer's clock)."""

    definition: str
    renewed: float


def statements_of(obj: Mapping[str, Any]) -> dict[str, Stated]:
    """The caps a recent part states, by digest (a line that does not read is skipped)."""
    status = obj.get("status")
    text = status.get("caps") if isinstance(status, Mapping) else None
    found: dict[str, Stated] = {}
    for line in text.splitlines() if isinstance(text, str) else ():
        digest, _, rest = line.strip().partition(" ")
        renewed, _, definition = rest.partition(" ")
        try:
            at = datetime.fromisoformat(renewed.removeprefix("renewed=").replace("Z", "+00:00")).timestamp()
        except ValueError:
            continue
        if digest and definition.startswith("{"):
            found[digest] = Stated(definition, at)
    return found


def statements_text(caps: Mapping[str, Stated]) -> str:
    return "".join(f"{digest} renewed={_time(s.renewed)} {s.definition}\n" for digest, s in sorted(caps.items()))


def name_of(key: LedgerKey, part: str = RECENT) -> str:
    """The object's name: readable (scope and group), and unique for the whole key (a hash of it)."""
    digest = hashlib.sha256("\0".join((key.scope, key.group, key.team_label, key.model_label)).encode()).hexdigest()
    readable = _UNSAFE.sub("-", key.group.lower()).strip("-")[:40].strip("-")
    name = f"{key.scope}-{readable}-{digest[:10]}" if readable else f"{key.scope}-{digest[:10]}"
    return name if part == RECENT else f"{name}-{part}"


def key_of(obj: Mapping[str, Any]) -> LedgerKey | None:
    """The ledger an object is part of, from its spec; None for an object that is not one of ours."""
    spec = obj.get("spec")
    if not isinstance(spec, Mapping):
        return None
    scope, group = spec.get("scope"), spec.get("group")
    if scope not in ("namespace", "team") or not isinstance(group, str) or not group:
        return None
    key = LedgerKey(str(scope), group, str(spec.get("teamLabel") or ""), str(spec.get("modelLabel") or ""))
    return key if name_of(key, part_of(obj)) == (obj.get("metadata") or {}).get("name") else None


def part_of(obj: Mapping[str, Any]) -> str:
    spec = obj.get("spec")
    return SETTLED if isinstance(spec, Mapping) and spec.get("part") == SETTLED else RECENT


def read(obj: Mapping[str, Any]) -> Part | None:
    """What a ledger object says; None for an object that is not one of ours."""
    key = key_of(obj)
    if key is None:
        return None
    part = part_of(obj)
    status = obj.get("status")
    status = status if isinstance(status, Mapping) else {}
    released = status.get("released") if part == RECENT else None
    return Part(key, part, entries(obj),
                frozenset(line.strip() for line in released.splitlines() if line.strip())
                if isinstance(released, str) else frozenset(),
                _count(status.get("settledGeneration" if part == RECENT else "generation")),
                _count(status.get("epoch" if part == RECENT else "recentEpoch")),
                statements_of(obj) if part == RECENT else {})


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def holdings(recent: Part, settled: Part | None) -> dict[str, Entry]:
    """What a ledger holds: the settled part less what was given back since, plus the recent charges."""
    found = {uid: entry for uid, entry in (settled.charges if settled is not None else {}).items()
             if uid not in recent.released}
    found.update(recent.charges)
    return found


def effective(objects: Iterable[Mapping[str, Any]]) -> dict[LedgerKey, dict[str, Entry]]:
    """Each ledger's holdings, from its objects as listed (for readers: the audit, the tests)."""
    parts = [p for p in (read(o) for o in objects) if p is not None]
    settled = {p.key: p for p in parts if p.part == SETTLED}
    return {p.key: holdings(p, settled.get(p.key)) for p in parts if p.part == RECENT}


def new_object(key: LedgerKey, namespace: str, charges: Mapping[str, Entry] | None = None,
               part: str = RECENT, caps: Mapping[str, Stated] | None = None) -> Object:
    """A new ledger object: a recent part holding ``charges`` (the pods the cluster view shows in its
    group), or an empty settled part."""
    spec: dict[str, str] = {"scope": key.scope, "group": key.group, "modelLabel": key.model_label}
    if key.team_label:
        spec["teamLabel"] = key.team_label
    if part != RECENT:
        spec["part"] = part
    status: dict[str, Any] = {"charges": text_of(charges or {})}
    status["settledGeneration" if part == RECENT else "generation"] = 0
    if caps and part == RECENT:
        status["caps"] = statements_text(caps)
    return {
        "apiVersion": API_VERSION, "kind": KIND,
        "metadata": {"name": name_of(key, part), "namespace": namespace, "labels": dict(MANAGED_BY)},
        "spec": spec, "status": status,
    }


def resource_version(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("resourceVersion") or "")


def entries(obj: Mapping[str, Any]) -> dict[str, Entry]:
    """The charges of a ledger object, by pod uid (a line someone wrote that does not read is skipped:
    it charges nothing, and the next recount charges the pod if it holds GPUs)."""
    status = obj.get("status")
    text = status.get("charges") if isinstance(status, Mapping) else None
    found: dict[str, Entry] = {}
    for line in text.splitlines() if isinstance(text, str) else ():
        uid, _, rest = line.strip().partition(" ")
        entry = _decoded(rest)
        if uid and entry is not None:
            found[uid] = entry
    return found


def encode(entry: Entry) -> str:
    """``<namespace>/<name> <resource>=<count>[,…] at=<time>[ priority=<class>][ models=<model>,…]
    [ claims=<claim>:<resource>=<count>[,…][;…]]``: names, resources, label values and times hold no
    spaces, commas, colons, semicolons or equal signs where these are read.

    The GPUs are everything the pod counts, its claims' devices included; ``claims`` names the
    ResourceClaims whose devices those are (a claim several pods name counts once). A replica of an
    older version reads the GPUs and skips ``claims``: it counts each such pod's claims as its own,
    more than is held, never less."""
    holding = entry.holding
    text = f"{holding.namespace}/{holding.name} {_gpus(holding.gpus)} at={_time(entry.at)}"
    if holding.priority:
        text += f" priority={holding.priority}"
    if holding.models is not None:
        text += f" models={','.join(sorted(holding.models))}"
    if holding.claims:
        text += " claims=" + ";".join(f"{claim}:{_gpus(gpus)}" for claim, gpus in holding.claims)
    return text


def _gpus(gpus: Gpus) -> str:
    return ",".join(f"{name}={_quantity(n)}" for name, n in gpus)


def _gpus_of(text: str) -> Gpus:
    """``<resource>=<count>[,…]`` read (raises InvalidOperation for a count that is not a number)."""
    return tuple(sorted((n, Decimal(c)) for n, _, c in (g.partition("=") for g in text.split(",") if g)))


def _claims_of(text: str) -> Claims:
    """``<claim>:<resource>=<count>[,…][;…]`` read (raises InvalidOperation for a count that is not a number)."""
    found = []
    for item in text.split(";"):
        claim, _, gpus = item.partition(":")
        found.append((claim, _gpus_of(gpus)))
    return tuple(sorted(found))


def decode(text: str) -> Entry | None:
    where, _, rest = text.partition(" ")
    namespace, slash, name = where.partition("/")
    gpus_text, _, rest = rest.partition(" ")
    fields = dict(item.partition("=")[::2] for item in rest.split())
    try:
        gpus = _gpus_of(gpus_text)
        at = datetime.fromisoformat(fields.get("at", "").replace("Z", "+00:00")).timestamp()
    except (InvalidOperation, ValueError):
        return None
    # (claims that do not read, or that hold what the GPUs do not, are read as none: the GPUs then
    # count as the pod's own, never fewer than it holds)
    try:
        claims = charge_bounds.claims_kept(_claims_of(fields["claims"]), gpus) if fields.get("claims") else ()
    except (InvalidOperation, ValueError):
        claims = ()
    if not slash or not namespace or not name or not gpus:
        return None
    models = fields.get("models")
    # (a line an older replica wrote may name thousands of models: read as every model, and written
    # back bounded)
    kept = charge_bounds.models_kept(frozenset(m for m in models.split(",") if m)) if models is not None else None
    holding = Holding(namespace, name, fields.get("priority", ""), kept, gpus, claims)
    return Entry(holding, at)


#: the longest line (uid and newline included) :func:`text_of` writes for a charge within
#: ``webhook.policy.charge_bounds`` (``charge_bounds.refusal`` refuses any other pod): ~2 KB, so a
#: ledger object holds ~800 charges even if every pod of the group wrote the longest it can
LINE_MAX = (names.UID_MAX + 1 + names.LABEL_MAX + 1 + names.SUBDOMAIN_MAX  # <uid> <namespace>/<name>
            + 1 + charge_bounds.GPUS_TEXT_MAX + len(" at=2026-01-01T00:00:00.000Z")
            + len(" priority=") + names.SUBDOMAIN_MAX + len(" models=") + charge_bounds.MODELS_TEXT_MAX
            + len(" claims=") + charge_bounds.CLAIMS_TEXT_MAX + 1)


#: a charge's line, read or written: each ledger is read and written whole on every change, and
#: most of its lines are the same from one version to the next
_LINES = 32768
_decoded = functools.lru_cache(maxsize=_LINES)(decode)
_encoded = functools.lru_cache(maxsize=_LINES)(encode)


def text_of(charges: Mapping[str, Entry]) -> str:
    return "".join(f"{uid} {_encoded(entry)}\n" for uid, entry in charges.items())


def replaced(obj: Mapping[str, Any], charges: Mapping[str, Entry], released: Iterable[str] = (),
             generation: int | None = None, epoch: int | None = None,
             caps: Mapping[str, Stated] | None = None) -> Object:
    """``obj`` (as read, with its resourceVersion: the write's precondition) with its charges, released
    charges (a recent part) and generation replaced: the body of a replace (PUT), which kube-apiserver
    refuses with 409 if the object changed since. (A replace costs it ~1 ms less than a merge patch of
    the same string: no patch to apply.)"""
    meta = {k: v for k, v in (obj.get("metadata") or {}).items() if k != "managedFields"}
    status = dict(obj.get("status") or {})
    status["charges"] = text_of(charges)
    if part_of(obj) == RECENT:
        status["released"] = "".join(f"{uid}\n" for uid in sorted(released))
    if generation is not None:
        status["settledGeneration" if part_of(obj) == RECENT else "generation"] = generation
    if epoch is not None:
        status["epoch" if part_of(obj) == RECENT else "recentEpoch"] = epoch
    if caps is not None and part_of(obj) == RECENT:
        status["caps"] = statements_text(caps)
    return {**obj, "metadata": meta, "status": status}


def changed(current: Mapping[str, Entry], added: Mapping[str, Entry], released: Iterable[str]) -> dict[str, Entry]:
    """``current`` less the released charges, plus the added ones."""
    gone = set(released)
    result = {uid: entry for uid, entry in current.items() if uid not in gone}
    result.update(added)
    return result


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
    for key, held in effective(ledgers).items():
        for uid, entry in held.items():
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
