"""Policy settings for Dynamic Resource Allocation: GPU device classes and the draClaims rule.

docs/dra.md documents each field.
"""

from __future__ import annotations

from pydantic import Field

from webhook.gpu.device_classes import PROFILE, DeviceClassInfo
from webhook.policy.settings.base import LabelSelector, MigProfile, Model, ResourceName
from webhook.policy.settings.validation import ClusterRuleBase, Severity


class DeviceClassEntry(Model):
    """A DeviceClass whose devices are GPUs, besides NVIDIA's built-in ones."""

    name: str = Field(min_length=1, description="the DeviceClass name, e.g. gpu.amd.com")
    resource: str = Field(
        min_length=1, description=f"the extended resource one device counts as; {PROFILE} takes a MIG profile"
    )
    driver: str = Field(default="", description="the DRA driver publishing its devices (default: the class name)")
    deviceType: str = Field(default="", description="the driver's type attribute of its devices; empty: any")

    def info(self) -> DeviceClassInfo:
        return DeviceClassInfo(self.name, self.resource, self.driver or self.name, self.deviceType)


class ClassRestriction(Model):
    """GPU device classes only some namespaces may claim."""

    classes: list[str] = Field(min_length=1, description="DeviceClass names; shell globs allowed")
    namespaces: list[str] = Field(default=[], description="namespaces that may use them; globs")
    namespaceSelector: LabelSelector | None = Field(default=None, description="or namespaces with these labels")


class DraClaimsRule(ClusterRuleBase):
    """GPU requests of ResourceClaims and ResourceClaimTemplates, and the claims pods name."""

    allocationModeAll: Severity = Field(
        default="deny", description="a GPU request of allocationMode All (every GPU of the node)"
    )
    maxPerClaim: dict[ResourceName, int] = Field(
        default={}, description='resource (or "prefix*") → most devices one claim may ask for'
    )
    migProfiles: list[MigProfile] = Field(default=[], description="allowed MIG profiles; empty: every valid one")
    adminAccessNamespaces: list[str] = Field(
        default=[], description="namespaces (globs) where adminAccess may be requested; empty: none"
    )
    restrictedClasses: list[ClassRestriction] = []
    unresolved: Severity = Field(
        default="warn", description="a pod naming a claim or template the cluster does not have"
    )
    nodeCapacity: bool = Field(
        default=True, description="deny a pod claiming more devices of a class than any node publishes"
    )
