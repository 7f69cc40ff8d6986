"""Building blocks shared by every policy model."""

from __future__ import annotations

import re
from decimal import Decimal
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from webhook.gpu import mig
from webhook.kube import quantity

#: enforce: apply (mutations) or deny (validations); warn: allow with an admission
#: warning; audit: record only (audit reports, metrics); off: do nothing.
Mode = Literal["enforce", "warn", "audit", "off"]


class Model(BaseModel):
    """Base of every policy model: unknown fields are errors; values are immutable."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class SelectorRequirement(Model):
    key: str = Field(min_length=1)
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"]
    values: list[str] = []

    @model_validator(mode="after")
    def _values_fit_operator(self) -> SelectorRequirement:
        check_values(self.operator, self.values)
        return self


def check_values(operator: str, values: list[str]) -> None:
    """The values a selector operator takes, as the Kubernetes API checks them."""
    if operator in ("In", "NotIn") and not values:
        raise ValueError(f"operator {operator} needs at least one value")
    if operator in ("Exists", "DoesNotExist") and values:
        raise ValueError(f"operator {operator} takes no values")
    if operator in ("Gt", "Lt") and (len(values) != 1 or not values[0].lstrip("-").isdigit()):
        raise ValueError(f"operator {operator} needs exactly one integer value")


class LabelSelector(Model):
    """A Kubernetes label selector: all of matchLabels and matchExpressions must hold."""

    matchLabels: dict[str, str] = {}
    matchExpressions: list[SelectorRequirement] = []


class RuleBase(Model):
    mode: Mode = "enforce"




def _valid_quantity(value: str) -> str:
    parsed = quantity.parse_quantity(value)
    if parsed is None or parsed < 0:
        raise ValueError(f"{value!r} is not a Kubernetes quantity such as 512Mi or 8Gi")
    return value


#: a Kubernetes quantity written as a string ("8Gi", "500m")
Quantity = Annotated[str, AfterValidator(_valid_quantity)]


def quantity_value(value: str) -> Decimal:
    """The numeric value of a validated Quantity."""
    parsed = quantity.parse_quantity(value)
    assert parsed is not None
    return parsed


_RESOURCE_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?(/[-A-Za-z0-9_.]+)?\*?$")


def _valid_resource_name(value: str) -> str:
    if not _RESOURCE_NAME.match(value):
        raise ValueError(f"{value!r} is not a resource name (optionally ending in *)")
    return value


#: a resource name ("nvidia.com/gpu"), or a prefix pattern ending in * ("nvidia.com/mig-*")
ResourceName = Annotated[str, AfterValidator(_valid_resource_name)]


def _valid_mig_profile(value: str) -> str:
    profile = mig.profile_of(value) or value
    if not mig.profile_like(profile):
        raise ValueError(f"{value!r} is not a MIG profile such as 1g.10gb, 3g.40gb or 1g.10gb+me")
    if profile != value:
        raise ValueError(f"{value!r} is a resource name: give the profile, {profile}")
    return value


#: a MIG profile as NVIDIA spells it ("1g.10gb", "1g.10gb+me"; ".me" as the resource name has it)
MigProfile = Annotated[str, AfterValidator(_valid_mig_profile)]
