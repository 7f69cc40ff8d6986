"""Registry credentials from docker config files (``~/.docker/config.json``, a mounted
``kubernetes.io/dockerconfigjson`` Secret). Secrets never reach a log or a message:
:class:`Credentials` prints as its user name only."""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from webhook.errors import RegistryError

_DOCKER_HUB = ("docker.io", "index.docker.io", "registry-1.docker.io", "https://index.docker.io/v1/")


@dataclass(frozen=True)
class Credentials:
    username: str
    password: str = field(repr=False)

    def basic(self) -> str:
        return base64.b64encode(f"{self.username}:{self.password}".encode()).decode()


def load_docker_config(path: Path) -> dict[str, Credentials]:
    """Registry host → credentials, from a docker config file; RegistryError when unreadable."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise RegistryError(f"{path}: not a readable docker config ({type(exc).__name__})") from exc
    return parse_docker_config(data, str(path))


def parse_docker_config(data: Any, where: str = "docker config") -> dict[str, Credentials]:
    """``{"auths": {host: {"auth": base64(user:pass)} | {"username", "password"}}}`` → host → credentials."""
    auths = data.get("auths") if isinstance(data, Mapping) else None
    if not isinstance(auths, Mapping):
        raise RegistryError(f"{where}: no auths")
    found: dict[str, Credentials] = {}
    for host, entry in auths.items():
        creds = _entry(entry)
        if creds is None:
            raise RegistryError(f"{where}: auths.{host} has no usable credentials")
        found[_host(str(host))] = creds
    return found


def for_registry(table: Mapping[str, Credentials], registry: str) -> Credentials | None:
    """The credentials for ``registry`` (Docker Hub under any of its names)."""
    if registry in _DOCKER_HUB:
        return next((table[h] for h in _DOCKER_HUB if h in table), None)
    return table.get(registry)


def _entry(entry: Any) -> Credentials | None:
    if not isinstance(entry, Mapping):
        return None
    if entry.get("username") and entry.get("password"):
        return Credentials(str(entry["username"]), str(entry["password"]))
    try:
        user, sep, password = base64.b64decode(str(entry.get("auth", "")), validate=True).decode().partition(":")
    except (binascii.Error, UnicodeDecodeError):
        return None
    return Credentials(user, password) if sep and user else None


def _host(key: str) -> str:
    """``https://index.docker.io/v1/`` → ``index.docker.io``; ``host:5000`` stays."""
    if key in _DOCKER_HUB:
        return key
    return key.split("://", 1)[-1].split("/", 1)[0]
