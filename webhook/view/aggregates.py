"""Per-snapshot answers that would otherwise cost a scan of the cluster on every admission.

:class:`Aggregates` is fed the nodes, namespaces and GPU pods of a cluster,
object by object (the server's watch threads, one event at a time) or all at
once (a snapshot, a relist), and keeps:

- the nodes in groups (:mod:`webhook.view.nodegroups`), for "which kinds
  of node could this pod land on, and what drivers do they run", each node
  with the devices its ResourceSlices publish (:mod:`webhook.view.node_devices`);
- the GPUs held per namespace and per team (:mod:`webhook.view.usage`),
  for each model label a policy asks about, joined with the node a pod is
  bound to (its GPU model) and its namespace's labels (its team).

One event costs O(1) in the size of the cluster: a node change touches its
group and, when its model label changes, the pods bound to it; a pod change
touches its namespace's and team's sums; a namespace relabel moves its sums;
a ResourceSlice change regroups its node.
Writers hold a lock (several watch threads feed one instance); readers take
none: every answer is an immutable object published by one assignment.

The server's index (``webhook.cluster``) and the snapshot view of the audit
CLI and the tests (``webhook.view.snapshot.SnapshotView``) both use this class,
so both answer alike.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from webhook.kube import termination
from webhook.kube.resource_slices import Device
from webhook.view.node_devices import SliceIndex
from webhook.view.nodegroups import NodeGroup, NodeGroups, labels_of, name_of
from webhook.view.usage import GpuUsage, PodKey, Share, UsageView, share_of

Object = Mapping[str, Any]


def pod_key(pod: Object) -> PodKey:
    meta = pod.get("metadata")
    meta = meta if isinstance(meta, Mapping) else {}
    return str(meta.get("namespace") or ""), str(meta.get("name", ""))


def _node_of(pod: Object) -> str:
    spec = pod.get("spec")
    return str(spec.get("nodeName") or "") if isinstance(spec, Mapping) else ""


def _uses_claims(pod: Object) -> bool:
    spec = pod.get("spec")
    return isinstance(spec, Mapping) and bool(spec.get("resourceClaims"))


def _namespace_labels(namespace: Object) -> dict[str, str]:
    meta = namespace.get("metadata")
    raw = meta.get("labels") if isinstance(meta, Mapping) else None
    return {str(k): str(v) for k, v in raw.items()} if isinstance(raw, Mapping) else {}


class Aggregates:
    """Node groups and GPU usage of one changing cluster."""

    def __init__(self, clock: Callable[[], float] | None = None) -> None:
        #: unix seconds now, for pods being deleted whose grace period passes (None: they hold until gone).
        #: Given by the live index (the cluster layer); the view itself reads no clock.
        self._clock = clock
        #: pods being deleted that hold GPUs until a moment (unix seconds): their shares are worked out
        #: again once it has passed, when the sums are next read
        self._expiring: dict[PodKey, float] = {}
        self._lock = threading.RLock()
        self._nodes: dict[str, Object] = {}
        #: pods by (namespace, name); a snapshot file may repeat a name, and then all count
        self._pods: dict[PodKey, tuple[Object, ...]] = {}
        self._on_node: dict[str, set[PodKey]] = {}
        #: pods asking for DRA claims: their devices depend on claims, templates and
        #: device classes that change on their own, so quotas count them when asked
        self._claim_pods: dict[PodKey, tuple[Object, ...]] = {}
        #: republished whole when one of them changes, so readers take no lock
        self._claim_pod_list: tuple[Object, ...] = ()
        self._ns_labels: dict[str, dict[str, str]] = {}
        self._groups = NodeGroups()
        self._slices = SliceIndex()
        self._usage: dict[str, GpuUsage] = {}

    # ------------------------------------------------------------ readers

    def node_groups(self) -> tuple[NodeGroup, ...]:
        return self._groups.groups

    def published_device(self, driver: str, pool: str, name: str) -> Device | None:
        return self._slices.device(driver, pool, name)

    def claim_pods(self) -> tuple[Object, ...]:
        """The pods that name resourceClaims (few, on most clusters)."""
        return self._claim_pod_list

    def gpu_usage(self, model_label: str, team_labels: Iterable[str] = ()) -> UsageView:
        """The sums for ``model_label``, with sums per team for each of ``team_labels``.

        The first call for a label works them out from every pod (once per
        label and process; policy reloads keep them); later calls are a lookup.
        """
        if self._expiring and self._clock is not None:
            self._expire(self._clock())
        usage = self._usage.get(model_label)
        labels = [label for label in team_labels if usage is None or label not in usage.view.teams]
        if usage is not None and not labels:
            return usage.view
        with self._lock:
            usage = self._usage.get(model_label)
            if usage is None:
                usage = GpuUsage(model_label, self._labels_of)
                usage.rebuild(self._shares(usage))
                self._usage[model_label] = usage
            for label in labels:
                if label not in usage.view.teams:
                    usage.add_team_label(label)
            return usage.view

    # ------------------------------------------------------------ nodes

    def put_node(self, node: Object) -> None:
        with self._lock:
            name = name_of(node)
            old = self._nodes.get(name)
            self._nodes[name] = node
            self._groups.put(node, self._slices.of_node(name))
            self._remodel(name, old, node)

    def discard_node(self, name: str) -> None:
        with self._lock:
            old = self._nodes.pop(name, None)
            if old is not None:
                self._groups.discard(name)
                self._remodel(name, old, None)

    def replace_nodes(self, nodes: Iterable[Object]) -> None:
        with self._lock:
            self._nodes = {name_of(n): n for n in nodes if isinstance(n, Mapping)}
            self._groups.replace(self._nodes.values(), self._slices.of_node)
            for usage in self._usage.values():
                usage.rebuild(self._shares(usage))

    def _remodel(self, name: str, old: Object | None, new: Object | None) -> None:
        """Pods bound to a node whose model label changed count on the new model."""
        for usage in self._usage.values():
            label = usage.model_label
            before = labels_of(old).get(label) if old is not None else None
            after = labels_of(new).get(label) if new is not None else None
            if before != after:
                for key in self._on_node.get(name, ()):
                    usage.set(key, self._share(usage, key))

    # ------------------------------------------------------------ ResourceSlices

    def put_slice(self, obj: Object) -> None:
        with self._lock:
            self._regroup(self._slices.put(obj))

    def discard_slice(self, name: str) -> None:
        with self._lock:
            self._regroup(self._slices.discard(name))

    def replace_slices(self, objs: Iterable[Object]) -> None:
        with self._lock:
            self._slices.replace(objs)
            self._groups.replace(self._nodes.values(), self._slices.of_node)

    def _regroup(self, names: Iterable[str]) -> None:
        """Nodes whose published devices changed move to the group of their new devices."""
        for name in names:
            node = self._nodes.get(name)
            if node is not None:
                self._groups.put(node, self._slices.of_node(name))

    # ------------------------------------------------------------ pods

    def put_pod(self, pod: Object) -> None:
        with self._lock:
            key = pod_key(pod)
            self._set_pods(key, (pod,))

    def discard_pod(self, namespace: str, name: str) -> None:
        with self._lock:
            self._set_pods((namespace, name), ())

    def replace_pods(self, pods: Iterable[Object]) -> None:
        with self._lock:
            grouped: dict[PodKey, list[Object]] = {}
            for pod in pods:
                if isinstance(pod, Mapping):
                    grouped.setdefault(pod_key(pod), []).append(pod)
            self._pods = {k: tuple(v) for k, v in grouped.items()}
            self._expiring = {}
            for key, same in self._pods.items():
                self._note_expiry(key, same)
            self._on_node = {}
            for key, same in self._pods.items():
                for pod in same:
                    self._on_node.setdefault(_node_of(pod), set()).add(key)
            self._claim_pods = {key: same for key, same in self._pods.items() if any(map(_uses_claims, same))}
            self._publish_claim_pods()
            for usage in self._usage.values():
                usage.rebuild(self._shares(usage))

    def _set_pods(self, key: PodKey, pods: tuple[Object, ...]) -> None:
        for pod in self._pods.get(key, ()):
            bound = self._on_node.get(_node_of(pod))
            if bound is not None:
                bound.discard(key)
                if not bound:
                    del self._on_node[_node_of(pod)]
        if pods:
            self._pods[key] = pods
            for pod in pods:
                self._on_node.setdefault(_node_of(pod), set()).add(key)
        else:
            self._pods.pop(key, None)
        if any(map(_uses_claims, pods)):
            self._claim_pods[key] = pods
            self._publish_claim_pods()
        elif self._claim_pods.pop(key, None) is not None:
            self._publish_claim_pods()
        self._note_expiry(key, pods)
        for usage in self._usage.values():
            usage.set(key, self._share(usage, key))

    def _expire(self, now: float) -> None:
        """Pods being deleted whose grace period has passed stop counting."""
        with self._lock:
            if not self._expiring or min(self._expiring.values()) >= now:
                return
            for key in [k for k, until in self._expiring.items() if until < now]:
                del self._expiring[key]
                for usage in self._usage.values():
                    usage.set(key, self._share(usage, key))

    def _note_expiry(self, key: PodKey, pods: Iterable[Object]) -> None:
        ends = [t for t in map(termination.released_at, pods) if t is not None]
        if ends:
            self._expiring[key] = max(ends)
        else:
            self._expiring.pop(key, None)

    def _publish_claim_pods(self) -> None:
        self._claim_pod_list = tuple(pod for same in self._claim_pods.values() for pod in same)

    def _share(self, usage: GpuUsage, key: PodKey) -> Share | None:
        label = usage.model_label

        def model_of(node: str) -> str | None:
            found = self._nodes.get(node)
            model = labels_of(found).get(label) if found is not None else None
            return str(model) if model else None

        return share_of(self._pods.get(key, ()), model_of, label, self._clock() if self._clock is not None else None)

    def _shares(self, usage: GpuUsage) -> Iterable[tuple[PodKey, Share | None]]:
        return ((key, self._share(usage, key)) for key in self._pods)

    # ------------------------------------------------------------ namespaces

    def put_namespace(self, namespace: Object) -> None:
        with self._lock:
            self._relabel(name_of(namespace), _namespace_labels(namespace))

    def discard_namespace(self, name: str) -> None:
        with self._lock:
            self._relabel(name, None)

    def replace_namespaces(self, namespaces: Iterable[Object]) -> None:
        with self._lock:
            labels: dict[str, dict[str, str]] = {}
            for namespace in namespaces:
                if isinstance(namespace, Mapping):  # a name twice (snapshot files): the first, as lookups find
                    labels.setdefault(name_of(namespace), _namespace_labels(namespace))
            self._ns_labels = labels
            for usage in self._usage.values():
                usage.rebuild(self._shares(usage))

    def _relabel(self, name: str, labels: dict[str, str] | None) -> None:
        old = self._ns_labels.pop(name, {})
        if labels is not None:
            self._ns_labels[name] = labels
        for usage in self._usage.values():
            usage.relabel(name, old, labels or {})

    def _labels_of(self, namespace: str) -> Mapping[str, str]:
        return self._ns_labels.get(namespace, {})


class AggregateAnswers:
    """The view methods a view's :class:`Aggregates` answers: one definition for the
    server's index and the snapshot view."""

    def aggregates(self) -> Aggregates:
        raise NotImplementedError

    def node_groups(self) -> tuple[NodeGroup, ...]:
        return self.aggregates().node_groups()

    def gpu_usage(self, model_label: str, team_labels: Iterable[str] = ()) -> UsageView:
        return self.aggregates().gpu_usage(model_label, team_labels)

    def claim_pods(self) -> tuple[Object, ...]:
        return self.aggregates().claim_pods()

    def published_device(self, driver: str, pool: str, name: str) -> Device | None:
        return self.aggregates().published_device(driver, pool, name)
