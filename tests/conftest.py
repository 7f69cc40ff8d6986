"""Fixtures: real certificates, a real TLS server on localhost, the shipped policies."""

from __future__ import annotations

import asyncio
import shutil
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.support import POLICIES
from webhook import certs
from webhook.server import listener, loop
from webhook.server.app import AppConfig, create_app
from webhook.server.tls import ReloadingTLS


#: test modules whose tests (and their fixtures) run on uvloop, `serve`'s default loop where
#: installed; every other async test runs on asyncio's own
ON_UVLOOP = frozenset({"test_server_uvloop.py"})


def pytest_asyncio_loop_factories(config: pytest.Config, item: pytest.Item) -> dict[str, Callable[[], asyncio.AbstractEventLoop]]:
    """The event loop of each async test, made by the factory `serve` uses (pytest-asyncio's hook)."""
    name = "uvloop" if item.path.name in ON_UVLOOP else "asyncio"
    return {name: loop.factory(name)}


@dataclass(frozen=True)
class Pki:
    directory: Path
    ca: Path
    cert: Path
    key: Path

    def client_context(self, *cafiles: Path) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.ca))
        for extra in cafiles:
            ctx.load_verify_locations(cafile=str(extra))
        return ctx


def make_pki(directory: Path) -> Pki:
    ca, cert, key = certs.generate_files(directory, ["localhost"], ["127.0.0.1"])
    return Pki(directory, ca, cert, key)


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    return make_pki(tmp_path / "pki")


@pytest.fixture
def policy_dir(tmp_path: Path) -> Path:
    target = tmp_path / "policies"
    shutil.copytree(POLICIES, target)
    return target


@dataclass
class Webhook:
    """A running TLS webhook server and a client that trusts its CA."""

    base: str
    session: aiohttp.ClientSession
    tls: ReloadingTLS
    app: Any
    listener: listener.Listener | None = None

    async def post(self, path: str, body: Any, headers: dict[str, str] | None = None, **kw: Any) -> aiohttp.ClientResponse:
        data = body if isinstance(body, (bytes, str)) else __import__("json").dumps(body)
        sent = {"Content-Type": "application/json", **(headers or {})}
        return await self.session.post(self.base + path, data=data, headers=sent, **kw)

    async def review(self, path: str, body: Any) -> dict[str, Any]:
        async with await self.post(path, body) as resp:
            assert resp.status == 200, await resp.text()
            return dict(await resp.json())


StartWebhook = Callable[..., Awaitable[Webhook]]


@pytest.fixture
async def start_webhook(pki: Pki, policy_dir: Path) -> AsyncIterator[StartWebhook]:
    """Start the server as `serve` does (guarded listener, real TLS) on a free localhost port."""
    sessions: list[aiohttp.ClientSession] = []
    running: list[listener.Listener] = []

    async def start(
        policies: Path | None = None, view: Any = None, cluster: Any = None,
        listen: listener.ListenerConfig | None = None, client_ca: Path | None = None, ledger: Any = None,
        **config: Any,
    ) -> Webhook:
        tls = ReloadingTLS(pki.cert, pki.key, client_ca)
        app = create_app(AppConfig(policies=policies or policy_dir, **config), tls=tls, view=view, cluster=cluster,
                         ledger=ledger)
        server = await listener.start(app, listen or listener.ListenerConfig(host="127.0.0.1", port=0), tls.context)
        running.append(server)
        session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=pki.client_context()))
        sessions.append(session)
        return Webhook(f"https://127.0.0.1:{server.port}", session, tls, app, server)

    yield start
    for session in sessions:
        await session.close()
    for server in running:
        await server.stop(timeout=2.0)


@pytest.fixture
async def webhook(start_webhook: StartWebhook) -> Webhook:
    return await start_webhook(reload_interval=0.05)
