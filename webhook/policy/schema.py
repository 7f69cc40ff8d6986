"""The policy file schema: Kubernetes-style documents validated by pydantic.

Four kinds of document live in a policy directory (apiVersion
``gpu-admission.io/v1alpha1``):

- ``GPUPolicy``: what to match and which rules to run, each rule with a mode;
- ``GPUWorkloadClass``: how to tell training from inference from notebooks;
- ``GPUWorkloadKind``: where the pod templates of a custom resource are;
- ``GPUPolicyException``: named objects that some rules of some policies skip.

Every model forbids unknown fields, so a misspelt key is an error at load
time, never a silently ignored setting. docs/policies.md documents each field.
"""

from __future__ import annotations

import re
from fnmatch import fnmatchcase
from functools import cached_property
from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from webhook.policy.settings import dra as dra_settings
from webhook.policy.settings import mutation as mutation_settings
from webhook.policy.settings import validation as validation_settings
from webhook.policy.settings.base import LabelSelector, Mode, Model, ResourceName, RuleBase, SelectorRequirement

__all__ = ["LabelSelector", "Mode", "Model", "RuleBase", "SelectorRequirement"]

API_VERSION = "gpu-admission.io/v1alpha1"


_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


class Metadata(Model):
    name: str = Field(min_length=1, max_length=253)
    labels: dict[str, str] = {}
    annotations: dict[str, str] = {}

    @field_validator("name")
    @classmethod
    def _dns_name(cls, value: str) -> str:
        if not _DNS_SUBDOMAIN.match(value):
            raise ValueError("must be a lowercase DNS-1123 subdomain, e.g. gpu-defaults")
        return value


class Match(Model):
    """What a policy applies to. Every given field must match (AND); lists are ORs."""

    namespaces: list[str] = Field(default=[], description="namespace names; shell globs allowed")
    namespaceSelector: LabelSelector | None = None
    kinds: list[str] = Field(
        default=["Pod"],
        description='"Pod", "Deployment", "kubeflow.org/PyTorchJob", or "*" for every kind with pod specs',
    )
    workloadClasses: list[str] = []
    gpuOnly: bool = Field(default=True, description="only pod specs that request a GPU resource")


class Exclude(Model):
    """What a policy never applies to, even when ``match`` says so."""

    namespaces: list[str] = []
    namespaceSelector: LabelSelector | None = None
    workloadClasses: list[str] = []


class Toleration(Model):
    key: str | None = None
    operator: Literal["Exists", "Equal"] = "Exists"
    value: str | None = None
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    tolerationSeconds: int | None = None

    @model_validator(mode="after")
    def _valid_toleration(self) -> Toleration:
        if self.operator == "Exists" and self.value:
            raise ValueError("a toleration with operator Exists takes no value")
        if not self.key and self.operator != "Exists":
            raise ValueError("a toleration with an empty key needs operator Exists")
        if self.tolerationSeconds is not None and self.effect != "NoExecute":
            raise ValueError("tolerationSeconds is only valid with effect NoExecute")
        return self

    def as_dict(self) -> dict[str, object]:
        return self.model_dump(exclude_none=True)


def _toleration_dicts(tolerations: list[Toleration]) -> tuple[dict[str, object], ...]:
    return tuple(t.as_dict() for t in tolerations)


class TolerationsRule(RuleBase):
    """Add the GPU-node taint tolerations a GPU pod needs (never a duplicate)."""

    tolerations: list[Toleration] = Field(
        default=[Toleration(key="nvidia.com/gpu", operator="Exists", effect="NoSchedule")],
        min_length=1,
    )

    @cached_property
    def wanted(self) -> tuple[dict[str, object], ...]:
        """The tolerations as pod-spec JSON (built once, at load)."""
        return _toleration_dicts(self.tolerations)


class Rules(Model):
    """The rules a policy runs, in this order. A rule left out does not run."""

    tolerations: TolerationsRule | None = None
    resourceShape: validation_settings.ResourceShapeRule | None = None
    quota: validation_settings.QuotaRule | None = None
    cudaDriver: validation_settings.CudaDriverRule | None = None
    gpuAccess: validation_settings.GpuAccessRule | None = None
    nodeAffinity: mutation_settings.NodeAffinityRule | None = None
    runtimeClass: mutation_settings.RuntimeClassRule | None = None
    priorityClass: mutation_settings.PriorityClassRule | None = None
    securityContext: mutation_settings.SecurityContextRule | None = None
    shm: mutation_settings.ShmRule | None = None
    gpuVisibility: mutation_settings.GpuVisibilityRule | None = None
    spreadReplicas: mutation_settings.SpreadReplicasRule | None = None
    trainingLocality: mutation_settings.TrainingLocalityRule | None = None
    notebookLifetime: mutation_settings.NotebookLifetimeRule | None = None
    draClaims: dra_settings.DraClaimsRule | None = None

    def active(self) -> bool:
        """True when any rule is present and not off."""
        return any(getattr(self, name) is not None and getattr(self, name).mode != "off" for name in type(self).model_fields)


class GPUPolicySpec(Model):
    order: int = Field(default=100, description="lower runs first; ties run by name")
    match: Match = Match()
    exclude: Exclude | None = None
    gpuResources: list[ResourceName] = Field(
        default=[], description="resource names counted as GPUs besides the built-in NVIDIA ones"
    )
    deviceClasses: list[dra_settings.DeviceClassEntry] = Field(
        default=[], description="DRA device classes of GPUs besides NVIDIA's (shared by every policy)"
    )
    rules: Rules = Rules()


class GPUPolicy(Model):
    apiVersion: Literal["gpu-admission.io/v1alpha1"]
    kind: Literal["GPUPolicy"]
    metadata: Metadata
    spec: GPUPolicySpec


class ClassMatch(Model):
    """How a workload class is recognised. Every given field must match (AND)."""

    labels: LabelSelector | None = None
    annotations: dict[str, str] = Field(default={}, description='value "*" matches any value')
    ownerKinds: list[str] = Field(default=[], description="kinds in the pod's ownerReferences")
    workloadKinds: list[str] = Field(default=[], description="kind of the admitted object")
    namespaces: list[str] = []
    namespaceSelector: LabelSelector | None = None


class GPUWorkloadClassSpec(Model):
    order: int = Field(default=100, description="lower is tried first; the first match wins")
    workloadClass: str | None = Field(
        default=None,
        description="the class assigned (default: metadata.name); several documents may assign one class",
    )
    matchAny: list[ClassMatch] = Field(min_length=1, description="the class applies when any entry matches")


class GPUWorkloadClass(Model):
    apiVersion: Literal["gpu-admission.io/v1alpha1"]
    kind: Literal["GPUWorkloadClass"]
    metadata: Metadata
    spec: GPUWorkloadClassSpec


class GPUWorkloadKindSpec(Model):
    group: str = Field(description='API group, "" for the core group')
    kind: str = Field(min_length=1)
    podTemplates: list[str] = Field(default=[], description="JSON pointers to pod templates; * is a wildcard")
    podSpecs: list[str] = Field(default=[], description="JSON pointers to bare pod specs; * is a wildcard")

    @model_validator(mode="after")
    def _has_paths(self) -> GPUWorkloadKindSpec:
        if not self.podTemplates and not self.podSpecs:
            raise ValueError("give at least one of podTemplates or podSpecs")
        for path in [*self.podTemplates, *self.podSpecs]:
            if not path.startswith("/"):
                raise ValueError(f"{path!r} is not a JSON pointer (it must start with /)")
        return self


class GPUWorkloadKind(Model):
    apiVersion: Literal["gpu-admission.io/v1alpha1"]
    kind: Literal["GPUWorkloadKind"]
    metadata: Metadata
    spec: GPUWorkloadKindSpec


class LiftedRules(Model):
    """One policy's rules an exception lifts."""

    policy: str = Field(min_length=1, description="the GPUPolicy's metadata.name")
    rules: list[str] = Field(default=[], description="rule names under its spec.rules; empty: every rule it has")

    @field_validator("rules")
    @classmethod
    def _known_rules(cls, value: list[str]) -> list[str]:
        for name in value:
            if name not in Rules.model_fields:
                raise ValueError(f"{name!r} is no rule (rules: {', '.join(Rules.model_fields)})")
        return value


class ExceptionMatch(Model):
    """The objects an exception covers. Every given field must match (AND); lists are ORs."""

    namespaces: list[str] = Field(default=[], description="namespace names (required); shell globs allowed")
    names: list[str] = Field(
        default=[], description="object names; shell globs allowed (a generateName prefix: only by a pattern ending in *)",
    )
    kinds: list[str] = Field(default=[], description="as a policy's match.kinds; empty: every kind")

    @model_validator(mode="after")
    def _in_namespaces(self) -> ExceptionMatch:
        # names (and generateName prefixes) are chosen by whoever creates the object: only the
        # namespaces, whose writers the platform grants, bound who an exception trusts
        if not self.namespaces:
            raise ValueError(
                "give namespaces: object names are chosen by whoever creates the object, so an exception "
                "by names alone would hold in every namespace"
            )
        for pattern in self.namespaces:
            if matches_every_namespace(pattern):
                raise ValueError(f"namespace pattern {pattern!r} matches every namespace: list the namespaces")
        if len(self.namespaces) > 1 and all(any(fnmatchcase(n, p) for p in self.namespaces) for n in _NAMESPACES):
            raise ValueError(f"namespace patterns {', '.join(self.namespaces)} together match every namespace: "
                             "list the namespaces")
        return self


_ALNUM = "abcdefghijklmnopqrstuvwxyz0123456789"

#: a glob that matches each of these matches every namespace name (a DNS-1123 label: [a-z0-9-], at
#: most 63 characters, starting and ending with a letter or digit). Matching every one-character name
#: leaves it at most one element that is not "*" (a "?", a set or a character), which then takes every
#: letter and digit; matching "ab" too, it has a "*" beside that element, so it matches any label: its
#: first, its last or some character is a letter or digit
_EVERY_NAMESPACE = (*_ALNUM, "ab")

#: patterns that together match every one of these (every name of one or two characters, and longer
#: ones) leave no namespace out that anyone names: refused as one that matches every namespace is
#: (for several patterns, no short proof says these names are enough; they are what such lists miss)
_NAMESPACES = (*_ALNUM, *(a + b for a in _ALNUM for b in _ALNUM), *(a + "-" + b for a in "a0z9" for b in "a0z9"),
               "abc", "a-b-c", "default", "kube-system", "a" * 63)


def matches_every_namespace(pattern: str) -> bool:
    """Does the shell glob ``pattern`` match every name a namespace can have (``*``, ``?*``, ``[a-z0-9]*``…)?"""
    return all(fnmatchcase(name, pattern) for name in _EVERY_NAMESPACE)


class GPUPolicyExceptionSpec(Model):
    exceptions: list[LiftedRules] = Field(min_length=1)
    match: ExceptionMatch


class GPUPolicyException(Model):
    apiVersion: Literal["gpu-admission.io/v1alpha1"]
    kind: Literal["GPUPolicyException"]
    metadata: Metadata
    spec: GPUPolicyExceptionSpec

    def summary(self) -> str:
        """"gpu-defaults/securityContext for Pod named llama-* in ml-research": what it lifts, and where."""
        spec = self.spec
        lifted = "; ".join(f"{e.policy}/{','.join(e.rules)}" if e.rules else f"{e.policy} (every rule)"
                           for e in spec.exceptions)
        where = [
            f"for {' or '.join(spec.match.kinds)}" if spec.match.kinds else "",
            f"named {' or '.join(spec.match.names)}" if spec.match.names else "",
            f"in {' or '.join(spec.match.namespaces)}" if spec.match.namespaces else "in any namespace",
        ]
        return f"{lifted} {' '.join(w for w in where if w)}"


Document = Annotated[
    GPUPolicy | GPUWorkloadClass | GPUWorkloadKind | GPUPolicyException, Field(discriminator="kind")
]
DOCUMENT_KINDS = ("GPUPolicy", "GPUWorkloadClass", "GPUWorkloadKind", "GPUPolicyException")
