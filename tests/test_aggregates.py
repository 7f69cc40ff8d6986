"""The per-snapshot aggregates answer exactly what a scan of the same objects answers.

Node groups against the per-node specification of the node filter
(tests/test_node_filter.py); GPU usage per namespace and team against a sum
over every pod, after random sequences of watch events (ADDED/MODIFIED,
DELETED, relists) in which pods change phase and node and nodes change model.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from decimal import Decimal
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.test_node_filter import NEEDS, SPEC, nodes, reference
from webhook.gpu import cuda
from webhook.gpu import resources as gpu
from webhook.view import nodegroups, scheduling
from webhook.view.aggregates import Aggregates
from webhook.view.usage import UsageKey

MODEL = "nvidia.com/gpu.product"
TEAM = "team"


def _projection(node: Mapping[str, Any]) -> tuple[Any, ...]:
    """What the filter and the node rules read of a node, less its name and per-node labels."""
    labels = sorted((repr(k), repr(v)) for k, v in scheduling.node_labels(node).items()
                    if k not in nodegroups.PER_NODE_LABELS)
    # a set: a taint written twice keeps off the pods it keeps off once (kube-apiserver refuses the
    # duplicate on a real node; a hand-written snapshot may hold one), and node groups count it once
    taints = sorted({repr(sorted(t.items(), key=repr)) for t in nodegroups.blocking_taints(node)})
    status = node.get("status")
    allocatable = status.get("allocatable") if isinstance(status, Mapping) else {}
    extended = sorted((k, repr(v)) for k, v in (allocatable or {}).items() if nodegroups.is_extended(k))
    return tuple(labels), tuple(taints), tuple(extended)


def _newest_driver(
    found: Iterable[Mapping[str, Any]], slices: Callable[[str], cuda.DriverVersion | None] = lambda _: None
) -> cuda.DriverVersion | None:
    """The newest driver among these nodes: GFD's labels, else what ``slices`` says the node's devices report."""
    drivers = [cuda.node_driver(scheduling.node_labels(n)) or slices(scheduling.node_name(n)) for n in found]
    return max(filter(None, drivers), default=None)


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=SPEC, node_list=nodes(), needs=NEEDS, tolerate_all=st.booleans())
def test_node_groups_place_a_pod_as_the_per_node_filter_does(
    spec: dict[str, Any], node_list: list[Any], needs: dict[str, Decimal], tolerate_all: bool
) -> None:
    extra = [{"operator": "Exists"}] if tolerate_all else []
    # a name twice (a hand-written snapshot): the later node wins, as applying the file would do
    unique = list({scheduling.node_name(n): n for n in node_list if isinstance(n, Mapping)}.values())
    expected = reference(spec, unique, needs, extra)
    placed = scheduling.NodeFilter(spec, needs, extra).placements(nodegroups.NodeGroups(node_list).groups)
    assert sum(p.nodes for p in placed) == len(expected)
    assert Counter(p for n, c, *_ in placed for p in [_projection(n)] * c) == Counter(_projection(n) for n in expected)
    assert max((p.driver for p in placed if p.driver), default=None) == _newest_driver(expected)


@settings(max_examples=300, deadline=None)
@given(node_list=nodes(), resource=st.sampled_from(["nvidia.com/gpu", "nvidia.com/mig-1g.10gb", "cpu"]))
def test_node_groups_know_the_largest_offer_and_who_makes_it(node_list: list[Any], resource: str) -> None:
    real = list({scheduling.node_name(n): n for n in node_list if isinstance(n, Mapping)}.values())
    groups = nodegroups.NodeGroups(node_list).groups
    expected = max(((nodegroups.amount(n, resource), scheduling.node_name(n)) for n in real), default=(Decimal(0), ""))
    assert max((g.largest(resource) for g in groups), default=(Decimal(0), "")) == expected
    assert any(g.offers(resource) for g in groups) == any(
        resource in ((n.get("status") or {}).get("allocatable") or {}) for n in real)


# -- a changing cluster --

NODE_NAMES = [f"gpu-{i}" for i in range(5)]
NAMESPACES = ["ml-a", "ml-b", "ml-c", "web"]
GPU_NAMES = ["nvidia.com/gpu", "nvidia.com/mig-1g.10gb"]


@st.composite
def a_node(draw: Any) -> dict[str, Any]:
    name = draw(st.sampled_from(NODE_NAMES))
    labels = {"kubernetes.io/hostname": name, "nvidia.com/gfd.timestamp": str(draw(st.integers(0, 9)))}
    labels.update(draw(st.dictionaries(st.sampled_from([MODEL, "nvidia.com/cuda.driver-version.full", "pool"]),
                                       st.sampled_from(["A100", "H100", "535.104.05", "550.54.15", "a", ""]), max_size=3)))
    taints = draw(st.lists(st.fixed_dictionaries({
        "key": st.sampled_from(["nvidia.com/gpu", "node.kubernetes.io/not-ready", "pool"]),
        "effect": st.sampled_from(["NoSchedule", "NoExecute", "PreferNoSchedule"])}), max_size=2))
    gpus = draw(st.sampled_from(["0", "4", "8"]))
    return {"kind": "Node", "metadata": {"name": name, "labels": labels}, "spec": {"taints": taints},
            "status": {"allocatable": {"cpu": str(draw(st.integers(1, 96))), "nvidia.com/gpu": gpus}}}


@st.composite
def a_pod(draw: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": f"p{draw(st.integers(0, 5))}", "namespace": draw(st.sampled_from(NAMESPACES))}
    if draw(st.integers(0, 5)) == 0:
        meta["deletionTimestamp"] = "2025-01-01T00:00:00Z"
    spec: dict[str, Any] = {"containers": [
        {"name": f"c{i}", "resources": {"limits": {draw(st.sampled_from(GPU_NAMES)): str(draw(st.integers(0, 4)))}}}
        for i in range(draw(st.integers(1, 2)))]}
    node = draw(st.sampled_from([None, *NODE_NAMES]))
    if node:
        spec["nodeName"] = node
    if draw(st.booleans()):
        spec["nodeSelector"] = {MODEL: draw(st.sampled_from(["A100", "H100"]))}
    if draw(st.booleans()):
        spec["priorityClassName"] = draw(st.sampled_from(["high", "low"]))
    if draw(st.integers(0, 3)) == 0:  # a DRA pod: its claim devices are counted from claim_pods()
        spec["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}]
    phase = draw(st.sampled_from(["Pending", "Running", "Succeeded", "Failed"]))
    return {"kind": "Pod", "metadata": meta, "spec": spec, "status": {"phase": phase}}


@st.composite
def a_namespace(draw: Any) -> dict[str, Any]:
    labels = draw(st.dictionaries(st.just(TEAM), st.sampled_from(["t1", "t2", ""]), max_size=1))
    return {"kind": "Namespace", "metadata": {"name": draw(st.sampled_from(NAMESPACES)), "labels": labels}}


@st.composite
def a_slice(draw: Any) -> dict[str, Any]:
    """A node-local ResourceSlice (its devices' attributes as NVIDIA's gpu-kubelet-plugin writes them)."""
    driver = draw(st.sampled_from(["gpu.nvidia.com", "other.example.com"]))
    name = f"s{draw(st.integers(0, 3))}"
    devices = [{"name": f"{name}-d{i}", "attributes": {
        "type": {"string": draw(st.sampled_from(["gpu", "mig"]))},
        "driverVersion": {"version": draw(st.sampled_from(["535.104.5", "570.124.6"]))}}}
        for i in range(draw(st.integers(0, 3)))]
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": name},
            "spec": {"driver": driver, "nodeName": draw(st.sampled_from(NODE_NAMES)), "pool": {"name": "p"}, "devices": devices}}


EVENT = st.one_of(
    st.tuples(st.just("put"), a_node() | a_pod() | a_namespace() | a_slice()),
    st.tuples(st.just("delete"), a_node() | a_pod() | a_namespace() | a_slice()),
    st.tuples(st.just("relist"), st.sampled_from(["Node", "Pod", "Namespace", "ResourceSlice"]),
              st.lists(a_node(), max_size=4), st.lists(a_pod(), max_size=6), st.lists(a_namespace(), max_size=3),
              st.lists(a_slice(), max_size=3)),
    st.tuples(st.just("ask"), st.sampled_from([MODEL, "pool"]), st.sampled_from([TEAM, "other"])),
)


def _key(obj: Mapping[str, Any]) -> tuple[str, str]:
    return obj["metadata"].get("namespace", ""), obj["metadata"]["name"]


def _apply(aggregates: Aggregates, state: dict[str, dict[tuple[str, str], Any]], event: tuple[Any, ...]) -> None:
    """One watch event on the aggregates, and on the plain objects the reference reads."""
    if event[0] == "ask":  # a policy starts asking about a model label and a team label
        aggregates.gpu_usage(event[1], [event[2]])
        return
    if event[0] == "relist":
        kind = event[1]
        listed = {"Node": event[2], "Pod": event[3], "Namespace": event[4], "ResourceSlice": event[5]}[kind]
        state[kind] = {_key(o): o for o in listed}
        {"Node": aggregates.replace_nodes, "Pod": aggregates.replace_pods, "Namespace": aggregates.replace_namespaces,
         "ResourceSlice": aggregates.replace_slices}[kind](list(state[kind].values()))
        return
    obj = event[1]
    kind, key = obj["kind"], _key(obj)
    if event[0] == "put":
        state[kind][key] = obj
        {"Node": aggregates.put_node, "Pod": aggregates.put_pod, "Namespace": aggregates.put_namespace,
         "ResourceSlice": aggregates.put_slice}[kind](obj)
    else:
        state[kind].pop(key, None)
        if kind == "Pod":
            aggregates.discard_pod(*key)
        else:
            {"Node": aggregates.discard_node, "Namespace": aggregates.discard_namespace,
             "ResourceSlice": aggregates.discard_slice}[kind](key[1])


def _published(state: dict[str, dict[tuple[str, str], Any]], node: str) -> tuple[dict[tuple[str, str], int], Any]:
    """A node's devices per (driver, type) and (driver, ""), and the oldest GPU driver they report: a scan."""
    counts: Counter[tuple[str, str]] = Counter()
    drivers: list[cuda.DriverVersion] = []
    for obj in state["ResourceSlice"].values():
        if obj["spec"]["nodeName"] != node:
            continue
        for device in obj["spec"]["devices"]:
            kind = device["attributes"]["type"]["string"]
            counts[(obj["spec"]["driver"], kind)] += 1
            counts[(obj["spec"]["driver"], "")] += 1
            if obj["spec"]["driver"] == "gpu.nvidia.com":
                version = cuda.DriverVersion.parse(device["attributes"]["driverVersion"]["version"])
                assert version is not None
                drivers.append(version)
    return dict(counts), min(drivers, default=None)


def _expected_usage(state: dict[str, dict[tuple[str, str], Any]], model_label: str) -> dict[str, Counter[UsageKey]]:
    """Sum over every pod, as the quota rule did before the aggregates."""
    models_of = {name: str(n["metadata"]["labels"][model_label]) for (_, name), n in state["Node"].items()
                 if n["metadata"]["labels"].get(model_label)}
    found: dict[str, Counter[UsageKey]] = {}
    for (namespace, _), pod in state["Pod"].items():
        # (a pod being deleted counts until it is gone: these aggregates have no clock for its grace period)
        if pod["status"]["phase"] in ("Succeeded", "Failed"):
            continue
        spec = pod["spec"]
        node_model = models_of.get(spec.get("nodeName", ""))
        models = frozenset({node_model}) if node_model else scheduling.label_values(spec, model_label)
        for resource, count in gpu.pod_gpus(spec, gpu.ResourceMatcher.of(GPU_NAMES)).items():
            held = found.setdefault(namespace, Counter())
            held[(spec.get("priorityClassName", ""), models, resource)] += count  # type: ignore[assignment]
    return found


def _nonzero(amounts: Mapping[UsageKey, Any]) -> dict[UsageKey, Any]:
    return {k: v for k, v in amounts.items() if v}


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(events=st.lists(EVENT, max_size=30))
def test_aggregates_stay_exact_through_watch_events(events: list[tuple[Any, ...]]) -> None:
    aggregates = Aggregates()
    aggregates.gpu_usage(MODEL, [TEAM])  # asked from the start: every event goes through the incremental path
    state: dict[str, dict[tuple[str, str], Any]] = {"Node": {}, "Pod": {}, "Namespace": {}, "ResourceSlice": {}}
    for event in events:
        _apply(aggregates, state, event)
    for obj in state["ResourceSlice"].values():  # what a claim's allocation names is found by its names
        for device in obj["spec"]["devices"]:
            found = aggregates.published_device(obj["spec"]["driver"], "p", device["name"])
            assert found is not None and found.attributes == device["attributes"]
    assert aggregates.published_device("gpu.nvidia.com", "p", "gone") is None
    for group in aggregates.node_groups():
        for name, node in group.members.items():
            devices, slice_driver = _published(state, name)
            assert dict(group.traits.devices) == devices
            assert group.traits.driver == (cuda.node_driver(scheduling.node_labels(node)) or slice_driver)
    for model_label in (MODEL, "pool"):
        usage = aggregates.gpu_usage(model_label, [TEAM])
        expected = _expected_usage(state, model_label)
        for namespace in NAMESPACES:
            assert _nonzero(usage.in_namespace(namespace)) == _nonzero(expected.get(namespace, {}))
        for team in ("t1", "t2"):
            members = [k[1] for k, ns in state["Namespace"].items() if ns["metadata"]["labels"].get(TEAM) == team]
            total: Counter[UsageKey] = Counter()
            for namespace in members:
                total.update(expected.get(namespace, {}))
            assert _nonzero(usage.in_team(TEAM, team)) == _nonzero(total)
        for key, pod in state["Pod"].items():
            share = usage.share(*key)
            alone: Mapping[UsageKey, Any] = _expected_usage({**state, "Pod": {key: pod}}, model_label).get(key[0], {})
            assert (dict(share.amounts) if share else {}) == _nonzero(alone)
    claiming = sorted(k for k, pod in state["Pod"].items() if pod["spec"].get("resourceClaims"))
    assert sorted(map(_key, aggregates.claim_pods())) == claiming
    groups = aggregates.node_groups()
    assert sorted(n for g in groups for n in g.members) == sorted(k[1] for k in state["Node"])
    for spec in ({}, {"tolerations": [{"operator": "Exists"}]}, {"nodeSelector": {MODEL: "A100"}}):
        placed = scheduling.NodeFilter(spec, {"nvidia.com/gpu": Decimal(1)}).placements(groups)
        expected_nodes = reference(spec, list(state["Node"].values()), {"nvidia.com/gpu": Decimal(1)}, [])
        assert sum(p.nodes for p in placed) == len(expected_nodes)
        newest = _newest_driver(expected_nodes, lambda name: _published(state, name)[1])
        assert max((p.driver for p in placed if p.driver), default=None) == newest
    # a pod claiming two GPUs lands only where a GPU driver publishes two GPU devices
    two = [[(("gpu.nvidia.com", "gpu"), 2)]]
    placed = scheduling.NodeFilter({"tolerations": [{"operator": "Exists"}]}, {}, (), two).placements(groups)
    assert sorted(scheduling.node_name(n) for g in groups for n in g.members.values() if g.traits.devices.get(
        ("gpu.nvidia.com", "gpu"), 0) >= 2) == sorted(m for p in placed for m in _members(groups, p.node))


def _members(groups: Iterable[nodegroups.NodeGroup], shape: Mapping[str, Any]) -> list[str]:
    return next(list(g.members) for g in groups if g.shape is shape)
