"""The ledger objects as this process knows them, and every read and write of them.

Each ledger is two objects (``webhook.ledger.document``): its recent
part, which admission writes, and its settled part, which
:meth:`LedgerStore.settle` fills from the recent one in batches. What a
ledger holds is the settled part (at least at the generation the recent part
names) less the charges released since, plus the recent charges. Every write
replaces an object as it was read, with its resourceVersion as a
precondition (409 when anyone changed it since).
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from webhook.cluster.session import ApiError, ApiSession
from webhook.ledger import document
from webhook.ledger.document import RECENT, SETTLED, Entry, Part, Stated
from webhook.ledger.metrics import LedgerMetrics
from webhook.ledger.settings import LedgerSettings
from webhook.policy.charges import Holding, LedgerKey

log = logging.getLogger(__name__)

#: the pods of a ledger's group as the cluster view shows them: what a new ledger starts with
Seeder = Callable[[LedgerKey], Awaitable[Mapping[str, Holding]]]
#: the caps this replica's policies state (``webhook.ledger.statements``): digest → (model label, definition)
Stating = Callable[[], Mapping[str, tuple[str, str]]]
#: a charge whose pod the cluster view shows stored (and so may be settled)
Confirmed = Callable[[str, Entry], bool]
Object = Mapping[str, Any]


class LedgerStore:
    """The newest version of each ledger object this process has seen, and the API calls on them."""

    def __init__(self, session: ApiSession, settings: LedgerSettings, metrics: LedgerMetrics, *,
                 seeder: Seeder | None = None, clock: Callable[[], float] = time.time,
                 rng: random.Random | None = None) -> None:
        self.session, self.settings, self.metrics = session, settings, metrics
        #: what a new ledger starts with (the pods the cluster view shows in its group)
        self.seeder = seeder
        self._clock = clock
        self._rng = rng or random.Random()
        self._parts: dict[str, tuple[Object, Part]] = {}  # object name → (newest version known, what it says)
        #: pod uid → the ledgers holding it
        self._where: dict[str, set[LedgerKey]] = {}
        self._held: dict[LedgerKey, frozenset[str]] = {}
        #: charges a write of each ledger's recent part adds, on average (how often to settle: ledger_upkeep)
        self._per_write: dict[LedgerKey, float] = {}
        #: the caps this replica's policies state, renewed in every write of a recent part
        self.stating: Stating = dict
        #: whether the API server was seen to drop status.caps (an older CRD): said once
        self._pruned = False
        #: the live statements of other policy versions, as last worked out, and until when that holds
        self._others: tuple[dict[str, str], float, Mapping[str, tuple[str, str]]] | None = None

    # ------------------------------------------------------------ what is known

    def holdings(self) -> dict[LedgerKey, dict[str, Entry]]:
        """Every ledger's holdings, as last known."""
        return {part.key: document.holdings(part, self._cached(part.key, SETTLED))
                for _, part in self._parts.values() if part.part == RECENT}

    def holds(self, uid: str) -> bool:
        """Whether a ledger known here holds a charge of ``uid`` (one dict lookup: safe from a watch thread)."""
        return uid in self._where

    def ledgers_of(self, uid: str) -> set[LedgerKey]:
        return set(self._where.get(uid, ()))

    def recent(self, key: LedgerKey) -> Part | None:
        return self._cached(key, RECENT)

    def settled_size(self, key: LedgerKey) -> int:
        """How many charges the ledger's settled part holds, as last known."""
        settled = self._cached(key, SETTLED)
        return len(settled.charges) if settled is not None else 0

    def per_write(self, key: LedgerKey) -> float:
        """How many charges a write of the ledger's recent part adds, on average lately."""
        return self._per_write.get(key, 1.0)

    def others(self) -> dict[str, str]:
        """The live statements of every ledger known that this replica's policies do not define identically:
        digest → definition (caps of other policy versions, enforced here too)."""
        now, mine, lease = self.now(), self.stating(), self.settings.lease
        if self._others is not None and now < self._others[1] and self._others[2] is mine:
            return self._others[0]
        found: dict[str, str] = {}
        until = now + lease
        for _, part in self._parts.values():
            for digest, stated in part.caps.items():
                ends = stated.renewed + lease
                if digest not in mine and now < ends:
                    found[digest] = stated.definition
                    until = min(until, ends)
        self._others = (found, until, mine)
        return found

    def due(self, key: LedgerKey) -> bool:
        """Whether this replica's statements in ledger ``key`` need renewing: missing, or renewed more than
        ``lease / 4`` seconds ago (as last known)."""
        recent = self._cached(key, RECENT)
        if recent is None:
            return False
        now = self.now()
        for digest, (model_label, _) in self.stating().items():
            stated = recent.caps.get(digest)
            if model_label == key.model_label and (stated is None or now - stated.renewed >= self.settings.lease / 4):
                return True
        return False

    def _cached(self, key: LedgerKey, part: str) -> Part | None:
        found = self._parts.get(document.name_of(key, part))
        return found[1] if found is not None else None

    def known(self, obj: Object, part: Part | None = None) -> Part | None:
        """A version of a ledger object was seen (a watch event, a read, a write's answer, whose ``part``
        is known already): kept if newer. What it says, or None when it is not one of ours."""
        name = str((obj.get("metadata") or {}).get("name") or "")
        old = self._parts.get(name)
        if old is not None and not _newer(document.resource_version(obj), document.resource_version(old[0])):
            return old[1]  # (an optimisation only: a stale copy costs a conflict, never a wrong answer)
        part = part or document.read(obj)
        if part is None:
            return None
        self._parts[name] = (obj, part)
        self._place(part.key)
        if self._others is not None and any(d not in self._others[0] and d not in self._others[2] for d in part.caps):
            self._others = None  # a statement of another version not counted yet (one lapsing is, until it does)
        return part

    def forget(self, name: str) -> None:
        """A ledger object is gone (deleted)."""
        found = self._parts.pop(name, None)
        if found is not None:
            self._place(found[1].key)
            self._others = None

    def _place(self, key: LedgerKey) -> None:
        """Keep ``_where`` true of the ledger ``key``."""
        recent = self._cached(key, RECENT)
        held = frozenset(document.holdings(recent, self._cached(key, SETTLED))) if recent else frozenset()
        before = self._held.get(key, frozenset())
        for uid in before - held:
            keys = self._where.get(uid)
            if keys is not None:
                keys.discard(key)
                if not keys:
                    del self._where[uid]
        for uid in held - before:
            self._where.setdefault(uid, set()).add(key)
        self._held[key] = held

    # ------------------------------------------------------------ reads

    async def current(self, key: LedgerKey, fresh: bool, timeout: float) -> tuple[Object, Part]:
        """The ledger's recent part: as last known, or (``fresh``) read now; created (with the pods the
        view shows in its group) when the ledger does not exist yet."""
        name = document.name_of(key)
        if not fresh and name in self._parts:
            return self._parts[name]
        obj = await self._read(name, timeout)
        if obj is None:
            obj = await self._create(key, timeout)
        self.known(obj)
        return self._parts[name]

    async def settled(self, key: LedgerKey, generation: int, timeout: float, fresh: bool = False) -> Part | None:
        """The ledger's settled part at ``generation`` or later (None: it has none): the copy known when it
        is recent enough, else read now."""
        cached = self._cached(key, SETTLED)
        if cached is not None and cached.generation >= generation and not fresh:
            return cached
        obj = await self._read(document.name_of(key, SETTLED), timeout)
        return self.known(obj) if obj is not None else None

    async def _read(self, name: str, timeout: float) -> Object | None:
        """A ledger object read now; None (and forgotten) when it does not exist."""
        try:
            return await self.session.request("GET", self._path(name), timeout=timeout)
        except ApiError as exc:
            if exc.status != 404:
                raise
            self.forget(name)
            return None

    async def _create(self, key: LedgerKey, timeout: float) -> Object:
        seeded = await self.seeder(key) if self.seeder is not None else {}
        now = self._clock()
        body = document.new_object(key, self.settings.namespace, {u: Entry(h, now) for u, h in seeded.items()},
                                   caps=self._stated(key, {}))
        obj, created = await self._post(body, timeout)
        if seeded and created:
            self.metrics.corrections.labels("added").inc(len(seeded))
        return obj

    async def _post(self, body: Object, timeout: float) -> tuple[Object, bool]:
        """Create a ledger object; the one another replica created first when it exists: (it, created)."""
        try:
            return await self.session.request("POST", document.collection_path(self.settings.namespace), body,
                                              timeout=timeout), True
        except ApiError as exc:
            if exc.status != 409:
                raise
            return await self.session.request("GET", self._path(str(body["metadata"]["name"])), timeout=timeout), False

    # ------------------------------------------------------------ writes

    async def write(self, obj: Object, charges: Mapping[str, Entry], released: frozenset[str] = frozenset(),
                    generation: int | None = None, timeout: float = 10.0, epoch: int | None = None) -> Part:
        """Replace the ledger object ``obj`` (as read) by one holding ``charges`` (and, a recent part,
        ``released``), at ``generation`` when given; ApiError 409 if it changed since. A recent part's
        epoch is counted up, and it states the live caps it stated with this replica's renewed; a settled
        part takes ``epoch``, the recent part's it was settled from."""
        name = str(obj["metadata"]["name"])
        old = document.read(obj)
        assert old is not None
        if old.part == RECENT:
            epoch = old.epoch + 1
            added = len(charges.keys() - old.charges.keys())
            if added:
                self._per_write[old.key] = 0.8 * self.per_write(old.key) + 0.2 * added
        elif epoch is None:
            epoch = old.epoch
        caps = self._stated(old.key, old.caps) if old.part == RECENT else None
        written = await self.session.request("PUT", self._path(name),
                                             document.replaced(obj, charges, released, generation, epoch, caps),
                                             timeout=timeout)
        if caps and not self._pruned and not (written.get("status") or {}).get("caps"):
            # a CRD older than this version prunes status.caps: no other version learns this one's caps
            self._pruned = True
            log.error("the API server dropped the caps this replica states in GPUQuotaLedgers (status.caps): its "
                      "CRD is older than this version; apply deploy/base/quota-ledger-crd.yaml, or caps may be "
                      "passed while policy versions overlap")
        part = Part(old.key, old.part, dict(charges), released if old.part == RECENT else frozenset(),
                    old.generation if generation is None else generation, epoch, caps or {})
        return self.known(written, part) or part

    def _stated(self, key: LedgerKey, caps: Mapping[str, Stated]) -> dict[str, Stated]:
        """What a write of ledger ``key``'s recent part that states ``caps`` (as read) states: the live ones,
        this replica's renewed now (those of the ledger's model label)."""
        now, lease = self.now(), self.settings.lease
        found = {d: s for d, s in caps.items() if now - s.renewed < lease}
        for digest, (model_label, definition) in self.stating().items():
            if model_label == key.model_label:
                found[digest] = Stated(definition, now)
        return found

    async def restate(self, key: LedgerKey, timeout: float = 10.0) -> None:
        """Renew this replica's statements in ledger ``key`` (a write of its recent part as it is)."""
        fresh = False
        for _ in range(4):
            obj, recent = await self.current(key, fresh, timeout)
            try:
                await self.write(obj, recent.charges, recent.released, timeout=timeout)
                return
            except ApiError as exc:
                if exc.status != 409:
                    raise
                fresh = True

    async def settle(self, key: LedgerKey, confirmed: Confirmed, timeout: float = 10.0) -> int:
        """Move the recent charges of pods seen stored to the settled part, and remove from it the
        charges released since; how many charges moved.

        The settled part is written first (its generation counted up, the
        recent part's epoch it started from noted), then the recent part,
        which drops what moved and what was released there, and names that
        generation: a reader of the new recent part reads a settled part at
        least as new. Until the second write lands, what moved is in both (one
        charge per uid: counted once); a charge released meanwhile is marked
        released in the recent part, so it is not counted in the settled one
        either. A settling that read the recent part before the last one did
        starts again: it could put back what that one removed.
        """
        for _ in range(4):
            obj, recent = await self.current(key, True, timeout)
            moving = {uid: entry for uid, entry in recent.charges.items() if confirmed(uid, entry)}
            applied = recent.released
            if not moving and not applied:
                return 0
            settled_obj, settled = await self._settled_object(key, timeout)
            if recent.epoch < settled.epoch:
                continue  # another settling started from a newer recent part: this read is stale
            base = {uid: entry for uid, entry in settled.charges.items() if uid not in applied}
            base.update(moving)
            generation = settled.generation + 1
            try:
                await self.write(settled_obj, base, generation=generation, timeout=timeout, epoch=recent.epoch)
            except ApiError as exc:
                if exc.status != 409:
                    raise
                continue
            for _ in range(8):
                try:
                    await self.write(obj, {u: e for u, e in recent.charges.items() if u not in moving},
                                     recent.released - applied, max(recent.generation, generation), timeout)
                    return len(moving)
                except ApiError as exc:
                    if exc.status != 409:
                        raise
                    obj, recent = await self.current(key, True, timeout)
            return len(moving)  # (counted twice until the next settling: never too few)
        return 0

    async def _settled_object(self, key: LedgerKey, timeout: float) -> tuple[Object, Part]:
        """The settled part, read now; created empty when there is none."""
        name = document.name_of(key, SETTLED)
        obj = await self._read(name, timeout)
        if obj is None:
            obj, _ = await self._post(document.new_object(key, self.settings.namespace, part=SETTLED), timeout)
        part = self.known(obj) or document.read(obj)
        assert part is not None
        return self._parts.get(name, (obj, part))

    def _path(self, name: str) -> str:
        return document.object_path(self.settings.namespace, name)

    def pause(self, attempt: int) -> float:
        """Seconds before trying again: short, growing, jittered (replicas that collided spread out)."""
        return min(0.005 * 2 ** attempt, 0.1) * (0.5 + self._rng.random())

    def now(self) -> float:
        return self._clock()


def _newer(version: str, than: str) -> bool:
    """Whether resourceVersion ``version`` may be newer than ``than``: not when both are integers (etcd's are)
    and it is not greater."""
    return not (version.isdigit() and than.isdigit()) or int(version) > int(than)
