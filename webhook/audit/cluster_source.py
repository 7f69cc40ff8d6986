"""``--cluster``: the live cluster as the view, and its running workloads as the objects to audit.

The view is listed once, page by page, and slimmed as the server's index
slims it. Without manifests, the workloads in the namespaces the webhooks
reach (opted in with the label below, never the control plane's) are each
judged as if created now: what would the policies say if this went through
admission today? An object a controller of an audited kind owns (the pods
of a Deployment's ReplicaSet, the ReplicaSet itself) is judged through its
owner, once.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import orjson

from webhook.audit.inputs import CLUSTER_PREFIX, Document
from webhook.audit.packed import Packed
from webhook.cluster import ApiClient, ClusterConfigError, discovery, kinds, listing, load_api_client, pods
from webhook.errors import ClusterError
from webhook.ledger import document
from webhook.ledger.settings import LedgerSettings
from webhook.policy.loader import PolicySet
from webhook.view.snapshot import SnapshotView

#: the namespaceSelector of deploy/base/*webhook.yaml
OPT_IN_LABEL = "gpu-admission.io/enabled"
NEVER_REACHED = frozenset({"kube-system", "kube-public", "kube-node-lease", "gpu-admission"})
_SERVER_FIELDS = ("managedFields", "resourceVersion", "generation", "creationTimestamp", "selfLink")


@dataclass(frozen=True)
class Cluster:
    """What was listed: the view, and what running workloads need."""

    api_client: ApiClient
    view: SnapshotView
    #: the namespaces whose running workloads are audited
    audited: set[str]
    #: their pods as listed, without status and server-set metadata, as compressed JSON (with ``keep_pods``)
    pods: Packed
    #: whether ``pods`` holds them (else they are listed again, page by page, when audited)
    kept_pods: bool = True
    #: what the listing has to say (the GPU quota ledger's charges in flight, or why it was not read)
    notes: list[str] = field(default_factory=list)


def connect(kubeconfig: str | None, context: str | None, in_cluster: bool) -> ApiClient:
    try:
        api_client = load_api_client(kubeconfig, context, True if in_cluster else None)
    except ClusterConfigError as exc:
        raise ClusterError(str(exc)) from exc
    if api_client is None:
        raise ClusterError("no cluster: pass --kubeconfig, set KUBECONFIG, or run in a pod (--in-cluster)")
    return api_client


def fetch(api_client: ApiClient, page_size: int = listing.PAGE_SIZE, *, all_namespaces: bool = False,
          keep_pods: bool = False, ledger_namespace: str = LedgerSettings.namespace) -> Cluster:  # fmt: skip
    """List every resource the policies read and build the view from it.

    With ``keep_pods``, the pods of the audited namespaces are kept as they
    stream past (namespaces are listed before pods), as a client would send
    them (``_as_new``) and packed (compressed JSON, a few hundred bytes a pod),
    so that auditing running workloads does not list every pod of the cluster
    a second time.
    The GPU quota ledgers in ``ledger_namespace`` are read too: pods the
    webhook admitted that are not stored yet hold GPUs as well (docs/quota.md).
    """
    objects: list[dict[str, Any]] = []
    labels: dict[str, dict[str, str]] = {}  # of the namespaces not being deleted
    audited: set[str] = set()
    kept = Packed()
    served = discovery.served_resources(api_client)  # resource.k8s.io/v1 from Kubernetes 1.34 only
    for resource in served:
        kind = kinds.KINDS[resource]
        shape = kinds.shaper(kind, pods.is_gpu_resource)
        if resource == "pods":
            audited = _audited(labels, all_namespaces)
        for obj in listing.list_all(kind.lister(api_client), resource, page_size):
            meta = obj.get("metadata") or {}
            if resource == "namespaces":
                if (obj.get("status") or {}).get("phase") != "Terminating":  # nothing new may be written there
                    labels[str(meta.get("name", ""))] = dict(meta.get("labels") or {})
            elif keep_pods and resource == "pods" and meta.get("namespace") in audited:
                kept.add(_pack(_as_new(obj)))
            shaped = shape(obj)
            if shaped is not None:
                objects.append(shaped)
    notes: list[str] = []
    objects.extend(_in_flight(api_client, ledger_namespace, [o for o in objects if o.get("kind") == "Pod"], page_size,
                              notes))
    view = SnapshotView.from_objects(objects, known=served, unknown_reason="{resource}: not served by this cluster")
    return Cluster(api_client, view, audited, kept, keep_pods, notes)


def _in_flight(api_client: ApiClient, namespace: str, pods: list[dict[str, Any]], page_size: int,
               notes: list[str]) -> list[dict[str, Any]]:
    """The charges of the GPU quota ledgers whose pods are not listed (admitted, not stored yet), as pods."""
    lister = listing.namespaced_lister(api_client, document.GROUP, document.VERSION, document.PLURAL,
                                       namespace)
    try:
        ledgers = list(listing.list_all(lister, f"GPU quota ledgers in {namespace}", page_size))
    except ClusterError as exc:
        notes.append(f"{exc}: charges in flight not counted")
        return []
    found = document.in_flight(ledgers, pods)
    if found:
        named = ", ".join(f"{p['metadata']['namespace']}/{p['metadata']['name']}" for p in found[:5])
        more = f" and {len(found) - 5} more" if len(found) > 5 else ""
        notes.append(f"GPU quota ledger: {len(found)} charge{'s' if len(found) > 1 else ''} in flight counted as used "
                     f"(pods admitted, not stored yet): {named}{more}")
    return found


def _audited(labels: dict[str, dict[str, str]], all_namespaces: bool) -> set[str]:
    """The namespaces whose workloads are audited: the webhooks' opted-in ones, or all."""
    if all_namespaces:
        return set(labels)
    return {
        name for name, values in labels.items()
        if values.get(OPT_IN_LABEL) == "true" and name not in NEVER_REACHED
    }  # fmt: skip


def workloads(cluster: Cluster, policies: PolicySet, notes: list[str], page_size: int = listing.PAGE_SIZE) -> Iterator[Document]:
    """The objects of every workload kind the policies know, in the audited namespaces, cleaned of server fields."""
    counters: dict[str, int] = {}
    for group, kind in sorted(policies.kinds):
        if (group, kind) == ("", "Pod") and cluster.kept_pods:
            listed: Iterable[dict[str, Any]] = map(_unpack, cluster.pods)
        else:
            lister = listing.workload_lister(cluster.api_client, group, kind)
            if lister is None:
                notes.append(f"{group + '/' if group else ''}{kind}: not served by this cluster, not audited")
                continue
            listed = listing.list_all(lister, f"{kind} objects", page_size)
        for obj in listed:
            meta = obj.get("metadata") or {}
            namespace = str(meta.get("namespace") or "")
            if namespace not in cluster.audited or _owned_by_audited(meta, policies):
                continue
            counters[namespace] = counters.get(namespace, 0) + 1
            yield Document(f"{CLUSTER_PREFIX}{namespace}", counters[namespace], 0, _as_new(obj), None, f"{namespace}.yaml")


#: marks an object packed by the standard json module: one orjson cannot write, and would read otherwise
_STDLIB = b"J"


def _pack(obj: dict[str, Any]) -> bytes:
    try:
        return orjson.dumps(obj)
    except orjson.JSONEncodeError:  # an integer past 64 bits (orjson would read it back as a float)
        return _STDLIB + json.dumps(obj, separators=(",", ":")).encode()


def _unpack(data: bytes) -> dict[str, Any]:
    obj: dict[str, Any] = json.loads(data[1:]) if data[:1] == _STDLIB else orjson.loads(data)
    return obj


def _owned_by_audited(meta: dict[str, Any], policies: PolicySet) -> bool:
    for ref in meta.get("ownerReferences") or ():
        if ref.get("controller"):
            group = str(ref.get("apiVersion", "")).rpartition("/")[0]
            if (group, ref.get("kind")) in policies.kinds:
                return True
    return False


def _as_new(obj: dict[str, Any]) -> dict[str, Any]:
    """The object as a client would send it: no status, no server-set metadata."""
    clean = {k: v for k, v in obj.items() if k != "status"}
    meta = copy.copy(obj.get("metadata") or {})
    for name in _SERVER_FIELDS:
        meta.pop(name, None)
    annotations = meta.get("annotations")
    if annotations and pods.LAST_APPLIED in annotations:
        meta["annotations"] = {k: v for k, v in annotations.items() if k != pods.LAST_APPLIED}
    clean["metadata"] = meta
    return clean
