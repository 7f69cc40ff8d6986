"""Resolve image references to their configs within a budget, and remember the answers.

Admission asks :meth:`Resolver.prefetch` for the images of a request with a
small budget (default 300 ms). What is cached answers at once and costs no
request; what is not is fetched in a background task that outlives the
budget, so a slow or failing registry delays admission by the budget at
most, and the next pod of that image finds the answer cached. A registry
that fails is remembered for a short while (``retry_after``) so a broken
registry is not asked on every pod. A failure is never a denial: the image
is judged as unknown, as without a resolver.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any

import aiohttp

from webhook.errors import RegistryError
from webhook.gpu import images
from webhook.gpu.images import ImageConfig, ImageRef
from webhook.registry.cache import TTLCache
from webhook.registry.client import Platform, RegistryClient
from webhook.registry.credentials import Credentials, load_docker_config

log = logging.getLogger(__name__)

_CONTAINER_LISTS = ("containers", "initContainers", "ephemeralContainers")


@dataclass(frozen=True)
class ResolverSettings:
    budget: float = 0.3  # seconds admission waits for unresolved images
    ttl: float = 6 * 3600.0  # a tag's answer; answers by digest never change, they share the bound
    retry_after: float = 60.0  # how long a failure is remembered
    size: int = 4096  # entries per cache
    timeout: float = 10.0  # one background resolution, end to end
    docker_config: str = ""  # a docker config.json with registry credentials (read-only)
    platform: Platform = Platform()
    #: registry host globs the resolver may contact (empty: any); pod specs name the
    #: registries, so an allow-list keeps tenants from pointing the webhook anywhere
    registries: tuple[str, ...] = ()


@contextlib.asynccontextmanager
async def running(settings: ResolverSettings) -> AsyncIterator[Resolver]:
    """A resolver with its own HTTP session, for as long as the block runs."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=settings.timeout)) as session:
        resolver = open_resolver(session, settings)
        try:
            yield resolver
        finally:
            await resolver.close()


def open_resolver(session: aiohttp.ClientSession, settings: ResolverSettings) -> Resolver:
    """A resolver over ``session`` with the credentials of ``settings.docker_config`` (RegistryError if unreadable)."""
    credentials: dict[str, Credentials] = load_docker_config(Path(settings.docker_config)) if settings.docker_config else {}
    client = RegistryClient(session, credentials=credentials, platform=settings.platform, clock=time.monotonic)
    return Resolver(client, settings)


class Resolver:
    """Image reference → ImageConfig, from cache or the registry, never blocking past the budget."""

    def __init__(self, client: RegistryClient, settings: ResolverSettings = ResolverSettings(),
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.client = client
        self.settings = settings
        self._by_reference: TTLCache[ImageConfig | RegistryError] = TTLCache(settings.size, clock)
        self._by_digest: TTLCache[ImageConfig] = TTLCache(settings.size, clock)
        self._inflight: dict[str, asyncio.Task[None]] = {}

    def image_config(self, image: str) -> ImageConfig | None:
        """What is known of ``image`` right now (never waits)."""
        found = self._cached(image.strip())
        return found if isinstance(found, ImageConfig) else None

    def resolving(self, image: str) -> bool:
        """Whether ``image`` is being fetched in the background right now."""
        return image.strip() in self._inflight

    def known(self) -> dict[str, ImageConfig]:
        """Every image reference resolved so far (for a snapshot view)."""
        return {image: found for image, found in self._by_reference.items() if isinstance(found, ImageConfig)}

    def _cached(self, image: str) -> ImageConfig | RegistryError | None:
        digest = _digest(image)
        return (self._by_digest.get(digest) if digest else None) or self._by_reference.get(image)

    async def prefetch(self, wanted: Iterable[str], budget: float | None = None) -> None:
        """Start resolving what is not cached; wait for it at most ``budget`` seconds."""
        tasks = [self._task(image) for image in dict.fromkeys(wanted) if self._needs(image)]
        if tasks:
            await asyncio.wait(tasks, timeout=self.settings.budget if budget is None else budget)

    async def close(self) -> None:
        for task in list(self._inflight.values()):
            task.cancel()
        await asyncio.gather(*self._inflight.values(), return_exceptions=True)

    def _needs(self, image: str) -> bool:
        image = image.strip()
        if image in self._inflight:
            return True  # wait on the running resolution too
        return images.is_reference(image) and self._allowed(image) and self._cached(image) is None

    def _allowed(self, image: str) -> bool:
        allowed = self.settings.registries
        return not allowed or any(fnmatchcase(ImageRef.parse(image).registry, glob) for glob in allowed)

    def _task(self, image: str) -> asyncio.Task[None]:
        image = image.strip()
        task = self._inflight.get(image)
        if task is None:
            task = asyncio.get_running_loop().create_task(self._resolve(image))
            self._inflight[image] = task
            task.add_done_callback(lambda _: self._inflight.pop(image, None))
        return task

    async def _resolve(self, image: str) -> None:
        ref, digest = ImageRef.parse(image), _digest(image)
        try:
            config = await asyncio.wait_for(self.client.config(ref, digest), self.settings.timeout)
        except (RegistryError, aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
            # the message names the registry and what failed, never credentials
            error = exc if isinstance(exc, RegistryError) else RegistryError(f"{ref.name}: {type(exc).__name__}")
            log.info("image %s not resolved: %s", image, error)
            self._by_reference.put(image, error, self.settings.retry_after)
            return
        self._by_reference.put(image, config, self.settings.ttl)
        self._by_digest.put(config.digest, config, self.settings.ttl)
        if digest:
            self._by_digest.put(digest, config, self.settings.ttl)


def unknown_images(obj: Any) -> list[str]:
    """The images of an object's containers (pod specs anywhere inside) whose CUDA the name does not tell."""
    found: list[str] = []
    _walk(obj, found)
    return [image for image in dict.fromkeys(found) if images.from_image(image) is None]


def _walk(node: Any, found: list[str]) -> None:
    if isinstance(node, Mapping):
        for key, value in node.items():
            if key in _CONTAINER_LISTS and isinstance(value, list):
                found.extend(str(c["image"]) for c in value if isinstance(c, Mapping) and isinstance(c.get("image"), str))
            else:
                _walk(value, found)
    elif isinstance(node, list):
        for item in node:
            _walk(item, found)


def _digest(image: str) -> str:
    _, at, digest = image.strip().partition("@")
    return digest if at else ""
