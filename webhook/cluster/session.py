"""An asynchronous session with the API server, for what must not block the event loop.

The ``kubernetes`` client blocks (urllib3), which suits the watch threads.
The quota ledger writes while an admission request waits, on the event loop:
this session sends those few requests (GET, POST, merge PATCH of one object)
with aiohttp, through the same endpoint, TLS settings and credentials as the
``kubernetes`` configuration it is built from. Connections are kept alive;
the credentials are read off the loop (a service account's token file is
re-read as it rotates) and cached.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import aiohttp
import orjson

if TYPE_CHECKING:  # (its configuration is what a session is built from: the caller has imported it)
    from kubernetes import client

from webhook.cluster.clock import ServerClock

log = logging.getLogger(__name__)

#: how often the credentials are read again (a projected token is rotated well before it expires)
REFRESH_SECONDS = 30.0


#: what etcd says of a request past its limit (1.5 MiB), which kube-apiserver passes on as a 500
TOO_LARGE = "request is too large"


class ApiError(Exception):
    """A request the API server refused or did not answer: ``status`` 0 when it did not answer."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}" if status else message)
        self.status = status
        self.message = message

    @property
    def retryable(self) -> bool:
        """Worth sending again within the same budget: no answer, 429, or a server error (but not one
        refusing what was sent)."""
        return not self.refused and (self.status == 0 or self.status == 429 or self.status >= 500)

    @property
    def refused(self) -> str:
        """Why the API server refused the request for what it is, not for being busy or away ("": it
        did not): ``too-large`` (413, or etcd's "request is too large", which kube-apiserver answers
        as a 500), ``invalid`` (422), ``forbidden`` (401, 403), ``bad-request`` (any other 4xx but a
        404, a 408 timeout, a 409 conflict and a 429)."""
        if self.status == 413 or TOO_LARGE in self.message:
            return "too-large"
        if self.status == 422:
            return "invalid"
        if self.status in (401, 403):
            return "forbidden"
        if 400 <= self.status < 500 and self.status not in (404, 408, 409, 429):
            return "bad-request"
        return ""


class ApiSession:
    """Requests to one API server as one client; ``async with session.running()`` around its use."""

    def __init__(self, configuration: client.Configuration) -> None:
        self._configuration = configuration
        self._base = str(configuration.host).rstrip("/")
        self._session: aiohttp.ClientSession | None = None
        self._headers: dict[str, str] = {}
        #: the API server's clock, from the Date of every answer (webhook.cluster.clock)
        self.clock = ServerClock()

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[ApiSession]:
        loop = asyncio.get_running_loop()
        # the CA and client certificate files are read once, here, off the loop
        context = await loop.run_in_executor(None, _ssl_context, self._configuration)
        self._headers = await loop.run_in_executor(None, _auth_headers, self._configuration)
        connector = aiohttp.TCPConnector(ssl=context, limit=32, keepalive_timeout=60, ttl_dns_cache=None)
        self._session = aiohttp.ClientSession(connector=connector)
        refresher = asyncio.create_task(self._refresh())
        try:
            yield self
        finally:
            refresher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await refresher
            await self._session.close()
            self._session = None

    async def _refresh(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(REFRESH_SECONDS)
            try:
                self._headers = await loop.run_in_executor(None, _auth_headers, self._configuration)
            except Exception:  # noqa: BLE001 - the old credentials stay until new ones read
                log.warning("reading the API credentials again failed", exc_info=True)

    async def request(self, method: str, path: str, body: Any = None, *, timeout: float,
                      content_type: str = "application/json") -> dict[str, Any]:
        """The JSON object the API server answers; :class:`ApiError` for anything else."""
        session = self._session
        if session is None:
            raise ApiError(0, "the API session is not running")
        headers = dict(self._headers)
        data = None
        if body is not None:
            headers["Content-Type"] = content_type
            data = orjson.dumps(body)
        sent = self.clock.local()
        try:
            async with session.request(method, self._base + path, data=data, headers=headers,
                                       timeout=aiohttp.ClientTimeout(total=max(timeout, 0.001)),
                                       server_hostname=self._configuration.tls_server_name or None) as response:
                text = await response.read()
                status = response.status
                date = response.headers.get("Date")
            if date:
                self.clock.sample(sent, self.clock.local(), date)
        except TimeoutError:
            raise ApiError(0, f"no answer from the API server within {timeout:.1f} s") from None
        except aiohttp.ClientError as exc:
            raise ApiError(0, f"cannot reach the API server ({type(exc).__name__})") from exc
        try:
            answer = orjson.loads(text) if text else {}
        except orjson.JSONDecodeError:
            answer = {}
        if not 200 <= status < 300:
            message = answer.get("message") if isinstance(answer, dict) else None
            raise ApiError(status, str(message or text[:200].decode(errors="replace") or "no message"))
        if not isinstance(answer, dict):
            raise ApiError(status, "the answer is not a JSON object")
        return answer


def _ssl_context(configuration: client.Configuration) -> ssl.SSLContext | bool:
    if not str(configuration.host).startswith("https"):
        return False
    context = ssl.create_default_context(cafile=configuration.ssl_ca_cert or None,
                                         cadata=getattr(configuration, "ca_cert_data", None) or None)
    if not configuration.verify_ssl:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    if configuration.cert_file:
        context.load_cert_chain(configuration.cert_file, configuration.key_file or None)
    return context


def _auth_headers(configuration: client.Configuration) -> dict[str, str]:
    """The Authorization header the ``kubernetes`` client would send (a bearer token, or basic auth)."""
    token = configuration.get_api_key_with_prefix("BearerToken", alias="authorization")
    if token:
        return {"Authorization": str(token)}
    if configuration.username or configuration.password:
        return {"Authorization": str(configuration.get_basic_auth_token())}
    return {}
