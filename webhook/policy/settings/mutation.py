"""Policy settings of the mutation rules (node affinity, runtime class, /dev/shm,
security context, priority class, GPU visibility). docs/policies.md documents each."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal
from fnmatch import fnmatchcase
from functools import cached_property
from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from webhook.gpu.resources import ResourceMatcher
from webhook.policy.settings.base import Model, Quantity, RuleBase, check_values, quantity_value


class NodeRequirement(Model):
    """A node-selector requirement, as in a pod's nodeAffinity."""

    key: str = Field(min_length=1)
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"]
    values: list[str] = []

    @model_validator(mode="after")
    def _values_fit_operator(self) -> NodeRequirement:
        check_values(self.operator, self.values)
        return self


class PreferredTerm(Model):
    weight: int = Field(ge=1, le=100)
    matchExpressions: list[NodeRequirement] = Field(min_length=1)


class ResourceAffinity(Model):
    """Extra requirements for pods that request certain GPU resources (e.g. MIG)."""

    resources: list[str] = Field(min_length=1, description='resource names; "prefix*" allowed')
    required: list[NodeRequirement] = []
    preferred: list[PreferredTerm] = []

    @cached_property
    def matcher(self) -> ResourceMatcher:
        return ResourceMatcher.of(self.resources)


class NodeAffinityRule(RuleBase):
    """Keep GPU pods on the right nodes: required terms are ANDed into every term."""

    required: list[NodeRequirement] = []
    preferred: list[PreferredTerm] = []
    byResource: list[ResourceAffinity] = []
    onConflict: Literal["deny", "skip"] = Field(
        default="deny", description="when the pod's own nodeSelector/affinity rules out every allowed node"
    )


class RuntimeClassRule(RuleBase):
    """Set runtimeClassName (removing /spec/overhead when the class changes)."""

    name: str = Field(default="nvidia", min_length=1)
    override: bool = Field(default=False, description="replace a different class the user set")
    draPods: Literal["set", "skip"] = Field(
        default="skip",
        description="pods whose GPUs all come from DRA claims: the DRA driver injects them through CDI",
    )


class ShmRule(RuleBase):
    """Mount a memory-backed emptyDir at /dev/shm in GPU containers that have none."""

    size: Quantity | None = Field(default=None, description="a fixed size; else memoryFraction of the limit")
    memoryFraction: float = Field(default=0.5, gt=0, le=1)
    maxSize: Quantity = "32Gi"
    minSize: Quantity = "64Mi"
    sizeWithoutMemoryLimit: Quantity = Field(default="1Gi", description="for containers with no memory limit, in a pod with none of its own")
    volumeName: str = Field(default="gpu-admission-shm", pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", max_length=55)
    initContainers: bool = Field(default=False, description="also GPU init containers (native sidecars, restartPolicy: Always, always)")

    @model_validator(mode="after")
    def _min_below_max(self) -> ShmRule:
        """A minSize given above the maximum turns the clamp upside down (the size is then the whole memory
        limit). A maxSize given alone below the default minimum caps as it did; a fixed size uses neither."""
        if self.size is None and "minSize" in self.model_fields_set and quantity_value(self.minSize) > quantity_value(self.maxSize):
            default = "" if "maxSize" in self.model_fields_set else " (the default)"
            raise ValueError(f"minSize {self.minSize} is above maxSize {self.maxSize}{default}: the fraction of the "
                             "memory limit is clamped between them")
        return self

    @cached_property
    def bytes(self) -> ShmSizes:
        """The sizes as numbers, parsed once."""
        return ShmSizes(
            fixed=quantity_value(self.size) if self.size is not None else None,
            maximum=quantity_value(self.maxSize),
            minimum=quantity_value(self.minSize),
            without_limit=quantity_value(self.sizeWithoutMemoryLimit),
            fraction=Decimal(str(self.memoryFraction)),
        )

    @cached_property
    def size_memo(self) -> dict[str, tuple[int, str]]:
        """memory limit → /dev/shm size (bytes, quantity), filled as limits are seen."""
        return {}


@dataclass(frozen=True)
class ShmSizes:
    fixed: Decimal | None
    maximum: Decimal
    minimum: Decimal
    without_limit: Decimal
    fraction: Decimal


class SecurityContextRule(RuleBase):
    """Non-root defaults that meet PodSecurity "restricted"."""

    level: Literal["default", "enforce"] = Field(
        default="default", description="default: fill what is unset; enforce: also deny explicit violations"
    )
    runAsUser: int | None = Field(default=1000, ge=1)
    runAsGroup: int | None = Field(default=1000, ge=0)
    fsGroup: int | None = Field(default=1000, ge=0)
    seccompProfile: Literal["RuntimeDefault", "Localhost", None] = "RuntimeDefault"
    allowedCapabilities: list[str] = Field(default=["NET_BIND_SERVICE"], description="capabilities.add allowed in enforce")

    @cached_property
    def unset_pod_defaults(self) -> dict[str, Any]:
        """What the pod's securityContext gets when nothing asks for root and nothing is set (seccomp aside);
        the rule leaves out of it what a pod's own settings rule out. Shared: the rule writes a copy (a
        dict's copy, not one built from pairs, on every admission)."""
        wanted: dict[str, Any] = {"runAsNonRoot": True}
        if self.runAsUser is not None:
            wanted["runAsUser"] = self.runAsUser
        if self.runAsGroup is not None:
            wanted["runAsGroup"] = self.runAsGroup
        if self.fsGroup is not None:
            # OnRootMismatch: no recursive chown of every volume at each start
            wanted.update(fsGroup=self.fsGroup, fsGroupChangePolicy="OnRootMismatch")
        return wanted


class ClassChoice(Model):
    """Which of the policy's classes a pod may name itself: the rest are refused."""

    namespaceLabelPrefix: str = Field(
        default="workload-classes.gpu-admission.io/", min_length=1,
        description='a namespace labelled <prefix><workload class>: "true" may name that workload class\'s PriorityClass',
    )
    everywhere: list[str] = Field(default=[], description="workload classes whose PriorityClass any namespace may name")
    ownClass: Literal["anywhere", "allowed-namespaces"] = Field(
        default="anywhere",
        description="where a pod's own workload class gives it that class's PriorityClass: anywhere, or only in "
        "namespaces that may choose the class (elsewhere the PriorityClass of the first class of `everywhere`): "
        "a class follows from the pod's kind or owner, which whoever creates the workload picks",
    )

    def allows(self, workload_class: str, ns_labels: Mapping[str, str]) -> bool:
        """Whether a namespace with ``ns_labels`` may choose ``workload_class``."""
        return workload_class in self.everywhere or ns_labels.get(self.namespaceLabelPrefix + workload_class) == "true"


class PriorityClassRule(RuleBase):
    """priorityClassName by workload class; spec.priority is dropped so it is recomputed."""

    classes: dict[str, Annotated[str, Field(min_length=1)]] = Field(default={}, description="workload class → PriorityClass name")
    default: str | None = Field(default=None, description="for pods of no listed class")
    override: bool = Field(default=False, description="replace a class the user set")
    refusedClasses: list[str] = Field(
        default=["system-*"], description='PriorityClasses a GPU pod may not name ("prefix*" allowed): the cluster\'s own'
    )
    refusedClassesExemptNamespaces: list[str] = Field(default=[], description="namespaces (globs) whose pods may name them")
    userChoice: ClassChoice | None = Field(
        default=None,
        description="refuse a class of `classes` the pod names that is not its own and its namespace may not choose "
        "(None: keep any)",
    )

    def refused(self, name: str, namespace: str) -> bool:
        """Whether a pod in ``namespace`` may not name the class ``name`` at all."""
        return (any(fnmatchcase(name, p) for p in self.refusedClasses)
                and not any(fnmatchcase(namespace, p) for p in self.refusedClassesExemptNamespaces))

    @cached_property
    def workload_classes(self) -> dict[str, list[str]]:
        """PriorityClass name → the workload classes the policy gives it, in the policy's order."""
        found: dict[str, list[str]] = {}
        for workload_class, name in self.classes.items():
            found.setdefault(name, []).append(workload_class)
        return found


class GpuVisibilityRule(RuleBase):
    """Hide the node's GPUs from containers that requested none."""

    setVoid: bool = Field(default=True, description="NVIDIA_VISIBLE_DEVICES=void in non-GPU containers of GPU pods")
    denyUnrequestedVisibleDevices: bool = Field(
        default=False, description="report containers that set NVIDIA_VISIBLE_DEVICES without requesting a GPU"
    )


#: labels that differ between the replicas or revisions of one workload; a
#: selector built from them would select one pod, or one revision only
PER_REPLICA_LABELS = [
    "pod-template-hash",
    "controller-revision-hash",
    "statefulset.kubernetes.io/pod-name",
    "apps.kubernetes.io/pod-index",
    "batch.kubernetes.io/job-completion-index",
    "job-completion-index",
]


class SpreadReplicasRule(RuleBase):
    """Anti-affinity between the replicas of one workload, so one node failure cannot take them all."""

    type: Literal["preferred", "required"] = "preferred"
    topologyKey: str = Field(default="kubernetes.io/hostname", min_length=1)
    weight: int = Field(default=100, ge=1, le=100)
    ignoreLabels: list[str] = Field(default=PER_REPLICA_LABELS, description="pod labels never used in the selector")


class JobIdentity(Model):
    """The label a training operator puts on every pod of one job, and the kinds that use it."""

    label: str = Field(min_length=1)
    kinds: list[str] = Field(min_length=1, description="kinds whose templates get name-of-the-object as value")


class TrainingLocalityRule(RuleBase):
    """Affinity between the pods of one distributed training job, on one topology domain."""

    type: Literal["preferred", "required"] = "preferred"
    topologyKey: str = Field(min_length=1, description="e.g. topology.kubernetes.io/zone or a rack/fabric label")
    weight: int = Field(default=100, ge=1, le=100)
    jobIdentities: list[JobIdentity] = Field(
        default=[
            JobIdentity(label="training.kubeflow.org/job-name",
                        kinds=["PyTorchJob", "TFJob", "MPIJob", "XGBoostJob", "PaddleJob", "JAXJob", "MXJob"]),
            JobIdentity(label="jobset.sigs.k8s.io/jobset-name", kinds=["JobSet"]),
            JobIdentity(label="batch.kubernetes.io/job-name", kinds=["Job"]),
        ],
        min_length=1,
    )


class NotebookLifetimeRule(RuleBase):
    """activeDeadlineSeconds for notebooks, so idle ones do not hold GPUs forever."""

    activeDeadlineSeconds: int = Field(default=43200, ge=60, description="set when the pod has none")
    skipControllerOwned: bool = Field(
        default=True,
        description="no default deadline for pods a controller recreates (a StatefulSet would restart them in a loop)",
    )
    maxActiveDeadlineSeconds: int | None = Field(default=86400, ge=60, description="longer ones are reported")

    @model_validator(mode="after")
    def _default_within_max(self) -> NotebookLifetimeRule:
        if self.maxActiveDeadlineSeconds is not None and self.activeDeadlineSeconds > self.maxActiveDeadlineSeconds:
            raise ValueError("activeDeadlineSeconds must not exceed maxActiveDeadlineSeconds")
        return self
