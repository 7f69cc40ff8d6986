"""Keeping the GPU quota ledger true: releases, the window, recounts; and the ledger as ``serve`` runs it.

- A pod the cluster view sees finish or go (Succeeded, Failed, deleted)
  releases its charges at once (the index's pod watch); one being deleted
  (Terminating) keeps them until ``deletionTimestamp +
  deletionGracePeriodSeconds`` has passed, as ResourceQuota counts it
  (``webhook.kube.termination``): released then by the sweep, or at once
  when it is gone.
- A charge whose pod the view has not shown within the window
  (``--quota-window``) is checked with a read of the pod, and released unless
  the pod exists with that uid (refused by a later admission plugin or webhook,
  a failed etcd write, a client that gave up, a name generated again, a
  review forged to the webhook's port); when the API server cannot be asked,
  released all the same once ``UNREACHABLE_WINDOWS`` windows old.
- Every ``--quota-recount`` seconds, and when the index lists the pods again
  or a namespace's labels change, each ledger is recounted from the view's
  pods (``webhook.ledger.recount``): a pod holding GPUs without a charge is
  charged, a charge the policies no longer make is removed.
- Every replica watches the ledger objects, so each knows the others' charges
  and the caps they state (``webhook.ledger.statements``): it renews its
  own statements (``state``) at least every ``lease / 4`` seconds, and
  counts and recounts pods under its policies and the live statements of
  other policy versions together.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import random
import time
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from typing import Any
from urllib.parse import quote

from kubernetes import client
from prometheus_client import CollectorRegistry

from webhook.cluster import kinds
from webhook.cluster.index import ClusterIndex
from webhook.cluster.session import ApiError, ApiSession
from webhook.cluster.watch import ResourceWatch, WatchSettings
from webhook.kube import names, termination
from webhook.ledger import document, recount, reservation, statements
from webhook.ledger.charger import Ledger
from webhook.ledger.document import Entry
from webhook.ledger.metrics import LedgerMetrics
from webhook.ledger.serving import LedgerServing
from webhook.ledger.settings import LedgerSettings
from webhook.ledger.store import LedgerStore
from webhook.policy.charges import Holding, LedgerKey
from webhook.policy.loader import PolicySet
from webhook.view.aggregates import pod_key
from webhook.view.protocol import Object

log = logging.getLogger(__name__)

KIND = kinds.Kind(document.PLURAL, document.KIND, document.API_VERSION, "CustomObjectsApi",
                  "list_namespaced_custom_object")
#: event-driven releases wait up to this long (at random), so that of the replicas that all saw the
#: pod go, one usually writes and the others find the charge gone already
RELEASE_SPREAD = 0.25
#: the upkeep's beat (at most; a shorter sweep interval beats faster)
TICK = 1.0
#: a charge whose pod the API server could not be asked about (not reached, 5xx) is released once this
#: many windows old all the same: a charge is kept only by its pod seen to exist (docs/quota.md)
UNREACHABLE_WINDOWS = 3
#: a ledger is settled once its recent part holds this many charges of stored pods or released ones
#: (more for a large ledger: _batch), or after this many seconds since it was last settled
SETTLE_BATCH, SETTLE_AFTER = 32, 5.0


class Upkeep:
    """The background work that keeps one process's view of the ledgers, and the ledgers, true."""

    def __init__(self, ledger: Ledger, index: ClusterIndex, policies: Callable[[], PolicySet]) -> None:
        self.ledger, self.index, self._policies = ledger, index, policies
        self._recount_due = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._rng = random.Random()
        self._settled_at: dict[LedgerKey, float] = {}
        #: stored pods the pod watch saw holding GPUs with no charge known here: charged at the next beat
        self._uncharged: dict[str, Object] = {}
        self._moved: dict[str, Object] = {}  # charged pods whose scheduling gates were lifted
        #: the statements of other policy versions last logged
        self._others: frozenset[str] = frozenset()
        #: whether the ledger watch has listed the ledgers (what other policy versions state is known)
        self.listed = False

    def counted(self) -> PolicySet:
        """What a pod's charges are counted by: this replica's policies, and the live caps other policy
        versions state in the ledgers (a recount never removes a charge one of them makes)."""
        return statements.union(self._policies(), self.ledger.store.others())

    # ------------------------------------------------------------ what a new ledger starts with

    async def seed(self, key: LedgerKey) -> Mapping[str, Holding]:
        """The pods the view shows in the ledger's group, as they would be charged (off the event loop)."""
        if not self._view_known():
            return {}
        names = recount.namespaces_of(key, self.index.namespaces())
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(None, recount.holdings, self.counted(), self.index, key, names,
                                          self.ledger.store.now())

    def _view_known(self) -> bool:
        return all(self.index.availability(r).known for r in ("pods", "namespaces"))

    # ------------------------------------------------------------ the loops

    async def run(self) -> None:
        """Settle and sweep every few seconds, recount every ``recount`` seconds or when due, until cancelled."""
        self._loop = asyncio.get_running_loop()
        settings = self.ledger.settings
        now = self._loop.time()
        next_sweep, next_recount = now + settings.sweep, now + settings.recount
        while True:
            # replicas tick out of step: fewer of them try to settle one ledger at the same moment.
            # (asyncio.timeout, not wait_for: on Python 3.11 wait_for swallows a cancellation that
            # arrives as the event is set, as the first lists do at startup, and this loop ran on
            # for ever, holding up the shutdown)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(min(settings.sweep, TICK) * (0.75 + self._rng.random() / 2)):
                    await self._recount_due.wait()
            try:
                await self.state()
                await self.settle()
                if self._uncharged or self._moved:
                    await self.heal()
                if self._loop.time() >= next_sweep:
                    next_sweep = self._loop.time() + settings.sweep
                    await self.sweep()
                if self._recount_due.is_set() or self._loop.time() >= next_recount:
                    self._recount_due.clear()
                    next_recount = self._loop.time() + settings.recount
                    await self.recount()
            except Exception:  # noqa: BLE001 - the upkeep must outlive any one failure
                log.exception("GPU quota ledger upkeep failed")

    async def state(self) -> None:
        """Renew this replica's statements of its caps in the anchor ledgers when due (made when missing: a
        replica states its caps before any pod is charged; ``webhook.ledger.statements``); say which caps of
        other policy versions are enforced here too. The replica is Ready once its ledger watch has listed (it
        knows what other versions state) and its anchors state its caps. (The other ledgers state them in
        every write this replica makes of them: each replica reads the union of every ledger's statements,
        so the anchors' renewals alone keep them live, one write per lease / 4 and model label.)"""
        store = self.ledger.store
        anchors = {statements.anchor(store.settings.namespace, label) for label, _ in store.stating().values()}
        stated = True
        for key in sorted(anchors, key=lambda k: k.model_label):
            if store.recent(key) is None or store.due(key):
                try:
                    await store.restate(key)
                except ApiError as exc:
                    stated = False
                    log.warning("stating this replica's caps in the GPU quota ledger of %s failed: %s", key.describe(),
                                exc)
        if stated and self.listed:
            self.ledger.unstated = ""
        self.note_others()

    def note_others(self) -> None:
        """The metric and log line of the caps other policy versions state: enforced here while they live."""
        store = self.ledger.store
        others = store.others()
        unreadable = sorted(d for d, definition in others.items() if statements.readable(definition) is None)
        metrics = self.ledger.metrics
        metrics.stated.labels("own").set(len(store.stating()))
        metrics.stated.labels("other").set(len(others) - len(unreadable))
        metrics.stated.labels("unreadable").set(len(unreadable))
        seen = frozenset(others)
        if seen == self._others:
            return
        added, gone = sorted(seen - self._others), sorted(self._others - seen)
        self._others = seen
        for digest in added:
            name = statements.name_of(others[digest])
            if digest in unreadable:
                log.error("another policy version states caps this version cannot read (policy %s, digest %s): they "
                          "are not enforced by this replica", name, digest)
            else:
                log.warning("enforcing the caps of policy %s as another policy version states them (digest %s) "
                            "beside this replica's own, until no replica renews them for %gs: while two versions "
                            "overlap, the stricter cap holds", name, digest, self.ledger.settings.lease)
        if gone:
            log.info("caps stated by another policy version lapsed (digests %s): this replica's own caps alone "
                     "apply to them now", ", ".join(gone))

    async def settle(self) -> None:
        """Settle the ledgers whose recent part holds enough charges of pods seen stored (or released
        charges), or has held some for a while: admission's writes stay small."""
        if not self.index.availability("pods").known:
            return
        store, now = self.ledger.store, self.ledger.store.now()
        for key in list(store.holdings()):
            recent = store.recent(key)
            if recent is None:
                continue
            ready = sum(1 for uid, entry in recent.charges.items() if self._stored(uid, entry))
            due = ready + len(recent.released)
            if not due:
                continue
            if due < _batch(store, key) and now - self._settled_at.get(key, 0.0) < SETTLE_AFTER:
                continue
            self._settled_at[key] = now
            try:
                await store.settle(key, self._stored)
            except ApiError as exc:
                log.warning("settling the GPU quota ledger of %s failed: %s", key.describe(), exc)

    def _stored(self, uid: str, entry: Entry) -> bool:
        """The view shows this very pod: its charge may be settled."""
        pod = self.index.pod(entry.holding.namespace, entry.holding.name)
        return pod is not None and recount.uid_of(pod) == uid

    async def sweep(self) -> None:
        """Release the charges of pods that finished, and of pods not seen within the window and not found."""
        if not self.index.availability("pods").known:
            return
        ledger = self.ledger
        now, window = ledger.store.now(), ledger.settings.window
        finished: set[str] = set()
        deleted: set[str] = set()
        overdue: dict[str, Entry] = {}
        in_flight = 0
        lapsed: set[LedgerKey] = set()
        for key, entries in ledger.store.holdings().items():
            for uid, entry in entries.items():
                if reservation.is_reservation(uid):
                    if now - entry.at >= window:
                        lapsed.add(key)  # a replica that is gone held it: freed by a recount
                    continue
                pod = self.index.pod(entry.holding.namespace, entry.holding.name)
                if pod is not None and recount.uid_of(pod) == uid:
                    if not recount.live(pod, now):
                        # (its watch event released it, unless that write failed; or its grace period
                        # passed while it stayed Terminating: no event says so)
                        (deleted if termination.terminating(pod) else finished).add(uid)
                elif now - entry.at < window:
                    in_flight += 1
                else:
                    overdue[uid] = entry
        ledger.metrics.in_flight.set(in_flight)
        if finished:
            ledger.release_pods(finished, "finished")
        if deleted:
            ledger.release_pods(deleted, "deleted")
        for uid, entry in overdue.items():
            found = await self._exists(entry.holding.namespace, entry.holding.name, uid)
            # kept only while the pod is known to exist; an API server that cannot say delays the
            # release, for UNREACHABLE_WINDOWS windows at most (a ghost must not hold a cap for ever)
            if found is False or (found is None and now - entry.at >= UNREACHABLE_WINDOWS * window):
                ledger.release_pods([uid], "unseen")
        for key in lapsed:
            try:
                await self._recount(key)
            except ApiError as exc:
                log.warning("freeing the reservations of %s failed: %s", key.describe(), exc)

    async def _exists(self, namespace: str, name: str, uid: str) -> bool | None:
        """Whether the pod exists with this uid and holds its GPUs, read from the API server (the view may
        lag); None when the API server cannot say (not reached, 5xx, 429). Any other answer is a no: a 404,
        and a 400 or 422 (a name no pod can have, as in a review forged to the webhook's port)."""
        if not (names.is_dns_label(namespace) and names.is_dns_subdomain(name)):
            return False  # no pod has that name: nothing to read
        path = f"/api/v1/namespaces/{quote(namespace, safe='')}/pods/{quote(name, safe='')}"
        try:
            pod = await self.ledger.store.session.request("GET", path, timeout=5.0)
        except ApiError as exc:
            return None if exc.status == 0 or exc.status == 429 or exc.status >= 500 else False
        return recount.uid_of(pod) == uid and recount.live(pod, self.ledger.store.now())

    def uncharged(self, pod: Object) -> None:
        """On the loop: the pod watch saw this stored pod hold GPUs; noted when no ledger known here charges it."""
        uid = recount.uid_of(pod)
        if uid and not self.ledger.store.ledgers_of(uid) and not self.ledger.admitted_unrecorded(uid):
            self._uncharged[uid] = pod

    def ungated(self, pod: Object) -> None:
        """On the loop: the pod watch saw a charged pod's scheduling gates lifted (its constraints may have
        narrowed with them: KEP-3838): its ledgers are recounted at the next beat, which corrects its charge."""
        uid = recount.uid_of(pod)
        if uid:
            self._moved[uid] = pod

    async def heal(self) -> None:
        """Charge the stored pods seen holding GPUs with no charge, at once rather than at the next periodic
        recount: each ledger such a pod would be charged to is recounted (a fresh read first: a charge another
        replica wrote that this one's ledger watch has not delivered yet is found, not written twice). The
        ledgers of pods just ungated are recounted too, which corrects their charges."""
        pods, self._uncharged = self._uncharged, {}
        moved, self._moved = self._moved, {}
        if not self._view_known():
            return
        pods = {uid: pod for uid, pod in pods.items() if not self.ledger.store.ledgers_of(uid)}
        if not pods and not moved:
            return
        loop = asyncio.get_running_loop()
        keys = await loop.run_in_executor(None, recount.ledgers_of, self.counted(), self.index,
                                          [*pods.values(), *moved.values()], self.ledger.store.now())
        for key in sorted(keys, key=lambda k: (k.scope, k.team_label, k.group, k.model_label)):
            try:
                added = await self._recount(key)
            except ApiError as exc:
                log.warning("charging the pods of %s that held GPUs with no charge failed: %s", key.describe(), exc)
                continue
            healed = sorted(f"{e.holding.namespace}/{e.holding.name}" for u, e in added.items() if u in pods)
            if healed:
                self.ledger.metrics.healed.inc(len(healed))
                log.warning("charged %d pods holding GPUs with no charge in the GPU quota ledger of %s (seen by the "
                            "pod watch): %s", len(healed), key.describe(), ", ".join(healed[:10]))

    async def recount(self) -> None:
        """Each ledger known against the pods of its group: charge what is not charged, remove what no policy charges."""
        if not self._view_known():
            return
        for key in list(self.ledger.store.holdings()):
            try:
                await self._recount(key)
            except ApiError as exc:
                log.warning("recounting the GPU quota ledger of %s failed: %s", key.describe(), exc)

    async def _recount(self, key: LedgerKey, attempts: int = 3) -> dict[str, Entry]:
        """One ledger, written against the version it was recounted from: a charge released meanwhile is
        not put back (the write is refused, and the recount done again). The charges it added."""
        store = self.ledger.store
        for attempt in range(attempts):
            # the ledger first, then the view: a pod that goes after the view was read is released by a
            # write the precondition below sees, and one that went before is not in the view
            obj, recent = await store.current(key, True, 10.0)
            settled = await store.settled(key, recent.generation, 10.0, fresh=True) if recent.generation else None
            held = document.holdings(recent, settled)
            expected = await self.seed(key)
            now = store.now()
            added = {uid: Entry(h, now) for uid, h in expected.items() if uid not in held}
            # a holding that no longer says what the pod holds (its scheduling gates lifted with a
            # nodeSelector or affinity added, which only narrows its models; a line of an older version):
            # the charge made again from the pod as it is, from when it was first charged
            corrected = {uid: Entry(h, held[uid].at) for uid, h in expected.items()
                         if uid in held and held[uid].holding != h and self._seen_live(uid, held[uid])}
            # a reservation a window old is of a replica that is gone (a live one returns its own well
            # before): the pods it admitted are stored by now, so in ``expected``
            removed = {uid for uid, entry in held.items()
                       if (uid not in expected and self._seen_live(uid, entry))
                       or (reservation.is_reservation(uid) and now - entry.at >= self.ledger.settings.window)}
            if not added and not removed and not corrected:
                return {}
            charges = {uid: entry for uid, entry in recent.charges.items() if uid not in removed}
            charges.update(added)
            charges.update(corrected)
            try:
                await store.write(obj, charges, recent.released | removed)
            except ApiError as exc:
                if exc.status != 409 or attempt == attempts - 1:
                    raise
                continue
            store.metrics.corrections.labels("added").inc(len(added))
            store.metrics.corrections.labels("removed").inc(len(removed))
            store.metrics.corrections.labels("corrected").inc(len(corrected))
            if removed:
                store.metrics.releases.labels("recount").inc(len(removed))
            log.info("recounted the GPU quota ledger of %s: %d charges added, %d removed, %d corrected",
                     key.describe(), len(added), len(removed), len(corrected))
            return added
        return {}

    def _seen_live(self, uid: str, entry: Entry) -> bool:
        """The view holds this very pod, alive: a charge no policy makes any more (the others are the sweep's)."""
        pod = self.index.pod(entry.holding.namespace, entry.holding.name)
        return pod is not None and recount.uid_of(pod) == uid and recount.live(pod, self.ledger.store.now())

    def recount_soon(self) -> None:
        self._recount_due.set()

    # ------------------------------------------------------------ from the watch threads

    def on_loop(self, call: Callable[..., Any], *args: Any) -> None:
        """Run ``call`` on the event loop (from a watch thread); dropped once the loop is gone."""
        loop = self._loop
        if loop is not None:
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(call, *args)

    def release_later(self, uids: list[str], reason: str) -> None:
        """On the loop: release these pods' charges after a short random wait."""
        delay = self._rng.uniform(0, RELEASE_SPREAD)
        asyncio.get_running_loop().call_later(delay, self.ledger.release_pods, uids, reason)


def _batch(store: LedgerStore, key: LedgerKey) -> int:
    """How many charges to settle at once. Every write of the recent part rewrites what it holds (half a
    batch on average), and each settling rewrites the settled part (its cost grows with the pods the
    ledger holds, N). Per charge, with w charges added by a write of the recent part (one per pod when
    each pod's charge is written before its answer; dozens when pods are admitted against reservations
    and recorded in batches), both together are least for a batch of about sqrt(2 N w): 32 at the least."""
    settled = store.settled_size(key)
    return max(SETTLE_BATCH, math.isqrt(int(2 * settled * max(store.per_write(key), 1.0))))


class PodFollower:
    """Told of every pod write of the index (in its watch thread): pods that go release their charges."""

    def __init__(self, upkeep: Upkeep) -> None:
        self._upkeep = upkeep
        self._uids: dict[tuple[str, str], str] = {}  # (only the pods' watch thread calls it)
        self._gated: set[str] = set()  # the uids of pods seen with scheduling gates

    def put(self, pod: Object) -> None:
        key, uid = pod_key(pod), recount.uid_of(pod)
        old = self._uids.get(key)
        self._uids[key] = uid
        if old and old != uid:
            self._released([old], "deleted")
        # a pod being deleted keeps its charge for its grace period (the sweep releases it after, if it is
        # still there: ResourceQuota counts it so)
        if not recount.live(pod, self._upkeep.ledger.store.now()):
            self._released([uid], "deleted" if termination.terminating(pod) else "finished")
        elif uid and not self._upkeep.ledger.store.holds(uid):
            # stored and holding, and no ledger known here charges it: charged at once (self-healing). The
            # check first, here in the watch thread (a lookup: atomic), spares the loop a call per update of
            # every charged pod (status changes, a bind)
            self._upkeep.on_loop(self._upkeep.uncharged, pod)
        if uid and (pod.get("spec") or {}).get("schedulingGates"):
            self._gated.add(uid)
        elif uid in self._gated:
            self._gated.discard(uid)
            if recount.live(pod, self._upkeep.ledger.store.now()) and self._upkeep.ledger.store.holds(uid):
                self._upkeep.on_loop(self._upkeep.ungated, pod)

    def discard(self, namespace: str, name: str) -> None:
        uid = self._uids.pop((namespace, name), None)
        if uid:
            self._gated.discard(uid)
            self._released([uid], "deleted")

    def replace(self, objects: Iterable[Object]) -> None:
        fresh = {pod_key(p): recount.uid_of(p) for p in objects}
        gone = set(self._uids.values()) - set(fresh.values())
        self._uids = fresh
        self._gated &= set(fresh.values())
        self._released(sorted(u for u in gone if u), "deleted")
        self._upkeep.on_loop(self._upkeep.recount_soon)

    def _released(self, uids: list[str], reason: str) -> None:
        if uids:
            self._upkeep.on_loop(self._upkeep.release_later, uids, reason)


class NamespaceFollower:
    """A namespace whose labels change may move between teams: recount."""

    def __init__(self, upkeep: Upkeep) -> None:
        self._upkeep = upkeep
        self._labels: dict[str, Any] = {}

    def put(self, namespace: Object) -> None:
        meta = namespace.get("metadata") or {}
        name, labels = str(meta.get("name") or ""), meta.get("labels") or {}
        if name in self._labels and self._labels[name] != labels:
            self._upkeep.on_loop(self._upkeep.recount_soon)
        self._labels[name] = labels

    def discard(self, namespace: str, name: str) -> None:
        self._labels.pop(name, None)

    def replace(self, objects: Iterable[Object]) -> None:
        self._labels = {str((o.get("metadata") or {}).get("name") or ""): (o.get("metadata") or {}).get("labels") or {}
                        for o in objects}
        self._upkeep.on_loop(self._upkeep.recount_soon)


class LedgerFollower:
    """Told of every ledger object the ledger watch writes (in its thread): the ledger learns of it."""

    def __init__(self, upkeep: Upkeep) -> None:
        self._upkeep = upkeep
        self._names: set[str] = set()

    def put(self, obj: Object) -> None:
        self._names.add(str((obj.get("metadata") or {}).get("name") or ""))
        self._upkeep.on_loop(self._upkeep.ledger.store.known, obj)

    def discard(self, namespace: str, name: str) -> None:
        self._names.discard(name)
        self._upkeep.on_loop(self._upkeep.ledger.store.forget, name)

    def replace(self, objects: Iterable[Object]) -> None:
        listed = list(objects)
        names = {str((o.get("metadata") or {}).get("name") or "") for o in listed}
        for name in self._names - names:
            self._upkeep.on_loop(self._upkeep.ledger.store.forget, name)
        self._names = names
        for obj in listed:
            self._upkeep.on_loop(self._upkeep.ledger.store.known, obj)
        self._upkeep.on_loop(setattr, self._upkeep, "listed", True)


@contextlib.asynccontextmanager
async def running(api_client: client.ApiClient, index: ClusterIndex, policies: Callable[[], PolicySet],
                  settings: LedgerSettings, registry: CollectorRegistry) -> AsyncIterator[Ledger]:
    """The ledger as ``serve`` runs it: its API session, the watch of the ledger objects, the upkeep.

    Enter before the index starts (it follows the index's pods and namespaces)."""
    metrics = LedgerMetrics(registry, settings.window)
    session = ApiSession(api_client.configuration)
    async with session.running():
        # every age on the API server's clock (webhook.cluster.clock): replicas' wall clocks may differ
        ledger = Ledger(LedgerStore(session, settings, metrics, clock=session.clock.now))
        ledger.serving = LedgerServing(session, policies, metrics)
        ledger.unstated = ("GPU quota ledger: the caps the ledgers state (every policy version's) not read yet, or "
                           "this replica's not stated yet")
        serving = asyncio.create_task(ledger.serving.run())
        upkeep = Upkeep(ledger, index, policies)
        ledger.store.seeder = upkeep.seed
        ledger.store.stating = lambda: statements.own(policies())
        index.follow("pods", PodFollower(upkeep))
        index.follow("namespaces", NamespaceFollower(upkeep))
        custom = client.CustomObjectsApi(api_client)

        def lister(**options: Any) -> Any:
            return custom.list_namespaced_custom_object(document.GROUP, document.VERSION, settings.namespace,
                                                        document.PLURAL, **options)

        watch = ResourceWatch(KIND, lister, kinds.shaper(KIND, lambda _: True), WatchSettings(),
                              clock=time.monotonic, rng=random.Random(), listener=LedgerFollower(upkeep))
        task = asyncio.create_task(upkeep.run())
        await asyncio.sleep(0)  # (the upkeep notes its loop before the watches deliver)
        watch.start()
        try:
            yield ledger
        finally:
            watch.stop()
            for running_task in (task, serving):
                running_task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await running_task
            await ledger.stop()
