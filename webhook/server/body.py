"""Reading a request body within limits: its size, its Content-Encoding, and its time.

aiohttp's own decompression is off (``auto_decompress=False`` on the
listener): it inflates without a bound and answers a mislabelled body with a
500. Here a gzip or deflate body is inflated step by step and the reading
stops as soon as the inflated size passes the limit, so a small bomb costs
no more than a plain body of the limit's size.
"""

from __future__ import annotations

import asyncio
import zlib
from typing import TypeVar

from aiohttp import web

from webhook.errors import RequestBodyError

_INFLATED = {"gzip", "x-gzip", "deflate"}
_READ_CHUNK = 64 * 1024

_Body = TypeVar("_Body", bytes, bytearray)


async def read_body(request: web.BaseRequest, max_bytes: int, timeout: float) -> bytes:
    """The request body, inflated; RequestBodyError (4xx) when it is unusable or too slow."""
    encoding = _encoding(request)
    length = request.content_length  # (a property that reads the header afresh on every read)
    if length is not None and length > max_bytes:
        raise RequestBodyError(413, "too-large", f"request body of {length} bytes is over the {max_bytes}-byte limit")
    try:
        if encoding == "identity" and request.content.is_eof():
            # nearly every review arrives whole with its head: take it as it is, no timer, no chunk loop
            return _within(request.content.read_nowait(), max_bytes)
        async with asyncio.timeout(timeout):
            if encoding in _INFLATED:
                return await _inflate(request, max_bytes)
            return await _read_plain(request, max_bytes)
    except TimeoutError as exc:
        raise RequestBodyError(408, "body-timeout", f"request body not received within {timeout:g} s") from exc
    except web.RequestPayloadError as exc:
        raise RequestBodyError(400, "framing", f"request body is malformed: {exc}") from exc


def _within(body: _Body, max_bytes: int) -> _Body:
    """``body``; RequestBodyError (413) when it is over ``max_bytes``."""
    if len(body) > max_bytes:
        raise RequestBodyError(413, "too-large", f"request body is over the {max_bytes}-byte limit")
    return body


def _encoding(request: web.BaseRequest) -> str:
    if "Content-Encoding" not in request.headers:  # (nearly every request)
        return "identity"
    codings = [c.strip().lower() for c in request.headers.get("Content-Encoding", "").split(",") if c.strip()]
    codings = [c for c in codings if c != "identity"]
    if not codings:
        return "identity"
    if len(codings) > 1 or codings[0] not in _INFLATED:
        raise RequestBodyError(
            415, "encoding", f"Content-Encoding {', '.join(codings)!r} is not supported (identity, gzip or deflate)"
        )
    return codings[0]


async def _read_plain(request: web.BaseRequest, max_bytes: int) -> bytes:
    body = bytearray()
    async for chunk in request.content.iter_chunked(_READ_CHUNK):
        body += chunk
        _within(body, max_bytes)
    return bytes(body)


async def _inflate(request: web.BaseRequest, max_bytes: int) -> bytes:
    inflater: zlib._Decompress | None = None
    wire, body = 0, bytearray()
    async for chunk in request.content.iter_chunked(_READ_CHUNK):
        wire += len(chunk)
        if wire > max_bytes:
            raise RequestBodyError(413, "too-large", f"compressed request body is over the {max_bytes}-byte limit")
        if inflater is None:
            inflater = _inflater_for(_name(request), chunk)
        try:
            body += inflater.decompress(chunk, max_bytes + 1 - len(body))
        except zlib.error as exc:
            raise RequestBodyError(400, "encoding", f"request body is not valid {_name(request)} data: {exc}") from exc
        if len(body) > max_bytes or inflater.unconsumed_tail:
            raise RequestBodyError(413, "too-large", f"inflated request body is over the {max_bytes}-byte limit")
    if inflater is None or not inflater.eof:
        raise RequestBodyError(400, "encoding", f"request body is not complete {_name(request)} data")
    return bytes(body)


def _inflater_for(encoding: str, first: bytes) -> zlib._Decompress:
    """gzip; or deflate, which RFC 9110 says is zlib-wrapped but some clients send raw."""
    if encoding != "deflate":
        return zlib.decompressobj(16 + zlib.MAX_WBITS)
    zlib_header = len(first) >= 2 and first[0] & 0x0F == 8 and (first[0] << 8 | first[1]) % 31 == 0
    return zlib.decompressobj(zlib.MAX_WBITS if zlib_header else -zlib.MAX_WBITS)


def _name(request: web.BaseRequest) -> str:
    return request.headers.get("Content-Encoding", "").strip().lower()
