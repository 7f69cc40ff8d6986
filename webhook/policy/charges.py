"""What an admitted pod charges to the GPU caps it falls under, and whether a ledger has room for it.

The quota rule checks caps against the cluster view, which follows the API
server by watch and so lags behind a burst of pods. For the caps it enforces
it also states, as plain data, what the pod would *charge*: one
:class:`Charge` per ledger (a namespace's, or a team's), holding what the pod
holds (:class:`Holding`) and the caps to check it against (:class:`CapCheck`).
The engine stays pure: the server writes the charges to the ledger in the API
server (``webhook.ledger.charger``) and judges them there, against every
charge the ledger holds, with :class:`Tally`; docs/quota.md says why that
cannot overshoot a cap.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from decimal import Decimal

from webhook.policy import caps
from webhook.policy.finding import Finding
from webhook.policy.schema import GPUPolicy

RULE = "quota"


@dataclass(frozen=True)
class LedgerKey:
    """One ledger: the pods of a namespace, or of a team's namespaces (with the label naming teams),
    their models read from ``model_label``."""

    scope: str  # "namespace" or "team"
    group: str  # the namespace, or the team (the label's value)
    team_label: str  # "" for a namespace
    model_label: str

    def describe(self) -> str:
        return caps.subject(self.scope, self.group, self.team_label)


#: (GPU resource, count), sorted by resource
Gpus = tuple[tuple[str, Decimal], ...]
#: (ResourceClaim name in the pod's namespace, its GPUs), sorted by name, each claim once
Claims = tuple[tuple[str, Gpus], ...]


@dataclass(frozen=True)
class Holding:
    """What one pod holds, as a cap counts it.

    ``gpus`` is everything the pod counts: its extended resources, the devices of the claims its
    templates make (those are the pod's own), and the devices of the ResourceClaims it names.
    ``claims`` says which part of ``gpus`` comes from ResourceClaims it names: another pod may name
    them too, and a claim counts once however many pods of a ledger name it (:class:`Tally`). A
    holding without ``claims`` (a line an older version wrote) counts all of ``gpus`` as its own:
    more than it holds when it shares a claim, never less.
    """

    namespace: str
    name: str
    priority: str
    models: frozenset[str] | None  # the models it can land on; None: any
    gpus: Gpus
    claims: Claims = ()

    def own(self) -> Gpus:
        """``gpus`` less the devices of the ResourceClaims it names: what no other pod can hold too."""
        if not self.claims:
            return self.gpus
        shared: dict[str, Decimal] = {}
        for _, gpus in self.claims:
            for name, n in gpus:
                shared[name] = shared.get(name, Decimal(0)) + n
        return tuple((name, n - shared.get(name, Decimal(0))) for name, n in self.gpus
                     if n > shared.get(name, Decimal(0)))


#: what a cap counts in a ledger: (resource or "prefix*", model, priority classes, the namespace or "" for all)
_Which = tuple[str, str, tuple[str, ...], str]


@dataclass(frozen=True)
class CapCheck:
    """One enforced cap, as the pod under admission meets it."""

    policy: str
    where: str  # the pod, as findings name it
    field: str  # the JSON pointer a finding names
    resource: str  # a resource name or "prefix*"
    model: str
    priority_classes: tuple[str, ...]
    maximum: int
    fail_closed: bool  # the rule's clusterUnavailable, for when the ledger cannot be reached
    scope: str = "namespace"  # the cap's: "namespace" or "team"
    group: str = ""  # the namespace or team it counts the pod in
    team_label: str = ""
    #: a namespace cap judged in its team's ledger counts that namespace's pods only ("" : every pod there)
    namespace: str = ""

    @property
    def which(self) -> _Which:
        return self.resource, self.model, self.priority_classes, self.namespace

    def counts(self, holding: Holding) -> Decimal:
        """GPUs of ``holding`` this cap counts."""
        return _count(self.which, holding)


def _count(which: _Which, holding: Holding) -> Decimal:
    """Every GPU of ``holding`` the cap counts (its claims' devices included, as if no other pod named them)."""
    resource, model, classes, namespace = which
    if namespace and holding.namespace != namespace:
        return Decimal(0)
    if not caps.counts(model, classes, holding.priority, holding.models):
        return Decimal(0)
    prefix = resource[:-1] if resource.endswith("*") else None
    return sum((n for name, n in holding.gpus if name == resource or (prefix is not None and name.startswith(prefix))),
               Decimal(0))


def _counted(which: _Which, holding: Holding) -> bool:
    """The cap counts this holding at all (its namespace, priority class, models)."""
    _, model, classes, namespace = which
    if namespace and holding.namespace != namespace:
        return False
    return caps.counts(model, classes, holding.priority, holding.models)


def _of(resource: str, gpus: Gpus) -> Decimal:
    """GPUs of ``resource`` (or of every resource of a "prefix*") in ``gpus``."""
    prefix = resource[:-1] if resource.endswith("*") else None
    return sum((n for name, n in gpus if name == resource or (prefix is not None and name.startswith(prefix))),
               Decimal(0))


#: a ResourceClaim, as a ledger tells claims apart: (its namespace, its name)
_ClaimRef = tuple[str, str]


class _Used:
    """What one cap counts in a ledger: the pods' own GPUs, plus each ResourceClaim once (the most any
    line naming it says it holds: lines of one claim say the same, unless it was made again)."""

    __slots__ = ("total", "claims")

    def __init__(self) -> None:
        self.total = Decimal(0)
        self.claims: dict[_ClaimRef, Decimal] = {}

    def gain(self, which: _Which, holding: Holding) -> Decimal:
        """What counting ``holding`` in adds: its own GPUs, and what its claims hold beyond what is counted."""
        if not holding.claims:
            return _count(which, holding)
        return self._gain(which, holding)[0] if _counted(which, holding) else Decimal(0)

    def add(self, which: _Which, holding: Holding) -> Decimal:
        """Count ``holding`` in; what it added."""
        if not holding.claims:  # (most lines: as fast as a sum)
            gain = _count(which, holding)
            self.total += gain
            return gain
        if not _counted(which, holding):
            return Decimal(0)
        gain, claims = self._gain(which, holding)
        self.total += gain
        for ref, n in claims.items():
            if n > self.claims.get(ref, Decimal(0)):
                self.claims[ref] = n
        return gain

    def _gain(self, which: _Which, holding: Holding) -> tuple[Decimal, dict[_ClaimRef, Decimal]]:
        """(what a holding with claims the cap counts adds, its claims' devices the cap counts)."""
        claims = self._claims(which, holding)
        gain = _of(which[0], holding.own())
        for ref, n in claims.items():
            gain += max(Decimal(0), n - self.claims.get(ref, Decimal(0)))
        return gain, claims

    @staticmethod
    def _claims(which: _Which, holding: Holding) -> dict[_ClaimRef, Decimal]:
        found: dict[_ClaimRef, Decimal] = {}
        for claim, gpus in holding.claims:
            ref = (holding.namespace, claim)
            found[ref] = max(found.get(ref, Decimal(0)), _of(which[0], gpus))
        return found


@dataclass(frozen=True)
class Charge:
    """What the pod ``uid`` charges to one ledger, and the caps it must fit under there."""

    key: LedgerKey
    uid: str
    holding: Holding
    caps: tuple[CapCheck, ...]


def merged(charges: Iterable[Charge]) -> tuple[Charge, ...]:
    """One charge per ledger: several policies (or caps) charging one ledger check all their caps at once."""
    by_key: dict[LedgerKey, Charge] = {}
    for charge in charges:
        found = by_key.get(charge.key)
        if found is None:
            by_key[charge.key] = charge
        else:
            more = tuple(c for c in charge.caps if c not in found.caps)
            by_key[charge.key] = replace(found, caps=found.caps + more)
    return tuple(by_key.values())


def enforcing(policies: Iterable[GPUPolicy]) -> tuple[str, ...]:
    """The policies whose quota rule enforces caps: what needs the ledger (docs/quota.md)."""
    return tuple(p.metadata.name for p in policies
                 if (rule := p.spec.rules.quota) is not None and rule.mode == "enforce" and rule.limits)


class Tally:
    """A ledger's holdings (pod uid → :class:`Holding`), and the charges judged against them in turn.

    A cap counts every holding's own GPUs, and the devices of each ResourceClaim
    once, however many of the holdings it counts name that claim: a claim's
    devices are held while any pod naming it holds its line, and given back
    with the last (docs/quota.md, "DRA claims").

    What each cap counts is summed once, when first asked, and kept current as
    charges are admitted: a batch of charges costs one pass over the ledger per
    distinct cap, not one per charge.
    """

    def __init__(self, key: LedgerKey, holdings: Mapping[str, Holding]) -> None:
        self.key = key
        self.holdings = dict(holdings)
        self._used: dict[_Which, _Used] = {}

    def used(self, check: CapCheck) -> Decimal:
        """What ``check``'s cap counts in the ledger now."""
        return self._counted(check.which).total

    def _counted(self, which: _Which) -> _Used:
        found = self._used.get(which)
        if found is None:
            found = self._used[which] = _Used()
            for holding in self.holdings.values():
                found.add(which, holding)
        return found

    def ask(self, check: CapCheck, holding: Holding) -> Decimal:
        """What ``holding`` would add to what ``check``'s cap counts here (not the devices of a claim the
        cap counts already)."""
        return self._counted(check.which).gain(check.which, holding)

    def judge(self, charge: Charge) -> tuple[Finding, ...]:
        """The denials of ``charge`` here: each cap it would take past its maximum (none when it is
        charged already, as when an answer was lost and the write is tried again, nor for a cap it adds
        nothing to, as a pod naming a claim the cap counts already)."""
        if charge.uid in self.holdings:
            return ()
        denials = []
        for check in charge.caps:
            ask = self.ask(check, charge.holding)
            used = self.used(check)
            if ask and used + ask > check.maximum:
                holders = caps.held_in(self._by_namespace(check)) if check.scope == "team" else ""
                message = caps.over(check.where, check.scope, check.group, check.team_label, check.model,
                                    check.priority_classes, check.resource, used, check.maximum, ask, holders)
                denials.append(Finding(check.policy, RULE, "enforce", message, check.field))
        return tuple(denials)

    def admit(self, charge: Charge) -> None:
        """Count ``charge`` in (it was judged to fit)."""
        if charge.uid in self.holdings:
            return
        self.holdings[charge.uid] = charge.holding
        for which, counted in self._used.items():
            counted.add(which, charge.holding)

    def release(self, uid: str) -> None:
        holding = self.holdings.pop(uid, None)
        if holding is not None:
            self._used.clear()

    def _by_namespace(self, check: CapCheck) -> dict[str, Decimal]:
        """Where the GPUs ``check``'s cap counts are held, per namespace (for a team's denial)."""
        per: dict[str, _Used] = {}
        for holding in self.holdings.values():
            per.setdefault(holding.namespace, _Used()).add(check.which, holding)
        return {namespace: counted.total for namespace, counted in per.items() if counted.total}


def unavailable(charges: Iterable[Charge], reason: str) -> tuple[Finding, ...]:
    """What to report when the ledger cannot be reached: per policy, its rule's ``clusterUnavailable``
    decides (fail-closed: a denial; fail-open: a warning)."""
    seen: dict[tuple[str, bool], Finding] = {}
    for charge in charges:
        for check in charge.caps:
            if (check.policy, check.fail_closed) in seen:
                continue
            message = f"{check.where}: GPU quota ledger unavailable: {reason} (GPU caps not checked exactly)"
            seen[(check.policy, check.fail_closed)] = Finding(
                check.policy, RULE, "enforce" if check.fail_closed else "warn", message, check.field)
    return tuple(seen.values())


def refused(charges: Iterable[Charge], reason: str) -> tuple[Finding, ...]:
    """What to report when the API server refused the ledger's write for what it holds (too large,
    invalid, forbidden): a denial per policy, whatever its rule's ``clusterUnavailable`` says (admitting
    would let whatever made the write so past the caps)."""
    seen: dict[str, Finding] = {}
    for charge in charges:
        for check in charge.caps:
            if check.policy not in seen:
                message = f"{check.where}: GPU quota ledger refused the charge: {reason} (GPU caps fail closed)"
                seen[check.policy] = Finding(check.policy, RULE, "enforce", message, check.field)
    return tuple(seen.values())
