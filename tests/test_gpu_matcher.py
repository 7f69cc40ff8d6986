"""A GPU matcher's remembered answers are the answers it would compute."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from webhook.cluster.pods import requests_gpu
from webhook.gpu import resources as gpu
from webhook.kube import quantity

NAMES = st.sampled_from(["cpu", "memory", "nvidia.com/gpu", "nvidia.com/gpu.shared", "nvidia.com/mig-1g.10gb",
                         "nvidia.com/mig-", "amd.com/gpu", "example.com/gpu", "ephemeral-storage"]) | st.text(max_size=12)


@settings(max_examples=200, deadline=None)
@given(patterns=st.lists(st.sampled_from([*gpu.DEFAULT_GPU_RESOURCES, "amd.com/gpu", "example.com/*"]), max_size=4),
       maps=st.lists(st.dictionaries(NAMES, st.just("1"), max_size=5), max_size=6), bound=st.sampled_from([0, 3, 1024]))
def test_names_in_is_the_names_the_matcher_matches(
    patterns: list[str], maps: list[dict[str, str]], bound: int
) -> None:
    matcher = gpu.ResourceMatcher.of(patterns)
    saved, gpu.MATCHES_SEEN = gpu.MATCHES_SEEN, bound  # a full memory answers as an empty one does
    try:
        for names in maps:
            assert matcher.names_in(names, frozenset()) == {n for n in names if matcher(n)}
            assert matcher.names_in(names, frozenset()) == {n for n in names if matcher(n)}, "asked again, from memory"
        assert len(matcher.answers) <= max(bound, 0) + max((len(m) for m in maps), default=0)
    finally:
        gpu.MATCHES_SEEN = saved


def test_gpu_slots_name_each_container_by_its_gpu_resources() -> None:
    matcher = gpu.ResourceMatcher.of(gpu.DEFAULT_GPU_RESOURCES)
    spec = {
        "initContainers": [{"name": "i", "resources": {"requests": {"nvidia.com/gpu": "1", "cpu": "1"}}}],
        "containers": [
            {"name": "a", "resources": {"limits": {"nvidia.com/mig-1g.10gb": "1"}, "requests": {"nvidia.com/gpu": "1"}}},
            {"name": "b", "resources": {"limits": {"cpu": "1", "memory": "1Gi"}}},
            {"name": "c", "resources": {"limits": "nonsense"}},
        ],
    }
    for _ in range(2):  # the second time from what the matcher remembers
        assert gpu.gpu_slots(spec, matcher) == {
            ("initContainers", 0): frozenset({"nvidia.com/gpu"}),
            ("containers", 0): frozenset({"nvidia.com/mig-1g.10gb", "nvidia.com/gpu"}),
        }


#: quantities as manifests and Helm charts write them: zeros of every spelling, counts, and what does not parse
QUANTITIES: st.SearchStrategy[object] = st.sampled_from(["0", 0, 0.0, "0m", "0.0", "00", "+0", "-0", " 0", "0Gi", "0e3", "0k",
                              "1", "4", 8, "1k", "100m", "1e0", "0.5", "-1", "one", "", None, True, [], {}])


def _resources(limits: dict[str, object] | None, requests: dict[str, object] | None) -> dict[str, object]:
    return {k: v for k, v in (("limits", limits), ("requests", requests)) if v is not None}


@settings(max_examples=300, deadline=None)
@given(containers=st.lists(st.tuples(st.none() | st.dictionaries(NAMES, QUANTITIES, max_size=4),
                                     st.none() | st.dictionaries(NAMES, QUANTITIES, max_size=4)), max_size=4))
def test_a_gpu_given_as_zero_everywhere_is_no_gpu(containers: list[tuple[dict[str, object] | None, ...]]) -> None:
    """gpu_slots' shortcut for counts agrees with parsing every quantity, and gpu_names agrees with it."""
    matcher = gpu.ResourceMatcher.of(gpu.DEFAULT_GPU_RESOURCES)
    spec = {"containers": [{"name": f"c{i}", "resources": _resources(*maps)} for i, maps in enumerate(containers)]}
    expected = {}
    for index, (limits, requests) in enumerate(containers):
        given = [m for m in (limits, requests) if m is not None]
        names = {n for m in given for n in m if matcher(n)}
        # (null is a zero quantity, as kube-apiserver decodes it)
        held = {n for n in names if any(m[n] is not None and quantity.parse_quantity(m[n]) != 0 for m in given if n in m)}
        if held:
            expected[("containers", index)] = frozenset(held)
        assert gpu.gpu_names(spec["containers"][index], matcher) == held
    assert gpu.gpu_slots(spec, matcher) == expected


@pytest.mark.parametrize("value", ["0", 0, "0m", "0.0", "0Gi", "00", 0.0, None])
def test_zero_gpus_are_no_gpus_to_the_cluster_index(value: object) -> None:
    resources: dict[str, Any] = {"limits": {"nvidia.com/gpu": value, "cpu": "1"}}
    pod = {"spec": {"containers": [{"name": "c", "resources": resources}]}}
    assert gpu.gpu_slots(pod["spec"], gpu.ResourceMatcher.of(gpu.DEFAULT_GPU_RESOURCES)) == {}
    assert not requests_gpu(pod)
    resources["requests"] = {"nvidia.com/gpu": "1"}  # (refused by the API server: but not zero everywhere)
    assert requests_gpu(pod)


def test_resource_names_that_are_not_strings_are_no_gpus() -> None:
    """A YAML manifest can key resources by a number, null or a boolean (the audit reads such files):
    not GPUs, and no error, compiled (typed as str, mypyc would refuse them) or not."""
    matcher = gpu.ResourceMatcher.of(gpu.DEFAULT_GPU_RESOURCES)
    for limits in ({"nvidia.com/gpu": "1", None: "1"}, {1: "2", "nvidia.com/gpu": "1"}, {True: "1"}):
        spec = {"containers": [{"name": "c", "resources": {"limits": limits, "requests": dict(limits)}}]}
        expected = {("containers", 0): frozenset({"nvidia.com/gpu"})} if "nvidia.com/gpu" in limits else {}
        for _ in range(2):  # the second time from what the matcher remembers
            assert gpu.gpu_slots(spec, matcher) == expected
