"""Hostile AdmissionReview bodies: mutations of the real corpus, what an answer must look like, and a lean client.

Used by tests/test_server_fuzz.py (a bounded number of cases in `make test`)
and bench/soak.py (as many as time allows).
"""

from __future__ import annotations

import asyncio
import gzip
import json
import random
import re
import ssl
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from tests.support import corpus_reviews


def _deep(levels: int) -> Any:
    value: Any = "bottom"
    for n in range(levels):
        value = [value] if n % 2 else {"d": value}
    return value


#: values put where the corpus has something else: wrong types, odd numbers and quantities, odd unicode
HOSTILE: list[Any] = [
    None, True, False, 0, -1, 2**64, -(2**70), 1e308, float("nan"), float("inf"), float("-inf"), 0.5,
    "", " ", "0.5", "500m", "1e999999999", "-1", "NaN", "Infinity", "64Gi", "1.5Ki", "0x10", "١٢",
    "\ud800", "Pod\udc00", "\u0000", "\u202e", "💥" * 300, "x" * 70_000, "nvidia.com/gpu",
    [], {}, [None], [{}], [[[]]], {"": None}, {"nvidia.com/gpu": "0.5"}, _deep(60), _deep(400),
]
ENCODINGS = ["gzip", "deflate", "x-gzip", "identity", "br", "zstd", "compress", "gzip, deflate", "GZIP", "", "gzip;q=1"]


@dataclass
class Case:
    """One request to send: its body and headers, and the uid an AdmissionReview answer must echo."""

    endpoint: str
    body: bytes
    headers: dict[str, str] = field(default_factory=dict)
    uid: str | None = None
    what: str = ""


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    yield prefix
    if isinstance(value, dict):
        for key, child in value.items():
            yield from _paths(child, (*prefix, key))
    elif isinstance(value, list):
        for index, child in enumerate(value[:4]):
            yield from _paths(child, (*prefix, index))


def _uid(review: Any) -> str | None:
    try:
        uid = review["request"]["uid"]
    except (TypeError, KeyError, IndexError):
        return None
    return uid if isinstance(uid, str) and uid else None


def _mutate_tree(rng: random.Random, text: str, paths: list[tuple[Any, ...]]) -> tuple[Any, str]:
    sent = json.loads(text)
    path: tuple[Any, ...] = ()
    for _ in range(rng.randint(1, 3)):
        path = rng.choice(paths)
        parent: Any = sent
        try:
            for key in path[:-1]:
                parent = parent[key]
            if rng.random() < 0.15 and isinstance(parent, dict):
                parent.pop(path[-1], None)
            else:
                parent[path[-1]] = rng.choice(HOSTILE)  # shared, never changed: it is only serialised
        except (KeyError, IndexError, TypeError):
            continue
    return sent, "tree:" + "/".join(map(str, path))


def _mutate_bytes(rng: random.Random, body: bytes) -> tuple[bytes, str]:
    op = rng.randrange(4)
    at = rng.randrange(len(body))
    if op == 0:
        return body[:at], "truncated"
    if op == 1:
        return body[:at] + bytes([rng.randrange(256)]) + body[at + 1 :], "flipped"
    if op == 2:
        return body[:at] + rng.randbytes(rng.randint(1, 16)) + body[at:], "inserted"
    return body[:at] + body[at : at + 200] * 3 + body[at:], "repeated"


def _encode(rng: random.Random, body: bytes) -> tuple[bytes, dict[str, str], str]:
    """Sometimes a Content-Encoding claim, true or false."""
    if rng.random() > 0.15:
        return body, {}, ""
    claim = rng.choice(ENCODINGS)
    honest = rng.random() < 0.5
    if honest and claim.strip().lower() in ("gzip", "x-gzip"):
        body = gzip.compress(body)
    elif honest and claim == "deflate":
        body = zlib.compress(body)
    return body, {"Content-Encoding": claim}, f" encoding:{claim}:{'honest' if honest else 'false'}"


def cases(seed: int, count: int) -> Iterator[Case]:
    """``count`` mutated requests, reproducible from ``seed``."""
    rng = random.Random(seed)
    reviews = [(text, [p for p in _paths(json.loads(text)) if p]) for text in (p.read_text() for p in corpus_reviews())]
    for _ in range(count):
        text, paths = rng.choice(reviews)
        endpoint = rng.choice(["/mutate", "/validate"])
        if rng.random() < 0.8:
            sent, what = _mutate_tree(rng, text, paths)
            body, uid = json.dumps(sent).encode(), _uid(sent)
        else:
            body, what = _mutate_bytes(rng, text.encode())
            try:
                uid = _uid(json.loads(body))
            except ValueError:
                uid = None
        body, headers, claim = _encode(rng, body)
        yield Case(endpoint, body, headers, uid, what + claim)


def problem(case: Case, status: int, body: bytes) -> str:
    """What is wrong with the answer to ``case`` ("" when it is a well-formed answer)."""
    if status >= 500:
        return f"{status} for {case.what}"
    try:
        answer = json.loads(body)
    except ValueError:
        return f"{status} with a body that is not JSON for {case.what}: {body[:100]!r}"
    if status == 200:
        response = answer.get("response", {})
        if answer.get("kind") != "AdmissionReview" or not isinstance(response.get("allowed"), bool):
            return f"malformed AdmissionReview for {case.what}"
        if case.uid is None or response.get("uid") != case.uid:
            return f"uid not echoed for {case.what}"
        return ""
    if not 400 <= status < 500 or answer.get("kind") != "Status" or not answer.get("message"):
        return f"{status} without a Status body for {case.what}"
    return ""


async def read_answer(reader: asyncio.StreamReader) -> bytes:
    """One HTTP answer (head and Content-Length body), or b"" when the server closes first."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError:
        return b""
    length = re.search(rb"(?i)content-length: *(\d+)", head)
    return head + (await reader.readexactly(int(length.group(1))) if length else b"")


class Connection:
    """A minimal keep-alive HTTP/1.1 client over TLS: cheap enough that the server does most of the work."""

    def __init__(self, base: str, ctx: ssl.SSLContext) -> None:
        host, port = base.removeprefix("https://").split(":")
        self.host, self.port, self.ctx = host, int(port), ctx
        self.streams: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None

    async def post(self, case: Case) -> tuple[int, bytes]:
        if self.streams is None:
            self.streams = await asyncio.open_connection(self.host, self.port, ssl=self.ctx, server_hostname="localhost")
        reader, writer = self.streams
        extra = "".join(f"{k}: {v}\r\n" for k, v in case.headers.items())
        writer.write(
            f"POST {case.endpoint} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n{extra}"
            f"Content-Length: {len(case.body)}\r\n\r\n".encode() + case.body
        )
        answer = await read_answer(reader)
        head, _, body = answer.partition(b"\r\n\r\n")
        if not answer or b"connection: close" in head.lower():
            writer.close()
            self.streams = None
        return (int(head.split(b" ", 2)[1]) if answer else 0), body
