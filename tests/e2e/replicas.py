"""Several ``gpu-admission serve`` processes sharing one real kube-apiserver, sent AdmissionReviews directly.

What deploy/autoscaling's HPA makes of the Deployment: replicas that share
nothing but the API server. Each runs as deploy/ runs it (deploy/'s
ServiceAccount and RBAC, the policies of the e2e suite), on its own port,
with a development certificate; the tests post reviews to them as
kube-apiserver would and read what they answer.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import ssl
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes import client

from tests.e2e.admission import DEPLOY, NAMESPACE, SERVICE_ACCOUNT
from tests.e2e.apiserver import REPO, ApiServer, spawn, stop_process
from tests.e2e.fixtures import gpu_container, pod
from tests.e2e.kube import Kube, Object, documents, eventually
from tests.support import free_port

#: deploy/ objects a replica needs: its namespace, the ledger's CRD, its RBAC
DEPLOY_FILES = ("base/namespace.yaml", "base/quota-ledger-crd.yaml", "base/rbac.yaml")


def install(admin: Kube, apiserver: ApiServer, folder: Path) -> Path:
    """deploy/'s objects, and a kubeconfig with a token of deploy/'s ServiceAccount (returned)."""
    for name in DEPLOY_FILES:
        for doc in documents(DEPLOY / name):
            admin.ensure(doc)
    crd = "gpuquotaledgers.gpu-admission.io"
    eventually(lambda: any(c["type"] == "Established" and c["status"] == "True" for c in
                           (admin.get("apiextensions.k8s.io/v1", "CustomResourceDefinition", crd).get("status") or {})
                           .get("conditions") or ()), what=f"{crd} established")
    request = client.AuthenticationV1TokenRequest(spec=client.V1TokenRequestSpec(audiences=[], expiration_seconds=86400))
    token = eventually(lambda: admin.core.create_namespaced_service_account_token(SERVICE_ACCOUNT, NAMESPACE, request),
                       what="a token of the webhook's ServiceAccount")
    assert token.status is not None
    return apiserver.kubeconfig(folder / "server.kubeconfig", str(token.status.token))


@dataclass
class Replica:
    """One ``serve`` process."""

    folder: Path
    port: int
    process: subprocess.Popen[bytes] | None = None

    def get(self, path: str, context: ssl.SSLContext) -> tuple[int, str]:
        connection = http.client.HTTPSConnection("127.0.0.1", self.port, context=context, timeout=5)
        try:
            connection.request("GET", path)
            response = connection.getresponse()
            return response.status, response.read().decode()
        except OSError as exc:
            return 0, str(exc)
        finally:
            connection.close()

    def metric(self, name: str, context: ssl.SSLContext) -> float:
        status, text = self.get("/metrics", context)
        assert status == 200, text
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith(name) and not line.startswith("#"))


@dataclass
class Replicas:
    """``serve`` processes started from one folder (certificates, kubeconfig, logs)."""

    folder: Path
    policies: Path
    kubeconfig: Path
    window: float
    running: list[Replica] = field(default_factory=list)

    def __post_init__(self) -> None:
        done = subprocess.run([sys.executable, "-m", "webhook", "certs", "generate", "--out", str(self.folder / "tls"),
                               "--ip", "127.0.0.1", "--dns", "localhost"], capture_output=True, text=True, cwd=REPO)
        assert done.returncode == 0, done.stderr
        self.context = ssl.create_default_context(cafile=str(self.folder / "tls" / "ca.crt"))

    def start(self, count: int, timeout: float = 60.0, policies: Path | None = None) -> list[Replica]:
        """``count`` more replicas, each ready (policies loaded, cluster view synced); with ``policies``
        (another policy version, as in a rollout) rather than the folder's own."""
        started = []
        for _ in range(count):
            replica = Replica(self.folder / f"replica-{len(self.running)}", free_port())
            replica.folder.mkdir(parents=True, exist_ok=True)
            env = {**os.environ, "PYTHONUNBUFFERED": "1"}
            env.pop("KUBECONFIG", None)
            replica.process = spawn([
                sys.executable, "-m", "webhook", "serve", "--policies", str(policies or self.policies),
                "--tls-cert", str(self.folder / "tls" / "tls.crt"), "--tls-key", str(self.folder / "tls" / "tls.key"),
                "--host", "127.0.0.1", "--port", str(replica.port), "--kubeconfig", str(self.kubeconfig),
                "--quota-window", str(self.window),
            ], replica.folder / "gpu-admission.log", env=env)
            self.running.append(replica)
            started.append(replica)
        deadline = time.monotonic() + timeout
        for replica in started:
            while replica.get("/readyz", self.context)[0] != 200:
                assert replica.process is not None and replica.process.poll() is None, self.log_tail(replica)
                assert time.monotonic() < deadline, f"replica not ready:\n{self.log_tail(replica)}"
                time.sleep(0.2)
        return started

    def kill(self, replica: Replica) -> None:
        """SIGKILL: no drain, no goodbye, whatever it was doing."""
        assert replica.process is not None
        os.killpg(replica.process.pid, signal.SIGKILL)
        replica.process.wait()
        self.running.remove(replica)

    def stop(self) -> None:
        for replica in self.running:
            stop_process(replica.process)
        self.running.clear()

    def log_tail(self, replica: Replica, lines: int = 30) -> str:
        path = replica.folder / "gpu-admission.log"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else ""


def pod_review(namespace: str, name: str, gpus: int = 1) -> dict[str, Any]:
    """The AdmissionReview kube-apiserver sends the validating webhook for a new pod (uid and name set)."""
    obj: Object = pod(name, namespace, gpu_container(gpus=gpus))
    obj["metadata"]["uid"] = str(uuid.uuid4())
    return {
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {
            "uid": str(uuid.uuid4()), "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"}, "namespace": namespace, "name": name,
            "operation": "CREATE", "userInfo": {"username": "e2e"}, "object": obj, "oldObject": None, "dryRun": False,
        },
    }


def post(replica: Replica, context: ssl.SSLContext, review: dict[str, Any], timeout: float = 10.0) -> dict[str, Any]:
    """The replica's answer (``response``), or ``{"error": …}`` when it gave none (a killed replica)."""
    connection = http.client.HTTPSConnection("127.0.0.1", replica.port, context=context, timeout=timeout)
    try:
        connection.request("POST", "/validate", body=json.dumps(review), headers={"Content-Type": "application/json"})
        response = connection.getresponse()
        body = response.read()
        if response.status != 200:
            return {"error": f"HTTP {response.status}: {body[:200]!r}"}
        return dict(json.loads(body)["response"])
    except (OSError, http.client.HTTPException, ValueError) as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}
    finally:
        connection.close()
