"""Where the Kubernetes API is, and with which credentials.

The order follows kubectl and client-go: an explicit kubeconfig or context
wins; then the pod's service account (in-cluster); then ``$KUBECONFIG`` or
``~/.kube/config``. Without any of them there is no cluster: the caller
runs with an empty view rather than failing, since the audit CLI and local
development are legitimate uses without an API server.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from typing import TYPE_CHECKING, Any

import yaml

if TYPE_CHECKING:
    from kubernetes import client

    #: a connection to the API server; other packages hold it as a handle and reach the API only through this package
    ApiClient = client.ApiClient

DEFAULT_KUBECONFIG = "~/.kube/config"
USER_AGENT = "gpu-admission"


def __getattr__(name: str) -> Any:
    # ``kubernetes`` is imported when a client is made, not with this module (which the CLI imports
    # for ClusterConfigError, whatever the command): ApiClient is its client's class
    if name == "ApiClient":
        from kubernetes import client

        return client.ApiClient
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class ClusterConfigError(Exception):
    """The Kubernetes API client could not be configured."""


def load_api_client(
    kubeconfig: str | None = None,
    context: str | None = None,
    in_cluster: bool | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    service_account: tuple[str, str] | None = None,
) -> client.ApiClient | None:
    """An API client for the configured cluster, or None when there is none.

    ``in_cluster=True`` insists on the service account, ``False`` never uses
    it, ``None`` uses it when the process runs in a pod. ``environ`` and
    ``service_account`` (token file, CA file; the pod's by default) exist for tests.
    """
    from kubernetes.config.incluster_config import SERVICE_CERT_FILENAME, SERVICE_TOKEN_FILENAME

    if service_account is None:
        service_account = (SERVICE_TOKEN_FILENAME, SERVICE_CERT_FILENAME)
    env = os.environ if environ is None else environ
    if kubeconfig or context:
        return _from_kubeconfig(kubeconfig or _default_kubeconfig(env), context)
    if in_cluster or (in_cluster is None and _runs_in_pod(env, service_account[0])):
        return _from_service_account(env, service_account)
    # Like kubectl, skip the files of $KUBECONFIG that do not exist.
    present = [p for p in _default_kubeconfig(env).split(os.pathsep) if p and Path(p).expanduser().is_file()]
    return _from_kubeconfig(os.pathsep.join(present), None) if present else None


def _default_kubeconfig(env: Mapping[str, str]) -> str:
    # Read at call time: kubernetes.config reads $KUBECONFIG once, at import.
    return env.get("KUBECONFIG") or DEFAULT_KUBECONFIG


def _runs_in_pod(env: Mapping[str, str], token_file: str) -> bool:
    from kubernetes.config.incluster_config import SERVICE_HOST_ENV_NAME

    return bool(env.get(SERVICE_HOST_ENV_NAME)) and Path(token_file).is_file()


def _from_kubeconfig(path: str, context: str | None) -> client.ApiClient:
    files = [p for p in path.split(os.pathsep) if p]
    missing = [p for p in files if not Path(p).expanduser().is_file()]
    if not files or missing:
        raise ClusterConfigError(f"kubeconfig not found: {', '.join(missing) or path!r}")
    from kubernetes import client, config
    from kubernetes.config.config_exception import ConfigException

    configuration = client.Configuration()
    try:
        # persist_config=False: never write refreshed tokens back into the user's file.
        config.load_kube_config(
            config_file=path,
            context=context,
            client_configuration=configuration,
            persist_config=False,
        )
    except (ConfigException, yaml.YAMLError, OSError, ValueError, KeyError, TypeError) as exc:
        where = f"{path} (context {context!r})" if context else path
        raise ClusterConfigError(f"cannot use kubeconfig {where}: {exc}") from exc
    return _client(configuration)


def _from_service_account(env: Mapping[str, str], files: tuple[str, str]) -> client.ApiClient:
    from kubernetes import client
    from kubernetes.config.config_exception import ConfigException
    from kubernetes.config.incluster_config import InClusterConfigLoader

    configuration = client.Configuration()
    loader = InClusterConfigLoader(token_filename=files[0], cert_filename=files[1], environ=env)
    try:
        loader.load_and_set(configuration)
    except (ConfigException, OSError) as exc:
        raise ClusterConfigError(f"cannot use the in-cluster service account: {exc}") from exc
    return _client(configuration)


def _client(configuration: client.Configuration) -> client.ApiClient:
    from kubernetes import client

    api_client = client.ApiClient(configuration)
    # Tells our requests apart in the API server's audit log.
    api_client.user_agent = USER_AGENT
    return api_client
