"""The ``GPUAdmissionTest`` document: policies, resources, cluster facts and the results expected.

Every model forbids unknown fields, so a misspelt key is refused with its
file, document and field path (exit 2), never silently ignored.
docs/testing.md documents each field.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator, model_validator

from webhook.policy.schema import Metadata, Model
from webhook.view.protocol import Resource

KIND = "GPUAdmissionTest"

#: one rule's result on one object; "none": the rule does not run on it (off, or its policy does not match)
RuleVerdict = Literal["deny", "audit", "warn", "mutate", "pass", "skip", "none"]
#: the object's verdict, as the two webhooks together answer it
ObjectVerdict = Literal["deny", "warn", "mutate", "pass"]
OBJECT_VERDICTS: tuple[str, ...] = ("deny", "warn", "mutate", "pass")


class RequestFacts(Model):
    """What kube-apiserver sends along with each object (no rule reads the requesting user)."""

    operation: Literal["CREATE", "UPDATE"] = "CREATE"
    oldResources: list[str] = Field(default=[],
                                    description="UPDATE: the objects as stored, matched by kind, namespace, name")
    namespace: str | None = Field(default=None, description="the namespace of resources that name none (default: default)")
    namespaceLabels: dict[str, dict[str, str]] = Field(default={}, description="namespace → its labels")

    @model_validator(mode="after")
    def _old_for_update(self) -> RequestFacts:
        if self.oldResources and self.operation != "UPDATE":
            raise ValueError("oldResources are for operation UPDATE")
        if self.operation == "UPDATE" and not self.oldResources:
            raise ValueError("operation UPDATE needs oldResources: the objects as they are stored")
        return self


class Expectation(Model):
    """The result expected for some resources: of one policy rule, or of the object as a whole."""

    resources: list[str] = Field(min_length=1, description="Kind/namespace/name, Kind/name, or a name")
    policy: str | None = None
    rule: str | None = None
    verdict: RuleVerdict | None = None
    message: str | None = Field(default=None, description="a regular expression one message must contain")
    patchedResource: str | None = Field(default=None, description="a file: the object as the mutating webhook leaves it")

    @field_validator("message")
    @classmethod
    def _compiles(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                re.compile(value)
            except re.error as exc:
                raise ValueError(f"not a regular expression: {exc}") from None
        return value

    @model_validator(mode="after")
    def _consistent(self) -> Expectation:
        if (self.policy is None) != (self.rule is None):
            raise ValueError("policy and rule go together (neither: the object as a whole)")
        if self.rule is None and self.verdict is not None and self.verdict not in OBJECT_VERDICTS:
            raise ValueError(f"an object's verdict is one of {', '.join(OBJECT_VERDICTS)} "
                             f"({self.verdict} is a rule's: name its policy and rule)")  # fmt: skip
        if self.patchedResource is not None and (self.rule is not None or len(self.resources) != 1):
            raise ValueError("patchedResource belongs to one resource as a whole (no policy, no rule)")
        if self.verdict is None and self.message is None and self.patchedResource is None:
            raise ValueError("expects nothing: give a verdict, a message or a patchedResource")
        return self

    @property
    def rule_id(self) -> str:
        return f"{self.policy}/{self.rule}" if self.rule else ""


class Spec(Model):
    policies: list[str] = Field(min_length=1, description="policy folders or files, relative to this file")
    resources: list[str] = Field(min_length=1, description="manifest files or folders, relative to this file")
    clusterState: list[str] = Field(default=[], description="cluster facts: what audit --cluster-state reads")
    complete: list[Resource] = Field(default=[], description="resources the cluster state lists in full")
    request: RequestFacts = RequestFacts()
    results: list[Expectation] = []


class GPUAdmissionTest(Model):
    apiVersion: Literal["gpu-admission.io/v1alpha1"]
    kind: Literal["GPUAdmissionTest"]
    metadata: Metadata
    description: str = ""
    spec: Spec

