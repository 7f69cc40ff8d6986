"""gpu-admission deployed against the real apiserver the way deploy/ deploys it, minus the pod.

What a cluster would do, done by the harness:
- deploy/'s Namespace, RBAC, PriorityClasses and RuntimeClass are applied;
- deploy/'s webhook configurations are registered as they are, but for
  ``clientConfig``: the Service reference becomes ``url: https://127.0.0.1:PORT/<path>``
  (there is no Service network here); ``certs install`` fills their caBundle;
- ``certs install`` writes the serving Secret; the harness projects it into
  files the way the kubelet projects a Secret volume (a ``..data`` symlink
  swapped atomically), and the server serves those files;
- the server runs as ``gpu-admission serve`` in its own process with a token
  of deploy/'s ServiceAccount (TokenRequest), so deploy/'s RBAC is what its
  cluster view gets.
"""

from __future__ import annotations

import base64
import copy
import os
import shutil
import ssl
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

from kubernetes import client

from tests.e2e.apiserver import REPO, ApiServer, PortTaken, spawn, stop_process
from tests.e2e.kube import Kube, Object, documents, eventually
from tests.support import free_port

DEPLOY = REPO / "deploy"
NAMESPACE = SERVICE_ACCOUNT = "gpu-admission"
TLS_SECRET = "gpu-admission-tls"

#: deploy/ objects the shipped policies rely on (or that the server itself needs)
DEPLOY_FILES = ("base/namespace.yaml", "base/quota-ledger-crd.yaml", "base/rbac.yaml", "base/priorityclasses.yaml",
                "runtimeclass/runtimeclass.yaml")
#: the GPU quota ledger's release window in the suite: short, so that tests see releases (docs/quota.md)
QUOTA_WINDOW = 3.0
WEBHOOK_FILES = ("base/mutatingwebhook.yaml", "base/validatingwebhook.yaml")


def webhook_configurations(port: int) -> list[Object]:
    """deploy/'s two configurations with clientConfig pointed at the local server; nothing else changed."""
    configs = []
    for name in WEBHOOK_FILES:
        for doc in documents(DEPLOY / name):
            doc = copy.deepcopy(doc)
            for hook in doc["webhooks"]:
                path = hook["clientConfig"]["service"]["path"]
                hook["clientConfig"] = {"url": f"https://127.0.0.1:{port}{path}"}
            configs.append(doc)
    return configs


class Admission:
    """The gpu-admission server, its certificates and its registration."""

    def __init__(self, apiserver: ApiServer, admin: Kube, folder: Path, policies: Path,
                 quota_window: float = QUOTA_WINDOW, serve_args: tuple[str, ...] = ()) -> None:
        self.apiserver, self.admin, self.folder, self.policies = apiserver, admin, folder, policies
        self.quota_window = quota_window
        #: more `serve` options (e.g. --compiled)
        self.serve_args = serve_args
        folder.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.cert_dir = folder / "tls"  # what the Secret volume would be
        self.process: subprocess.Popen[bytes] | None = None
        self.admin_kubeconfig = apiserver.kubeconfig(folder / "admin.kubeconfig")

    # -- set-up, as an operator would do it

    def install(self) -> None:
        for name in DEPLOY_FILES:
            for doc in documents(DEPLOY / name):
                self.admin.ensure(doc)
                if doc["kind"] == "CustomResourceDefinition":
                    self._wait_established(doc["metadata"]["name"])
        for doc in webhook_configurations(self.port):
            self.admin.ensure(doc)
        self.certs("install")
        self.project_secret()
        self.server_kubeconfig()

    def _wait_established(self, name: str) -> None:
        """A CRD is served once kube-apiserver says so (Established)."""
        def established() -> bool:
            crd = self.admin.get("apiextensions.k8s.io/v1", "CustomResourceDefinition", name)
            return any(c["type"] == "Established" and c["status"] == "True"
                       for c in (crd.get("status") or {}).get("conditions") or ())

        eventually(established, what=f"CustomResourceDefinition {name} established")

    def certs(self, *args: str) -> str:
        """``gpu-admission certs …`` against the apiserver, as the bootstrap Job runs it."""
        done = subprocess.run(
            [sys.executable, "-m", "webhook", "certs", *args, "--kubeconfig", str(self.admin_kubeconfig),
             "--ip", "127.0.0.1", "--dns", "localhost"],
            capture_output=True, text=True, cwd=REPO, timeout=60,
        )
        assert done.returncode == 0, f"certs {' '.join(args)} failed: {done.stderr}"
        return done.stdout

    def project_secret(self) -> None:
        """Write the serving Secret into files as the kubelet does: new folder, then swap ``..data``."""
        secret = self.admin.core.read_namespaced_secret(TLS_SECRET, NAMESPACE)
        self.cert_dir.mkdir(parents=True, exist_ok=True)
        version = self.cert_dir / f"..{time.strftime('%Y_%m_%d_%H_%M_%S')}.{time.monotonic_ns()}"
        version.mkdir()
        for key, value in (secret.data or {}).items():
            (version / key).write_bytes(base64.b64decode(value))
            link = self.cert_dir / key
            if not link.is_symlink():
                link.symlink_to(Path("..data") / key)
        staged = self.cert_dir / "..data_tmp"
        staged.unlink(missing_ok=True)
        staged.symlink_to(version.name)
        old = os.readlink(self.cert_dir / "..data") if (self.cert_dir / "..data").is_symlink() else None
        os.replace(staged, self.cert_dir / "..data")
        if old:
            shutil.rmtree(self.cert_dir / old, ignore_errors=True)

    def server_kubeconfig(self) -> None:
        request = client.AuthenticationV1TokenRequest(spec=client.V1TokenRequestSpec(audiences=[], expiration_seconds=86400))
        token = self.admin.core.create_namespaced_service_account_token(SERVICE_ACCOUNT, NAMESPACE, request)
        assert token.status is not None
        self.apiserver.kubeconfig(self.folder / "server.kubeconfig", str(token.status.token))

    # -- the server process

    def start(self, timeout: float = 30.0, attempts: int = 3) -> None:
        """Serve, ready within ``timeout``. The port was picked free but is bound only now: if
        another process took it meanwhile, the server starts on a new one, which the webhook
        configurations are pointed at (nothing else in them changes)."""
        for attempt in range(attempts):
            try:
                return self._start(timeout)
            except PortTaken:
                stop_process(self.process)
                if attempt == attempts - 1:
                    raise
                self.port = free_port()
                self._point_webhooks_at(self.port)

    def _point_webhooks_at(self, port: int) -> None:
        for name in WEBHOOK_FILES:
            for doc in documents(DEPLOY / name):
                current = self.admin.get(doc["apiVersion"], doc["kind"], doc["metadata"]["name"])
                for hook in current["webhooks"]:
                    path = urllib.parse.urlsplit(hook["clientConfig"]["url"]).path
                    hook["clientConfig"]["url"] = f"https://127.0.0.1:{port}{path}"
                self.admin.replace(current)

    def _start(self, timeout: float) -> None:
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        env.pop("KUBECONFIG", None)
        self.process = spawn([
            sys.executable, "-m", "webhook", "serve", "--policies", str(self.policies),
            "--tls-cert", str(self.cert_dir / "tls.crt"), "--tls-key", str(self.cert_dir / "tls.key"),
            "--host", "127.0.0.1", "--port", str(self.port), "--reload-interval", "0.5",
            "--kubeconfig", str(self.folder / "server.kubeconfig"), "--quota-window", str(self.quota_window), *self.serve_args,
        ], self.folder / "gpu-admission.log", env=env)
        deadline = time.monotonic() + timeout
        while self.get("/readyz")[0] != 200:
            if self.process.poll() is not None and "address already in use" in self.log_tail(5):
                raise PortTaken(f"gpu-admission could not listen on port {self.port}:\n{self.log_tail(5)}")
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"gpu-admission did not become ready:\n{self.log_tail()}")
            time.sleep(0.2)

    def stop(self) -> None:
        stop_process(self.process, grace=20)
        self.process = None

    def get(self, path: str) -> tuple[int, str]:
        ctx = ssl.create_default_context(cafile=str(self.cert_dir / "ca.crt"))
        try:
            with urllib.request.urlopen(f"https://127.0.0.1:{self.port}{path}", context=ctx, timeout=5) as resp:
                return int(resp.status), resp.read().decode()
        except urllib.error.HTTPError as exc:
            return int(exc.code), exc.read().decode()
        except OSError as exc:
            return 0, str(exc)

    def view_count(self, resource: str) -> float:
        """How many objects of ``resource`` the server's cluster view holds (from /metrics)."""
        return self.metric(f'gpu_admission_cluster_objects{{resource="{resource}"}}')

    def metric(self, sample: str) -> float:
        """A sample of /metrics, by its name and labels as exposed (-1 when absent)."""
        status, text = self.get("/metrics")
        assert status == 200, text
        for line in text.splitlines():
            if line.startswith(sample + " "):
                return float(line[len(sample) + 1:])
        return -1.0

    def log_tail(self, lines: int = 40) -> str:
        path = self.folder / "gpu-admission.log"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else ""
