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


@dataclass(frozen=True)
class Holding:
    """What one pod holds, as a cap counts it."""

    namespace: str
    name: str
    priority: str
    models: frozenset[str] | None  # the models it can land on; None: any
    gpus: tuple[tuple[str, Decimal], ...]  # (GPU resource, count), sorted by resource


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
    resource, model, classes, namespace = which
    if namespace and holding.namespace != namespace:
        return Decimal(0)
    if not caps.counts(model, classes, holding.priority, holding.models):
        return Decimal(0)
    prefix = resource[:-1] if resource.endswith("*") else None
    return sum((n for name, n in holding.gpus if name == resource or (prefix is not None and name.startswith(prefix))),
               Decimal(0))


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

    What each cap counts is summed once, when first asked, and kept current as
    charges are admitted: a batch of charges costs one pass over the ledger per
    distinct cap, not one per charge.
    """

    def __init__(self, key: LedgerKey, holdings: Mapping[str, Holding]) -> None:
        self.key = key
        self.holdings = dict(holdings)
        self._used: dict[_Which, Decimal] = {}

    def used(self, check: CapCheck) -> Decimal:
        """What ``check``'s cap counts in the ledger now."""
        which = check.which
        total = self._used.get(which)
        if total is None:
            total = self._used[which] = sum((check.counts(h) for h in self.holdings.values()), Decimal(0))
        return total

    def judge(self, charge: Charge) -> tuple[Finding, ...]:
        """The denials of ``charge`` here: each cap it would take past its maximum (none when it is
        charged already, as when an answer was lost and the write is tried again)."""
        if charge.uid in self.holdings:
            return ()
        denials = []
        for check in charge.caps:
            ask = check.counts(charge.holding)
            used = self.used(check)
            if used + ask > check.maximum:
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
        for which in self._used:
            self._used[which] += _count(which, charge.holding)

    def release(self, uid: str) -> None:
        holding = self.holdings.pop(uid, None)
        if holding is not None:
            self._used.clear()

    def _by_namespace(self, check: CapCheck) -> dict[str, Decimal]:
        """Where the GPUs ``check``'s cap counts are held, per namespace (for a team's denial)."""
        found: dict[str, Decimal] = {}
        for holding in self.holdings.values():
            n = check.counts(holding)
            if n:
                found[holding.namespace] = found.get(holding.namespace, Decimal(0)) + n
        return found


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
