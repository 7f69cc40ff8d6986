"""The tests' hands on the real apiserver: the real ``kubernetes`` client, its dynamic flavour.

Writes return what the apiserver stored, or raise :class:`Refused` carrying
the apiserver's own status message (``admission webhook "…" denied the
request: …``), so a test reads like what a user sees.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar

import yaml
from kubernetes import client, config
from kubernetes.dynamic import DynamicClient
from kubernetes.dynamic.exceptions import ApiException as DynamicApiException
from kubernetes.client.exceptions import ApiException

Object = dict[str, Any]
T = TypeVar("T")


class Refused(Exception):
    """The apiserver refused a request; ``status`` and ``message`` are its answer."""

    def __init__(self, status: int, message: str, reason: str = "") -> None:
        super().__init__(f"{status} {reason}: {message}")
        self.status, self.message, self.reason = status, message, reason


def _refused(exc: ApiException | DynamicApiException) -> Refused:
    body = getattr(exc, "body", None)
    try:
        status = json.loads(body) if body else {}
    except (TypeError, ValueError):
        status = {}
    return Refused(int(exc.status or 0), str(status.get("message", body)), str(status.get("reason", "")))


class Kube:
    """A client for one user of the apiserver."""

    def __init__(self, kubeconfig: Path) -> None:
        self.api = config.new_client_from_config(str(kubeconfig))
        self.dynamic = DynamicClient(self.api)
        self.core = client.CoreV1Api(self.api)

    def close(self) -> None:
        self.api.close()

    def _resource(self, obj: Object) -> Any:
        return self.dynamic.resources.get(api_version=obj["apiVersion"], kind=obj["kind"])

    def _call(self, fn: Callable[[], Any]) -> Object:
        try:
            result = fn()
        except (ApiException, DynamicApiException) as exc:
            raise _refused(exc) from None
        return dict(result.to_dict()) if hasattr(result, "to_dict") else dict(result)

    def create(self, obj: Object, namespace: str | None = None, **query: Any) -> Object:
        """Create ``obj``; ``dry_run="All"`` and other query parameters pass through."""
        ns = namespace or obj.get("metadata", {}).get("namespace")
        resource = self._resource(obj)
        kwargs = {"namespace": ns} if resource.namespaced else {}
        return self._call(lambda: resource.create(body=obj, **kwargs, **query))

    def get(self, api_version: str, kind: str, name: str, namespace: str | None = None) -> Object:
        resource = self.dynamic.resources.get(api_version=api_version, kind=kind)
        kwargs = {"namespace": namespace} if resource.namespaced else {}
        return self._call(lambda: resource.get(name=name, **kwargs))

    def list(self, api_version: str, kind: str, namespace: str | None = None) -> list[Object]:
        resource = self.dynamic.resources.get(api_version=api_version, kind=kind)
        kwargs = {"namespace": namespace} if resource.namespaced and namespace else {}
        return list(self._call(lambda: resource.get(**kwargs)).get("items", []))

    def patch(self, obj: Object, patch: Any, content_type: str = "application/merge-patch+json",
              subresource: str | None = None, **query: Any) -> Object:
        meta = obj["metadata"]
        resource = self._resource(obj)
        if subresource:
            resource = resource.subresources[subresource]
        kwargs = {"namespace": meta["namespace"]} if "namespace" in meta else {}
        return self._call(lambda: resource.patch(body=patch, name=meta["name"], content_type=content_type,
                                                 **kwargs, **query))

    def replace(self, obj: Object, subresource: str | None = None) -> Object:
        resource = self._resource(obj)
        meta = obj["metadata"]
        kwargs = {"namespace": meta["namespace"]} if resource.namespaced else {}
        if subresource:  # (e.g. PUT namespaces/NAME/finalize)
            resource = resource.subresources[subresource]
            kwargs["name"] = meta["name"]
        return self._call(lambda: resource.replace(body=obj, **kwargs))

    def apply(self, obj: Object, manager: str = "e2e", **query: Any) -> Object:
        """Server-side apply, as ``kubectl apply --server-side`` does it."""
        resource = self._resource(obj)
        meta = obj["metadata"]
        kwargs = {"namespace": meta["namespace"]} if resource.namespaced else {}
        return self._call(lambda: resource.server_side_apply(body=obj, name=meta["name"], field_manager=manager,
                                                             force_conflicts=True, **kwargs, **query))

    def delete(self, obj: Object, missing_ok: bool = True, grace: int | None = None) -> None:
        """Delete ``obj``; ``grace``: its grace period in seconds (the object's default when None)."""
        resource = self._resource(obj)
        meta = obj["metadata"]
        kwargs: dict[str, Any] = {"namespace": meta["namespace"]} if resource.namespaced else {}
        if grace is not None:
            kwargs["body"] = {"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": grace}
        try:
            resource.delete(name=meta["name"], **kwargs)
        except (ApiException, DynamicApiException) as exc:
            if not (missing_ok and exc.status == 404):
                raise _refused(exc) from None

    def ensure(self, obj: Object) -> Object:
        """Create, or leave as it is when it exists (deploy/ objects shared by the run)."""
        try:
            return self.create(obj)
        except Refused as exc:
            if exc.status != 409:
                raise
            return self.get(obj["apiVersion"], obj["kind"], obj["metadata"]["name"], obj["metadata"].get("namespace"))


def documents(path: Path) -> list[Object]:
    return [d for d in yaml.safe_load_all(path.read_text()) if isinstance(d, dict)]


def eventually(check: Callable[[], T | None], timeout: float = 20.0, what: str = "condition") -> T:
    """Poll ``check`` until it returns something truthy; the value is returned."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached within {timeout:.0f}s")
        time.sleep(0.1)


def names(objs: Iterable[Object]) -> list[str]:
    return [str(o["metadata"]["name"]) for o in objs]
