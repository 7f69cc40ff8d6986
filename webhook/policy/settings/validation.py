"""Policy settings of the validation rules (issue #5): GPU resource shape, GPU
quotas, CUDA versus driver. docs/validations.md documents each field."""

from __future__ import annotations

from functools import cached_property
from typing import Annotated, Any, Literal

from pydantic import Discriminator, Field, Tag, field_validator, model_validator

from webhook.gpu import products
from webhook.gpu.cuda import CudaVersion, DriverVersion, strict_index
from webhook.gpu.resources import ResourceMatcher
from webhook.policy.settings.base import LabelSelector, MigProfile, Model, ResourceName, RuleBase

#: what a policy wants done about a finding: nothing, a warning, or what the
#: rule's mode says (a denial in enforce)
Severity = Literal["allow", "warn", "deny"]
Count = Annotated[int, Field(ge=0)]


def _count_or_map(value: Any) -> str:
    return "by-resource" if isinstance(value, dict) else "all"


#: one cap for every resource, or resource (or "prefix*") → cap; errors name the form
Caps = Annotated[
    Annotated[Count, Tag("all")] | Annotated[dict[ResourceName, Count], Tag("by-resource")],
    Discriminator(_count_or_map),
]


class ClusterRuleBase(RuleBase):
    """A rule that needs cluster state (nodes, pods, quotas) from the cluster view."""

    clusterUnavailable: Literal["fail-open", "fail-closed"] = Field(
        default="fail-open",
        description="when the state is not known: fail-open allows with a warning, fail-closed reports (denies in enforce)",
    )


class SharingSchemes(Model):
    """Vendor GPU-sharing schemes: resources and pod annotations that ask for part of a GPU."""

    resources: list[ResourceName] = Field(
        default=[
            "nvidia.com/gpumem", "nvidia.com/gpucores", "nvidia.com/gpumem-percentage",
            "aliyun.com/gpu-mem", "aliyun.com/gpu-core.percentage",
            "volcano.sh/vgpu-memory", "volcano.sh/vgpu-cores", "volcano.sh/vgpu-number",
        ],
        description='resource names that mark a scheme; "prefix*" allowed',
    )
    annotations: list[str] = Field(default=["gpu-fraction", "gpu-memory"], description="pod annotation keys (KAI)")
    allowed: list[str] = Field(default=[], description="resources / annotation keys of schemes this cluster runs")
    otherwise: Severity = Field(default="warn", description="for a scheme not in allowed")

    @cached_property
    def matcher(self) -> ResourceMatcher:
        """The scheme resources as a matcher (built once)."""
        return ResourceMatcher.of(self.resources)


class ResourceShapeRule(RuleBase):
    """GPU requests the API server or the scheduler would refuse, found before pods exist."""

    initOnly: Severity = Field(default="warn", description="GPUs requested by init containers only")
    maxPerPod: Caps | None = Field(
        default=None, description='a cap for every GPU resource, or resource (or "prefix*") → cap'
    )
    nodeCapacity: bool = Field(default=True, description="deny more GPUs than the largest node, or the node spec.nodeName names, offers (nodes known)")
    migProfiles: list[MigProfile] = Field(default=[], description="allowed MIG profiles such as 1g.10gb; empty: every valid one")
    sharingSchemes: SharingSchemes = SharingSchemes()


class QuotaLimit(Model):
    """One GPU cap: who it covers, which GPUs it counts and how many."""

    scope: Literal["namespace", "team"] = "namespace"
    namespaces: list[str] = Field(default=[], description="namespace scope: globs, each namespace capped alone; empty: all")
    teamLabel: str = Field(default="team", min_length=1, description="team scope: namespace label naming the team")
    teams: list[str] = Field(default=[], description="team scope: label values this cap covers; empty: every team")
    resource: ResourceName = Field(default="nvidia.com/gpu", description='a resource name or "prefix*"')
    model: str = Field(default="*", description='"*": every pod; "any": pods that target no model; else a glob')
    priorityClasses: list[str] = Field(default=[], description="only pods of these priority classes; empty: all")
    max: Count


class QuotaRule(ClusterRuleBase):
    """GPU caps per namespace, team, GPU model and priority class, and native ResourceQuotas."""

    limits: list[QuotaLimit] = []
    modelLabel: str = Field(default=products.PRODUCT_LABEL, min_length=1, description="the node label naming the model")
    resourceQuotas: bool = Field(default=True, description="also deny what a native ResourceQuota would")
    templates: Literal["ignore", "warn"] = Field(
        default="warn", description="warn when a template's replicas × GPUs alone exceed a cap or a native ResourceQuota"
    )


class ImageCuda(Model):
    image: str = Field(min_length=1, description="a shell glob over the image as written in the pod spec")
    cuda: str = Field(description='its CUDA version, or "none" for an image without CUDA')

    @field_validator("cuda")
    @classmethod
    def _version(cls, value: str) -> str:
        if value.strip().lower() != "none" and CudaVersion.parse(value) is None:
            raise ValueError(f'{value!r} is not a CUDA version such as 12.4 or 12.4.1, nor "none"')
        return value


class ForwardCompat(Model):
    """CUDA forward compatibility (cuda-compat in the image): data-center GPUs, some driver branches.

    ``auto`` applies it where NVIDIA documents it: NGC framework releases on the
    branches their release notes list, images whose ``NVIDIA_REQUIRE_CUDA``
    lists ``brand=tesla`` branches; on nodes whose GPU product is a data-center GPU.
    """

    mode: Literal["auto", "off"] = Field(default="auto", description="auto: where NVIDIA supports it; off: never")
    driverBranches: list[int] = Field(default=[], description="more driver majors the `images` globs run on, e.g. [550]")
    images: list[str] = Field(default=["nvcr.io/nvidia/*"], description="globs of images that ship cuda-compat, for driverBranches")
    nodes: LabelSelector | None = Field(
        default=None, description="nodes with data-center GPUs (default: by their GPU product label)"
    )
    productLabel: str = Field(default=products.PRODUCT_LABEL, min_length=1, description="the node label naming the GPU")
    dataCenterProducts: list[str] = Field(default=[], description="globs of more GPU products to treat as data-center GPUs")


class CudaDriverRule(ClusterRuleBase):
    """Deny images whose CUDA is newer than the driver of every node the pod could land on."""

    compatibility: Literal["strict", "minor-version"] = "strict"
    partial: Literal["deny", "warn", "steer"] = Field(
        default="steer", description="when only some eligible nodes can run it"
    )
    unsteerable: Severity = Field(
        default="deny",
        description="partial: steer, and no node affinity can say which nodes run it (their labels do not tell)",
    )
    unknownCuda: Severity = Field(default="warn", description="a GPU container whose CUDA version is unknown")
    images: list[ImageCuda] = Field(default=[], description="image → CUDA, for images tags do not tell")
    minDrivers: dict[str, str] = Field(default={}, description="extra or corrected rows: CUDA version → minimum driver")
    forwardCompat: ForwardCompat = Field(
        default=ForwardCompat(), description="where NVIDIA supports forward compatibility (data-center GPUs); mode: off to never assume it"
    )
    templateTolerates: list[str] = Field(
        default=["nvidia.com/gpu"],
        description="taint keys the pods of a template are assumed to tolerate (added at pod creation)",
    )

    @cached_property
    def driver_index(self) -> dict[tuple[int, int, int], DriverVersion]:
        """CUDA release → minimum driver, the table with minDrivers applied (built once)."""
        return strict_index(self.minDrivers)

    @cached_property
    def image_memo(self) -> dict[str, tuple[Any, Any]]:
        """image → (the resolver's config it was judged with, what its containers need), filled as images are seen."""
        return {}

    @model_validator(mode="after")
    def _rows(self) -> CudaDriverRule:
        for cuda, driver in self.minDrivers.items():
            if CudaVersion.parse(cuda) is None or DriverVersion.parse(driver) is None:
                raise ValueError(f"minDrivers: {cuda!r}: {driver!r} must map a CUDA version to a driver version")
        return self


class GpuAccessRule(RuleBase):
    """Refuse the ways a pod reaches a node's GPUs besides requesting them (docs/validations.md)."""

    variables: list[str] = Field(
        default=["NVIDIA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES", "NVIDIA_MIG_CONFIG_DEVICES",
                 "NVIDIA_MIG_MONITOR_DEVICES"],
        description="environment variables the NVIDIA container toolkit reads: refused in containers without GPUs "
                    "unless void, none or empty",
    )
    allowedWithGpu: list[str] = Field(
        default=["NVIDIA_DRIVER_CAPABILITIES"],
        description="of those, the ones a container that requested a GPU may set (to any value)",
    )
    runtimeClasses: list[str] = Field(
        default=["nvidia"], description="runtime classes refused on pods that request no GPU"
    )
    hostPaths: list[str] = Field(
        default=["/", "/dev", "/dev/nvidia*", "/dev/dri*"],
        description="hostPath volume paths refused (shell globs, after removing ./, // and a trailing /)",
    )
    privileged: bool = Field(default=True, description="refuse privileged containers in pods that request GPUs")
    envFromPrefixes: bool = Field(
        default=True,
        description="refuse envFrom whose non-empty prefix begins one of the variables (in a GPU container: one "
                    "not in allowedWithGpu)",
    )

    @field_validator("hostPaths")
    @classmethod
    def _absolute(cls, paths: list[str]) -> list[str]:
        for path in paths:
            if not path.startswith("/"):
                raise ValueError(f"{path!r} is not an absolute path")
        return paths
