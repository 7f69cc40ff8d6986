"""Writing custom objects the way a controller owns them: server-side apply under our field manager, and
paginated lists by label. For ``gpu-admission report`` (the PolicyReports it keeps current).

Each call is one request with a timeout; a refusal becomes
:class:`~webhook.errors.ClusterError` carrying the API server's own message
(``HTTP 403: policyreports.wgpolicyk8s.io "x" is forbidden: User "u" cannot patch …``).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from kubernetes import client

from webhook.cluster import listing
from webhook.cluster.config import ApiClient
from webhook.errors import ClusterError

#: who owns the fields we write (what `kubectl get --show-managed-fields` names)
FIELD_MANAGER = "gpu-admission-report"
APPLY_PATCH = "application/apply-patch+yaml"  # JSON is YAML: the body is sent as JSON
PARTIAL_METADATA = "application/json;as=PartialObjectMetadataList;v=v1;g=meta.k8s.io,application/json"


@dataclass(frozen=True)
class CustomResource:
    """One custom resource: its group, version, plural, kind and scope."""

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}"

    def named(self, namespace: str | None, name: str) -> str:
        return f"{self.kind} {namespace}/{name}" if namespace else f"{self.kind} {name}"


def apply(api_client: ApiClient, resource: CustomResource, obj: dict[str, Any]) -> None:
    """Server-side apply ``obj`` (created when absent), forcing ownership of the fields it holds."""
    meta = obj["metadata"]
    api = client.CustomObjectsApi(api_client)
    options: dict[str, Any] = {
        "field_manager": FIELD_MANAGER, "force": True, "_content_type": APPLY_PATCH,
        "_preload_content": False, "_request_timeout": listing.TIMEOUT,
    }  # fmt: skip
    what = f"writing {resource.named(meta.get('namespace'), meta['name'])}"
    if resource.namespaced:
        listing.answer(lambda: api.patch_namespaced_custom_object(
            resource.group, resource.version, meta["namespace"], resource.plural, meta["name"], obj, **options), what)
    else:
        listing.answer(lambda: api.patch_cluster_custom_object(
            resource.group, resource.version, resource.plural, meta["name"], obj, **options), what)


def metadata(api_client: ApiClient, resource: CustomResource, label_selector: str,
             page_size: int = listing.PAGE_SIZE) -> Iterator[dict[str, Any]]:  # fmt: skip
    """The metadata of every object of ``resource`` the selector matches, in every namespace, page by page.

    Asked as ``PartialObjectMetadataList`` (what ``kubectl get`` asks for names): a report may weigh a
    megabyte, its metadata a few hundred bytes. A server that answers with whole objects is read the same.
    """
    api = client.CustomObjectsApi(api_client)
    headers = {"Accept": PARTIAL_METADATA}

    def lister(**options: Any) -> Any:
        if resource.namespaced:
            return api.list_custom_object_for_all_namespaces(
                resource.group, resource.version, resource.plural, label_selector=label_selector, _headers=headers,
                **options)  # fmt: skip
        return api.list_cluster_custom_object(resource.group, resource.version, resource.plural,
                                              label_selector=label_selector, _headers=headers, **options)  # fmt: skip

    try:
        for obj in listing.list_all(lister, f"{resource.kind} objects", page_size):
            yield obj.get("metadata") or {}
    except ClusterError as exc:
        if "HTTP 404" in str(exc):
            raise ClusterError(f"the cluster serves no {resource.api_version} {resource.kind}: install its CRD "
                               "(deploy/reports/crds/, or Kyverno's or Policy Reporter's)") from exc  # fmt: skip
        raise
