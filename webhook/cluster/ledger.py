"""The GPU quota ledger: charges written to the API server before a pod is allowed, shared by every replica.

A pod's charges (``webhook.policy.charges``) go to one GPUQuotaLedger object
per ledger (``webhook.cluster.ledger_object``). Per object, one writer in
this process takes every charge waiting for it, judges them in turn against
the object as last known (a :class:`~webhook.policy.charges.Tally`), and
writes those that fit in one replace of the object whose ``resourceVersion``
is the one it judged against: kube-apiserver refuses it (409) if any other writer
(another replica) changed the object since, and the writer then reads the
object again and judges the whole batch anew, after a short jittered pause,
until the admission's budget runs out. A refusal is only answered from a
state just read or just written, never from one the watch may have left
behind. That is how kube-apiserver's ResourceQuota plugin charges
``status.used`` (FACTS.md §8), and docs/quota.md walks through why no
interleaving of requests or replicas can admit past a cap.

Releases (a pod that finished, was deleted, never appeared, or whose other
charge was refused) go through the same writer, in the same writes.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from webhook.cluster import ledger_object
from webhook.cluster.ledger_metrics import LedgerMetrics
from webhook.cluster.ledger_object import Entry
from webhook.cluster.ledger_settings import LedgerSettings
from webhook.cluster.session import ApiError, ApiSession
from webhook.policy.charges import Charge, Holding, LedgerKey, Tally
from webhook.policy.finding import Finding

log = logging.getLogger(__name__)

#: the pods of a ledger's group as the cluster view shows them: what a new ledger object starts with
Seeder = Callable[[LedgerKey], Awaitable[Mapping[str, Holding]]]
#: how long a write that no admission waits for (a release) may take
BACKGROUND_TIMEOUT = 10.0


class Settlement(NamedTuple):
    """What the ledger said of one pod's charges."""

    denials: tuple[Finding, ...] = ()
    #: why the ledger could not judge them (""; it did)
    unavailable: str = ""
    #: the charges written (to release again if the pod is refused after all)
    charged: tuple[Charge, ...] = ()


class _Verdict(NamedTuple):
    denials: tuple[Finding, ...] = ()
    unavailable: str = ""
    charged: bool = False


@dataclass
class _Ask:
    charge: Charge
    dry_run: bool
    deadline: float  # loop time
    future: asyncio.Future[_Verdict]


class Ledger:
    """The ledger objects as this process knows them, and a writer per object."""

    def __init__(self, session: ApiSession, settings: LedgerSettings, metrics: LedgerMetrics, *,
                 seeder: Seeder | None = None, clock: Callable[[], float] = time.time,
                 rng: random.Random | None = None) -> None:
        self.session, self.settings, self.metrics = session, settings, metrics
        #: what a new ledger object starts with (the pods the cluster view shows in its group)
        self.seeder = seeder
        self._clock = clock
        self._rng = rng or random.Random()
        self._objects: dict[str, Mapping[str, Any]] = {}  # object name → the newest version known
        self._entries: dict[str, dict[str, Entry]] = {}  # object name → its charges, decoded once
        self._keys: dict[str, LedgerKey] = {}
        self._where: dict[str, set[str]] = {}  # pod uid → names of the objects charging it
        self._writers: dict[str, _Writer] = {}

    # ------------------------------------------------------------ what is known

    def entries(self) -> dict[LedgerKey, dict[str, Entry]]:
        """Every ledger's charges as last known."""
        return {self._keys[name]: entries for name, entries in self._entries.items() if name in self._keys}

    def entries_of(self, name: str, obj: Mapping[str, Any]) -> dict[str, Entry]:
        """The charges of ``obj`` (a version of the object ``name``), decoded once per version."""
        if self._objects.get(name) is obj:
            return self._entries[name]
        return ledger_object.entries(obj)

    def holds(self, uid: str) -> bool:
        return uid in self._where

    def known(self, obj: Mapping[str, Any], entries: dict[str, Entry] | None = None) -> None:
        """A version of a ledger object was seen (a watch event, a read, a write's answer, whose
        ``entries`` are known already): keep the newer."""
        name = str((obj.get("metadata") or {}).get("name") or "")
        key = ledger_object.key_of(obj)
        if key is None:
            return
        old = self._objects.get(name)
        if old is not None and not _newer(ledger_object.resource_version(obj), ledger_object.resource_version(old)):
            return  # (an optimisation only: a stale cache costs a conflict, never a wrong answer)
        if entries is None:
            entries = ledger_object.entries(obj)
        for uid in self._entries.get(name, {}).keys() - entries.keys():
            self._unplace(uid, name)
        for uid in entries:
            self._where.setdefault(uid, set()).add(name)
        self._objects[name], self._entries[name], self._keys[name] = obj, entries, key

    def forget(self, name: str) -> None:
        """A ledger object is gone (deleted)."""
        self._objects.pop(name, None)
        self._keys.pop(name, None)
        for uid in self._entries.pop(name, {}):
            self._unplace(uid, name)

    def _unplace(self, uid: str, name: str) -> None:
        names = self._where.get(uid)
        if names is not None:
            names.discard(name)
            if not names:
                del self._where[uid]

    # ------------------------------------------------------------ admission

    async def settle(self, charges: Sequence[Charge], dry_run: bool) -> Settlement:
        """Charge (or, on a dry run, only judge) every charge of one pod, one ledger after the other:
        namespaces first, then teams, and none past the first that refuses.

        In that order a charge that is given back (a later ledger refused the
        pod) can only have held up, meanwhile, pods that the later ledger, full,
        refuses too: a burst still fills every cap exactly (docs/quota.md).
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.settings.budget
        charged: list[Charge] = []
        denials: list[Finding] = []
        unavailable = ""
        for charge in sorted(charges, key=_order):
            verdict = await self._writer(charge.key).judge(charge, dry_run, deadline)
            if verdict.charged:
                charged.append(charge)
            denials.extend(verdict.denials)
            unavailable = unavailable or verdict.unavailable
            if (verdict.denials or verdict.unavailable) and not dry_run:
                break
        outcome = "denied" if denials else "unavailable" if unavailable else "dry-run" if dry_run else "charged"
        self.metrics.charges.labels(outcome).inc()
        return Settlement(tuple(denials), unavailable, tuple(charged))

    def release(self, charges: Iterable[Charge], reason: str) -> None:
        """Remove these charges (a pod refused after its charges were written), in the background."""
        for charge in charges:
            self._writer(charge.key).release(charge.uid, reason)

    def release_pods(self, uids: Iterable[str], reason: str) -> None:
        """Remove every charge of these pods, wherever they are."""
        for uid in uids:
            for name in tuple(self._where.get(uid, ())):
                key = self._keys.get(name)
                if key is not None:
                    self._writer(key).release(uid, reason)

    def _writer(self, key: LedgerKey) -> _Writer:
        name = ledger_object.name_of(key)
        writer = self._writers.get(name)
        if writer is None:
            writer = self._writers[name] = _Writer(self, key, name)
        return writer

    async def stop(self) -> None:
        """Wait (briefly) for the writes under way."""
        tasks = [w.task for w in self._writers.values() if w.task is not None and not w.task.done()]
        if tasks:
            await asyncio.wait(tasks, timeout=self.settings.budget)

    # ------------------------------------------------------------ the API

    async def current(self, key: LedgerKey, name: str, fresh: bool, timeout: float) -> Mapping[str, Any]:
        """The ledger object: as last known, or (``fresh``) read now; created (with the pods the view
        shows in its group) when it does not exist yet."""
        path = ledger_object.object_path(self.settings.namespace, name)
        if not fresh and name in self._objects:
            return self._objects[name]
        try:
            obj = await self.session.request("GET", path, timeout=timeout)
        except ApiError as exc:
            if exc.status != 404:
                raise
            self.forget(name)
            obj = await self._create(key, timeout)
        self.known(obj)
        return self._objects.get(name, obj)

    async def _create(self, key: LedgerKey, timeout: float) -> dict[str, Any]:
        seeded = await self.seeder(key) if self.seeder is not None else {}
        now = self._clock()
        body = ledger_object.new_object(key, self.settings.namespace, {u: Entry(h, now) for u, h in seeded.items()})
        try:
            obj = await self.session.request("POST", ledger_object.collection_path(self.settings.namespace), body,
                                             timeout=timeout)
        except ApiError as exc:
            if exc.status != 409:  # another replica created it first
                raise
            return await self.session.request(
                "GET", ledger_object.object_path(self.settings.namespace, ledger_object.name_of(key)), timeout=timeout)
        if seeded:
            self.metrics.corrections.labels("added").inc(len(seeded))
        return obj

    async def write(self, obj: Mapping[str, Any], charges: Mapping[str, Entry], timeout: float) -> Mapping[str, Any]:
        """Replace the ledger object ``obj`` (as read) by one holding ``charges``; 409 if it changed since."""
        name = str(obj["metadata"]["name"])
        written = await self.session.request("PUT", ledger_object.object_path(self.settings.namespace, name),
                                             ledger_object.with_charges(obj, charges), timeout=timeout)
        self.known(written, dict(charges))
        return written

    def pause(self, attempt: int) -> float:
        """Seconds before trying again: short, growing, jittered (replicas that collided spread out)."""
        return min(0.005 * 2 ** attempt, 0.1) * (0.5 + self._rng.random())

    def now(self) -> float:
        return self._clock()


@dataclass
class _Writer:
    """Every write to one ledger object from this process, one batch at a time."""

    ledger: Ledger
    key: LedgerKey
    name: str
    asks: list[_Ask] = field(default_factory=list)
    releases: dict[str, str] = field(default_factory=dict)  # uid → why
    task: asyncio.Task[None] | None = None
    #: why the last write failed, until one succeeds: what an admission that ran out of time is told
    failing: str = ""

    async def judge(self, charge: Charge, dry_run: bool, deadline: float) -> _Verdict:
        loop = asyncio.get_running_loop()
        ask = _Ask(charge, dry_run, deadline, loop.create_future())
        self.asks.append(ask)
        self._kick()
        try:
            return await asyncio.wait_for(asyncio.shield(ask.future), max(deadline - loop.time(), 0))
        except TimeoutError:
            return _Verdict(unavailable=_late(self.ledger.settings.budget, self.failing))

    def release(self, uid: str, reason: str) -> None:
        self.releases[uid] = reason
        self._kick()

    def _kick(self) -> None:
        if self.task is None or self.task.done():
            self.task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        while self.asks or self.releases:
            asks, self.asks = self.asks, []
            releases, self.releases = self.releases, {}
            try:
                await self._settle(asks, releases)
            except Exception:  # noqa: BLE001 - a bug must not leave admissions waiting
                log.exception("the GPU quota ledger %s failed", self.name)
                _answer(asks, _Verdict(unavailable="internal error (see gpu-admission's logs)"))

    async def _settle(self, asks: list[_Ask], releases: dict[str, str]) -> None:
        loop = asyncio.get_running_loop()
        ledger = self.ledger
        fresh, attempt = False, 0
        while True:
            asks = _pending(asks, loop.time(), _late(ledger.settings.budget, self.failing))
            if not asks and not releases:
                return
            timeout = max((a.deadline for a in asks), default=loop.time() + BACKGROUND_TIMEOUT) - loop.time()
            try:
                obj = await ledger.current(self.key, self.name, fresh, timeout)
                entries = ledger.entries_of(self.name, obj)
                released = [uid for uid in releases if uid in entries]
                tally = Tally(self.key, {u: e.holding for u, e in entries.items() if u not in released})
                verdicts, added, confirmed = _judge(tally, asks, ledger.now())
                if not added and not released and not (confirmed or fresh):
                    fresh = True  # a refusal, or a dry run's answer, only from a state just read
                    continue
                if added or released:
                    # the whole ledger, as it was judged, or refused if anyone changed it since
                    await ledger.write(obj, ledger_object.changed(entries, added, released), timeout)
                    for uid in released:
                        ledger.metrics.releases.labels(releases[uid]).inc()
                self.failing = ""
                for ask, verdict in verdicts:
                    if not ask.future.done():
                        ask.future.set_result(verdict)
                return
            except ApiError as exc:
                self.failing = _reason(exc)
                if exc.status == 409:
                    ledger.metrics.conflicts.inc()
                    ledger.metrics.retries.labels("conflict").inc()
                    fresh = True
                elif exc.status == 404:
                    ledger.forget(self.name)  # deleted meanwhile: created again (seeded) on the next try
                elif exc.retryable and (asks or attempt < 8):
                    ledger.metrics.retries.labels("error").inc()
                    fresh = True
                else:
                    _answer(asks, _Verdict(unavailable=_reason(exc)))
                    if releases:
                        log.warning("releasing charges from %s failed: %s", self.name, exc)
                    return
                attempt += 1
                if not asks and attempt >= 8:
                    log.warning("releasing charges from %s failed %d times: %s", self.name, attempt, exc)
                    return
                pause = ledger.pause(attempt)
                if asks and loop.time() + pause >= max(a.deadline for a in asks):
                    _answer(asks, _Verdict(unavailable=_reason(exc)))
                    asks = []
                    if not releases:
                        return
                await asyncio.sleep(pause)


def _order(charge: Charge) -> tuple[bool, str, str, str]:
    key = charge.key
    return key.scope != "namespace", key.team_label, key.group, key.model_label


def _judge(tally: Tally, asks: list[_Ask], now: float) -> tuple[list[tuple[_Ask, _Verdict]], dict[str, Entry], bool]:
    """Each ask in turn against the tally: (verdicts, the charges to write, whether every verdict stands
    without a fresh read: only charges to write, and charges the ledger holds already)."""
    verdicts: list[tuple[_Ask, _Verdict]] = []
    added: dict[str, Entry] = {}
    confirmed = True
    for ask in asks:
        charge = ask.charge
        if charge.uid in tally.holdings and charge.uid not in added:
            verdicts.append((ask, _Verdict()))  # written already: an answer was lost, or a second call
            continue
        denials = tally.judge(charge)
        if denials:
            verdicts.append((ask, _Verdict(denials=denials)))
            confirmed = False
            continue
        if ask.dry_run:  # judged, and nothing taken: a dry run holds no GPU
            confirmed = False
            verdicts.append((ask, _Verdict()))
        else:
            tally.admit(charge)
            added[charge.uid] = Entry(charge.holding, now)
            verdicts.append((ask, _Verdict(charged=True)))
    return verdicts, added, confirmed or bool(added)


def _late(budget: float, failing: str) -> str:
    return f"the ledger was not written within {budget:g} s" + (f" ({failing})" if failing else "")


def _pending(asks: list[_Ask], now: float, late: str) -> list[_Ask]:
    """The asks still waiting; those past their deadline are answered (their caller has given up)."""
    waiting = []
    for ask in asks:
        if ask.future.done():
            continue
        if now >= ask.deadline:
            ask.future.set_result(_Verdict(unavailable=late))
        else:
            waiting.append(ask)
    return waiting


def _answer(asks: Iterable[_Ask], verdict: _Verdict) -> None:
    for ask in asks:
        if not ask.future.done():
            ask.future.set_result(verdict)


def _reason(exc: ApiError) -> str:
    if exc.status == 403:
        return f"the webhook may not write GPUQuotaLedgers ({exc}; see deploy/base/rbac.yaml)"
    if exc.status == 404:
        return f"GPUQuotaLedgers are not served ({exc}; install deploy/base/quota-ledger-crd.yaml)"
    return str(exc)


def _newer(version: str, than: str) -> bool:
    """Whether resourceVersion ``version`` may be newer than ``than``: not when both are integers (etcd's are)
    and it is not greater."""
    return not (version.isdigit() and than.isdigit()) or int(version) > int(than)
