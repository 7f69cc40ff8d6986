"""The bounds of a charge: what the GPU quota ledger keeps of a pod, and which pods it will not charge.

Each charge is a line of a ledger object, and etcd refuses an object past
1.5 MiB: a line must have a size no pod can choose. The API server bounds
most of what a line holds (a namespace, a name, a priority class, resource
names, whole quantities), but not the values of a required node affinity: a
pod may list thousands of made-up GPU models beside the real one. So:

- **models** are kept as the pod names them when they are at most
  :data:`MODELS_MAX` label values of :data:`MODELS_TEXT_MAX` characters
  together; otherwise the charge holds
  :data:`~webhook.policy.caps.MANY`, which every cap counts, whatever its
  model: never fewer caps than the models named could match;
- the **ResourceClaims** a pod names (the part of its GPUs another pod may
  name too, counted once) are kept when they take at most
  :data:`CLAIMS_TEXT_MAX` characters written out, and their devices are part
  of the pod's GPUs; otherwise the charge names none (:func:`claims_kept`)
  and its claims' devices count as its own: never fewer than it holds;
- a pod whose namespace, name, uid, priority class, GPU resources or counts
  are not what Kubernetes allows (a review forged straight to the webhook's
  port), or whose GPU resources and counts take more than
  :data:`GPUS_TEXT_MAX` characters written out (more than a few), is
  refused rather than charged (:func:`refusal`).

A line is then at most ``webhook.ledger.document.LINE_MAX`` (~2 KB)
long, whatever the pod.
"""

from __future__ import annotations

from collections.abc import Iterable
from decimal import Decimal

from webhook.kube import names
from webhook.policy.caps import MANY, number
from webhook.policy.charges import Claims, Gpus

#: models a charge names at most, and their characters together (commas included): a pod choosing
#: among a dozen GPU models of 25 characters is charged as it names them
MODELS_MAX: int = 32
MODELS_TEXT_MAX: int = 512
#: characters of a charge's GPU resources and counts (``nvidia.com/gpu=1``: 16; a pod asks for one
#: resource, or a few MIG profiles)
GPUS_TEXT_MAX = 256
#: characters of a charge's ResourceClaims (``<claim>:<resource>=<count>[,…][;…]``): a few claims of
#: usual names (``shared-a100:nvidia.com/gpu=4``: 28)
CLAIMS_TEXT_MAX = 512
#: a count: a positive quantity below 10^18 with at most nine decimals (Kubernetes quantities'
#: precision)
COUNT_DIGITS, COUNT_DECIMALS = 18, 9


def models_kept(models: frozenset[str] | None) -> frozenset[str] | None:
    """The models a charge holds for a pod that can land on ``models`` (None: any): the same, or
    :data:`MANY` (counted by every cap) when they are too many or hold a value no node label can have."""
    if models is None or models == MANY:
        return models
    if len(models) > MODELS_MAX or sum(len(m) + 1 for m in models) - 1 > MODELS_TEXT_MAX or \
            not all(names.is_label_value(m) for m in models):
        return MANY
    return models


def claims_kept(claims: Claims, gpus: Gpus) -> Claims:
    """The ResourceClaims a charge holding ``gpus`` names: ``claims``, or none when they take more than
    :data:`CLAIMS_TEXT_MAX` characters written out, name what no claim or resource can be called, or hold
    devices that ``gpus`` does not (their devices then count as the pod's own: never fewer than it holds)."""
    if not claims:
        return ()
    total = dict(gpus)
    shared: dict[str, Decimal] = {}
    seen: set[str] = set()
    for claim, held in claims:
        if claim in seen or not names.is_dns_subdomain(claim) or not held:
            return ()
        seen.add(claim)
        for resource, n in held:
            if not names.is_qualified_name(resource) or not is_count(n):
                return ()
            shared[resource] = shared.get(resource, Decimal(0)) + n
    if any(n > total.get(resource, Decimal(0)) for resource, n in shared.items()):
        return ()
    return claims if claims_text_size(claims) <= CLAIMS_TEXT_MAX else ()


def claims_text_size(claims: Claims) -> int:
    """Characters of ``<claim>:<resource>=<count>[,…][;…]``, as a charge's line writes them."""
    return sum(len(claim) + 1 + gpus_text_size(held) + 1 for claim, held in claims) - 1


def is_count(n: Decimal) -> bool:
    """A count a charge can hold: positive, finite, below 10^18, nine decimals at most."""
    if not n.is_finite() or n <= 0:
        return False
    exponent = n.normalize().as_tuple().exponent
    return n.adjusted() < COUNT_DIGITS and isinstance(exponent, int) and exponent >= -COUNT_DECIMALS


def refusal(namespace: str, name: str, uid: str, priority: str, gpus: Iterable[tuple[str, Decimal]]) -> str:
    """Why a pod cannot be charged ("" : it can): what Kubernetes would not allow, or more GPU
    resources than a charge names."""
    if not names.is_dns_label(namespace):
        return f"its namespace {_shown(namespace)} is not a DNS-1123 label of at most {names.LABEL_MAX} characters"
    if not names.is_dns_subdomain(name):
        return f"its name {_shown(name)} is not a DNS-1123 subdomain of at most {names.SUBDOMAIN_MAX} characters"
    if not names.is_uid(uid):
        return f"its uid {_shown(uid)} is not a uid of at most {names.UID_MAX} letters, digits, '-', '_' or '.'"
    if priority and not names.is_dns_subdomain(priority):
        return f"its priority class {_shown(priority)} is not a DNS-1123 subdomain"
    listed = list(gpus)
    for resource, n in listed:
        if not names.is_qualified_name(resource):
            return f"its resource name {_shown(resource)} is not a qualified name"
        if not is_count(n):
            return f"its count of {_shown(resource)} is not a positive quantity Kubernetes allows"
    if gpus_text_size(listed) > GPUS_TEXT_MAX:
        return (f"it asks for {len(listed)} different GPU resources, more than a charge can name "
                f"({GPUS_TEXT_MAX} characters)")
    return ""


def gpus_text_size(gpus: Iterable[tuple[str, Decimal]]) -> int:
    """Characters of ``<resource>=<count>,…``, as a charge's line writes them."""
    return sum(len(name) + 1 + len(number(n)) + 1 for name, n in gpus) - 1


def _shown(value: str) -> str:
    """A value as a message quotes it: printable, and short."""
    text = value if len(value) <= 80 else value[:77] + "..."
    return repr(text)
