"""Fixtures: real certificates, a real TLS server on localhost, the shipped policies."""

from __future__ import annotations

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
from webhook.server.app import AppConfig, create_app
from webhook.server.tls import ReloadingTLS


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

    async def post(self, path: str, body: Any, **kw: Any) -> aiohttp.ClientResponse:
        data = body if isinstance(body, (bytes, str)) else __import__("json").dumps(body)
        return await self.session.post(self.base + path, data=data, headers={"Content-Type": "application/json"}, **kw)

    async def review(self, path: str, body: Any) -> dict[str, Any]:
        async with await self.post(path, body) as resp:
            assert resp.status == 200, await resp.text()
            return dict(await resp.json())


StartWebhook = Callable[..., Awaitable[Webhook]]


@pytest.fixture
async def start_webhook(aiohttp_server: Any, pki: Pki, policy_dir: Path) -> AsyncIterator[StartWebhook]:
    sessions: list[aiohttp.ClientSession] = []

    async def start(policies: Path | None = None, view: Any = None, cluster: Any = None, **config: Any) -> Webhook:
        tls = ReloadingTLS(pki.cert, pki.key)
        app = create_app(AppConfig(policies=policies or policy_dir, **config), tls=tls, view=view, cluster=cluster)
        server = await aiohttp_server(app, ssl=tls.context)
        session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=pki.client_context()))
        sessions.append(session)
        return Webhook(f"https://127.0.0.1:{server.port}", session, tls, app)

    yield start
    for session in sessions:
        await session.close()


@pytest.fixture
async def webhook(start_webhook: StartWebhook) -> Webhook:
    return await start_webhook(reload_interval=0.05)
