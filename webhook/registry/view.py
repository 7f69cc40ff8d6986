"""A cluster view that also answers what the registry resolver knows of images."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from webhook.gpu.images import ImageConfig
from webhook.kube.resource_slices import Device
from webhook.registry.resolver import Resolver
from webhook.view.nodegroups import NodeGroup
from webhook.view.protocol import Availability, ClusterView, Object, Resource
from webhook.view.usage import UsageView


@dataclass(frozen=True)
class ResolvedView:
    """``base`` for cluster state, ``resolver``'s cache for image configs."""

    base: ClusterView
    resolver: Resolver

    def availability(self, resource: Resource) -> Availability:
        return self.base.availability(resource)

    def namespace(self, name: str) -> Object | None:
        return self.base.namespace(name)

    def nodes(self) -> Iterable[Object]:
        return self.base.nodes()

    def pods(self, namespace: str | None = None) -> Iterable[Object]:
        return self.base.pods(namespace)

    def resource_quotas(self, namespace: str) -> Iterable[Object]:
        return self.base.resource_quotas(namespace)

    def priority_class(self, name: str) -> Object | None:
        return self.base.priority_class(name)

    def runtime_class(self, name: str) -> Object | None:
        return self.base.runtime_class(name)

    def node_groups(self) -> Sequence[NodeGroup]:
        return self.base.node_groups()

    def gpu_usage(self, model_label: str, team_labels: Iterable[str] = ()) -> UsageView:
        return self.base.gpu_usage(model_label, team_labels)

    def claim_pods(self) -> Iterable[Object]:
        return self.base.claim_pods()

    def device_class(self, name: str) -> Object | None:
        return self.base.device_class(name)

    def resource_claim_template(self, namespace: str, name: str) -> Object | None:
        return self.base.resource_claim_template(namespace, name)

    def resource_claim(self, namespace: str, name: str) -> Object | None:
        return self.base.resource_claim(namespace, name)

    def resource_slices(self) -> Iterable[Object]:
        return self.base.resource_slices()

    def published_device(self, driver: str, pool: str, name: str) -> Device | None:
        return self.base.published_device(driver, pool, name)

    def image_config(self, image: str) -> ImageConfig | None:
        return self.resolver.image_config(image) or self.base.image_config(image)
