"""A model test of the GPU quota ledger: random interleavings of charges, conflicts, releases and recounts.

The real :class:`~webhook.ledger.charger.Ledger` and
:class:`~webhook.ledger.upkeep.Upkeep` of several replicas run
against :class:`ModelApi`, an in-memory API server holding exactly what the
ledger relies on of kube-apiserver (objects with a resourceVersion, replaces
refused with 409 when their precondition is stale, 404 for what does not
exist; the e2e suite shows the real one does the same). Every
request the ledgers send waits until hypothesis picks it, so the order in
which the replicas' reads and writes reach the "API server" is hypothesis's
choice; so are which replica sees which ledger version (the watch), which
admitted pods are stored and which never appear, which finish, and when a
sweep or a recount runs.

The replicas may run different policy versions (a rollout): each has the
team cap in ``enforce`` at 4, raised to 6, lowered to 2, or not at all (the
cap removed, ``off`` or ``warn``: no charge of its own). Each states its cap
in the ledger (``webhook.ledger.statements``) before the pods come, and
judges a pod under its own cap and the live statements its store knows, as
the server does (``webhook.server.charging``); a recount counts a pod when
any of them charges it, as ``Upkeep.counted`` does.

Properties: at every step the GPUs of the pods admitted and stored and not
finished stay within the strictest cap any replica enforces (no interleaving
overshoots, whichever replica admits), and once every request has been
answered, the window has passed and a recount has run, the ledger holds
exactly the pods that hold GPUs. Some pods name one of two shared
ResourceClaims (of 2 and 3 devices) rather than hold a GPU of their own: a
claim's devices count once however many pods holding GPUs name it.
"""

from __future__ import annotations

import asyncio
import copy
import json
import random
import re
from collections.abc import Mapping
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from email.utils import formatdate
from decimal import Decimal
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from webhook.cluster.clock import ServerClock
from webhook.cluster.session import ApiError
from webhook.kube import termination
from webhook.ledger import document
from webhook.ledger.charger import Ledger, Settlement
from webhook.ledger.metrics import LedgerMetrics
from webhook.ledger.settings import LedgerSettings
from webhook.ledger.store import LedgerStore
from webhook.ledger.upkeep import PodFollower, Upkeep
from webhook.policy.charges import CapCheck, Charge, Holding, LedgerKey
from webhook.view.protocol import KNOWN, Availability

CAP = 4
NAMESPACE = "gpu-admission"
KEY = LedgerKey("team", "vision", "team", "nvidia.com/gpu.product")
WINDOW = 60.0
#: a deleted pod's grace period (seconds): it stays Terminating (no kubelet) and holds its GPU for two
#: of them (kube-apiserver writes deletionTimestamp = the delete + the grace)
GRACE = 30
EPOCH = 1_700_000_000.0  # the model's clock starts here (unix seconds)


def _holds(pod: Mapping[str, Any], now: float) -> bool:
    """ResourceQuota's rule (QuotaV1Pod), written out here as the model's oracle: not finished, and not
    deleted longer ago than its grace period allows."""
    if pod["status"]["phase"] != "Running":
        return False
    stamp = pod["metadata"].get("deletionTimestamp")
    if stamp is None:
        return True
    return now <= datetime.fromisoformat(stamp).timestamp() + pod["metadata"]["deletionGracePeriodSeconds"]


@dataclass
class _Pending:
    method: str
    path: str
    body: Any
    future: asyncio.Future[dict[str, Any]]


@dataclass
class ModelApi:
    """The API server as the ledger uses it, each request answered when the test says so."""

    objects: dict[str, dict[str, Any]] = field(default_factory=dict)
    pods: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    pending: list[_Pending] = field(default_factory=list)
    version: int = 0

    async def request(self, method: str, path: str, body: Any = None, *, timeout: float,
                      content_type: str = "application/json") -> dict[str, Any]:
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self.pending.append(_Pending(method, path, copy.deepcopy(body), future))
        return await future

    def answer(self, index: int) -> None:
        """Answer one waiting request, now, atomically."""
        request = self.pending.pop(index)
        try:
            request.future.set_result(self._apply(request.method, request.path, request.body))
        except ApiError as exc:
            request.future.set_exception(exc)

    def _apply(self, method: str, path: str, body: Any) -> dict[str, Any]:
        parts = path.strip("/").split("/")
        if parts[:2] == ["api", "v1"]:  # GET a pod
            found = self.pods.get((parts[3], parts[5]))
            if found is None:
                raise ApiError(404, "pod not found")
            return copy.deepcopy(found)
        name = parts[-1] if parts[-1] != document.PLURAL else ""
        if method == "POST":
            name = body["metadata"]["name"]
            if name in self.objects:
                raise ApiError(409, "already exists")
            return self._store(name, body)
        current = self.objects.get(name)
        if current is None:
            raise ApiError(404, "not found")
        if method == "GET":
            return copy.deepcopy(current)
        assert method == "PUT", method
        wanted = (body.get("metadata") or {}).get("resourceVersion")
        if wanted != current["metadata"]["resourceVersion"]:
            raise ApiError(409, "the object has been modified")
        changed = copy.deepcopy(body)  # (a replace: the object sent, its metadata kept by the server)
        changed["metadata"] = copy.deepcopy(current["metadata"])
        if changed == current:
            return copy.deepcopy(current)
        return self._store(name, changed)

    def _store(self, name: str, obj: dict[str, Any]) -> dict[str, Any]:
        self.version += 1
        stored = copy.deepcopy(obj)
        stored["metadata"]["resourceVersion"] = str(self.version)
        self.objects[name] = stored
        return copy.deepcopy(stored)

    def charged(self) -> dict[str, Any]:
        """What the ledger holds, both its parts read."""
        return dict(document.effective(list(self.objects.values())).get(KEY, {}))


@dataclass
class _Session:
    """One replica's session with the model's API server: each answer dated by the API server's clock (the
    model's), read by the replica's :class:`ServerClock`, whose own wall clock may be off by any amount."""

    api: ModelApi
    clock: ServerClock
    server: Callable[[], float]

    async def request(self, method: str, path: str, body: Any = None, *, timeout: float,
                      content_type: str = "application/json") -> dict[str, Any]:
        sent = self.clock.local()
        try:
            return await self.api.request(method, path, body, timeout=timeout)
        finally:
            self.clock.sample(sent, self.clock.local(), formatdate(self.server(), usegmt=True))


class _Store(LedgerStore):
    def pause(self, attempt: int) -> float:
        return 0.0  # (hypothesis orders the requests; a real pause would only slow the test)


@dataclass
class ModelIndex:
    """What a replica's cluster view shows: the stored pods."""

    api: ModelApi

    def availability(self, resource: str) -> Availability:
        return KNOWN

    def pod(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        return self.api.pods.get((namespace, name))


class _Upkeep(Upkeep):
    async def seed(self, key: LedgerKey) -> Mapping[str, Holding]:
        # the pods any cap charges, this replica's or one another version states (Upkeep.counted); none in
        # another ledger (the anchors of the statements, in the webhook's namespace)
        if not _caps_of(self.ledger) or key != KEY:
            return {}
        now = self.ledger.store.now()
        return {p["metadata"]["uid"]: _holding(p["metadata"]["name"]) for p in self.index.api.pods.values()  # type: ignore[attr-defined]
                if _holds(p, now)}

    def _view_known(self) -> bool:
        return True

    def on_loop(self, call: Any, *args: Any) -> None:
        call(*args)  # (the model's watch runs on the loop)

    def release_later(self, uids: list[str], reason: str) -> None:
        self.ledger.release_pods(uids, reason)  # (hypothesis orders the requests: no random wait)


#: the ResourceClaims pods may share, and their devices: a pod ``p<n>-<claim>`` names one, ``p<n>`` holds a GPU
CLAIMS = {"s2": 2, "s3": 3}


def _claim_of(name: str) -> str:
    return name.partition("-")[2]


def _holding(name: str) -> Holding:
    claim = _claim_of(name)
    if not claim:
        return Holding("ml-a", name, "", None, (("nvidia.com/gpu", Decimal(1)),))
    gpus = (("nvidia.com/gpu", Decimal(CLAIMS[claim])),)
    return Holding("ml-a", name, "", None, gpus, ((claim, gpus),))


#: the team cap of each policy version a replica may run: as it was, raised, lowered; None: not enforced
#: (removed, off or warn)
VERSIONS = (CAP, CAP + 2, CAP - 2, None)


def _definition(cap: int) -> str:
    """A policy version's statement (the model's stand-in for the policy reduced to its quota rule)."""
    return json.dumps({"cap": cap})


def _stating(cap: int | None) -> dict[str, tuple[str, str]]:
    return {f"cap-{cap}": (KEY.model_label, _definition(cap))} if cap is not None else {}


def _caps_of(ledger: Ledger) -> set[int]:
    """The caps a replica judges a pod under: its own, and those other versions state (live)."""
    own = {json.loads(d)["cap"] for _, d in ledger.store.stating().values()}
    return own | {json.loads(d)["cap"] for d in ledger.store.others().values()}


def _charge(name: str, caps: set[int] | None = None) -> Charge:
    checks = tuple(CapCheck("caps", f"Pod ml-a/{name}", "/spec/containers", "nvidia.com/gpu", "*", (), cap, True)
                   for cap in sorted({CAP} if caps is None else caps))
    return Charge(KEY, f"uid-{name}", _holding(name), checks)


async def _admit(ledger: Ledger, name: str) -> Settlement:
    """A pod admitted by a replica: charged under its caps (none: allowed uncharged, as a replica that
    enforces no cap and knows of none allows it)."""
    caps = _caps_of(ledger)
    if not caps:
        return Settlement()
    return await ledger.settle([_charge(name, caps)], False)


@dataclass
class World:
    """The replicas, the API server, the clock, and what became of each pod."""

    api: ModelApi
    ledgers: list[Ledger]
    upkeeps: list[Upkeep]
    clock: list[float]
    tasks: dict[str, asyncio.Task[Any]] = field(default_factory=dict)
    admitted: set[str] = field(default_factory=set)  # allowed by a replica
    refused: set[str] = field(default_factory=set)
    reserving: bool = False
    claims: bool = False
    #: the strictest cap any replica enforces (None: none does)
    cap: int | None = CAP

    followers: list[PodFollower] = field(default_factory=list)

    def holding(self) -> set[str]:
        """The uids of the pods admitted, stored, not finished, and not deleted longer ago than their grace
        period allows (as ResourceQuota counts them): what holds GPUs."""
        return {p["metadata"]["uid"] for p in self.api.pods.values() if _holds(p, self.clock[0])}

    def gpus(self) -> int:
        """The GPUs the pods that hold GPUs hold: one each, or the devices of the claim they name, once
        however many of them name it."""
        names = [p["metadata"]["name"] for p in self.api.pods.values() if _holds(p, self.clock[0])]
        return sum(1 for n in names if not _claim_of(n)) + sum(CLAIMS[c] for c in {_claim_of(n) for n in names} - {""})


async def _quiet() -> None:
    """Let every task run until each waits on a request (or is done)."""
    for _ in range(30):
        await asyncio.sleep(0)


ACTIONS = st.lists(st.tuples(
    st.sampled_from(["admit"] * 3 + ["answer"] * 4 + ["watch", "finish", "delete", "gone", "sweep", "recount",
                                                        "settle", "state"]),
    st.integers(0, 1000), st.booleans()), min_size=30, max_size=90)


#: reservations as the model grants them: all the room the cap leaves, whenever a GPU fits
RESERVING = {"reserve_max": CAP, "reserve_min": 1, "reserve_share": 1, "record_every": 0.0}


class _Settings(LedgerSettings):
    @property
    def lease(self) -> float:
        # statements live through the run (the model jumps the clock by windows, and renews only when
        # hypothesis says so): their lapse is test_a_raised_cap_takes_effect_once_the_old_statement_lapses'
        return 1e9


#: how far a replica's wall clock may be from the API server's: none, or more than the window either way
SKEWS = st.tuples(*[st.sampled_from([0.0, 0.0, 2.5 * WINDOW, -2.5 * WINDOW])] * 3)


async def _play(actions: list[tuple[str, int, bool]], replicas: int, reserving: bool,
                versions: tuple[int | None, ...] = (CAP,) * 3, skews: tuple[float, ...] = (0.0,) * 3,
                claims: bool = False) -> None:
    api = ModelApi()
    clock = [EPOCH]  # the API server's
    ledgers: list[Ledger] = []
    upkeeps: list[Upkeep] = []
    for i in range(replicas):
        options: dict[str, Any] = RESERVING if reserving else {"reserve_max": 0}
        # the replica's ages on the API server's clock, as serve reads it (webhook.cluster.clock)
        server_clock = ServerClock(lambda skew=skews[i]: clock[0] + skew)  # type: ignore[misc]
        store = _Store(_Session(api, server_clock, lambda: clock[0]),  # type: ignore[arg-type]
                       _Settings(namespace=NAMESPACE, window=WINDOW, budget=1e6, **options),  # type: ignore[arg-type]
                       LedgerMetrics(CollectorRegistry(), WINDOW), clock=server_clock.now, rng=random.Random(0))
        mine = _stating(versions[i])
        store.stating = lambda mine=mine: mine  # type: ignore[misc]
        replica = Ledger(store)
        upkeep = _Upkeep(replica, ModelIndex(api), lambda: None)  # type: ignore[arg-type, return-value]
        store.seeder = upkeep.seed
        ledgers.append(replica)
        upkeeps.append(upkeep)
    enforced = [c for c in versions[:replicas] if c is not None]
    world = World(api, ledgers, upkeeps, clock, reserving=reserving, claims=claims, followers=[PodFollower(u) for u in upkeeps],
                  cap=min(enforced, default=None))
    # the replicas started before the pods come: each read the API server (its clock too: serve is not
    # Ready before discovery answered) and stated its caps, and each one's watch saw the ledger
    await _run_through(world, [ledger.store.restate(KEY) if ledger.store.stating() else ledger.store.current(KEY, True, 1e6)
                               for ledger in ledgers])
    for each in ledgers:
        for obj in api.objects.values():
            each.store.known(copy.deepcopy(obj))
    serials = iter(range(1000))
    stores: dict[str, bool] = {}

    for action, pick, flag in actions:
        if action == "admit":
            name = f"p{next(serials)}"
            if claims and pick % 3:
                name += "-" + sorted(CLAIMS)[pick % 2]
            stores[name] = flag or pick % 4 != 0  # most admitted pods are stored; some never appear
            world.tasks[name] = asyncio.ensure_future(_admit(ledgers[pick % replicas], name))
        elif action == "answer" and api.pending:
            api.answer(pick % len(api.pending))
        elif action == "watch" and api.objects:  # a replica's watch delivers the ledger as it is now
            for obj in api.objects.values():
                ledgers[pick % replicas].store.known(copy.deepcopy(obj))
        elif action == "settle":  # a replica moves what its view shows stored to the settled part
            mover = upkeeps[pick % replicas]
            world.tasks[f"settle-{len(world.tasks)}"] = asyncio.ensure_future(mover.ledger.store.settle(KEY, mover._stored))
        elif action == "finish":
            running = sorted(k for k, p in api.pods.items() if p["status"]["phase"] == "Running")
            if running:
                pod = api.pods[running[pick % len(running)]]
                pod["status"]["phase"] = "Succeeded"
                if flag:  # the watch saw it (else a sweep finds it)
                    world.followers[pick % replicas].put(copy.deepcopy(pod))
        elif action == "delete":  # deleted with a grace period: Terminating (no kubelet ends it)
            alive = sorted(k for k, p in api.pods.items() if not termination.terminating(p))
            if alive:
                pod = api.pods[alive[pick % len(alive)]]
                stamp = datetime.fromtimestamp(clock[0] + GRACE, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
                pod["metadata"].update(deletionTimestamp=stamp, deletionGracePeriodSeconds=GRACE)
                if flag:  # the watch saw it
                    world.followers[pick % replicas].put(copy.deepcopy(pod))
        elif action == "gone" and api.pods:  # a pod's object removed (its kubelet, or a forced delete)
            key = sorted(api.pods)[pick % len(api.pods)]
            del api.pods[key]
            if flag:
                world.followers[pick % replicas].discard(*key)
        elif action == "sweep":
            # the window outlasts any admission (its budget): it passes only while none is under way
            admitting = any(not t.done() for n, t in world.tasks.items() if n.startswith("p"))
            clock[0] += WINDOW + 1 if flag and not admitting else 1.0
            world.tasks[f"sweep-{len(world.tasks)}"] = asyncio.ensure_future(upkeeps[pick % replicas].sweep())
        elif action == "recount":
            world.tasks[f"recount-{len(world.tasks)}"] = asyncio.ensure_future(upkeeps[pick % replicas].recount())
        elif action == "state":  # a replica renews its statements (its upkeep's beat)
            world.tasks[f"state-{len(world.tasks)}"] = asyncio.ensure_future(upkeeps[pick % replicas].state())
        await _quiet()
        _collect(world, stores)
        assert world.cap is None or world.gpus() <= world.cap, (world.holding(), api.charged())

    # the end: every request answered, every replica's watch current, the window past, a sweep and a recount
    await _drain(world, stores)
    for each in ledgers:
        for obj in api.objects.values():
            each.store.known(copy.deepcopy(obj))
    clock[0] += WINDOW + 1
    await _run_through(world, [upkeeps[0].sweep(), upkeeps[0].ledger.store.settle(KEY, upkeeps[0]._stored),
                               upkeeps[0].recount()])
    await _drain(world, stores)
    if world.cap is not None:  # (no replica enforcing a cap: no ledger, nothing charged)
        assert set(api.charged()) == world.holding()
        assert world.gpus() <= world.cap


async def _run_through(world: World, steps: list[Any]) -> list[Any]:
    """Run each step in turn, every request it sends answered at once: what each returned."""
    results = []
    for step in steps:
        task = asyncio.ensure_future(step)
        while not task.done():
            await _quiet()
            while world.api.pending:
                world.api.answer(0)
                await _quiet()
        results.append(task.result())
    return results


async def _drain(world: World, stores: dict[str, bool]) -> None:
    for _ in range(10_000):
        await _quiet()
        _collect(world, stores)
        if not world.api.pending and all(t.done() for t in world.tasks.values()):
            return
        if world.api.pending:
            world.api.answer(0)
    raise AssertionError("the ledgers never went quiet")


def _collect(world: World, stores: dict[str, bool]) -> None:
    """What the admissions that ended said: an allowed pod is stored (or, for some, never appears)."""
    for name, task in world.tasks.items():
        if not name.startswith("p") or not task.done() or name in world.admitted | world.refused:
            continue
        settlement = task.result()
        if (settlement.charged or not settlement.denials) and not settlement.unavailable:
            world.admitted.add(name)
            if stores[name]:
                pod = {"metadata": {"name": name, "namespace": "ml-a", "uid": f"uid-{name}"},
                       "status": {"phase": "Running"}}
                world.api.pods[("ml-a", name)] = pod
                for follower in world.followers:  # (the watches see it: a delete of it is then news)
                    follower.put(copy.deepcopy(pod))
        else:
            # (a recount may charge a pod admitted against a reservation before its owner recorded it:
            # counted twice, until that owner's next write, which is never too few)
            assert settlement.denials, settlement
            used, cap = map(int, re.findall(r"uses (\d+) of (\d+) nvidia.com/gpu", settlement.denials[0].message)[0])
            assert world.reserving or world.claims or used == cap, settlement
            world.refused.add(name)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(actions=ACTIONS, replicas=st.integers(1, 3), reserving=st.booleans(), skews=SKEWS, claims=st.booleans())
def test_no_interleaving_overshoots_a_cap_and_the_ledger_converges_to_the_pods_that_hold_gpus(
    actions: list[tuple[str, int, bool]], replicas: int, reserving: bool, skews: tuple[float, ...], claims: bool
) -> None:
    """Whatever the replicas' wall clocks say (each off from the API server's by more than the window, or
    not): every age is measured on the API server's clock."""
    asyncio.run(_play(actions, replicas, reserving, skews=skews, claims=claims))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(actions=ACTIONS, replicas=st.integers(2, 3), reserving=st.booleans(),
       versions=st.tuples(*[st.sampled_from(VERSIONS)] * 3), skews=SKEWS)
def test_replicas_on_different_policy_versions_hold_the_strictest_cap_and_converge(
    actions: list[tuple[str, int, bool]], replicas: int, reserving: bool, versions: tuple[int | None, ...],
    skews: tuple[float, ...]
) -> None:
    """A rollout: the replicas run the cap as it was, raised, lowered, or not enforced (removed, off,
    warn), in any mix; whichever admits, the strictest cap holds, and a recount by a replica that does
    not define a cap keeps its charges."""
    asyncio.run(_play(actions, replicas, reserving, versions, skews))


async def test_the_upkeep_stops_when_cancelled_whatever_it_was_told_just_before() -> None:
    """Cancelled (as shutdown does) just after a recount was asked for (as the watches' first lists
    do at startup), the upkeep stops: the wait for its next beat never swallows the cancellation
    (``asyncio.wait_for`` does on Python 3.11 when what it waits for finished meanwhile)."""
    api = ModelApi()
    store = _Store(api, LedgerSettings(namespace=NAMESPACE, window=WINDOW, budget=1e6),  # type: ignore[arg-type]
                   LedgerMetrics(CollectorRegistry(), WINDOW), clock=lambda: EPOCH, rng=random.Random(0))
    upkeep = _Upkeep(Ledger(store), ModelIndex(api), lambda: None)  # type: ignore[arg-type, return-value]
    for turns in range(4):  # loop turns between the ask and the cancellation
        task = asyncio.create_task(upkeep.run())
        await asyncio.sleep(0.01)  # waiting for its beat
        upkeep.recount_soon()
        for _ in range(turns):
            await asyncio.sleep(0)
        task.cancel()
        done, _ = await asyncio.wait([task], timeout=5)
        assert done and task.cancelled(), f"the upkeep ran on after its cancellation ({turns} turns after the ask)"


async def test_a_raised_cap_takes_effect_once_the_old_versions_statement_lapses() -> None:
    """An old replica (the cap at 2) and a new one (raised to 4): the new one admits 2 while the old one's
    statement lives, even once the old one is gone (no renewal) until ``lease`` has passed; then 4."""
    api = ModelApi()
    clock = [EPOCH]
    settings_ = LedgerSettings(namespace=NAMESPACE, window=WINDOW, budget=1e6, reserve_max=0)
    stores = []
    for cap in (CAP - 2, CAP):
        store = _Store(api, settings_, LedgerMetrics(CollectorRegistry(), WINDOW),  # type: ignore[arg-type]
                       clock=lambda: clock[0], rng=random.Random(0))
        mine = _stating(cap)
        store.stating = lambda mine=mine: mine  # type: ignore[misc]
        stores.append(store)
    old, new = Ledger(stores[0]), Ledger(stores[1])
    world = World(api, [old, new], [], clock)
    await _run_through(world, [old.store.restate(KEY), new.store.restate(KEY)])
    new.store.known(copy.deepcopy(api.objects[document.name_of(KEY)]))

    async def admitted(names: list[str]) -> list[str]:
        settlements = await _run_through(world, [_admit(new, name) for name in names])
        return [name for name, settlement in zip(names, settlements, strict=True) if settlement.charged]

    assert await admitted(["a", "b", "c"]) == ["a", "b"]
    clock[0] += settings_.lease - 1  # the old replica is gone: its statement is not renewed
    assert await admitted(["d"]) == []
    clock[0] += 2  # lapsed: the raised cap alone
    assert await admitted(["e", "f", "g"]) == ["e", "f"]
    assert set(document.statements_of(api.objects[document.name_of(KEY)])) == {f"cap-{CAP}"}
