"""The live cluster view: the only part of gpu-admission that imports ``kubernetes``.

- :func:`load_api_client` finds the API server (kubeconfig, in-cluster, none);
- :class:`ClusterIndex` lists and watches what the policies need and serves
  it as a :class:`webhook.view.protocol.ClusterView`;
- the GPU quota ledger (``ledger*.py``, ``reservation.py``, docs/quota.md)
  charges new pods to their enforced GPU caps in the API server, shared by
  every replica (far from a cap, against room a replica reserved there).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from webhook.cluster.backoff import Backoff
    from webhook.cluster.config import ApiClient, ClusterConfigError, load_api_client
    from webhook.cluster.index import ClusterIndex
    from webhook.cluster.pods import is_gpu_resource
    from webhook.cluster.state import ResourceState
    from webhook.cluster.watch import WatchSettings

#: name → the module that holds it, imported on first use: ``kubernetes`` (~20 MB resident, 150 ms
#: to import) only in a process that reaches the API server, not in ``serve --no-cluster`` whose
#: quota ledger's modules name this package's errors and session (docs/performance.md, "Memory")
_LAZY = {
    "ApiClient": "webhook.cluster.config",
    "Backoff": "webhook.cluster.backoff",
    "ClusterConfigError": "webhook.cluster.config",
    "ClusterIndex": "webhook.cluster.index",
    "ResourceState": "webhook.cluster.state",
    "WatchSettings": "webhook.cluster.watch",
    "is_gpu_resource": "webhook.cluster.pods",
    "load_api_client": "webhook.cluster.config",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


__all__ = [
    "ApiClient",
    "Backoff",
    "ClusterConfigError",
    "ClusterIndex",
    "ResourceState",
    "WatchSettings",
    "is_gpu_resource",
    "load_api_client",
]
