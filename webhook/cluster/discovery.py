"""Which of the view's resources the cluster serves: DRA's resource.k8s.io/v1 is not everywhere.

Kubernetes serves resource.k8s.io/v1 from 1.34; older clusters serve it as a
beta behind a feature gate, or not at all. Watching a resource the API server
does not serve would keep the index from ever syncing (and the server from
ever becoming ready), so the DRA resources are only watched where v1 is
served. Asked once at start-up: a cluster upgraded to serve it is seen on the
next restart.
"""

from __future__ import annotations

import logging

import urllib3
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from webhook.view.protocol import DRA_RESOURCES, RESOURCES, Resource

log = logging.getLogger(__name__)


def served_resources(api_client: client.ApiClient, timeout: float = 10.0) -> tuple[Resource, ...]:
    """The view's resources this cluster serves; when the answer is unclear, all of them."""
    try:
        client.ResourceV1Api(api_client).get_api_resources(_request_timeout=timeout)
    except ApiException as exc:
        if exc.status == 404:
            log.info("resource.k8s.io/v1 not served: DRA claims are not watched")
            return tuple(r for r in RESOURCES if r not in DRA_RESOURCES)
        log.warning("API discovery of resource.k8s.io/v1 failed (HTTP %s): watching it anyway", exc.status)
    except (urllib3.exceptions.HTTPError, OSError) as exc:
        log.warning("API discovery of resource.k8s.io/v1 failed (%s): watching it anyway", exc)
    return RESOURCES
