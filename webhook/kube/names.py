"""The names Kubernetes allows (k8s.io/apimachinery/pkg/util/validation): what kube-apiserver accepts
for a namespace, an object's name, a label value, a resource name, a uid.

The webhook sees only what kube-apiserver accepted, except in a review
forged straight to its port: whatever is written to the GPU quota ledger is
checked against these first (docs/quota.md, "Bounds").
"""

from __future__ import annotations

import re

#: a DNS-1123 label: namespaces (at most 63 characters)
_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
#: a DNS-1123 subdomain: most objects' names, priority classes (at most 253 characters)
_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
#: a label value (at most 63 characters; may be empty)
_LABEL_VALUE = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
#: the name part of a qualified name (a resource name's, a label key's)
_QUALIFIED_NAME = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
#: a uid: kube-apiserver gives every object a UUID; one of this many characters at most is accepted
UID_MAX = 64
_UID = re.compile(r"[A-Za-z0-9][-A-Za-z0-9_.]*")

LABEL_MAX, SUBDOMAIN_MAX = 63, 253
#: a qualified name: ``<DNS-1123 subdomain>/<name of 63 at most>``, or the name alone
QUALIFIED_MAX = SUBDOMAIN_MAX + 1 + LABEL_MAX


def is_dns_label(value: str) -> bool:
    """A namespace's name."""
    return len(value) <= LABEL_MAX and _LABEL.fullmatch(value) is not None


def is_dns_subdomain(value: str) -> bool:
    """A pod's name, a priority class's."""
    return len(value) <= SUBDOMAIN_MAX and _SUBDOMAIN.fullmatch(value) is not None


def is_label_value(value: str) -> bool:
    """A non-empty label value (a node label's value: a GPU model)."""
    return len(value) <= LABEL_MAX and _LABEL_VALUE.fullmatch(value) is not None


def is_qualified_name(value: str) -> bool:
    """A resource name (``nvidia.com/gpu``) or label key."""
    prefix, slash, name = value.rpartition("/")
    if slash and not is_dns_subdomain(prefix):
        return False
    return len(name) <= LABEL_MAX and _QUALIFIED_NAME.fullmatch(name) is not None


def is_uid(value: str) -> bool:
    """A uid as kube-apiserver makes them (a UUID), or close: no space, colon or slash, bounded."""
    return len(value) <= UID_MAX and _UID.fullmatch(value) is not None
