"""The live cluster view: an in-memory index kept current by list+watch.

:class:`ClusterIndex` implements :class:`webhook.view.protocol.ClusterView` for
the server. Each watched resource has a thread that lists and watches it
(:mod:`webhook.cluster.watch`); the read methods only look at the latest
immutable snapshot, so the admission hot path never waits on I/O, on a lock
held by a watch, or on a relist.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass

from kubernetes import client
from prometheus_client import CollectorRegistry

from webhook.cluster import kinds, pods
from webhook.cluster.metrics import IndexCollector, Reading
from webhook.cluster.state import ResourceState
from webhook.cluster.store import CLUSTER, Listener, Snapshot
from webhook.cluster.watch import ResourceWatch, WatchSettings
from webhook.policy.settings.validation import QuotaLimit, QuotaRule
from webhook.view.aggregates import AggregateAnswers, Aggregates
from webhook.view.protocol import RESOURCES, Availability, Object, Resource

_POLL = 0.02  # seconds between checks in wait_synced() and stop()


class ClusterIndex(AggregateAnswers):
    """List+watch of the resources the loaded policies need, as a ClusterView.

    ``resources`` picks what is watched (default: all six). Pods are kept
    only when ``is_gpu_resource`` accepts one of their requested or limited
    resource names, and trimmed. ``registry`` receives the index metrics.
    ``clock`` and ``rng`` exist for tests.
    """

    def __init__(
        self,
        api_client: client.ApiClient,
        *,
        resources: Iterable[Resource] = RESOURCES,
        is_gpu_resource: pods.ResourcePredicate = pods.is_gpu_resource,
        settings: WatchSettings | None = None,
        registry: CollectorRegistry | None = None,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
    ) -> None:
        wanted = set(resources)
        unknown = wanted - set(RESOURCES)
        if unknown:
            raise ValueError(f"cannot watch {', '.join(sorted(unknown))}: not one of {', '.join(RESOURCES)}")
        self.settings = settings or WatchSettings()
        self._clock = clock
        # (the wall clock: when a Terminating pod's grace period, written by the API server, has passed)
        self._aggregates = Aggregates(time.time)
        # The quota rule's default labels are summed from the first list on, in
        # the watch threads: the first admission with caps then finds them ready
        # instead of working them out on the event loop (~0.5 s at 30,000 GPU pods).
        self._aggregates.gpu_usage(
            QuotaRule.model_fields["modelLabel"].default, [QuotaLimit.model_fields["teamLabel"].default])
        rng = rng or random.Random()
        #: what else follows the pods and namespaces the watches write (the quota ledger's upkeep)
        self._followers: dict[Resource, list[Listener]] = {"pods": [], "namespaces": []}
        self._watches = {
            r: ResourceWatch(
                kinds.KINDS[r],
                kinds.KINDS[r].lister(api_client),
                kinds.shaper(kinds.KINDS[r], is_gpu_resource),
                self.settings,
                clock=clock,
                rng=random.Random(rng.random()),
                listener=_listener(self._aggregates, r, self._followers.get(r)),
            )
            for r in RESOURCES
            if r in wanted
        }
        self._started = False
        self._empty = Snapshot()
        if registry is not None:
            registry.register(IndexCollector(self._reading, clock))

    # ------------------------------------------------------------ lifecycle

    @property
    def resources(self) -> frozenset[Resource]:
        """The watched resources."""
        return frozenset(self._watches)

    async def start(self) -> None:
        """Start the watch threads and return at once (see :meth:`wait_synced`)."""
        if self._started:
            return
        self._started = True
        for watch in self._watches.values():
            watch.start()

    async def stop(self, timeout: float = 2.0) -> None:
        """Stop every watch and wait up to ``timeout`` seconds for their threads.

        Threads still blocked after that (say, in a TCP connect) are daemons
        and are abandoned: they can neither write anything that matters nor
        keep the process alive.
        """
        for watch in self._watches.values():
            watch.stop()
        deadline = time.monotonic() + timeout
        while any(w.is_alive() for w in self._watches.values()) and time.monotonic() < deadline:
            await asyncio.sleep(_POLL)

    async def wait_synced(self, timeout: float, resources: Iterable[Resource] | None = None) -> bool:
        """Wait until :meth:`synced`, at most ``timeout`` seconds; returns whether it is."""
        deadline = time.monotonic() + timeout
        while not self.synced(resources):
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(_POLL)
        return True

    def synced(self, resources: Iterable[Resource] | None = None) -> bool:
        """Whether every given resource (default: every watched one) had a full list.

        A resource that is not watched is never synced: asking for it is a
        configuration error that readiness should expose, not hide.
        """
        wanted = self._watches if resources is None else resources
        return all(self.state(r).synced for r in wanted)

    def state(self, resource: Resource) -> ResourceState:
        watch = self._watches.get(resource)
        return watch.state if watch is not None else ResourceState(watched=False)

    def resource_version(self, resource: Resource) -> str | None:
        """Where the resource's next watch resumes (diagnostics and tests)."""
        watch = self._watches.get(resource)
        return watch.resource_version if watch is not None else None

    def _snapshot(self, resource: Resource) -> Snapshot:
        watch = self._watches.get(resource)
        return watch.store.snapshot if watch is not None else self._empty

    def _reading(self) -> Reading:
        return {r: (w.state, w.store.snapshot.size) for r, w in self._watches.items()}

    # ------------------------------------------------------------ ClusterView

    def availability(self, resource: Resource) -> Availability:
        return self.state(resource).availability(resource, self._clock(), self.settings.stale_after)

    def namespace(self, name: str) -> Object | None:
        return self._snapshot("namespaces").get(CLUSTER, name)

    def nodes(self) -> Collection[Object]:
        return self._snapshot("nodes").in_namespace(CLUSTER)

    def pods(self, namespace: str | None = None) -> Collection[Object]:
        snapshot = self._snapshot("pods")
        return snapshot.all() if namespace is None else snapshot.in_namespace(namespace)

    def pod(self, namespace: str, name: str) -> Object | None:
        """A pod the view holds (GPU pods and pods naming DRA claims), by name."""
        return self._snapshot("pods").get(namespace, name)

    def namespaces(self) -> Collection[Object]:
        return self._snapshot("namespaces").in_namespace(CLUSTER)

    def follow(self, resource: Resource, listener: Listener) -> None:
        """Tell ``listener`` of every write to ``resource`` ("pods" or "namespaces") from now on, in the
        watch thread, after the aggregates (before :meth:`start`)."""
        self._followers[resource].append(listener)

    def resource_quotas(self, namespace: str) -> Collection[Object]:
        return self._snapshot("resourcequotas").in_namespace(namespace)

    def priority_class(self, name: str) -> Object | None:
        return self._snapshot("priorityclasses").get(CLUSTER, name)

    def runtime_class(self, name: str) -> Object | None:
        return self._snapshot("runtimeclasses").get(CLUSTER, name)

    def aggregates(self) -> Aggregates:
        return self._aggregates

    def image_config(self, image: str) -> None:
        """Image configs come from the registry resolver (webhook.registry), which wraps this view."""
        return None

    def device_class(self, name: str) -> Object | None:
        return self._snapshot("deviceclasses").get(CLUSTER, name)

    def resource_claim_template(self, namespace: str, name: str) -> Object | None:
        return self._snapshot("resourceclaimtemplates").get(namespace, name)

    def resource_claim(self, namespace: str, name: str) -> Object | None:
        return self._snapshot("resourceclaims").get(namespace, name)

    def resource_slices(self) -> Collection[Object]:
        return self._snapshot("resourceslices").in_namespace(CLUSTER)


@dataclass(frozen=True)
class _Feed:
    """The store writes of one resource, passed on to the aggregates."""

    put: Callable[[Object], None]
    discard: Callable[[str, str], None]  # (namespace, name)
    replace: Callable[[Iterable[Object]], None]


def _listener(aggregates: Aggregates, resource: Resource, followers: list[Listener] | None) -> Listener | None:
    """Nodes, namespaces, pods and ResourceSlices keep the aggregates current; the other resources have none.
    Pods and namespaces also tell their followers."""
    if resource == "pods":
        feed = _Feed(aggregates.put_pod, aggregates.discard_pod, aggregates.replace_pods)
        return _Fanout(feed, followers) if followers is not None else feed
    if resource == "nodes":
        return _Feed(aggregates.put_node, lambda _, name: aggregates.discard_node(name), aggregates.replace_nodes)
    if resource == "namespaces":
        feed = _Feed(aggregates.put_namespace, lambda _, name: aggregates.discard_namespace(name),
                     aggregates.replace_namespaces)
        return _Fanout(feed, followers) if followers is not None else feed
    if resource == "resourceslices":
        return _Feed(aggregates.put_slice, lambda _, name: aggregates.discard_slice(name), aggregates.replace_slices)
    return None


@dataclass(frozen=True)
class _Fanout:
    """The aggregates' feed, then every follower (a list that may grow until the watches start)."""

    first: Listener
    followers: list[Listener]

    def put(self, obj: Object) -> None:
        self.first.put(obj)
        for follower in self.followers:
            follower.put(obj)

    def discard(self, namespace: str, name: str) -> None:
        self.first.discard(namespace, name)
        for follower in self.followers:
            follower.discard(namespace, name)

    def replace(self, objects: Iterable[Object]) -> None:
        if not self.followers:
            self.first.replace(objects)
            return
        objects = list(objects)
        self.first.replace(objects)
        for follower in self.followers:
            follower.replace(objects)
