"""The live index keeps its aggregates current through lists, watch events and relists."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from tests.fakeapi import FakeApiServer
from webhook.cluster import ClusterIndex
from webhook.view.snapshot import SnapshotView

from . import builders
from .conftest import MakeIndex
from .polling import eventually

MODEL = "nvidia.com/gpu.product"
H100, A100 = "NVIDIA-H100-80GB-HBM3", "NVIDIA-A100-SXM4-80GB"


def _agrees(index: ClusterIndex) -> bool:
    """The index's aggregates equal those of a snapshot of the objects it holds now."""
    snapshot = SnapshotView.from_objects([*index.nodes(), *index.pods(), *_namespaces(index)])
    live, fresh = index.gpu_usage(MODEL, ["team"]), snapshot.gpu_usage(MODEL, ["team"])
    groups = sorted(sorted(g.members) for g in index.node_groups())
    return (live.namespaces, live.teams) == (fresh.namespaces, fresh.teams) and groups == sorted(
        sorted(g.members) for g in snapshot.node_groups())


def _namespaces(index: ClusterIndex) -> list[Any]:
    return [ns for name in ("ml", "cv") if (ns := index.namespace(name)) is not None]


def _held(index: ClusterIndex, team: str) -> dict[Any, Decimal]:
    return dict(index.gpu_usage(MODEL, ["team"]).in_team("team", team))


async def test_usage_and_node_groups_follow_watch_events(api: FakeApiServer, make_index: MakeIndex) -> None:
    api.add_many([builders.namespace("ml", team="a"), builders.namespace("cv", team="b"),
                  builders.node("gpu-1"), builders.node("gpu-2", product=A100, driver="535.104.05")])
    api.add_many([builders.pod("p1", "ml", gpus=2, node="gpu-1"), builders.pod("p2", "cv", gpus=1, node="gpu-2"),
                  builders.pod("web", "ml", gpus=0)])
    index = await make_index(resources=["nodes", "namespaces", "pods"])
    assert await index.wait_synced(5)
    assert _held(index, "a") == {("", frozenset({H100}), "nvidia.com/gpu"): Decimal(2)}
    assert len(index.node_groups()) == 2 and _agrees(index)

    api.modify(builders.pod("p1", "ml", gpus=2, node="gpu-1", phase="Succeeded"))  # finished: holds none
    await eventually(lambda: _held(index, "a") == {}, what="a finished pod leaves the sums")
    api.modify(builders.namespace("cv", team="a"))  # cv moves to team a, with its pod
    await eventually(lambda: _held(index, "a") == {("", frozenset({A100}), "nvidia.com/gpu"): Decimal(1)},
                     what="a relabelled namespace moves its sums")
    api.modify(builders.node("gpu-2"))  # gpu-2 is now an H100 like gpu-1: one group, the pod counts on H100
    await eventually(lambda: len(index.node_groups()) == 1, what="nodes regrouped")
    await eventually(lambda: _held(index, "a") == {("", frozenset({H100}), "nvidia.com/gpu"): Decimal(1)},
                     what="pods on a relabelled node count on its new model")
    api.delete("Pod", "p2", "cv")
    await eventually(lambda: _held(index, "a") == {}, what="a deleted pod leaves the sums")
    api.add(builders.pod("p3", "cv", gpus=4, node="gpu-1"))
    api.compact()
    api.expire_watches()  # 410: every resource is listed again and its aggregates rebuilt
    await eventually(lambda: index.state("pods").relists >= 1, what="relist")
    await eventually(lambda: _held(index, "a") == {("", frozenset({H100}), "nvidia.com/gpu"): Decimal(4)},
                     what="sums after a relist")
    assert _agrees(index)


async def test_the_default_quota_labels_are_summed_before_any_admission_asks(
    api: FakeApiServer, make_index: MakeIndex
) -> None:
    api.add_many([builders.namespace("ml", team="a"), builders.pod("p1", "ml", gpus=2)])
    index = await make_index(resources=["namespaces", "pods"])
    assert await index.wait_synced(5)
    usage = index.gpu_usage(MODEL)  # asks for no team label, yet the default one is there
    assert dict(usage.in_team("team", "a")) == {("", None, "nvidia.com/gpu"): Decimal(2)}
