"""A GPU matcher's remembered answers are the answers it would compute."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from webhook.policy import gpu

NAMES = st.sampled_from(["cpu", "memory", "nvidia.com/gpu", "nvidia.com/gpu.shared", "nvidia.com/mig-1g.10gb",
                         "nvidia.com/mig-", "amd.com/gpu", "example.com/gpu", "ephemeral-storage"]) | st.text(max_size=12)


@settings(max_examples=200, deadline=None)
@given(patterns=st.lists(st.sampled_from([*gpu.DEFAULT_GPU_RESOURCES, "amd.com/gpu", "example.com/*"]), max_size=4),
       maps=st.lists(st.dictionaries(NAMES, st.just("1"), max_size=5), max_size=6), bound=st.sampled_from([0, 3, 1024]))
def test_among_is_the_names_the_matcher_matches(
    patterns: list[str], maps: list[dict[str, str]], bound: int
) -> None:
    matcher = gpu.ResourceMatcher.of(patterns)
    saved, gpu.MATCHES_SEEN = gpu.MATCHES_SEEN, bound  # a full memory answers as an empty one does
    try:
        for names in maps:
            assert matcher.among(names) == {n for n in names if matcher(n)}
            assert matcher.among(names) == {n for n in names if matcher(n)}, "asked again, from memory"
        assert len(matcher.seen) <= max(bound, 0) + max((len(m) for m in maps), default=0)
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
