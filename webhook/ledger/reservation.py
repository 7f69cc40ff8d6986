"""Reservations: room under a ledger's caps that one replica holds in the ledger and admits pods against
without a write of its own; their charges are recorded after the answer, in batches.

A write per pod costs kube-apiserver and etcd a few milliseconds of CPU
whatever the object's size, which a busy cluster feels in every pod's
creation (docs/quota.md, "Cost"). Far from a cap, a replica instead charges
the ledger a **reservation**: a line like a pod's, keyed ``reserved:…``,
holding N GPUs of one *shape* (namespace, priority class, models, resource),
judged against the caps like any charge (so it is written only if it fits).
A pod of that shape, under no cap the reservation was not judged against,
is then admitted against it in memory: what every cap counts of the ledger
already includes the reservation's N, so it includes the pod. The pod's
charge is written later (every ``record_every`` seconds), in the same write
that lowers the reservation by what it recorded: every cap counts the same
before and after, since a cap counts GPUs by shape alone.

The rules that keep it exact (docs/quota.md argues them):
- only what a write confirmed is admitted against (a grant or growth counts
  once kube-apiserver answered it);
- each write of the replica sets its reservation lines to what is left of
  them *when the write is built*, and records every pod admitted before;
  pods admitted while it is in flight take from what it leaves;
- a line of ours the ledger no longer holds (a recount freed it) is never
  written back: what it held is dropped here first;
- a reservation admits nobody after ``LedgerSettings.life`` seconds; one of a
  replica that died is freed by a recount once the window has passed since
  it was granted (its pods, stored by then, are charged by that recount).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal

from webhook.ledger.document import Entry
from webhook.ledger.settings import LedgerSettings
from webhook.policy.charges import Charge, Holding, Tally

PREFIX = "reserved:"

#: (namespace, priority class, models, resource): what every cap counts a holding by
Shape = tuple[str, str, frozenset[str] | None, str]
#: a cap, as far as what it admits goes
CapId = tuple[object, ...]


def is_reservation(uid: str) -> bool:
    """Whether a ledger line is a reservation rather than a pod's charge (pod uids hold no colon)."""
    return uid.startswith(PREFIX)


def shape_of(holding: Holding) -> Shape | None:
    """The shape a reservation for this pod holds; None for a pod of several resources, or naming
    ResourceClaims (what it adds to a cap depends on whether another pod names them: charged one by one)."""
    if len(holding.gpus) != 1 or holding.claims:
        return None
    return holding.namespace, holding.priority, holding.models, holding.gpus[0][0]


def cap_ids(charge: Charge) -> frozenset[CapId]:
    return frozenset((c.which, c.maximum, c.scope, c.group, c.team_label) for c in charge.caps)


@dataclass
class Reservation:
    uid: str
    shape: Shape
    caps: frozenset[CapId]
    #: GPUs not yet given to a pod
    left: Decimal
    #: when it was granted (store clock): others free it a window after
    at: float
    #: no pod is admitted against it from then on (store clock)
    until: float

    def entry(self) -> Entry:
        return line(self.uid, self.shape, self.left, self.at)


@dataclass
class Grant:
    """A reservation to write (new, or grown): counted here once the write is answered."""

    uid: str
    shape: Shape
    caps: frozenset[CapId]
    size: Decimal
    at: float
    grown: Decimal  # what it adds to a reservation held already (the whole size for a new one)


@dataclass
class Reservations:
    """One replica's reservations in one ledger, and the pods admitted against them not recorded yet."""

    replica: str
    settings: LedgerSettings
    held: dict[Shape, Reservation] = field(default_factory=dict)
    #: pods admitted against a reservation, their charges not written yet
    unrecorded: dict[str, Entry] = field(default_factory=dict)
    _serial: itertools.count[int] = field(default_factory=itertools.count)

    @property
    def prefix(self) -> str:
        return f"{PREFIX}{self.replica}:"

    def take(self, charge: Charge, now: float) -> bool:
        """Admit ``charge`` against a reservation, in memory; False when none has room for it."""
        shape = shape_of(charge.holding)
        found = self.held.get(shape) if shape is not None else None
        if found is None or now >= found.until or not cap_ids(charge) <= found.caps:
            return False
        ask = charge.holding.gpus[0][1]
        if charge.uid in self.unrecorded:
            return True
        if ask > found.left:
            return False
        found.left -= ask
        self.unrecorded[charge.uid] = Entry(charge.holding, now)
        return True

    def drop(self, uid: str) -> bool:
        """A pod admitted against a reservation was refused after all, or went: not recorded (its GPUs
        return to the ledger at the next write, which sets the reservation to what is left)."""
        return self.unrecorded.pop(uid, None) is not None

    def give_back(self) -> None:
        """Nothing more is admitted against any reservation: the next write returns what is left."""
        self.held.clear()

    def lines(self, present: Iterable[str], now: float) -> dict[str, Entry]:
        """The lines of our reservations for the write being built: what is left of each. A reservation
        the ledger no longer holds (freed by a recount) or past its life is dropped first."""
        still = set(present)
        for shape, found in list(self.held.items()):
            if found.uid not in still or now >= found.until:
                del self.held[shape]
        return {r.uid: r.entry() for r in self.held.values() if r.left > 0}

    def grants(self, tally: Tally, charges: Iterable[Charge], now: float) -> list[Grant]:
        """Reservations to grant or grow for the shapes of ``charges`` (admitted in this write): a share
        of the room every cap of the charge leaves, when that is large; each judged in ``tally`` and
        counted there."""
        settings = self.settings
        found: list[Grant] = []
        seen: set[Shape] = set()
        for charge in charges:
            shape = shape_of(charge.holding)
            if shape is None or shape in seen or settings.reserve_max <= 0:
                continue
            seen.add(shape)
            one = Holding(shape[0], "", shape[1], shape[2], ((shape[3], Decimal(1)),))
            rooms = [check.maximum - tally.used(check) for check in charge.caps if check.counts(one) > 0]
            room = min(rooms) if rooms else Decimal(settings.reserve_max * settings.reserve_share)
            size = min(Decimal(settings.reserve_max), room // settings.reserve_share)
            held = self.held.get(shape)
            if held is None or held.caps != cap_ids(charge) or now >= held.until or not held.left:
                held = None
            left = held.left if held is not None else Decimal(0)
            if size < settings.reserve_min or left * 2 >= size:
                continue
            uid, at = (held.uid, held.at) if held is not None else (f"{self.prefix}{next(self._serial)}", now)
            grant = Grant(uid, shape, cap_ids(charge), size, at, size - left)
            block = Charge(tally.key, uid, Holding(shape[0], "", shape[1], shape[2], ((shape[3], grant.grown),)),
                           charge.caps)
            if tally.judge(block):
                continue
            tally.admit(Charge(tally.key, f"{uid}+{now}", block.holding, charge.caps))
            found.append(grant)
        return found

    def granted(self, grants: Iterable[Grant], now: float) -> None:
        """The write holding ``grants`` was answered: pods may be admitted against them."""
        for grant in grants:
            held = self.held.get(grant.shape)
            if held is not None and held.uid == grant.uid:
                held.left += grant.grown
            else:
                self.held[grant.shape] = Reservation(grant.uid, grant.shape, grant.caps, grant.grown, grant.at,
                                                     grant.at + self.settings.life)

    def recorded(self, uids: Iterable[str]) -> None:
        for uid in uids:
            self.unrecorded.pop(uid, None)

    def line_of(self, grant: Grant) -> Entry:
        """A grant's line: what is left of the reservation plus what it grows by."""
        held = self.held.get(grant.shape)
        left = held.left if held is not None and held.uid == grant.uid else Decimal(0)
        return line(grant.uid, grant.shape, left + grant.grown, grant.at)


def line(uid: str, shape: Shape, amount: Decimal, at: float) -> Entry:
    """A reservation's line in the ledger: a holding of its shape (named after it), charged at ``at``."""
    namespace, priority, models, resource = shape
    name = "reserved-" + uid[len(PREFIX):].replace(":", "-")
    return Entry(Holding(namespace, name, priority, models, ((resource, amount),)), at)


def mine(held: Mapping[str, Entry], prefix: str) -> set[str]:
    """The lines of ``held`` that are reservations of the replica ``prefix`` names."""
    return {uid for uid in held if uid.startswith(prefix)}
