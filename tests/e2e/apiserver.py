"""A real etcd + kube-apiserver for the end-to-end suite, started in a temporary folder on free ports.

Where the binaries come from, in order: ``KUBEBUILDER_ASSETS`` (the envtest
layout: a folder holding ``kube-apiserver`` and ``etcd``, as ``setup-envtest
use 1.36 -p path`` prints), else ``../shared/tools/kube-apiserver/install.sh``
beside the repository (``GPU_ADMISSION_E2E_K8S`` picks its version). Without
either the suite is skipped with that reason; with
``GPU_ADMISSION_E2E=required`` (CI) it fails instead.

Every process is started in its own process group with a parent-death signal,
and stopped (group-wide) by :meth:`ApiServer.stop`, so an interrupted or
crashed test run leaves nothing behind.
"""

from __future__ import annotations

import ctypes
import json
import os
import re
import shutil
import signal
import ssl
import subprocess
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from tests.support import free_ports
from webhook import certs

REPO = Path(__file__).resolve().parents[2]
INSTALLER = REPO.parent / "shared" / "tools" / "kube-apiserver" / "install.sh"
DEFAULT_VERSION = "1.36.2"
ADMIN_TOKEN = "e2e-admin-token"

#: users of the token file: token → (user, groups); tests act as them
USERS: dict[str, tuple[str, tuple[str, ...]]] = {
    ADMIN_TOKEN: ("e2e-admin", ("system:masters",)),
    "e2e-namespace-editor-token": ("e2e-namespace-editor", ()),
    # the two setups the compiled-policy equivalence test compares, side by side (test_compiled_equivalence.py)
    "e2e-webhooks-token": ("e2e-webhooks", ("system:masters",)),
    "e2e-compiled-token": ("e2e-compiled", ("system:masters",)),
    # the compiled policies without any webhook (bench/cel.py)
    "e2e-in-process-token": ("e2e-in-process", ("system:masters",)),
    "e2e-team-editor-token": ("e2e-team-editor", ()),
    # a tenant with edit and the debugging grant in one namespace (test_gpu_access.py)
    "e2e-tenant-token": ("e2e-tenant", ()),
}


class Unavailable(Exception):
    """No kube-apiserver can be had here; the message says what to do."""


@dataclass(frozen=True)
class Assets:
    folder: Path
    version: str


def find_assets(environ: dict[str, str] | os._Environ[str] = os.environ) -> Assets:
    """The binaries to use, or :class:`Unavailable` with what to install."""
    wanted = environ.get("GPU_ADMISSION_E2E_K8S") or None
    folder_text = environ.get("KUBEBUILDER_ASSETS")
    if folder_text:
        folder = Path(folder_text)
    elif INSTALLER.is_file():
        done = subprocess.run([str(INSTALLER), wanted or DEFAULT_VERSION], capture_output=True, text=True)
        if done.returncode != 0:
            raise Unavailable(f"{INSTALLER} failed: {done.stderr.strip() or done.stdout.strip()}")
        folder = Path(done.stdout.strip().splitlines()[-1])
    else:
        raise Unavailable(
            "no kube-apiserver: set KUBEBUILDER_ASSETS to a folder holding kube-apiserver and etcd "
            "(e.g. `export KUBEBUILDER_ASSETS=$(setup-envtest use 1.36 -p path)`)"
        )
    for binary in ("kube-apiserver", "etcd"):
        if not os.access(folder / binary, os.X_OK):
            raise Unavailable(f"{folder / binary} is missing or not executable (KUBEBUILDER_ASSETS={folder})")
    version = _version(folder / "kube-apiserver")
    if wanted and version != wanted:
        raise Unavailable(f"GPU_ADMISSION_E2E_K8S={wanted} but {folder}/kube-apiserver is {version}")
    return Assets(folder, version)


def _version(binary: Path) -> str:
    out = subprocess.run([str(binary), "--version"], capture_output=True, text=True, check=True).stdout
    found = re.search(r"v(\d+\.\d+\.\d+)", out)
    return found.group(1) if found else out.strip()


def _die_with_parent() -> None:
    # A SIGKILLed test run must not leave an apiserver or a webhook behind.
    os.setsid()
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class PortTaken(RuntimeError):
    """etcd or kube-apiserver could not bind a port picked for it."""


def spawn(argv: Sequence[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """A child process in its own group, its output in ``log``, killed when the test run dies."""
    with log.open("ab") as out:
        return subprocess.Popen(list(argv), stdout=out, stderr=subprocess.STDOUT, env=env,
                                preexec_fn=_die_with_parent)  # noqa: PLW1509 - the point is a pre-exec hook


def stop_process(proc: subprocess.Popen[bytes] | None, grace: float = 10.0) -> None:
    if proc is None or proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    except ProcessLookupError:
        pass


@dataclass
class ApiServer:
    """etcd and kube-apiserver, in ``folder`` (logs, certificates, data)."""

    assets: Assets
    folder: Path
    port: int = 0
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)
    #: more kube-apiserver flags (e.g. --admission-control-config-file)
    extra_args: tuple[str, ...] = ()

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    @property
    def ca_file(self) -> Path:
        return self.folder / "certs" / "apiserver.crt"

    @property
    def version(self) -> str:
        return self.assets.version

    def start(self, timeout: float = 60.0, attempts: int = 3) -> None:
        """Start etcd and kube-apiserver; again on new ports when another process took one of
        them between picking it and binding it (a shared machine runs other jobs)."""
        for attempt in range(attempts):
            try:
                return self._start(timeout)
            except PortTaken:
                self.stop()
                shutil.rmtree(self.folder / "etcd", ignore_errors=True)
                if attempt == attempts - 1:
                    raise

    def _start(self, timeout: float) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        client_port, peer_port, self.port = free_ports(3)
        etcd_url = f"http://127.0.0.1:{client_port}"
        self.processes.append(spawn([
            str(self.assets.folder / "etcd"), "--data-dir", str(self.folder / "etcd"),
            "--listen-client-urls", etcd_url, "--advertise-client-urls", etcd_url,
            "--listen-peer-urls", f"http://127.0.0.1:{peer_port}",
            "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer_port}",
            "--initial-cluster", f"default=http://127.0.0.1:{peer_port}",
            "--unsafe-no-fsync",
        ], self.folder / "etcd.log"))
        self._write_keys()
        self.processes.append(spawn([
            str(self.assets.folder / "kube-apiserver"),
            f"--etcd-servers={etcd_url}", "--bind-address=127.0.0.1", f"--secure-port={self.port}",
            f"--cert-dir={self.folder / 'certs'}", f"--token-auth-file={self.folder / 'tokens.csv'}",
            "--authorization-mode=RBAC", "--service-account-issuer=https://kubernetes.default.svc",
            f"--service-account-key-file={self.folder / 'sa.pub'}",
            f"--service-account-signing-key-file={self.folder / 'sa.key'}",
            "--service-cluster-ip-range=10.96.0.0/16", "--disable-admission-plugins=ServiceAccount",
            # as kubeadm and GPU clusters run it (the NVIDIA device plugin and GPU Operator need privileged
            # pods): a privileged container reaches admission, where gpu-admission must refuse it
            "--allow-privileged=true",
            f"--audit-policy-file={self._write_audit_policy()}", f"--audit-log-path={self.audit_log}",
            *self._version_flags(), *self.extra_args,
        ], self.folder / "kube-apiserver.log"))
        self._wait_ready(timeout)

    def _version_flags(self) -> list[str]:
        # MutatingAdmissionPolicy is admissionregistration.k8s.io/v1 and on by default from 1.36;
        # older versions serve it as beta or alpha behind a gate, which a cluster may have switched on.
        major, minor = (int(p) for p in self.version.split(".")[:2])
        if (major, minor) >= (1, 36):
            return []
        group = "v1beta1" if (major, minor) >= (1, 34) else "v1alpha1"
        return ["--feature-gates=MutatingAdmissionPolicy=true",
                f"--runtime-config=admissionregistration.k8s.io/{group}=true"]

    @property
    def audit_log(self) -> Path:
        """kube-apiserver's audit log: one JSON event per line."""
        return self.folder / "audit.log"

    def audit_events(self) -> list[dict[str, Any]]:
        if not self.audit_log.exists():
            return []
        return [json.loads(line) for line in self.audit_log.read_text().splitlines() if line.strip()]

    def create_event(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The audit event of a pod's creation, once complete (None until the log has it)."""
        for event in self.audit_events():
            ref = event.get("objectRef") or {}
            if (event.get("stage") == "ResponseComplete" and event.get("verb") == "create"
                    and ref.get("namespace") == namespace and ref.get("name") == name):
                return dict(event)
        return None

    def _write_audit_policy(self) -> Path:
        # pod creations only, at Metadata (where admission webhooks' audit annotations are kept):
        # what the suite reads back, at no cost to the other requests
        path = self.folder / "audit-policy.yaml"
        path.write_text(
            "apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [RequestReceived]\nrules:\n"
            "  - {level: Metadata, verbs: [create], resources: [{group: '', resources: [pods]}]}\n"
            "  - {level: None}\n"
        )
        return path

    def _write_keys(self) -> None:
        pair = certs.generate_ca(days=2)  # any EC key pair signs service-account tokens (ES256)
        public = pair.certificate.public_key().public_bytes(Encoding.PEM, PublicFormat.SubjectPublicKeyInfo)
        (self.folder / "sa.key").write_bytes(pair.key_pem)
        (self.folder / "sa.pub").write_bytes(public)
        lines = [f'{token},{user},{user},"{",".join(groups)}"' for token, (user, groups) in USERS.items()]
        (self.folder / "tokens.csv").write_text("\n".join(lines) + "\n")

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for proc, name in zip(self.processes, ("etcd", "kube-apiserver"), strict=False):
                if proc.poll() is not None:
                    tail = self.log_tail(name)
                    error = PortTaken if "address already in use" in tail else RuntimeError
                    raise error(f"{name} exited with {proc.returncode}:\n{tail}")
            if self.ca_file.exists() and self._readyz():
                return
            time.sleep(0.25)
        raise RuntimeError(f"kube-apiserver not ready within {timeout:.0f}s:\n{self.log_tail('kube-apiserver')}")

    def _readyz(self) -> bool:
        ctx = ssl.create_default_context(cafile=str(self.ca_file))
        request = urllib.request.Request(self.url + "/readyz", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
        try:
            with urllib.request.urlopen(request, context=ctx, timeout=2) as resp:
                return bool(resp.status == 200)
        except OSError:
            return False

    def log_tail(self, name: str, lines: int = 30) -> str:
        path = self.folder / f"{name}.log"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else ""

    def kubeconfig(self, path: Path, token: str = ADMIN_TOKEN) -> Path:
        """A kubeconfig for this apiserver as the user of ``token``."""
        import yaml

        path.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "e2e",
            "clusters": [{"name": "e2e", "cluster": {"server": self.url, "certificate-authority": str(self.ca_file)}}],
            "users": [{"name": "e2e", "user": {"token": token}}],
            "contexts": [{"name": "e2e", "context": {"cluster": "e2e", "user": "e2e"}}],
        }))
        return path

    def stop(self) -> None:
        for proc in reversed(self.processes):
            stop_process(proc)
        self.processes.clear()

    def cleanup(self) -> None:
        self.stop()
        shutil.rmtree(self.folder, ignore_errors=True)
