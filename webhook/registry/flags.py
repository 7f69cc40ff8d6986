"""The command-line flags of the registry resolver, shared by ``serve`` and ``audit``."""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Iterable, Mapping
from typing import Any

from webhook.gpu.images import ImageConfig
from webhook.registry.client import Platform
from webhook.registry.resolver import ResolverSettings, running, unknown_images


def add_arguments(p: argparse.ArgumentParser, how: str) -> None:
    p.add_argument("--resolve-images", action="store_true",
                   help=f"read unknown images' CUDA from their registry (network egress; off by default): {how}")
    p.add_argument("--registry-config", default="", metavar="PATH",
                   help="docker config.json with registry credentials (e.g. a mounted dockerconfigjson Secret)")
    p.add_argument("--registry-platform", default="linux/amd64", metavar="OS/ARCH",
                   help="the platform picked from multi-arch images")
    p.add_argument("--registry-allow", action="append", default=[], metavar="GLOB",
                   help="only registries whose host matches (repeatable; default: any), e.g. nvcr.io, *.example.com")


def settings(args: argparse.Namespace, budget: float) -> ResolverSettings | None:
    """The resolver's settings from the flags; None when --resolve-images is off."""
    if not args.resolve_images:
        return None
    os_name, _, arch = args.registry_platform.partition("/")
    return ResolverSettings(budget=budget, docker_config=args.registry_config, platform=Platform(os_name, arch or "amd64"),
                            registries=tuple(args.registry_allow))


def resolve_all(objects: Iterable[Mapping[str, Any]], config: ResolverSettings) -> dict[str, ImageConfig]:
    """Resolve every unknown image of ``objects`` (offline tools: waits up to the budget in total)."""
    wanted = [image for obj in objects for image in unknown_images(obj)]

    async def resolve() -> dict[str, ImageConfig]:
        async with running(config) as resolver:
            await resolver.prefetch(wanted)
            return resolver.known()

    return asyncio.run(resolve()) if wanted else {}
