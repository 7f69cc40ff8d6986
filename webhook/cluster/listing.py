"""One-shot, paginated listing of any resource: for the audit CLI's ``--cluster``.

The index (:mod:`webhook.cluster.watch`) lists and then watches; the audit
only needs one consistent list of each resource, page by page
(``limit``/``continue``) so that 100,000 pods never arrive as one response.
Workload kinds are listed through the ``kubernetes`` client's typed calls
for built-in kinds and through discovery and the custom-objects API for the
others. Failures become :class:`~webhook.errors.ClusterError` with one line.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import urllib3
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from webhook.errors import ClusterError

PAGE_SIZE = 500
TIMEOUT = (5.0, 60.0)  # connect, read (one page)

#: (group, kind) → (API class, cluster-wide list call) of the built-in workload kinds
BUILTIN_WORKLOADS: dict[tuple[str, str], tuple[str, str]] = {
    ("", "Pod"): ("CoreV1Api", "list_pod_for_all_namespaces"),
    ("", "PodTemplate"): ("CoreV1Api", "list_pod_template_for_all_namespaces"),
    ("", "ReplicationController"): ("CoreV1Api", "list_replication_controller_for_all_namespaces"),
    ("apps", "Deployment"): ("AppsV1Api", "list_deployment_for_all_namespaces"),
    ("apps", "StatefulSet"): ("AppsV1Api", "list_stateful_set_for_all_namespaces"),
    ("apps", "DaemonSet"): ("AppsV1Api", "list_daemon_set_for_all_namespaces"),
    ("apps", "ReplicaSet"): ("AppsV1Api", "list_replica_set_for_all_namespaces"),
    ("batch", "Job"): ("BatchV1Api", "list_job_for_all_namespaces"),
    ("batch", "CronJob"): ("BatchV1Api", "list_cron_job_for_all_namespaces"),
}


def list_all(lister: Callable[..., Any], what: str, page_size: int = PAGE_SIZE) -> Iterator[dict[str, Any]]:
    """Every object ``lister`` returns, page by page, each with its ``kind`` and ``apiVersion`` set."""
    token: str | None = None
    while True:
        options: dict[str, Any] = {"limit": page_size, "_preload_content": False, "_request_timeout": TIMEOUT}
        if token:
            options["_continue"] = token
        page = _call(lambda: lister(**options), what)
        kind = str(page.get("kind", "")).removesuffix("List")
        api_version = page.get("apiVersion", "")
        for item in page.get("items") or ():
            if isinstance(item, dict):
                item.setdefault("kind", kind)
                item.setdefault("apiVersion", api_version)
                yield item
        token = (page.get("metadata") or {}).get("continue")
        if not token:
            return


def workload_lister(api_client: client.ApiClient, group: str, kind: str) -> Callable[..., Any] | None:
    """The cluster-wide list call of a workload kind, or None when the cluster does not serve it."""
    builtin = BUILTIN_WORKLOADS.get((group, kind))
    if builtin is not None:
        api, method = builtin
        return getattr(getattr(client, api)(api_client), method)  # type: ignore[no-any-return]
    found = _discover(api_client, group, kind)
    if found is None:
        return None
    version, plural = found
    custom = client.CustomObjectsApi(api_client)

    def lister(**options: Any) -> Any:
        return custom.list_custom_object_for_all_namespaces(group, version, plural, **options)

    return lister


def namespaced_lister(api_client: client.ApiClient, group: str, version: str, plural: str,
                      namespace: str) -> Callable[..., Any]:
    """The list call of a custom resource in one namespace (the GPU quota ledgers)."""
    custom = client.CustomObjectsApi(api_client)

    def lister(**options: Any) -> Any:
        return custom.list_namespaced_custom_object(group, version, namespace, plural, **options)

    return lister


def _discover(api_client: client.ApiClient, group: str, kind: str) -> tuple[str, str] | None:
    """(preferred version, plural) of a custom kind, through API discovery."""
    try:
        groups = _call(lambda: client.ApisApi(api_client).get_api_versions(_preload_content=False), "API groups")
    except ClusterError:
        return None
    for entry in groups.get("groups") or ():
        if entry.get("name") != group:
            continue
        version = (entry.get("preferredVersion") or {}).get("version")
        if not version:
            return None
        resources = _call(
            lambda: client.CustomObjectsApi(api_client).get_api_resources(group, version, _preload_content=False),
            f"resources of {group}/{version}",
        )
        for resource in resources.get("resources") or ():
            if resource.get("kind") == kind and "/" not in str(resource.get("name", "")):
                return version, str(resource["name"])
    return None


def answer(request: Callable[[], Any], what: str) -> bytes:
    """The body of one call made with ``_preload_content=False``, read to its end (a connection back in the
    pool with its answer unread breaks the next request on it); ClusterError saying ``what`` failed."""
    try:
        response = request()
        try:
            return bytes(response.data)
        finally:
            response.release_conn()
    except ApiException as exc:
        raise ClusterError(f"{what}: {status_text(exc)}") from exc
    except urllib3.exceptions.HTTPError as exc:
        raise ClusterError(f"{what}: cannot reach the API server ({type(exc).__name__})") from exc


def _call(request: Callable[[], Any], what: str) -> dict[str, Any]:
    data = answer(request, f"listing {what}")
    try:
        page = json.loads(data)
    except ValueError as exc:
        raise ClusterError(f"listing {what}: the API server's answer is not JSON") from exc
    if not isinstance(page, dict):
        raise ClusterError(f"listing {what}: the API server's answer is not a JSON object")
    return page


def status_text(exc: ApiException) -> str:
    """The API server's own message of a failed call, with its HTTP status."""
    try:
        message = json.loads(exc.body or "")["message"]
    except (ValueError, KeyError, TypeError):
        message = exc.reason
    return f"HTTP {exc.status}: {message}" if exc.status else f"cannot reach the API server ({exc.reason})"
