"""What one admission request may cost: limits a real object never reaches.

kube-apiserver sends at most 3 MiB (FACTS.md §6), but within 3 MiB fit
~25,000 containers, whose evaluation would hold a CPU for seconds and whose
answer (patch, denial message) would run to megabytes. Objects past these
limits are answered at once, without evaluation: allowed unchanged with a
warning by the mutating webhook, refused with the reason by the validating one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

#: the keys under which pod specs list containers
_CONTAINER_LISTS = frozenset({"containers", "initContainers", "ephemeralContainers"})
#: subtrees that never hold a pod spec (and hold most of a real object's fields)
_SKIPPED = frozenset({"metadata", "status"})


@dataclass(frozen=True)
class Limits:
    #: kube-apiserver sends at most 3 MiB; more (inflated) is answered 413
    max_body_bytes: int = 3 * 1024 * 1024
    #: from the request head to the body's last byte
    body_timeout: float = 10.0
    #: JSON objects in the review ("{" in the body, strings included: an upper bound).
    #: Checked before decoding: a 3 MiB body of small objects would hold the interpreter
    #: for ~0.2 s; 40,000 decode in ~10 ms. A real pod review has a few hundred, but the
    #: review of an UPDATE carries the object twice, each with its managedFields and, when
    #: kubectl applied it, itself again as text (last-applied-configuration): 20,000 refused
    #: the updates of Deployments made within it
    max_objects: int = 40_000
    #: containers of every kind in the whole object (all its pod templates)
    max_containers: int = 256
    #: an encoded patch past this is dropped (the object is allowed unchanged, with a warning)
    max_patch_bytes: int = 1024 * 1024
    #: bodies at least this large are evaluated in a worker thread, off the event loop: only outsized
    #: objects, whose evaluation would hold the loop for long (a worker shares the GIL, so for a review
    #: of ordinary size, a 20-container pod of ~66 KB included, it only adds hand-offs: issue #44)
    offload_bytes: int = 512 * 1024
    #: how long an evaluation may take; below the mutating webhook's 3 s timeout
    deadline: float = 2.0

    def problem(self, obj: Any) -> str:
        """Why ``obj`` is past the limits, or ""."""
        count = count_containers(obj)
        if count > self.max_containers:
            return (
                f"the object has {count} containers; gpu-admission evaluates objects with at most "
                f"{self.max_containers} (no real pod has that many)"
            )
        return ""


def count_containers(obj: Any) -> int:
    """Containers listed anywhere in ``obj`` (pods, and the templates of any workload kind),
    metadata and status aside.

    A container list is counted, not walked: no kind nests containers in a container, and the
    engine finds pod specs only at pod-template paths, so what a container carries (env, ports,
    probes: most of a large pod's bytes) costs nothing here (issue #44)."""
    count = 0
    stack = [obj]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            for key, value in node.items():
                if key in _CONTAINER_LISTS and isinstance(value, list):
                    count += len(value)
                elif isinstance(value, (dict, list)) and key not in _SKIPPED:
                    stack.append(value)
        elif isinstance(node, list):
            stack.extend(v for v in node if isinstance(v, (dict, list)))
    return count
