"""The GPU quota ledger: charges written to the API server before a pod is allowed, shared by every replica.

A pod's charges (``webhook.policy.charges``) go to one ledger each
(``webhook.cluster.ledger_object``, ``webhook.cluster.ledger_store``). Per
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
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from webhook.cluster import ledger_object
from webhook.cluster.ledger_object import Entry
from webhook.cluster.ledger_store import LedgerStore
from webhook.cluster.session import ApiError
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
    """Charges and releases, one writer per ledger, over the ledger objects as ``store`` knows them."""

    def __init__(self, store: LedgerStore) -> None:
        self.store = store
        self.settings, self.metrics = store.settings, store.metrics
        self._writers: dict[LedgerKey, _Writer] = {}

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
            for key in self.store.ledgers_of(uid):
                self._writer(key).release(uid, reason)

    def _writer(self, key: LedgerKey) -> _Writer:
        writer = self._writers.get(key)
        if writer is None:
            writer = self._writers[key] = _Writer(self, key)
        return writer

    async def stop(self) -> None:
        """Wait (briefly) for the writes under way."""
        tasks = [w.task for w in self._writers.values() if w.task is not None and not w.task.done()]
        if tasks:
            await asyncio.wait(tasks, timeout=self.settings.budget)


@dataclass
class _Writer:
    """Every write to one ledger from this process, one batch at a time."""

    ledger: Ledger
    key: LedgerKey
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
                log.exception("the GPU quota ledger of %s failed", self.key.describe())
                _answer(asks, _Verdict(unavailable="internal error (see gpu-admission's logs)"))

    async def _settle(self, asks: list[_Ask], releases: dict[str, str]) -> None:
        loop = asyncio.get_running_loop()
        store = self.ledger.store
        fresh, attempt = False, 0
        while True:
            asks = _pending(asks, loop.time(), _late(store.settings.budget, self.failing))
            if not asks and not releases:
                return
            timeout = max((a.deadline for a in asks), default=loop.time() + BACKGROUND_TIMEOUT) - loop.time()
            try:
                obj, recent = await store.current(self.key, fresh, timeout)
                settled = await store.settled(self.key, recent.generation, timeout) if recent.generation else None
                held = ledger_object.holdings(recent, settled)
                released = [uid for uid in releases if uid in held]
                tally = Tally(self.key, {u: e.holding for u, e in held.items() if u not in released})
                verdicts, added, confirmed = _judge(tally, asks, store.now())
                if not added and not released and not (confirmed or fresh):
                    fresh = True  # a refusal, or a dry run's answer, only from a state just read
                    continue
                if added or released:
                    # the recent part as it was judged, or refused if anyone changed it since; a release
                    # is also marked (a charge being settled meanwhile is not counted there either)
                    charges = {u: e for u, e in recent.charges.items() if u not in released}
                    charges.update(added)
                    await store.write(obj, charges, recent.released | set(released), timeout=timeout)
                    for uid in released:
                        store.metrics.releases.labels(releases[uid]).inc()
                self.failing = ""
                for ask, verdict in verdicts:
                    if not ask.future.done():
                        ask.future.set_result(verdict)
                return
            except ApiError as exc:
                self.failing = _reason(exc)
                if exc.status == 409:
                    store.metrics.conflicts.inc()
                    store.metrics.retries.labels("conflict").inc()
                    fresh = True
                elif exc.status == 404:
                    store.forget(ledger_object.name_of(self.key))  # deleted meanwhile: created again, seeded
                elif exc.retryable and (asks or attempt < 8):
                    store.metrics.retries.labels("error").inc()
                    fresh = True
                else:
                    _answer(asks, _Verdict(unavailable=_reason(exc)))
                    if releases:
                        log.warning("releasing charges from %s failed: %s", self.key.describe(), exc)
                    return
                attempt += 1
                if not asks and attempt >= 8:
                    log.warning("releasing charges from %s failed %d times: %s", self.key.describe(), attempt, exc)
                    return
                pause = store.pause(attempt)
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
