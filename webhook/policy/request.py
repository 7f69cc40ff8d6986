"""The engine's view of one admission request: plain data, no wire format."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from webhook.kube.patch import submap
from webhook.kube.value_text import text

Phase = Literal["mutate", "validate"]

@dataclass(frozen=True)
class Request:
    operation: str
    group: str
    version: str
    kind: str
    namespace: str
    name: str
    object: Mapping[str, Any] | None
    old_object: Mapping[str, Any] | None = None
    sub_resource: str = ""
    dry_run: bool = False
    #: who sends it (``userInfo.username``): the API server authenticated it, so a tenant cannot forge it
    #: as it can an ownerReference (the resourceclaim controller's claims: docs/dra.md)
    user: str = ""

    @classmethod
    def for_object(cls, obj: Mapping[str, Any], *, operation: str = "CREATE", namespace: str | None = None,
                   user: str = "") -> Request:
        """A CREATE request for a manifest (the audit CLI and tests)."""
        api_version = text(obj.get("apiVersion", "v1"))
        group, _, version = api_version.rpartition("/")
        meta = submap(obj, "metadata")
        return cls(
            operation=operation,
            group=group,
            version=version,
            kind=text(obj.get("kind", "")),
            namespace=namespace or text(meta.get("namespace") or "default"),
            name=text(meta.get("name") or ""),
            object=obj,
            user=user,
        )

    @property
    def display_name(self) -> str:
        if self.name:
            return self.name
        meta = submap(self.object, "metadata")
        if meta.get("name"):
            return text(meta["name"])
        generate = meta.get("generateName")
        return f"{text(generate)}*" if generate else "(unnamed)"

    @property
    def subject(self) -> str:
        """e.g. ``Pod ml-a/trainer``."""
        return f"{self.kind} {self.namespace}/{self.display_name}" if self.namespace else f"{self.kind} {self.display_name}"

