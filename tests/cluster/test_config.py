"""Finding the API server: explicit kubeconfig, in-cluster, $KUBECONFIG, or none."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from kubernetes import client

from tests.fakeapi import FakeApiServer
from webhook.cluster import ClusterConfigError, load_api_client


def _kubeconfig(path: Path, servers: dict[str, str], current: str) -> Path:
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": n, "cluster": {"server": url}} for n, url in servers.items()],
        "users": [{"name": "dev", "user": {"token": "secret-token"}}],
        "contexts": [{"name": n, "context": {"cluster": n, "user": "dev"}} for n in servers],
        "current-context": current,
    }))  # fmt: skip
    return path


def _service_account(tmp_path: Path) -> tuple[str, str]:
    token, ca = tmp_path / "token", tmp_path / "ca.crt"
    token.write_text("sa-token")
    ca.write_text("-----BEGIN CERTIFICATE-----\n")
    return str(token), str(ca)


IN_POD = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}


def test_explicit_kubeconfig_and_context(api: FakeApiServer, tmp_path: Path) -> None:
    path = _kubeconfig(tmp_path / "config", {"broken": "http://127.0.0.1:9", "fake": api.url}, "broken")
    api_client = load_api_client(str(path), "fake", None, environ={})
    assert api_client is not None
    names = []
    for namespace in client.CoreV1Api(api_client).list_namespace().items:
        assert namespace.metadata is not None
        names.append(namespace.metadata.name)
    assert "default" in names
    assert api.requests()[-1].headers["Authorization"] == "Bearer secret-token"
    assert api.requests()[-1].headers["User-Agent"] == "gpu-admission"


def test_explicit_kubeconfig_wins_over_the_service_account(api: FakeApiServer, tmp_path: Path) -> None:
    path = _kubeconfig(tmp_path / "config", {"fake": api.url}, "fake")
    api_client = load_api_client(str(path), None, None, environ=IN_POD, service_account=_service_account(tmp_path))
    assert api_client is not None and api_client.configuration.host == api.url


def test_in_cluster_when_running_in_a_pod(tmp_path: Path) -> None:
    kubeconfig = _kubeconfig(tmp_path / "config", {"dev": "http://127.0.0.1:9"}, "dev")
    env = IN_POD | {"KUBECONFIG": str(kubeconfig)}
    api_client = load_api_client(None, None, None, environ=env, service_account=_service_account(tmp_path))
    assert api_client is not None
    assert api_client.configuration.host == "https://10.96.0.1:443"
    assert api_client.configuration.api_key["BearerToken"] == "bearer sa-token"


def test_kubeconfig_env_when_not_in_a_pod(api: FakeApiServer, tmp_path: Path) -> None:
    kubeconfig = _kubeconfig(tmp_path / "config", {"fake": api.url}, "fake")
    env = {"KUBECONFIG": f"{tmp_path / 'missing'}:{kubeconfig}"}  # missing files are skipped, as kubectl does
    api_client = load_api_client(None, None, None, environ=env, service_account=_service_account(tmp_path))
    assert api_client is not None and api_client.configuration.host == api.url
    never_in_cluster = load_api_client(None, None, False, environ=IN_POD | env,
                                       service_account=_service_account(tmp_path))  # fmt: skip
    assert never_in_cluster is not None and never_in_cluster.configuration.host == api.url


def test_no_cluster_at_all(tmp_path: Path) -> None:
    env = {"KUBECONFIG": str(tmp_path / "missing")}
    assert load_api_client(None, None, None, environ=env, service_account=(str(tmp_path / "t"), "ca")) is None
    assert load_api_client(None, None, False, environ=env) is None


@pytest.mark.parametrize(
    ("setup", "message"),
    [
        ("missing", "kubeconfig not found"),
        ("garbage", "cannot use kubeconfig"),
        ("no-context", "cannot use kubeconfig"),
    ],
)
def test_kubeconfig_errors_are_translated(tmp_path: Path, setup: str, message: str) -> None:
    path = tmp_path / "config"
    if setup == "garbage":
        path.write_text("clusters: [unclosed")
    elif setup == "no-context":
        _kubeconfig(path, {"a": "http://127.0.0.1:9"}, "a")
    context = "nope" if setup == "no-context" else None
    with pytest.raises(ClusterConfigError, match=message) as caught:
        load_api_client(str(path), context, None, environ={})
    assert str(path) in str(caught.value)


def test_in_cluster_demanded_but_absent(tmp_path: Path) -> None:
    with pytest.raises(ClusterConfigError, match="in-cluster service account: Service host/port is not set"):
        load_api_client(None, None, True, environ={}, service_account=_service_account(tmp_path))
    with pytest.raises(ClusterConfigError, match="token file does not exist"):
        load_api_client(None, None, True, environ=IN_POD, service_account=(str(tmp_path / "none"), "ca"))
