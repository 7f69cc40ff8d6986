"""Fuzzing a real `gpu-admission serve` process over TLS: never a 500, always a well-formed answer.

Mutations of the real corpus (``tests/fuzz.py``), hypothesis-generated JSON
and broken HTTP framing: each answer is an AdmissionReview echoing the uid or
a 4xx with a Status body; afterwards /metrics and /healthz still answer 200 and
the metric labels hold only known values. `make soak` runs many more cases.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import re
import ssl
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests import fuzz
from tests.conftest import Pki, make_pki
from tests.support import corpus_reviews, load_review
from tests.support import listening_port
from tests.test_server_shutdown import start_server, wait_ready

#: `make soak` raises these (GPU_ADMISSION_FUZZ_SCALE=10 sends ten times as many)
SCALE = int(os.environ.get("GPU_ADMISSION_FUZZ_SCALE", "1"))
MUTATIONS = 9_300 * SCALE
HYPOTHESIS_CASES = 700 * SCALE
CONCURRENCY = 8


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Pki]]:
    root = tmp_path_factory.mktemp("fuzz")
    pki = make_pki(root / "pki")
    policies = Path(__file__).resolve().parents[1] / "policies"
    proc = start_server(pki, policies, root / "server.log", level="WARNING")
    port = listening_port(proc)
    base = f"https://127.0.0.1:{port}"
    asyncio.run(wait_ready(base, pki.client_context(), proc))
    yield base, pki
    proc.terminate()
    proc.wait(20)
    lines = [json.loads(line) for line in (root / "server.log").read_text().splitlines()]
    assert not [line for line in lines if line["level"] == "error"], lines[:3]


async def send_all(base: str, ctx: ssl.SSLContext, cases: Iterator[fuzz.Case]) -> tuple[int, list[str]]:
    sent, problems = 0, []

    async def worker() -> None:
        nonlocal sent
        connection = fuzz.Connection(base, ctx)
        for case in cases:
            status, body = await connection.post(case)
            sent += 1
            found = fuzz.problem(case, status, body) if status else f"closed without an answer: {case.what}"
            if found:
                problems.append(found)
        if connection.streams:
            connection.streams[1].close()

    await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))
    return sent, problems


def test_mutated_corpus_reviews_get_well_formed_answers(server: tuple[str, Pki]) -> None:
    base, pki = server
    sent, problems = asyncio.run(send_all(base, pki.client_context(), fuzz.cases(seed=14, count=MUTATIONS)))
    assert sent == MUTATIONS and not problems, problems[:5]


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)
REVIEW = load_review(corpus_reviews()[1])
REQUEST_KEYS = sorted(REVIEW["request"])


@st.composite
def reviews(draw: Any) -> fuzz.Case:
    """Random JSON, or a corpus review with random values at its top levels."""
    if draw(st.booleans()):
        body: Any = draw(JSON)
    else:
        body = json.loads(json.dumps(REVIEW))
        for key in draw(st.lists(st.sampled_from(REQUEST_KEYS), max_size=3)):
            body["request"][key] = draw(JSON)
        if draw(st.booleans()):
            body[draw(st.sampled_from(["apiVersion", "kind", "request"]))] = draw(JSON)
    uid = fuzz._uid(body) if isinstance(body, dict) else None
    return fuzz.Case(draw(st.sampled_from(["/mutate", "/validate"])), json.dumps(body).encode(), {}, uid, "hypothesis")


class Client:
    """A keep-alive HTTPS client for hypothesis' synchronous tests."""

    def __init__(self, base: str, ctx: ssl.SSLContext) -> None:
        self.host, self.port = base.removeprefix("https://").split(":")
        self.ctx = ctx
        self.conn = http.client.HTTPSConnection(self.host, int(self.port), context=ctx, timeout=10)

    def post(self, case: fuzz.Case) -> tuple[int, bytes]:
        self.conn.request("POST", case.endpoint, body=case.body, headers={"Content-Type": "application/json"})
        resp = self.conn.getresponse()
        body = resp.read()
        if resp.getheader("Connection", "").lower() == "close":
            self.conn.close()
        return resp.status, body


def test_hypothesis_reviews_get_well_formed_answers(server: tuple[str, Pki]) -> None:
    base, pki = server
    client = Client(base, pki.client_context())

    @settings(max_examples=HYPOTHESIS_CASES, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(case=reviews())
    def check(case: fuzz.Case) -> None:
        status, body = client.post(case)
        assert not fuzz.problem(case, status, body)

    check()


#: broken framing, and what the answer says (each has a defined 400: none may end in a bare close)
FRAMING = [
    (b"POST /validate HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nContent-Length: 7\r\n\r\n{}",
     r"malformed HTTP request: Duplicate '?Content-Length"),
    (b"POST /validate HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n",
     r"malformed HTTP request: .*chunk"),
    (b"POST /validate HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nContent-Length: 2\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
     r"malformed HTTP request: .*(Content-Length.*Transfer-Encoding|Transfer-Encoding.*Content-Length)"),
    # (the body is read chunked: "{}" is no AdmissionReview)
    (b"POST /validate HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip, chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
     r"^apiVersion must be one of"),
    (b"POST /validate HTTP/1.1\r\nHost: x\r\nX-Long: " + b"a" * 100_000 + b"\r\n\r\n", r"malformed HTTP request: .*8190 bytes"),
    (b"POST /validate HTTP/9.9\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}", r"malformed HTTP request: .*HTTP version"),
    (b"POST /validate\r\n\r\n", r"^request body is not JSON"),  # HTTP/0.9: no headers, no body
    (b"POST /validate HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999999999999\r\n\r\n{}",
     r"malformed HTTP request: .*Content-Length"),
    (b"POST /validate HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nBad Header\r\n\r\n{}", r"malformed HTTP request: .*header"),
    (b"POST /validate HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\x00: y\r\n\r\n{}", r"malformed HTTP request: .*header"),
    (b"\x16\x03\x01\x00\x05hello", r"malformed HTTP request: "),  # a TLS ClientHello inside TLS
    (b"POST /" + b"a" * 20_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n", r"malformed HTTP request: .*8190 bytes"),
    (b"POST /validate HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n" + b"f" * 40 + b"\r\n",
     r"malformed HTTP request: .*[Cc]hunk size"),
]


@pytest.mark.parametrize(("raw", "says"), FRAMING, ids=range(len(FRAMING)))
def test_broken_framing_gets_a_400_with_a_status_saying_why(server: tuple[str, Pki], raw: bytes, says: str) -> None:
    base, pki = server
    host, port = base.removeprefix("https://").split(":")

    async def send() -> bytes:
        reader, writer = await asyncio.open_connection(host, int(port), ssl=pki.client_context(), server_hostname="localhost")
        writer.write(raw)
        await writer.drain()
        answer = await asyncio.wait_for(fuzz.read_answer(reader), 15)
        writer.close()
        return answer

    answer = asyncio.run(send())
    assert answer, "closed without an answer"
    head, _, body = answer.partition(b"\r\n\r\n")
    assert int(head.split(b" ", 2)[1]) == 400, answer[:300]
    status = json.loads(body)
    assert status["kind"] == "Status" and re.search(says, status["message"]), status


def test_large_bodies_are_answered(server: tuple[str, Pki]) -> None:
    base, pki = server
    review = load_review(corpus_reviews()[1])
    cases = []
    for size in (3 * 1024 * 1024 - 4096, 3 * 1024 * 1024 + 1, 8 * 1024 * 1024):
        review["request"]["object"]["metadata"]["annotations"] = {"pad": "x" * size}
        cases.append(fuzz.Case("/validate", json.dumps(review).encode(), {}, review["request"]["uid"], f"{size} bytes"))
    sent, problems = asyncio.run(send_all(base, pki.client_context(), iter(cases)))
    assert sent == 3 and not problems, problems


def test_the_server_is_healthy_afterwards_and_labels_are_bounded(server: tuple[str, Pki]) -> None:
    """Whatever ran before (alone, it sends its own): kinds no policy knows count as "other"."""
    base, pki = server
    client = Client(base, pki.client_context())
    answered = 0
    for n in range(60):  # kinds no policy knows; every third with an operation that is none (a 400)
        sent = load_review(corpus_reviews()[1])
        sent["request"]["kind"]["kind"] = f"Fuzzed{n}"
        sent["request"]["operation"] = f"FUZZ{n}" if n % 3 == 0 else "CREATE"
        case = fuzz.Case("/validate", json.dumps(sent).encode(), {}, sent["request"]["uid"], f"kind Fuzzed{n}")
        status, body = client.post(case)
        assert not fuzz.problem(case, status, body) and status == (400 if n % 3 == 0 else 200), (status, body)
        answered += status == 200
    for path in ("/healthz", "/metrics"):
        client.conn.request("GET", path)
        resp = client.conn.getresponse()
        text = resp.read().decode()
        assert resp.status == 200
    kinds = set(re.findall(r'gpu_admission_requests_total\{[^}]*kind="([^"]*)"', text))
    assert kinds <= {"", "other", "Pod", "Deployment", "Job", "CronJob", "StatefulSet", "DaemonSet", "ReplicaSet",
                     "PyTorchJob", "RayCluster", "ReplicationController"} | kinds_known_by_policies(), kinds
    operations = set(re.findall(r'gpu_admission_requests_total\{[^}]*operation="([^"]*)"', text))
    assert operations <= {"", "CREATE", "UPDATE", "DELETE", "CONNECT", "other"}
    assert "Fuzzed" not in text and "FUZZ" not in text
    others = sum(float(count) for count in re.findall(r'gpu_admission_requests_total\{[^}]*kind="other"[^}]*\} (\S+)', text))
    assert others >= answered == 40, (answered, others)
    assert len(text) < 200_000


def kinds_known_by_policies() -> set[str]:
    from tests.support import shipped_policies

    return {kind for _, kind in shipped_policies().kinds}
