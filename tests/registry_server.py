"""A real OCI registry for the resolver tests: Debian's ``docker-registry`` (distribution 2.8)
started on 127.0.0.1 with temporary storage, open, behind htpasswd, or behind bearer tokens
from a small token service, and a client that pushes images by the OCI distribution API."""

from __future__ import annotations

import base64
import hashlib
import json
import shutil
import subprocess
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa
from cryptography.x509.oid import NameOID

from tests.support import listening_port, send_json, unavailable

BINARY = shutil.which("docker-registry")
HTPASSWD = shutil.which("htpasswd")
INDEX = "application/vnd.oci.image.index.v1+json"
MANIFEST = "application/vnd.oci.image.manifest.v1+json"
CONFIG = "application/vnd.oci.image.config.v1+json"
SERVICE = "gpu-admission-tests"


@dataclass
class Registry:
    host: str  # 127.0.0.1:port
    process: subprocess.Popen[bytes]
    token_url: str = ""
    user: tuple[str, str] | None = None

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=10)


@contextmanager
def run_registry(workdir: Path, auth: str = "none") -> Iterator[Registry]:
    """A registry on a port the kernel picks: ``auth`` none, htpasswd (user "puller") or token (anonymous pull).

    Without the binaries the test skips, or fails where the whole suite must run (``unavailable``)."""
    if BINARY is None or HTPASSWD is None:
        unavailable("docker-registry / htpasswd not installed (make test installs Debian's docker-registry "
                    "and apache2-utils)")
    config: dict[str, Any] = {
        "version": 0.1,
        "log": {"level": "error", "accesslog": {"disabled": True}},
        "storage": {"filesystem": {"rootdirectory": str(workdir / "storage")}, "delete": {"enabled": True}},
        "http": {"addr": "127.0.0.1:0", "secret": "tests"},  # (a port the kernel picks: listening_port)
    }
    registry_user: tuple[str, str] | None = None
    token_service: _TokenService | None = None
    if auth == "htpasswd":
        assert HTPASSWD is not None
        registry_user = ("puller", "s3cret-pass")
        subprocess.run([HTPASSWD, "-Bbc", str(workdir / "htpasswd"), *registry_user], check=True, capture_output=True)
        config["auth"] = {"htpasswd": {"realm": "tests", "path": str(workdir / "htpasswd")}}
    elif auth == "token":
        token_service = _TokenService(workdir)
        config["auth"] = {"token": {"realm": token_service.url, "service": SERVICE, "issuer": "tests",
                                    "rootcertbundle": str(token_service.cert_path)}}
    (workdir / "config.yml").write_text(yaml.safe_dump(config))
    process = subprocess.Popen([BINARY, "serve", str(workdir / "config.yml")], stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE)
    registry = Registry("", process, token_service.url if token_service else "", registry_user)
    try:
        registry.host = f"127.0.0.1:{listening_port(process)}"
        _wait_until_up(registry)
        yield registry
    finally:
        registry.stop()
        if token_service is not None:
            token_service.close()


def _wait_until_up(registry: Registry) -> None:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if registry.process.poll() is not None:
            raise RuntimeError(f"docker-registry exited: {registry.process.stderr.read().decode() if registry.process.stderr else ''}")
        try:
            urllib.request.urlopen(f"http://{registry.host}/v2/", timeout=1)
            return
        except urllib.error.HTTPError:
            return  # 401 from a protected registry: it is up
        except OSError:
            time.sleep(0.05)
    raise RuntimeError("docker-registry did not start")


class Pusher:
    """Pushes blobs, manifests and indexes to a registry by the OCI distribution API."""

    def __init__(self, registry: Registry) -> None:
        self.registry = registry

    def image(self, repository: str, tag: str, env: Mapping[str, str], *, arch: str = "amd64",
              labels: Mapping[str, str] | None = None) -> str:
        """A one-layer image whose config carries ``env``; returns its manifest digest."""
        config = {"architecture": arch, "os": "linux", "rootfs": {"type": "layers", "diff_ids": []},
                  "config": {"Env": [f"{k}={v}" for k, v in env.items()], "Labels": dict(labels or {})}}
        config_blob = json.dumps(config).encode()
        layer = f"layer of {repository}:{tag}:{arch}".encode()
        for blob in (config_blob, layer):
            self.blob(repository, blob)
        manifest = {"schemaVersion": 2, "mediaType": MANIFEST,
                    "config": {"mediaType": CONFIG, "digest": _digest(config_blob), "size": len(config_blob)},
                    "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": _digest(layer),
                                "size": len(layer)}]}
        return self.manifest(repository, tag, manifest, MANIFEST)

    def index(self, repository: str, tag: str, platforms: Mapping[str, Mapping[str, str]]) -> str:
        """A multi-arch index of one image per architecture (arch → env)."""
        entries = []
        for arch, env in platforms.items():
            digest = self.image(repository, f"{tag}-{arch}", env, arch=arch)
            size = len(self._get(repository, f"/v2/{repository}/manifests/{digest}", MANIFEST))
            entries.append({"mediaType": MANIFEST, "digest": digest, "size": size,
                            "platform": {"os": "linux", "architecture": arch}})
        return self.manifest(repository, tag, {"schemaVersion": 2, "mediaType": INDEX, "manifests": entries}, INDEX)

    def blob(self, repository: str, data: bytes) -> None:
        request = self._request("POST", f"/v2/{repository}/blobs/uploads/", repository, b"")
        with urllib.request.urlopen(request, timeout=10) as response:
            location = response.headers["Location"]
        joiner = "&" if "?" in location else "?"
        url = location if location.startswith("http") else f"http://{self.registry.host}{location}"
        put = self._request("PUT", f"{url}{joiner}digest={_digest(data)}", repository, data)
        put.add_header("Content-Type", "application/octet-stream")
        urllib.request.urlopen(put, timeout=10).close()

    def manifest(self, repository: str, tag: str, body: Mapping[str, Any], media_type: str) -> str:
        data = json.dumps(body).encode()
        request = self._request("PUT", f"/v2/{repository}/manifests/{tag}", repository, data)
        request.add_header("Content-Type", media_type)
        urllib.request.urlopen(request, timeout=10).close()
        return _digest(data)

    def _get(self, repository: str, path: str, accept: str) -> bytes:
        request = self._request("GET", path, repository, None)
        request.add_header("Accept", accept)
        with urllib.request.urlopen(request, timeout=10) as response:
            return bytes(response.read())

    def _request(self, method: str, path: str, repository: str, data: bytes | None) -> urllib.request.Request:
        url = path if path.startswith("http") else f"http://{self.registry.host}{path}"
        request = urllib.request.Request(url, data=data, method=method)
        if self.registry.user is not None:
            request.add_header("Authorization", "Basic " + base64.b64encode(":".join(self.registry.user).encode()).decode())
        elif self.registry.token_url:
            query = urllib.parse.urlencode({"service": SERVICE, "scope": f"repository:{repository}:pull,push"})
            with urllib.request.urlopen(f"{self.registry.token_url}?{query}", timeout=10) as response:
                request.add_header("Authorization", "Bearer " + json.load(response)["token"])
        return request


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


class _TokenService:
    """Issues registry bearer tokens (RS256 JWTs with an x5c chain) to anyone: anonymous pull."""

    def __init__(self, workdir: Path) -> None:
        self.key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "tests token issuer")])
        now = time.time()
        self.cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(self.key.public_key())
                     .serial_number(x509.random_serial_number())
                     .not_valid_before(_utc(now - 3600)).not_valid_after(_utc(now + 86400))
                     .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
                     .sign(self.key, hashes.SHA256()))
        self.cert_path = workdir / "token-root.pem"
        self.cert_path.write_bytes(self.cert.public_bytes(serialization.Encoding.PEM))
        self.requests = 0
        service = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                service.requests += 1
                query = urllib.parse.parse_qs(urllib.parse.urlparse(self.path).query)
                send_json(self, {"token": service.token(query.get("scope", [""])[0]), "expires_in": 300})

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/token"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def token(self, scope: str) -> str:
        access = []
        if scope.startswith("repository:"):
            _, name, actions = scope.split(":", 2)
            access.append({"type": "repository", "name": name, "actions": actions.split(",")})
        now = int(time.time())
        der = self.cert.public_bytes(serialization.Encoding.DER)
        header = {"typ": "JWT", "alg": "RS256", "x5c": [base64.b64encode(der).decode()]}
        claims = {"iss": "tests", "sub": "", "aud": SERVICE, "exp": now + 300, "nbf": now - 10, "iat": now,
                  "jti": f"{now}-{self.requests}", "access": access}
        signing_input = f"{_b64(json.dumps(header).encode())}.{_b64(json.dumps(claims).encode())}"
        signature = self.key.sign(signing_input.encode(), padding.PKCS1v15(), hashes.SHA256())
        return f"{signing_input}.{_b64(signature)}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _utc(seconds: float) -> Any:
    import datetime

    return datetime.datetime.fromtimestamp(seconds, tz=datetime.timezone.utc)
