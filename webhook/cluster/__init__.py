"""The live cluster view: the only part of gpu-admission that imports ``kubernetes``.

- :func:`load_api_client` finds the API server (kubeconfig, in-cluster, none);
- :class:`ClusterIndex` lists and watches what the policies need and serves
  it as a :class:`webhook.view.protocol.ClusterView`;
- the GPU quota ledger (``ledger*.py``, ``reservation.py``, docs/quota.md)
  charges new pods to their enforced GPU caps in the API server, shared by
  every replica (far from a cap, against room a replica reserved there).
"""

from __future__ import annotations

from webhook.cluster.backoff import Backoff
from webhook.cluster.config import ApiClient, ClusterConfigError, load_api_client
from webhook.cluster.index import ClusterIndex
from webhook.cluster.pods import is_gpu_resource
from webhook.cluster.state import ResourceState
from webhook.cluster.watch import WatchSettings

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
