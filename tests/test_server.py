"""The server over real localhost TLS: the AdmissionReview contract and bad input."""

from __future__ import annotations

import asyncio
import base64
import copy
import email.utils
import json
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Webhook
from webhook.server import keys
from tests.support import apply_patch, assert_schema_valid, corpus_reviews, load_review

WARNING_MAX = 256


def check_contract(sent: dict[str, Any], answer: dict[str, Any], *, mutating: bool) -> dict[str, Any]:
    """What kube-apiserver checks of every answer (FACTS.md §6); returns the response."""
    assert answer["apiVersion"] == sent["apiVersion"]
    assert answer["kind"] == "AdmissionReview"
    response = answer["response"]
    assert response["uid"] == sent["request"]["uid"]
    assert isinstance(response["allowed"], bool)
    assert ("patch" in response) == ("patchType" in response)
    if "patch" in response:
        assert mutating, "a validating webhook must not patch"
        assert response["patchType"] == "JSONPatch"
        ops = json.loads(base64.b64decode(response["patch"]))
        assert isinstance(ops, list) and ops
        patched = apply_patch(sent["request"]["object"], ops)
        assert_schema_valid(patched)
    if not response["allowed"]:
        assert response["status"]["code"] == 403
        assert response["status"]["message"]
    for warning in response.get("warnings", []):
        assert 0 < len(warning) <= WARNING_MAX
    assert sum(len(w) for w in response.get("warnings", [])) <= 4096
    return dict(response)


@pytest.mark.parametrize("path", corpus_reviews(), ids=lambda p: p.stem)
async def test_replays_every_corpus_request(webhook: Webhook, path: Path) -> None:
    sent = load_review(path)
    endpoint = "/mutate" if "_mutate_" in path.name else "/validate"
    response = check_contract(sent, await webhook.review(endpoint, sent), mutating=endpoint == "/mutate")
    request = sent["request"]
    if request["operation"] in ("DELETE", "CONNECT") or request.get("subResource"):
        assert response["allowed"] and "patch" not in response
    if request["operation"] == "UPDATE" and request["kind"]["kind"] == "Pod":
        assert "patch" not in response, "a pod's spec is immutable on UPDATE"


async def test_a_pod_the_mutating_webhook_denies_is_not_said_to_be_mutated(webhook: Webhook) -> None:
    # the shipped MIG affinity contradicts the pod's nodeSelector: denied, nothing stored, so no "mutated" warning
    sent = load_review(corpus_reviews()[2])  # a 1-GPU pod
    spec = sent["request"]["object"]["spec"]
    spec["nodeSelector"] = {"nvidia.com/mig.capable": "false"}
    spec["containers"][0]["resources"] = {"limits": {"nvidia.com/mig-1g.10gb": "1"}}
    response = check_contract(sent, await webhook.review("/mutate", sent), mutating=True)
    assert not response["allowed"] and "[gpu-defaults/nodeAffinity]" in response["status"]["message"]
    assert not any(w.startswith("gpu-admission mutated") for w in response.get("warnings", [])), response
    del spec["nodeSelector"]
    allowed = check_contract(sent, await webhook.review("/mutate", sent), mutating=True)
    assert allowed["allowed"] and allowed["warnings"][0].startswith("gpu-admission mutated: ")


async def test_mutate_adds_gpu_toleration_end_to_end(webhook: Webhook) -> None:
    sent = load_review(corpus_reviews()[2])  # a 1-GPU pod
    pod = sent["request"]["object"]
    pod["spec"]["tolerations"] = [t for t in pod["spec"]["tolerations"] if t["key"] != "nvidia.com/gpu"]
    response = check_contract(sent, await webhook.review("/mutate", sent), mutating=True)
    patched = apply_patch(pod, json.loads(base64.b64decode(response["patch"])))
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in patched["spec"]["tolerations"]
    assert patched["metadata"]["annotations"]["gpu-admission.io/mutated"].startswith("tolerations")
    assert any("tolerations" in w for w in response["warnings"])
    # kube-apiserver calls again after a patch (reinvocation): no second patch
    sent["request"]["object"] = patched
    again = check_contract(sent, await webhook.review("/mutate", sent), mutating=True)
    assert "patch" not in again


async def test_dry_run_gets_the_same_answer(webhook: Webhook) -> None:
    dry = load_review(next(p for p in corpus_reviews() if p.name.endswith("mutate_create_pods_dryrun.json")))
    dry["request"]["object"]["spec"]["tolerations"] = []
    wet = copy.deepcopy(dry)
    wet["request"]["dryRun"] = False
    a, b = await webhook.review("/mutate", dry), await webhook.review("/mutate", wet)
    assert a["response"]["patch"] == b["response"]["patch"]


async def test_v1beta1_is_answered_in_kind(webhook: Webhook) -> None:
    sent = load_review(corpus_reviews()[0])
    sent["apiVersion"] = "admission.k8s.io/v1beta1"
    answer = await webhook.review("/mutate", sent)
    assert answer["apiVersion"] == "admission.k8s.io/v1beta1"
    assert answer["response"]["uid"] == sent["request"]["uid"]


BAD_BODIES = [
    (b"{not json", "not JSON"),
    (b"[1, 2]", "not a JSON object"),
    (json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}), "no request"),
    (json.dumps({"kind": "AdmissionReview", "request": {}}), "apiVersion"),
    (json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "Pod", "request": {}}), "kind must be AdmissionReview"),
]


@pytest.mark.parametrize(("body", "reason"), BAD_BODIES)
async def test_malformed_bodies_get_400(webhook: Webhook, body: Any, reason: str) -> None:
    async with await webhook.post("/mutate", body) as resp:
        assert resp.status == 400
        assert reason in (await resp.json())["message"]


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (lambda r: r.pop("uid"), "uid"),
        (lambda r: r.pop("object"), "request.object"),
        (lambda r: r.update(operation="EXPLODE"), "operation"),
        (lambda r: r.update(kind="Pod"), "request.kind"),
        (lambda r: r.update(namespace=7), "namespace"),
    ],
    ids=["no-uid", "no-object-on-create", "bad-operation", "kind-not-object", "namespace-not-string"],
)
async def test_reviews_missing_parts_get_400(webhook: Webhook, change: Any, reason: str) -> None:
    sent = load_review(corpus_reviews()[0])
    change(sent["request"])
    async with await webhook.post("/validate", sent) as resp:
        assert resp.status == 400
        assert reason in (await resp.json())["message"]


async def test_update_without_old_object_gets_400(webhook: Webhook) -> None:
    sent = load_review(next(p for p in corpus_reviews() if "update_pods_.json" in p.name))
    sent["request"]["oldObject"] = None
    async with await webhook.post("/mutate", sent) as resp:
        assert resp.status == 400


async def test_body_over_3_mib_gets_413(webhook: Webhook) -> None:
    sent = load_review(corpus_reviews()[0])
    sent["request"]["object"]["metadata"]["annotations"]["big"] = "x" * (3 * 1024 * 1024)
    async with await webhook.post("/mutate", sent) as resp:
        assert resp.status == 413


async def test_admission_endpoints_answer_as_the_apiserver_calls_them(webhook: Webhook) -> None:
    """kube-apiserver adds ?timeout= to the URL; a client may ask Expect: 100-continue (the router's path)."""
    sent = load_review(corpus_reviews()[0])
    plain = await webhook.review("/mutate", sent)
    assert plain["response"]["patch"], "the corpus pod is mutated"
    for path, expect100 in (("/mutate?timeout=10s", False), ("/mutate", True)):
        async with await webhook.post(path, sent, expect100=expect100) as resp:
            assert resp.status == 200, await resp.text()
            assert (await resp.json())["response"] == plain["response"], path
    async with await webhook.post("/validate?timeout=10s", sent) as resp:
        assert resp.status == 200 and (await resp.json())["response"]["uid"] == sent["request"]["uid"]


async def test_wrong_method_and_unknown_path(webhook: Webhook) -> None:
    async with webhook.session.get(webhook.base + "/mutate") as resp:
        assert resp.status == 405
    async with webhook.session.post(webhook.base + "/nope", data=b"{}") as resp:
        assert resp.status == 404
    async with webhook.session.post(webhook.base + "/mutate/", data=b"{}") as resp:
        assert resp.status == 404


async def test_health_readiness_and_metrics(webhook: Webhook) -> None:
    async with webhook.session.get(webhook.base + "/healthz") as resp:
        assert resp.status == 200
    async with webhook.session.get(webhook.base + "/readyz") as resp:
        assert resp.status == 200
    await webhook.review("/mutate", load_review(corpus_reviews()[0]))
    async with await webhook.post("/mutate", b"nope") as resp:
        assert resp.status == 400
    async with webhook.session.get(webhook.base + "/metrics") as resp:
        text = await resp.text()
    assert 'gpu_admission_requests_total{decision="patch",endpoint="/mutate",kind="Pod",operation="CREATE"} 1.0' in text
    assert 'gpu_admission_requests_total{decision="error",endpoint="/mutate",kind="",operation=""} 1.0' in text
    assert "gpu_admission_request_duration_seconds_bucket" in text
    assert 'gpu_admission_certificate_not_after_seconds{cert="serving"}' in text
    loaded = len(webhook.app[keys.STORE].current.policies)
    assert f"gpu_admission_policies_loaded {float(loaded)}" in text


async def _exchange(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, head: str, body: bytes) -> tuple[str, dict[str, str], bytes]:
    """One request on a raw connection: (status line, headers by lower-case name, body); an
    interim 100 Continue (the answer to Expect) is read past."""
    writer.write(head.encode() + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
    await writer.drain()
    lines = (await reader.readuntil(b"\r\n\r\n")).decode().split("\r\n")
    if lines[0].startswith("HTTP/1.1 100 "):
        lines = (await reader.readuntil(b"\r\n\r\n")).decode().split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:] if line)}
    return lines[0], headers, await reader.readexactly(int(headers["content-length"]))


async def test_a_target_spelt_otherwise_is_read_as_its_url_says(webhook: Webhook, pki: Any) -> None:
    """The fast path takes the request target as sent, up to its query; a target spelt any other way
    (percent-escapes, dot segments) goes through the router, which reads it as a URL: the same answer,
    beside the control that a target naming no endpoint is a 404 either way."""
    sent = load_review(corpus_reviews()[0])
    plain = await webhook.review("/mutate", sent)
    body = json.dumps(sent).encode()
    port = int(webhook.base.rsplit(":", 1)[1])
    for target, status in (("/mut%61te?timeout=10s", "200"), ("/%6Dutate", "200"), ("/mutat%65s", "404"), ("/mutate%3F", "404")):
        reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=pki.client_context(), server_hostname="localhost")
        try:
            line, _, answer = await _exchange(reader, writer, f"POST {target} HTTP/1.1\r\nHost: x\r\n", body)
        finally:
            writer.close()
        assert line.split(" ")[1] == status, (target, line)
        if status == "200":
            assert json.loads(answer)["response"] == plain["response"], target


async def test_answers_are_well_formed_http_on_kept_and_closed_connections(webhook: Webhook, pki: Any) -> None:
    """The admission answer is written in one piece (handlers.Answer): status line and headers as
    HTTP/1.1 and 1.0 clients expect them, the connection kept or closed as each asked."""
    sent = load_review(corpus_reviews()[0])
    body = json.dumps(sent).encode()
    port = int(webhook.base.rsplit(":", 1)[1])
    reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=pki.client_context(), server_hostname="localhost")
    try:
        for _ in range(2):  # one connection, two answers: kept alive (HTTP/1.1's default)
            status, headers, answer = await _exchange(reader, writer, "POST /mutate HTTP/1.1\r\nHost: x\r\n", body)
            assert status == "HTTP/1.1 200 OK"
            assert headers["content-type"] == "application/json" and "connection" not in headers
            assert email.utils.parsedate_to_datetime(headers["date"]).tzinfo is not None
            check_contract(sent, json.loads(answer), mutating=True)
    finally:
        writer.close()
    for keep in (False, True):  # HTTP/1.0 closes unless the client asks to keep the connection
        reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=pki.client_context(), server_hostname="localhost")
        try:
            head = "POST /validate HTTP/1.0\r\n" + ("Connection: keep-alive\r\n" if keep else "")
            status, headers, answer = await _exchange(reader, writer, head, body)
            assert status == "HTTP/1.0 200 OK" and json.loads(answer)["response"]["uid"] == sent["request"]["uid"]
            assert headers.get("connection") == ("keep-alive" if keep else None)
            if keep:
                assert (await _exchange(reader, writer, head, body))[0] == "HTTP/1.0 200 OK"
            else:
                assert await reader.read() == b"", "the server closes an HTTP/1.0 connection after its answer"
        finally:
            writer.close()


async def test_while_draining_admission_answers_close_their_connection_by_either_path(webhook: Webhook, pki: Any) -> None:
    """During the drain every answer says Connection: close and the server closes after it: on the
    fast path (dispatch) and through the router, which a request asking Expect: 100-continue takes
    (the app's response hook sets it there)."""
    body = json.dumps(load_review(corpus_reviews()[0])).encode()
    port = int(webhook.base.rsplit(":", 1)[1])
    webhook.app[keys.DRAINING].set()
    for expect in ("", "Expect: 100-continue\r\n"):
        reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=pki.client_context(), server_hostname="localhost")
        try:
            status, headers, answer = await _exchange(reader, writer, f"POST /mutate HTTP/1.1\r\nHost: x\r\n{expect}", body)
            assert status == "HTTP/1.1 200 OK" and json.loads(answer)["response"]["uid"] == json.loads(body)["request"]["uid"]
            assert headers.get("connection") == "close", (expect, headers)
            assert await asyncio.wait_for(reader.read(), 5) == b"", "closed after the answer"
        finally:
            writer.close()
