"""The GPU quota ledger: charges written to the API server before a pod is allowed, shared by every replica.

A pod's charges (``webhook.policy.charges``) go to one ledger each
(``webhook.ledger.document``, ``webhook.ledger.store``). Per
ledger, one writer in this process takes every charge waiting for it, judges
them in turn against what the ledger holds as last known (a
:class:`~webhook.policy.charges.Tally`), and writes those that fit in one
replace of the ledger's recent part whose ``resourceVersion`` is the one it
judged against: kube-apiserver refuses it (409) if any other writer
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
import secrets
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from webhook.cluster.session import ApiError
from webhook.ledger import document, reservation
from webhook.ledger.document import Entry
from webhook.ledger.reservation import Reservations
from webhook.ledger.serving import LedgerServing
from webhook.ledger.store import LedgerStore
from webhook.policy.charges import Charge, LedgerKey, Tally
from webhook.policy.finding import Finding

log = logging.getLogger(__name__)

#: how long a write that no admission waits for (a release) may take
BACKGROUND_TIMEOUT = 10.0


class Settlement(NamedTuple):
    """What the ledger said of one pod's charges."""

    denials: tuple[Finding, ...] = ()
    #: why the ledger could not judge them (""; it did)
    unavailable: str = ""
    #: the charges written (to release again if the pod is refused after all)
    charged: tuple[Charge, ...] = ()
    #: the API server refused a ledger write for what it holds (``ApiError.refused``: why): the caps
    #: fail closed whatever clusterUnavailable says ("" : it did not)
    refused: str = ""


class _Verdict(NamedTuple):
    denials: tuple[Finding, ...] = ()
    unavailable: str = ""
    charged: bool = False
    refused: str = ""


@dataclass
class _Ask:
    charge: Charge
    dry_run: bool
    deadline: float  # loop time
    future: asyncio.Future[_Verdict]


class Ledger:
    """Charges and releases, one writer per ledger, over the ledger objects as ``store`` knows them."""

    def __init__(self, store: LedgerStore) -> None:
        self.store = store
        self.settings, self.metrics = store.settings, store.metrics
        #: names this process's reservations (docs/quota.md): a new one for every start
        self.replica = secrets.token_hex(5)
        self._writers: dict[LedgerKey, _Writer] = {}
        #: whether the API server serves the ledger's resource (None: not checked, as in tests of the ledger alone)
        self.serving: LedgerServing | None = None
        #: why the caps this replica states, or those other policy versions state, may not be known yet
        #: ("" : they are; ``Upkeep.state``)
        self.unstated = ""

    def not_ready(self) -> str:
        """Why the server must not be Ready for the ledger ("" : nothing): caps enforced and no ledger resource;
        or, unless the ledger is known not to be served, its statements of caps not read and this replica's
        not written yet (nor the API server's clock read: webhook.cluster.clock)."""
        if self.serving is None:
            return ""
        return self.serving.said() or ("" if self.serving.served is False else self.unstated)

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
        unavailable = refused = ""
        for charge in sorted(charges, key=_order):
            verdict = await self._writer(charge.key).judge(charge, dry_run, deadline)
            if verdict.charged:
                charged.append(charge)
            denials.extend(verdict.denials)
            unavailable = unavailable or verdict.unavailable
            refused = refused or verdict.refused
            if (verdict.denials or verdict.unavailable) and not dry_run:
                break
        outcome = "denied" if denials else "unavailable" if unavailable else "dry-run" if dry_run else "charged"
        self.metrics.charges.labels(outcome).inc()
        return Settlement(tuple(denials), unavailable, tuple(charged), refused)

    def release(self, charges: Iterable[Charge], reason: str) -> None:
        """Remove these charges (a pod refused after its charges were written), in the background."""
        for charge in charges:
            self._writer(charge.key).release(charge.uid, reason)

    def release_pods(self, uids: Iterable[str], reason: str) -> None:
        """Remove every charge of these pods, wherever they are."""
        for uid in uids:
            for key in self.store.ledgers_of(uid):
                self._writer(key).release(uid, reason)
            for writer in self._writers.values():
                if uid in writer.reserved.unrecorded:  # admitted against a reservation, not recorded yet
                    writer.release(uid, reason)

    def admitted_unrecorded(self, uid: str) -> bool:
        """Whether this replica admitted the pod against a reservation and has not recorded its charge yet."""
        return any(uid in writer.reserved.unrecorded for writer in self._writers.values())

    def _writer(self, key: LedgerKey) -> _Writer:
        writer = self._writers.get(key)
        if writer is None:
            writer = self._writers[key] = _Writer(self, key, Reservations(self.replica, self.settings))
        return writer

    async def stop(self) -> None:
        """Return the reservations, record what was admitted against them, and wait (briefly) for the
        writes under way."""
        for writer in self._writers.values():
            writer.reserved.give_back()
            writer.hurry = True
            writer.kick()
        tasks = [w.task for w in self._writers.values() if w.task is not None and not w.task.done()]
        if tasks:
            await asyncio.wait(tasks, timeout=self.settings.budget)


@dataclass
class _Writer:
    """Every write to one ledger from this process, one batch at a time."""

    ledger: Ledger
    key: LedgerKey
    reserved: Reservations
    asks: list[_Ask] = field(default_factory=list)
    releases: dict[str, str] = field(default_factory=dict)  # uid → why
    task: asyncio.Task[None] | None = None
    #: why the last write failed, until one succeeds: what an admission that ran out of time is told
    failing: str = ""
    #: loop time of the last write (what pods admitted against reservations wait for, at most
    #: ``record_every`` after it), and the timer of the next
    written: float = 0.0
    timer: asyncio.TimerHandle | None = None
    #: write what is owed now (the process is stopping)
    hurry: bool = False

    async def judge(self, charge: Charge, dry_run: bool, deadline: float) -> _Verdict:
        if not dry_run and self.reserved.take(charge, self.ledger.store.now()):
            self.ledger.metrics.reserved.inc()
            self._record_soon()
            return _Verdict(charged=True)
        loop = asyncio.get_running_loop()
        ask = _Ask(charge, dry_run, deadline, loop.create_future())
        self.asks.append(ask)
        self.kick()
        try:
            return await asyncio.wait_for(asyncio.shield(ask.future), max(deadline - loop.time(), 0))
        except TimeoutError:
            return _Verdict(unavailable=_late(self.ledger.settings.budget, self.failing))

    def release(self, uid: str, reason: str) -> None:
        writing = self.task is not None and not self.task.done()
        if self.reserved.drop(uid):
            self.ledger.metrics.releases.labels(reason).inc()
            if not writing:
                return  # never recorded: its GPUs go back with the next write, which sets what is left
        # (a write under way may be recording it: released after it, if it did)
        self.releases[uid] = reason
        self.kick()

    def kick(self) -> None:
        if self.task is None or self.task.done():
            self.task = asyncio.get_running_loop().create_task(self._run())

    def _record_soon(self) -> None:
        """Write the charges of pods admitted against reservations ``record_every`` after the last write:
        a burst is recorded in a few writes, not one per pod."""
        if self.timer is not None or (self.task is not None and not self.task.done()):
            return  # (the writer records them when it is done)
        loop = asyncio.get_running_loop()
        self.timer = loop.call_at(self.written + self.ledger.settings.record_every, self._recording)

    def _recording(self) -> None:
        self.timer = None
        self.kick()

    def _due(self) -> bool:
        """Whether a write is owed for the reservations alone: pods to record, or lines of ours in the
        ledger that no longer stand for room held here (given back, used up, past their life)."""
        if self.reserved.unrecorded:
            return True
        store = self.ledger.store
        recent = store.recent(self.key)
        if recent is None:
            return False
        now = store.now()
        live = {r.uid for r in self.reserved.held.values() if now < r.until and r.left > 0}
        return any(uid.startswith(self.reserved.prefix) and uid not in live for uid in recent.charges)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while self.asks or self.releases or self._due():
            if not (self.asks or self.releases or self.hurry) and \
                    loop.time() < self.written + self.ledger.settings.record_every:
                if self.timer is None:
                    self.timer = loop.call_at(self.written + self.ledger.settings.record_every, self._recording)
                return
            asks, self.asks = self.asks, []
            releases, self.releases = self.releases, {}
            try:
                done = await self._settle(asks, releases)
            except Exception:  # noqa: BLE001 - a bug must not leave admissions waiting
                log.exception("the GPU quota ledger of %s failed", self.key.describe())
                _answer(asks, _Verdict(unavailable="internal error (see gpu-admission's logs)"))
                done = False
            if not done and not self.asks and not self.releases:
                # a background write failed: tried again at the next beat (never in a busy loop)
                self.written = loop.time() + 1.0
                self.timer = loop.call_at(self.written, self._recording)
                return

    async def _settle(self, asks: list[_Ask], releases: dict[str, str]) -> bool:
        """Judge and write one batch; False when a write owed (a release, a record) could not be made."""
        loop = asyncio.get_running_loop()
        store = self.ledger.store
        reserved = self.reserved
        fresh, attempt = False, 0
        while True:
            asks = _pending(asks, loop.time(), _late(store.settings.budget, self.failing))
            if not asks and not releases and not self._due():
                return True
            timeout = max((a.deadline for a in asks), default=loop.time() + BACKGROUND_TIMEOUT) - loop.time()
            try:
                obj, recent = await store.current(self.key, fresh, timeout)
                settled = await store.settled(self.key, recent.generation, timeout) if recent.generation else None
                # from here to the write, nothing awaits: what is admitted against reservations meanwhile
                # takes from what this write leaves them (reservation.py)
                held = document.holdings(recent, settled)
                released = [uid for uid in releases if uid in held]
                ours = reservation.mine(held, reserved.prefix)
                now = store.now()
                lines = reserved.lines(ours, now)
                records = dict(reserved.unrecorded)
                base = {u: e for u, e in held.items() if u not in released and u not in ours}
                base.update({u: e for u, e in records.items() if u not in base})
                tally = Tally(self.key, {u: e.holding for u, e in {**base, **lines}.items()})
                verdicts, added, confirmed = _judge(tally, asks, now)
                if lines and any(v.denials for _, v in verdicts):
                    # a pod refused while this replica holds room: the room is given back first
                    reserved.give_back()
                    lines = {}
                    tally = Tally(self.key, {u: e.holding for u, e in base.items()})
                    verdicts, added, confirmed = _judge(tally, asks, now)
                grants = reserved.grants(tally, [a.charge for a, v in verdicts if v.charged], now)
                lines.update({g.uid: reserved.line_of(g) for g in grants})
                charges = {u: e for u, e in recent.charges.items() if u not in released and u not in ours}
                charges.update({u: e for u, e in records.items() if u not in held})
                charges.update(added)
                charges.update(lines)
                changed = bool(released) or charges != recent.charges
                if not changed and not (confirmed or fresh):
                    fresh = True  # a refusal, or a dry run's answer, only from a state just read
                    continue
                if changed:
                    # the recent part as it was judged, or refused if anyone changed it since; a release
                    # is also marked (a charge being settled meanwhile is not counted there either)
                    await store.write(obj, charges, recent.released | set(released), timeout=timeout)
                    self.written = loop.time()
                    for uid in released:
                        store.metrics.releases.labels(releases[uid]).inc()
                reserved.recorded(records)
                reserved.granted(grants, now)
                if grants:  # returned once past its life, even if nothing else is written by then
                    loop.call_later(store.settings.life + 0.05, self.kick)
                self.failing = ""
                for ask, verdict in verdicts:
                    if not ask.future.done():
                        ask.future.set_result(verdict)
                return True
            except ApiError as exc:
                self.failing = _reason(exc)
                if exc.status == 409:
                    store.metrics.conflicts.inc()
                    store.metrics.retries.labels("conflict").inc()
                    fresh = True
                elif exc.status == 404:
                    store.forget(document.name_of(self.key))  # deleted meanwhile: created again, seeded
                elif exc.refused:
                    # refused for what it holds (too large, invalid, forbidden): sending it again, or
                    # letting clusterUnavailable admit, would let whatever made it so past the caps
                    _answer(asks, _Verdict(unavailable=_reason(exc), refused=exc.refused))
                    log.error("the API server refused the GPU quota ledger of %s (%s): %s", self.key.describe(),
                              exc.refused, exc)
                    return False
                elif exc.retryable and (asks or attempt < 8):
                    store.metrics.retries.labels("error").inc()
                    fresh = True
                else:
                    _answer(asks, _Verdict(unavailable=_reason(exc)))
                    if releases or reserved.unrecorded:
                        log.warning("releasing or recording charges in %s failed: %s", self.key.describe(), exc)
                    return False
                attempt += 1
                if not asks and attempt >= 8:
                    log.warning("releasing or recording charges in %s failed %d times: %s", self.key.describe(),
                                attempt, exc)
                    return False
                pause = store.pause(attempt)
                if asks and loop.time() + pause >= max(a.deadline for a in asks):
                    _answer(asks, _Verdict(unavailable=_reason(exc)))
                    asks = []
                    if not releases and not self._due():
                        return True
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
