"""An OCI distribution API client that reads one thing: an image's config.

reference → manifest (an index or manifest list picks the platform manifest)
→ config blob → the CUDA-relevant environment. Auth as registries ask for it
in their ``WWW-Authenticate`` challenge: an anonymous or credentialed bearer
token from the realm they name, or basic auth. Credentials and tokens are
sent only to the registry and realm that asked, and never logged.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp

from webhook.errors import RegistryError
from webhook.gpu.images import ImageConfig, ImageRef
from webhook.registry.cache import TTLCache
from webhook.registry.credentials import Credentials, for_registry

INDEX_TYPES = (
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
)
MANIFEST_TYPES = (
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.v2+json",
)
#: the config keys the CUDA check reads; the rest of the environment is not kept
CUDA_ENV = ("CUDA_VERSION", "NVIDIA_REQUIRE_CUDA", "NVIDIA_DISABLE_REQUIRE")
#: manifests and configs are small; anything larger is not what we asked for
MAX_DOCUMENT = 4 * 1024 * 1024
_HOSTS = {"docker.io": "registry-1.docker.io"}
_CHALLENGE = re.compile(r'(\w+)="([^"]*)"')


@dataclass(frozen=True)
class Platform:
    os: str = "linux"
    architecture: str = "amd64"


class RegistryClient:
    """Reads image configs with one aiohttp session; counts the HTTP requests it makes."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        *,
        credentials: Mapping[str, Credentials] | None = None,
        plain_http: Callable[[str], bool] = lambda host: host.split(":")[0] in ("localhost", "127.0.0.1"),
        platform: Platform = Platform(),
        clock: Callable[[], float],
    ) -> None:
        self._session = session
        self._credentials = credentials or {}
        self._plain_http = plain_http
        self._platform = platform
        self._tokens: TTLCache[str] = TTLCache(1024, clock)
        self.requests = 0

    async def config(self, ref: ImageRef, digest: str = "") -> ImageConfig:
        """The config of ``ref`` (pinned to ``digest`` when given) for the platform."""
        manifest, manifest_digest = await self._manifest(ref, digest or ref.tag or "latest")
        if manifest.get("mediaType") in INDEX_TYPES or "manifests" in manifest:
            manifest, manifest_digest = await self._manifest(ref, self._pick(ref, manifest))
        config = (manifest.get("config") or {}).get("digest") if isinstance(manifest.get("config"), dict) else None
        if not isinstance(config, str):
            raise RegistryError(f"{ref.name}: manifest {manifest_digest} has no config")
        blob = _json(await self._get(ref, f"/blobs/{config}", verify=config), ref)
        return ImageConfig(manifest_digest, _cuda_env(blob))

    def _pick(self, ref: ImageRef, index: Mapping[str, Any]) -> str:
        for entry in index.get("manifests") or ():
            platform = (entry.get("platform") or {}) if isinstance(entry, dict) else {}
            if (platform.get("os"), platform.get("architecture")) == (self._platform.os, self._platform.architecture):
                return str(entry.get("digest"))
        raise RegistryError(f"{ref.name}: no {self._platform.os}/{self._platform.architecture} image in its index")

    async def _manifest(self, ref: ImageRef, reference: str) -> tuple[dict[str, Any], str]:
        accept = ", ".join((*INDEX_TYPES, *MANIFEST_TYPES))
        verify = reference if reference.startswith("sha256:") else ""
        body, headers = await self._get_with_headers(ref, f"/manifests/{reference}", accept, verify)
        digest = headers.get("Docker-Content-Digest") or "sha256:" + hashlib.sha256(body).hexdigest()
        return _json(body, ref), digest

    async def _get(self, ref: ImageRef, path: str, *, verify: str = "") -> bytes:
        body, _ = await self._get_with_headers(ref, path, "", verify)
        return body

    async def _get_with_headers(self, ref: ImageRef, path: str, accept: str, verify: str) -> tuple[bytes, Mapping[str, str]]:
        url = f"{self._base(ref.registry)}/v2/{ref.repository}{path}"
        for attempt in (1, 2):
            headers = {"Accept": accept} if accept else {}
            headers.update(self._authorization(ref))
            self.requests += 1
            async with self._session.get(url, headers=headers) as response:
                if response.status == 401 and attempt == 1:
                    await self._authenticate(ref, response.headers.get("WWW-Authenticate", ""))
                    continue
                if response.status != 200:
                    raise RegistryError(f"{ref.name}: {path.split('/')[1]} answered HTTP {response.status}")
                body = await response.content.read(MAX_DOCUMENT + 1)
                if len(body) > MAX_DOCUMENT:
                    raise RegistryError(f"{ref.name}: {path} is larger than {MAX_DOCUMENT} bytes")
                if verify and "sha256:" + hashlib.sha256(body).hexdigest() != verify:
                    raise RegistryError(f"{ref.name}: content of {verify} does not match its digest")
                return body, response.headers
        raise RegistryError(f"{ref.name}: still unauthorized after authenticating")

    def _base(self, registry: str) -> str:
        host = _HOSTS.get(registry, registry)
        return f"{'http' if self._plain_http(host) else 'https'}://{host}"

    def _authorization(self, ref: ImageRef) -> dict[str, str]:
        token = self._tokens.get(_scope(ref))
        return {"Authorization": token} if token else {}

    async def _authenticate(self, ref: ImageRef, challenge: str) -> None:
        scheme, _, params = challenge.partition(" ")
        creds = for_registry(self._credentials, ref.registry)
        if scheme.lower() == "basic":
            if creds is None:
                raise RegistryError(f"{ref.name}: the registry wants credentials and none are configured for it")
            self._tokens.put(_scope(ref), f"Basic {creds.basic()}", 3600)
        elif scheme.lower() == "bearer":
            await self._bearer(ref, dict(_CHALLENGE.findall(params)), creds)
        else:
            raise RegistryError(f"{ref.name}: unsupported auth challenge {scheme or 'none'}")

    async def _bearer(self, ref: ImageRef, params: Mapping[str, str], creds: Credentials | None) -> None:
        realm = params.get("realm", "")
        # plain HTTP only where the registry itself is plain HTTP (local): tokens and credentials
        # never cross the network in the clear
        schemes = ("https://", "http://") if self._plain_http(_HOSTS.get(ref.registry, ref.registry)) else ("https://",)
        if not realm.startswith(schemes):
            raise RegistryError(f"{ref.name}: bearer challenge without an {'/'.join(s[:-3] for s in schemes)} realm")
        query = {"scope": params.get("scope") or f"repository:{ref.repository}:pull"}
        if params.get("service"):
            query["service"] = params["service"]
        headers = {"Authorization": f"Basic {creds.basic()}"} if creds is not None else {}
        self.requests += 1
        async with self._session.get(realm, params=query, headers=headers) as response:
            if response.status != 200:
                raise RegistryError(f"{ref.name}: token service answered HTTP {response.status}")
            answer = _json(await response.content.read(MAX_DOCUMENT), ref)
        token = answer.get("token") or answer.get("access_token")
        if not isinstance(token, str) or not token:
            raise RegistryError(f"{ref.name}: token service gave no token")
        expires = answer.get("expires_in")
        lifetime = float(expires) if isinstance(expires, (int, float)) and expires > 0 else 60.0
        self._tokens.put(_scope(ref), f"Bearer {token}", max(lifetime - 10, 1))


def _scope(ref: ImageRef) -> str:
    return f"{ref.registry}/{ref.repository}"


def _json(body: bytes, ref: ImageRef) -> dict[str, Any]:
    try:
        data = json.loads(body)
    except ValueError as exc:
        raise RegistryError(f"{ref.name}: answered something that is not JSON") from exc
    if not isinstance(data, dict):
        raise RegistryError(f"{ref.name}: answered JSON that is not an object")
    return data


def _cuda_env(blob: Mapping[str, Any]) -> dict[str, str]:
    config = blob.get("config") if isinstance(blob.get("config"), dict) else {}
    env = config.get("Env") if isinstance(config, dict) else None
    pairs = (str(e).partition("=") for e in env or () if isinstance(e, str))
    return {k: v for k, _, v in pairs if k in CUDA_ENV}
