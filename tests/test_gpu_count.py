"""How many GPUs a pod needs, as the scheduler counts them."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from webhook.policy import gpu

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
