"""Reviews only from kube-apiserver: a real kube-apiserver presents a client certificate to the webhook
through its admission configuration (``--admission-control-config-file``, as docs/deploy.md shows it),
and a real ``serve --client-ca F --client-name N`` accepts it, and only it.

Its own kube-apiserver (the flag is read at start-up; the suite's shared one runs without it), with
one webhook registered by URL: the cost of one more apiserver start, in this module alone."""

from __future__ import annotations

import asyncio
import base64
import ssl
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest
import yaml

from tests.conftest import Pki, make_pki
from tests.e2e.apiserver import ADMIN_TOKEN, ApiServer, Unavailable, find_assets
from tests.e2e.fixtures import gpu_container, pod
from tests.e2e.kube import Kube, Refused, eventually
from tests.support import POLICIES, REPO, listening_port, unavailable
from webhook import certs

CLIENT_NAME = "kube-apiserver-webhook-client"
#: no node could ever run this; gpu-admission refuses it wherever it looks
INVALID_MIG = {"name": "c", "image": "x", "resources": {"limits": {"nvidia.com/mig-9g.99gb": 1}}}


@dataclass(frozen=True)
class Setup:
    kube: Kube
    port: int
    pki: Pki
    clients: Path


def _admission_config(folder: Path, port: int, cert: Path, key: Path) -> Path:
    """docs/deploy.md's AdmissionConfiguration, its kubeconfig's user named as the webhook is reached
    (a URL webhook: host:port; a Service: <service>.<namespace>.svc)."""
    kubeconfig = folder / "webhooks.kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config",
        "users": [{"name": f"127.0.0.1:{port}", "user": {"client-certificate": str(cert), "client-key": str(key)}}],
    }))
    plugin = {"apiVersion": "apiserver.config.k8s.io/v1", "kind": "WebhookAdmissionConfiguration",
              "kubeConfigFile": str(kubeconfig)}
    config = folder / "admission.yaml"
    config.write_text(yaml.safe_dump({
        "apiVersion": "apiserver.config.k8s.io/v1", "kind": "AdmissionConfiguration",
        "plugins": [{"name": "ValidatingAdmissionWebhook", "configuration": plugin},
                    {"name": "MutatingAdmissionWebhook", "configuration": plugin}],
    }))
    return config


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    try:
        assets = find_assets()
    except Unavailable as exc:
        unavailable(f"end-to-end suite: {exc}")
    folder = tmp_path_factory.mktemp("client-auth")
    pki = make_pki(folder / "pki")
    clients = folder / "clients"
    ca = certs.generate_ca("webhook client CA")
    certs.write_pair(clients, ca, "ca.crt", "ca.key")
    for name in (CLIENT_NAME, "intruder"):
        certs.write_pair(clients, certs.generate_serving(ca, [name], client=True), f"{name}.crt", f"{name}.key")
    server = subprocess.Popen(
        [sys.executable, "-m", "webhook", "serve", "--no-cluster", "--host", "127.0.0.1", "--port", "0",
         "--policies", str(POLICIES), "--tls-cert", str(pki.cert), "--tls-key", str(pki.key),
         "--client-ca", str(clients / "ca.crt"), "--client-name", CLIENT_NAME],
        cwd=REPO, stdout=subprocess.DEVNULL, stderr=(folder / "serve.log").open("wb"),
    )
    apiserver: ApiServer | None = None
    try:
        port = listening_port(server)
        config = _admission_config(folder, port, clients / f"{CLIENT_NAME}.crt", clients / f"{CLIENT_NAME}.key")
        apiserver = ApiServer(assets, folder / "kube", extra_args=(f"--admission-control-config-file={config}",))
        apiserver.start()
        kube = Kube(apiserver.kubeconfig(folder / "admin.kubeconfig", ADMIN_TOKEN))
        kube.create({
            "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
            "metadata": {"name": "gpu-admission-client-auth"},
            "webhooks": [{
                "name": "validate.gpu-admission.io", "admissionReviewVersions": ["v1"], "sideEffects": "NoneOnDryRun",
                "failurePolicy": "Fail", "timeoutSeconds": 5,
                "clientConfig": {"url": f"https://127.0.0.1:{port}/validate",
                                 "caBundle": base64.b64encode(pki.ca.read_bytes()).decode()},
                "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"]}],
            }],
        })
        kube.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "client-auth"}})
        yield Setup(kube, port, pki, clients)
        kube.close()
    finally:
        if apiserver is not None:
            apiserver.cleanup()
        server.terminate()
        server.wait(30)


def test_kube_apiserver_presents_its_certificate_and_pods_are_still_admitted(setup: Setup) -> None:
    """A pod the webhook refuses is refused with its message (kube-apiserver's call got through the
    client-certificate check to an answer), and an ordinary pod is admitted."""

    def refused() -> Refused | None:
        try:
            setup.kube.create(pod("mig", "client-auth", INVALID_MIG), dry_run="All")
        except Refused as exc:
            return exc
        return None

    denial = eventually(refused, what="the webhook registered")
    assert 'admission webhook "validate.gpu-admission.io" denied the request' in denial.message, denial.message
    assert "nvidia.com/mig-9g.99gb" in denial.message
    stored = setup.kube.create(pod("plain", "client-auth", {"name": "c", "image": "nginx:1.27"}))
    assert stored["metadata"]["name"] == "plain"
    gpu = setup.kube.create(pod("gpu", "client-auth", gpu_container()), dry_run="All")
    assert gpu["metadata"]["name"] == "gpu"


def test_a_forged_review_without_kube_apiservers_certificate_fails(setup: Setup) -> None:
    """A client without a certificate fails the handshake; one with a certificate of the same CA for
    another name is closed before it is answered."""

    async def post(ctx: ssl.SSLContext) -> int:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ctx, force_close=True)) as s:
            async with s.post(f"https://127.0.0.1:{setup.port}/validate", json={}) as resp:
                return resp.status

    anonymous = setup.pki.client_context()
    with pytest.raises(aiohttp.ClientError):
        asyncio.run(post(anonymous))
    intruder = setup.pki.client_context()
    intruder.load_cert_chain(setup.clients / "intruder.crt", setup.clients / "intruder.key")
    with pytest.raises(aiohttp.ClientError):
        asyncio.run(post(intruder))
    apiserver = setup.pki.client_context()
    apiserver.load_cert_chain(setup.clients / f"{CLIENT_NAME}.crt", setup.clients / f"{CLIENT_NAME}.key")
    assert asyncio.run(post(apiserver)) == 400  # (answered: an empty body is no AdmissionReview)
