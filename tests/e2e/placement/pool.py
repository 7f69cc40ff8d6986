"""A node pool per test case, and where pods land in it.

Every case registers its own nodes, labelled ``e2e.gpu-admission.io/pool: <unique>``,
and its pods select that label (``nodeSelector``): cases, and nodes other
tests leave behind, never share a node. The pool's nodes are deleted at the
end of the case, and so are the workloads and pods it made (with
``gracePeriodSeconds: 0``: no kubelet ever confirms a pod stopped).
"""

from __future__ import annotations

import copy
import uuid
from collections.abc import Callable, Collection, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from kubernetes.client.exceptions import ApiException
from kubernetes.dynamic.exceptions import ApiException as DynamicApiException

from tests.e2e.admission import Admission
from tests.e2e.control_plane import PACKING
from tests.e2e.fixtures import make_ready, wait_for_view
from tests.e2e.kube import Kube, Object, Refused, eventually

POOL_LABEL = "e2e.gpu-admission.io/pool"
#: pod name → the node it is bound to, or None when the scheduler found it unschedulable
Placement = dict[str, str | None]
T = TypeVar("T")
R = TypeVar("R")


def in_parallel(fn: Callable[[T], R], items: Iterable[T], workers: int = 8) -> list[R]:
    listed = list(items)
    if not listed:
        return []
    with ThreadPoolExecutor(min(workers, len(listed))) as pool:
        return list(pool.map(fn, listed))


class Pool:
    """The nodes of one test case, the selector of its pods, and what to clean up."""

    def __init__(self, admin: Kube, admission: Admission) -> None:
        self.admin, self.admission = admin, admission
        self.name = uuid.uuid4().hex[:8]
        self.nodes: list[str] = []
        self.namespaces: set[str] = set()

    @property
    def selector(self) -> dict[str, str]:
        return {POOL_LABEL: self.name}

    def node_name(self, suffix: str) -> str:
        return f"{self.name}-{suffix}"

    def register(self, *nodes: Object) -> list[Object]:
        """Create ``nodes`` (named ``<pool>-<their name>``, labelled with the pool) Ready, at once, and wait
        for the server's cluster view to hold them."""
        def one(node: Object) -> Object:
            node = copy.deepcopy(node)
            meta = node["metadata"]
            meta["name"] = self.node_name(meta["name"])
            meta["labels"] = {**meta.get("labels", {}), POOL_LABEL: self.name,
                              "kubernetes.io/hostname": meta["name"]}
            self.nodes.append(meta["name"])
            return make_ready(self.admin, self.admin.create(node))

        stored = in_parallel(one, nodes)
        wait_for_view(self.admin, self.admission, "nodes", "v1", "Node")
        return stored

    def relabel(self, suffix: str, labels: dict[str, str]) -> Object:
        node = self.admin.get("v1", "Node", self.node_name(suffix))
        return self.admin.patch(node, {"metadata": {"labels": labels}})

    # -- pods

    def pod(self, obj: Object, scheduler: str = PACKING) -> Object:
        """``obj`` (a Pod) made to select the pool and name one of the suite's scheduler profiles."""
        obj = copy.deepcopy(obj)
        spec = obj["spec"] if obj["kind"] == "Pod" else _template_spec(obj)
        spec["nodeSelector"] = {**spec.get("nodeSelector", {}), **self.selector}
        spec["schedulerName"] = scheduler
        self.namespaces.add(obj["metadata"]["namespace"])
        return obj

    workload = pod  # the same for a Deployment's or Job's template

    def create(self, objs: Iterable[Object], scheduler: str = PACKING) -> dict[str, Object | Refused]:
        """Create every object at once (each made to select the pool); by name, what was stored or the refusal."""
        def one(obj: Object) -> tuple[str, Object | Refused]:
            made = self.pod(obj, scheduler)
            try:
                return made["metadata"]["name"], self.admin.create(made)
            except Refused as exc:
                return made["metadata"]["name"], exc

        return dict(in_parallel(one, objs))

    def cleanup(self) -> None:
        """Delete the pool's nodes, then its workloads (their dependents with them) and pods, until the case's
        namespaces hold no pod: nothing of a case outlives it, even while the controllers still run."""
        in_parallel(lambda name: self.admin.delete({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}}),
                    self.nodes)
        for namespace in self.namespaces:
            for api_version, kind in (("apps/v1", "Deployment"), ("batch/v1", "Job"), ("apps/v1", "ReplicaSet"),
                                      ("apps/v1", "DaemonSet")):
                resource = self.admin.dynamic.resources.get(api_version=api_version, kind=kind)
                for obj in self.admin.list(api_version, kind, namespace):
                    # a Job's dependents are orphaned by default: background, as kubectl deletes
                    try:
                        resource.delete(name=obj["metadata"]["name"], namespace=namespace,
                                        body={"propagationPolicy": "Background"})
                    except DynamicApiException as exc:  # a ReplicaSet its Deployment's deletion took already
                        if exc.status != 404:
                            raise

            def gone(ns: str = namespace) -> bool:
                left = self.admin.list("v1", "Pod", ns)
                in_parallel(lambda p: delete_now(self.admin, p), left)
                return not left

            eventually(gone, timeout=30, what=f"the pods of {namespace} deleted")


def _template_spec(obj: Object) -> dict[str, Any]:
    spec: dict[str, Any] = obj["spec"]["template"]["spec"]
    return spec


def delete_now(admin: Kube, pod: Object) -> None:
    meta = pod["metadata"]
    try:
        admin.core.delete_namespaced_pod(meta["name"], meta["namespace"], grace_period_seconds=0)
    except ApiException as exc:
        if exc.status != 404:
            raise


def unschedulable(pod: Object) -> bool:
    """The scheduler tried and found no node: ``PodScheduled=False``."""
    return any(c.get("type") == "PodScheduled" and c.get("status") == "False"
               for c in (pod.get("status") or {}).get("conditions") or ())


def placements(admin: Kube, namespace: str, names: Collection[str] | None = None, count: int | None = None,
               timeout: float = 60.0) -> Placement:
    """Wait until each pod (``names``, else every pod of the namespace, at least ``count`` of them) is bound
    (``spec.nodeName``) or found unschedulable; where each landed (None: nowhere)."""
    wanted = set(names) if names is not None else None
    expected = len(wanted) if wanted is not None else (count or 1)

    def settled() -> Placement | None:
        pods = [p for p in admin.list("v1", "Pod", namespace)
                if (wanted is None or p["metadata"]["name"] in wanted) and not p["metadata"].get("deletionTimestamp")]
        if len(pods) < expected:
            return None
        result: Placement = {}
        for p in pods:
            node = p["spec"].get("nodeName")
            if node:
                result[p["metadata"]["name"]] = node
            elif unschedulable(p):
                result[p["metadata"]["name"]] = None
            else:
                return None
        return result

    what = f"{expected} pod(s) of {namespace} bound or unschedulable"
    return eventually(settled, timeout=timeout, what=what)


def bound(admin: Kube, namespace: str, name: str, timeout: float = 30.0) -> str:
    """Wait until the pod is bound; its node."""
    def node() -> str | None:
        found: str | None = admin.get("v1", "Pod", name, namespace)["spec"].get("nodeName")
        return found

    return eventually(node, timeout=timeout, what=f"pod {namespace}/{name} bound")


def landed_on(placement: Placement, pool: Pool) -> dict[str, str | None]:
    """The placement with node names shortened to their suffix in the pool (``a100`` for ``<pool>-a100``)."""
    prefix = pool.name + "-"
    return {pod: (node[len(prefix):] if node and node.startswith(prefix) else node) for pod, node in placement.items()}


def with_cpu(container: Object, cpu: str) -> Object:
    """``container`` also requesting ``cpu`` (limits: requests default to them), so it weighs on a node's CPUs."""
    container = copy.deepcopy(container)
    container["resources"].setdefault("limits", {})["cpu"] = cpu
    return container


def driver_labels(driver: str) -> dict[str, str]:
    """GPU Feature Discovery's driver labels for ``driver`` (what a driver upgrade changes)."""
    major, minor, revision = (driver.split(".") + ["", ""])[:3]
    return {"nvidia.com/cuda.driver-version.full": driver, "nvidia.com/cuda.driver-version.major": major,
            "nvidia.com/cuda.driver-version.minor": minor, "nvidia.com/cuda.driver-version.revision": revision}
