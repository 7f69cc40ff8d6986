"""Which pods the index keeps, and the compact form it keeps them in.

Only pods that request GPU-like extended resources matter to the policies
(GPU quota usage, placement), and a cluster can run tens of thousands of
other pods, so the index drops the rest on arrival and keeps the fields the
:mod:`webhook.view.protocol` docstring promises and nothing else: a trimmed
pod is a few hundred bytes instead of the 5-20 KB the API server sends.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from itertools import chain
from typing import Any

from webhook.gpu import resources

#: An object as parsed from the API server's JSON: a fresh dict, ours to edit.
Raw = dict[str, Any]
ResourcePredicate = Callable[[str], bool]

GPU_RESOURCE_NAMES = frozenset({"nvidia.com/gpu", "nvidia.com/gpu.shared", "amd.com/gpu"})
GPU_RESOURCE_PREFIXES = ("nvidia.com/mig-", "gpu.intel.com/")
LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"

# deletionTimestamp and deletionGracePeriodSeconds: a pod on its way out holds its GPUs for its grace
# period, as ResourceQuota counts it (webhook.kube.termination)
_METADATA = ("name", "namespace", "uid", "labels", "ownerReferences", "deletionTimestamp",
             "deletionGracePeriodSeconds")
# resourceClaims: pods that get GPUs through DRA claims
_SPEC = ("nodeName", "nodeSelector", "affinity", "tolerations", "priorityClassName", "resourceClaims",
         "schedulingGates")  # (gates: a charged pod ungated has its charge corrected, webhook.ledger.upkeep)


def is_gpu_resource(name: str) -> bool:
    """The default notion of a GPU-like extended resource (FACTS.md §3)."""
    return name in GPU_RESOURCE_NAMES or name.startswith(GPU_RESOURCE_PREFIXES)


def requests_gpu(pod: Mapping[str, Any], is_gpu: ResourcePredicate = is_gpu_resource) -> bool:
    """Whether any container or init container requests or limits a GPU-like resource (more than zero of it)."""
    spec = pod.get("spec") or {}
    for container in chain(spec.get("containers") or (), spec.get("initContainers") or ()):
        amounts = container.get("resources") or {}
        requests, limits = amounts.get("requests") or {}, amounts.get("limits") or {}
        names = {name for name in chain(requests, limits) if is_gpu(name)}
        # "nvidia.com/gpu: 0" (a chart's CPU mode) holds no GPU, as the policy core counts it
        if names and resources.held(names, limits, requests):
            return True
    return False


def trim_pod(pod: Mapping[str, Any]) -> Raw:
    """The fields policies read, in a new dict (sub-objects are shared, not copied)."""
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    trimmed_meta = {k: meta[k] for k in _METADATA if k in meta}
    annotations = {k: v for k, v in (meta.get("annotations") or {}).items() if k != LAST_APPLIED}
    if annotations:
        trimmed_meta["annotations"] = annotations
    trimmed_spec: Raw = {k: spec[k] for k in _SPEC if k in spec}
    trimmed_spec["containers"] = _containers(spec.get("containers") or ())
    if spec.get("initContainers"):
        trimmed_spec["initContainers"] = _containers(spec["initContainers"])
    trimmed: Raw = {"apiVersion": "v1", "kind": "Pod", "metadata": trimmed_meta, "spec": trimmed_spec}
    status = pod.get("status") or {}
    kept = {k: status[k] for k in ("phase", "resourceClaimStatuses") if status.get(k)}
    if kept:  # (resourceClaimStatuses: the claims a pod holds, made from its templates)
        trimmed["status"] = kept
    return trimmed


def uses_claims(pod: Mapping[str, Any]) -> bool:
    """Whether the pod names DRA claims (which may hand it GPUs: the policy core resolves them)."""
    return bool((pod.get("spec") or {}).get("resourceClaims"))


def _containers(containers: Iterable[Mapping[str, Any]]) -> list[Raw]:
    # restartPolicy marks native sidecars, which count beside the app containers
    return [
        {"name": c.get("name", ""), **{k: c[k] for k in ("resources", "restartPolicy") if c.get(k)}}
        for c in containers
    ]


def gpu_pod_shaper(is_gpu: ResourcePredicate) -> Callable[[Raw], Raw | None]:
    """Trim GPU pods; drop (None) every other pod."""

    def shape(pod: Raw) -> Raw | None:
        return trim_pod(pod) if requests_gpu(pod, is_gpu) or uses_claims(pod) else None

    return shape
