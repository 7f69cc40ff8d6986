"""The options that say which cluster, with which credentials, and how far to look: ``audit --cluster`` and
``report`` share them (kept apart from :mod:`~webhook.audit.cluster_source`, which imports the client: a
file audit never loads it)."""

from __future__ import annotations

from typing import Any


def add_connection_arguments(group: Any) -> None:
    """The options that say which cluster, how, and how far: audit --cluster and report share them."""
    group.add_argument("--kubeconfig", help="kubeconfig file (default: $KUBECONFIG, then ~/.kube/config)")
    group.add_argument("--context", help="kubeconfig context")
    group.add_argument("--in-cluster", action="store_true", help="use the pod's service account")
    group.add_argument("--all-namespaces", "-A", action="store_true",
                       help="every namespace, not only the opted-in ones")  # fmt: skip
    group.add_argument("--page-size", type=int, default=500, help="objects per list request (default: 500)")
