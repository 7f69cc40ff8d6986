"""How many GPUs a pod needs, as the scheduler counts them."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from webhook.gpu import resources as gpu

MATCH = gpu.ResourceMatcher.of(gpu.DEFAULT_GPU_RESOURCES)


def c(name: str, gpus: int, **extra: Any) -> dict[str, Any]:
    return {"name": name, "image": "x", "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}, **extra}


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ({"containers": [c("a", 4), c("b", 2)]}, 6),
        ({"initContainers": [c("i", 8)], "containers": [c("a", 2)]}, 8),
        ({"initContainers": [c("i", 1)], "containers": [c("a", 2)]}, 2),
        # a native sidecar runs beside the app containers
        ({"initContainers": [c("s", 2, restartPolicy="Always")], "containers": [c("a", 8)]}, 10),
        # and beside the init containers started after it, not before it
        ({"initContainers": [c("s", 2, restartPolicy="Always"), c("i", 7)], "containers": [c("a", 1)]}, 9),
        ({"initContainers": [c("i", 7), c("s", 2, restartPolicy="Always")], "containers": [c("a", 1)]}, 7),
    ],
)
def test_pod_gpus(spec: dict[str, Any], expected: int) -> None:
    assert gpu.pod_gpus(spec, MATCH) == {"nvidia.com/gpu": Decimal(expected)}
    assert gpu.pod_gpus(spec, MATCH, gpu.gpu_slots(spec, MATCH)) == {"nvidia.com/gpu": Decimal(expected)}


CONTAINER = st.fixed_dictionaries({"name": st.just("c")}, optional={
    "restartPolicy": st.just("Always"),
    "resources": st.fixed_dictionaries({}, optional={
        field: st.dictionaries(st.sampled_from(["nvidia.com/gpu", "nvidia.com/mig-1g.10gb", "cpu", "amd.com/gpu"]),
                               st.sampled_from(["0", "1", "2", "8", "1.5", "x", "500m"]), max_size=3)
        for field in ("limits", "requests")}),
})


@settings(max_examples=300, deadline=None)
@given(init=st.lists(CONTAINER, max_size=4), app=st.lists(CONTAINER, max_size=4))
def test_counting_only_the_gpu_containers_counts_the_same(init: list[Any], app: list[Any]) -> None:
    """The engine counts over the containers gpu_slots found (the others add nothing)."""
    spec = {"initContainers": init, "containers": app}
    assert gpu.pod_gpus(spec, MATCH, gpu.gpu_slots(spec, MATCH)) == gpu.pod_gpus(spec, MATCH)
